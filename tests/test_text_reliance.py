"""Does a run read its text (arnar.evaluate.text_reliance): mismatched readings and their gap."""

import math

import pytest
import torch

from arnar.evaluate.text_reliance import markdown, mismatched_text, rescaled_ends, text_reliance
from arnar.paradigms import build_paradigm
from arnar.paradigms.base import Utterance, Vocab

VOCAB = Vocab(text_size=10, speech_size=6)
TINY = {"dim": 16, "n_layers": 1, "n_heads": 2, "dropout": 0.0}


def test_rescaled_ends_stretch_the_timing_onto_the_frames():
    assert rescaled_ends(torch.tensor([2, 5, 10]), 20).tolist() == [4, 10, 20]
    # 1 * 5 / 3 = 1.67 -> 2; the last end is the frame count exactly
    assert rescaled_ends(torch.tensor([1, 3]), 5).tolist() == [2, 5]
    # halves round up: 1 * 3 / 2 = 1.5 -> 2
    assert rescaled_ends(torch.tensor([1, 2]), 3).tolist() == [2, 3]
    with pytest.raises(ValueError, match="0 frames"):
        rescaled_ends(torch.tensor([0, 0]), 4)


def utt(i: int, frames: int, text: list[int], **features) -> Utterance:
    return Utterance(f"spk{i % 2}_{i}", f"spk{i % 2}", torch.tensor(text), torch.full((frames,), i % 6),
                     ends=torch.linspace(frames / len(text), frames, len(text)).round().long(),
                     features={k: torch.tensor(v) for k, v in features.items()})


def test_each_utterance_reads_the_text_half_the_list_on_and_keeps_its_speech():
    utts = [utt(i, 4 + i, [i, i + 1], phonemes=[10 + i]) for i in range(4)]
    swapped = mismatched_text(utts)
    # shift 2 of 4: 0 <- 2, 1 <- 3, 2 <- 0, 3 <- 1
    assert [u.text.tolist() for u in swapped] == [[2, 3], [3, 4], [0, 1], [1, 2]]
    assert [u.features["phonemes"].tolist() for u in swapped] == [[12], [13], [10], [11]]
    for before, after in zip(utts, swapped):
        assert torch.equal(before.speech, after.speech) and before.utt_id == after.utt_id
        assert int(after.ends[-1]) == before.num_frames  # the other's timing, on this one's frames
    # utterance 0 (4 frames) gets utterance 2's ends [3, 6] of 6 frames: [2, 4]
    assert swapped[0].ends.tolist() == [2, 4]
    assert [u.text.tolist() for u in mismatched_text(utts, shift=1)][0] == [1, 2]
    with pytest.raises(ValueError, match="with itself"):
        mismatched_text(utts, shift=4)
    with pytest.raises(ValueError, match="at least 2"):
        mismatched_text(utts[:1])


def speech_from_first_text_token(input_ids, position_ids, attention_mask=None, cache=None, cond=None):
    """Stands in for a network that has learned the text: every position predicts the speech
    code equal to the first text token (position 1 of NAR's ``<sos> text <turn> ...``)."""
    code = input_ids[:, 1] - VOCAB.text_offset
    logits = torch.zeros(*input_ids.shape, VOCAB.size)
    logits[torch.arange(len(code)), :, VOCAB.speech_offset + code] = 10.0
    return logits


def copy_input(input_ids, position_ids, attention_mask=None, cache=None, cond=None):
    """Stands in for a network that ignores the text: each position repeats the id it reads."""
    return torch.nn.functional.one_hot(input_ids, VOCAB.size).float() * 10.0


# utterance k speaks code k throughout and its text starts with k: its own text names its tokens
SPEAKS_ITS_TEXT = [Utterance(f"s_{k}", "s", torch.tensor([k, 9]), torch.full((6 + k,), k)) for k in range(4)]


def test_a_model_that_reads_the_text_loses_everything_with_another_text():
    model = build_paradigm("nar", VOCAB, TINY).eval()
    model.logits = speech_from_first_text_token
    result = text_reliance(model, SPEAKS_ITS_TEXT, seed=0, max_tokens=200)
    assert result["matched"]["accuracy"] == 1.0 and result["mismatched"]["accuracy"] == 0.0
    # own text: every target at logit 10 against 0 for the other 31 ids; another's: at 0 against one 10
    right = -math.log(math.exp(10) / (math.exp(10) + VOCAB.size - 1))
    wrong = -math.log(1 / (math.exp(10) + VOCAB.size - 1))
    assert result["matched"]["loss"] == pytest.approx(right, rel=1e-4)
    assert result["mismatched"]["loss"] == pytest.approx(wrong, rel=1e-4)
    assert result["loss_gap"] == pytest.approx(wrong - right, rel=1e-4)
    assert result["accuracy_gap"] == -1.0 and result["utterances"] == 4


def test_a_model_that_ignores_the_text_shows_no_gap():
    model = build_paradigm("nar", VOCAB, TINY).eval()
    model.logits = copy_input
    result = text_reliance(model, SPEAKS_ITS_TEXT, seed=0, max_tokens=200)
    # NAR's masks depend on the speech alone: the same targets behind <mask> in both readings
    assert result["loss_gap"] == 0.0 and result["matched"]["accuracy"] == 0.0
    assert result["matched"]["loss"] == pytest.approx(-math.log(1 / (math.exp(10) + VOCAB.size - 1)), rel=1e-4)


@pytest.mark.parametrize("name", ["ar", "syncspeech", "palle"])
def test_every_layout_is_read_both_ways(name):
    model = build_paradigm(name, VOCAB, TINY).eval()
    utts = [utt(i, 6 + i, [i, i + 1, 3]) for i in range(4)]
    result = text_reliance(model, utts, seed=0, max_tokens=200)
    assert all(math.isfinite(result[r]["loss"]) for r in ("matched", "mismatched"))
    table = markdown([{"run": "runs/" + name, "checkpoint": "best", **result}])
    assert f"| {name} | best |" in table

