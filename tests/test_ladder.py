"""The teacher-forced rung (arnar.evaluate.ladder): which output predicts which target frame."""

import pytest
import torch

from arnar.evaluate.ladder import teacher_forced_codes
from arnar.paradigms import build_paradigm
from arnar.paradigms.base import Vocab

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


def test_a_masked_paradigm_is_refused_with_the_reason():
    model = build_paradigm("nar", VOCAB, TINY)
    with pytest.raises(ValueError, match="next-token paradigms"):
        teacher_forced_codes(model, torch.tensor([4]), torch.tensor([5]), torch.tensor([1]), torch.tensor([2]))
