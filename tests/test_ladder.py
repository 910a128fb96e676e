"""The teacher-forced rung (arnar.evaluate.ladder): which output predicts which target frame."""

import pytest
import torch

from arnar.evaluate.ladder import teacher_forced_codes
from arnar.paradigms import build_paradigm
from arnar.paradigms.base import MASK, Vocab

VOCAB = Vocab(text_size=10, speech_size=6)
TINY = {"dim": 16, "n_layers": 1, "n_heads": 2, "dropout": 0.0}


class CopyPrevious:
    """Stands in for the network: at each position, all the weight on the id it reads, so the
    "next token" it predicts is the token it was fed (a repeat-the-last-frame model)."""

    def __init__(self, vocab_size):
        self.vocab_size = vocab_size

    def __call__(self, input_ids, position_ids, attention_mask=None, cache=None, cond=None):
        return torch.nn.functional.one_hot(input_ids, self.vocab_size).float() * 10.0


def test_each_target_frame_is_predicted_from_the_true_frame_before_it():
    model = build_paradigm("ar", VOCAB, TINY).eval()
    model.logits = CopyPrevious(VOCAB.size)
    # <sos> x_ref x_gen <turn> c_ref c_gen: prompt codes [3, 1], target codes [2, 2, 5].
    # The output before target frame j reads frame j-1 of the true sequence, so a model that
    # repeats its input predicts [1 (last prompt code), 2, 2]: one of three right (the middle 2).
    codes, accuracy = teacher_forced_codes(model, text=torch.tensor([4, 5]), prompt_text=torch.tensor([7]),
                                           prompt_speech=torch.tensor([3, 1]), target_speech=torch.tensor([2, 2, 5]))
    assert codes.tolist() == [1, 2, 2]
    assert accuracy == pytest.approx(1 / 3)


def test_predictions_are_speech_codes_even_where_a_text_id_wins():
    model = build_paradigm("ar", VOCAB, TINY).eval()
    model.logits = CopyPrevious(VOCAB.size)
    # The first target frame is predicted at the <turn> position when there is no prompt speech:
    # the copy model puts its weight on <turn> (a special id), so the argmax over speech codes
    # alone is a tie among them -> code 0 (torch's argmax takes the first).
    codes, _ = teacher_forced_codes(model, text=torch.tensor([4]), prompt_text=torch.tensor([], dtype=torch.long),
                                    prompt_speech=torch.tensor([], dtype=torch.long), target_speech=torch.tensor([5, 3]))
    assert codes.tolist() == [0, 5]


class LastUnmaskedFrame:
    """Stands in for PALLE's network: at every position, all the weight on the last frame of the
    speech stream that is not ``<mask>`` (a model that repeats the history's last frame)."""

    def __init__(self, vocab_size):
        self.vocab_size, self.calls = vocab_size, []

    def __call__(self, input_ids, position_ids, attention_mask=None, cache=None, cond=None, *, text_ids=None, stage=None):
        self.calls.append((input_ids.clone(), None if text_ids is None else text_ids.clone(), stage))
        last = [int((row != MASK).nonzero().max()) for row in input_ids]
        picked = input_ids[torch.arange(len(last)), torch.tensor(last)]
        return torch.nn.functional.one_hot(picked, self.vocab_size).float()[:, None, :].expand(*input_ids.shape, -1) * 10.0


@pytest.mark.parametrize("steps, expected, accuracy", [
    # T = 2 + 4 = 6 frames. 100 steps: floor(6 / 100) -> 1 frame a span, each predicted from the
    # true frame before it: [1, 2, 2, 5] against [2, 2, 5, 4], one right
    (100, [1, 2, 2, 5], 1 / 4),
    # 3 steps: spans of floor(6 / 3) = 2 frames; frames 2-3 read up to frame 1 (code 1), frames
    # 4-5 read up to frame 3 (the true code 2 at target frame 1, not the prediction)
    (3, [1, 1, 2, 2], 0.0),
])
@pytest.mark.parametrize("layout", ["fused", "concat"])
def test_palle_stage_one_predicts_each_span_from_the_true_frames_before_it(steps, expected, accuracy, layout):
    """Both layouts read the same history; concat has the text (7, 4, 5) before the speech."""
    from arnar.evaluate.ladder import palle_teacher_forced_codes
    from arnar.paradigms.palle import padded_text

    model = build_paradigm("palle", VOCAB, TINY, layout=layout).eval()
    model.logits = LastUnmaskedFrame(VOCAB.size)
    codes, right = palle_teacher_forced_codes(model, text=torch.tensor([4, 5]), prompt_text=torch.tensor([7]),
                                              prompt_speech=torch.tensor([3, 1]),
                                              target_speech=torch.tensor([2, 2, 5, 4]), steps=steps)
    assert codes.tolist() == expected
    assert right == pytest.approx(accuracy)
    for inputs, text, stage in model.logits.calls:
        assert stage == 1
        if layout == "fused":
            assert text[0].tolist() == padded_text(VOCAB, torch.tensor([7, 4, 5]), 6).tolist()  # Eq. 13, all 6 frames
            speech = inputs
        else:
            assert text is None and (inputs[:, :3] == VOCAB.text(torch.tensor([7, 4, 5]))).all()
            speech = inputs[:, 3:]
        for row in speech:  # the true history, then <mask> to the end
            s = int((row == MASK).int().argmax())
            assert (row[s:] == MASK).all()
            assert row[:s].tolist() == VOCAB.speech(torch.tensor([3, 1, 2, 2, 5, 4]))[:s].tolist()


def test_a_masked_paradigm_is_refused_with_the_reason():
    model = build_paradigm("nar", VOCAB, TINY)
    with pytest.raises(ValueError, match="fill the target left to right"):
        teacher_forced_codes(model, torch.tensor([4]), torch.tensor([5]), torch.tensor([1]), torch.tensor([2]))
