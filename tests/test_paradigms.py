"""AR and NAR baselines: sequence layouts, masks and targets against hand-worked examples;
sampling and MaskGIT schedules against their formulas; decoding loops on tiny random models."""

from __future__ import annotations

import math

import pytest
import torch

from arnar.decode.sampling import filter_top_k_top_p, repetition_aware, restrict_logits, sample_tokens
from arnar.decode.schedules import cosine_mask_ratio, masks_per_step, total_frames_estimate
from arnar.paradigms import build_paradigm, paradigm_class
from arnar.paradigms.base import (
    EOS,
    IGNORE,
    MASK,
    PAD,
    SOS,
    TURN,
    Example,
    SynthesisRequest,
    Utterance,
    Vocab,
    collate,
)
from arnar.synthesize import continuation_text, item_seed

TINY = {"dim": 32, "n_layers": 2, "n_heads": 4, "dropout": 0.0}
VOCAB = Vocab(text_size=10, speech_size=12)  # text ids 8..17, speech ids 18..29


def utterance(text=(1, 2, 3), speech=(5, 6, 7, 8, 9)):
    return Utterance("spk00_0000", "spk00", torch.tensor(text), torch.tensor(speech))


# ----------------------------------------------------------------------------- vocabulary, batching

def test_vocab_layout():
    assert (VOCAB.text_offset, VOCAB.speech_offset, VOCAB.size) == (8, 18, 30)
    assert VOCAB.speech(torch.tensor([0, 11])).tolist() == [18, 29]
    assert VOCAB.speech_codes(torch.tensor([18, 29])).tolist() == [0, 11]
    assert VOCAB.is_speech(torch.tensor([17, 18, 29, 30])).tolist() == [False, True, True, False]


def test_collate_pads_with_self_attention_only():
    a = Example(torch.tensor([1, 2, 3]), torch.arange(3), torch.tensor([IGNORE, 5, 6]))
    b = Example(torch.tensor([4]), torch.tensor([7]), torch.tensor([9]), torch.ones(1, 1, dtype=torch.bool),
                extras={"t": torch.tensor(0.5)})
    a.extras["t"] = torch.tensor(0.25)
    batch = collate([a, b])
    assert batch.input_ids.tolist() == [[1, 2, 3], [4, PAD, PAD]]
    assert batch.targets.tolist() == [[IGNORE, 5, 6], [9, IGNORE, IGNORE]]
    assert batch.position_ids.tolist() == [[0, 1, 2], [7, 0, 0]]
    # example a: causal; example b: its one real token, then pads attending only themselves
    assert batch.attention_mask[0].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert batch.attention_mask[1].tolist() == [[True, False, False], [False, True, False], [False, False, True]]
    assert batch.extras["t"].tolist() == [0.25, 0.5]
    assert batch.n_targets == 3


# ----------------------------------------------------------------------------- AR

def test_ar_training_example_hand_worked():
    model = build_paradigm("ar", VOCAB, TINY)
    ex = model.training_example(utterance(), torch.Generator().manual_seed(0))
    # <sos> t1 t2 t3 <turn> c5 c6 c7 c8 c9 <eos>  ->  inputs drop <eos>, targets drop <sos>
    assert ex.input_ids.tolist() == [SOS, 9, 10, 11, TURN, 23, 24, 25, 26, 27]
    assert ex.targets.tolist() == [IGNORE, IGNORE, IGNORE, IGNORE, 23, 24, 25, 26, 27, EOS]
    assert ex.position_ids.tolist() == list(range(10))
    assert ex.attention_mask is None  # causal


def test_ar_input_noise_corrupts_read_speech_tokens_only():
    model = build_paradigm("ar", VOCAB, TINY, input_noise=0.5)
    speech = tuple(range(12)) * 20  # 240 frames: the share replaced is measurable
    clean = build_paradigm("ar", VOCAB, TINY).training_example(utterance(speech=speech), torch.Generator())
    ex = model.training_example(utterance(speech=speech), torch.Generator().manual_seed(0))
    # targets, text and markers are untouched: the model still predicts the true next token
    assert torch.equal(ex.targets, clean.targets)
    assert ex.input_ids[:5].tolist() == clean.input_ids[:5].tolist() == [SOS, 9, 10, 11, TURN]
    read = ex.input_ids[5:]
    assert bool(VOCAB.is_speech(read).all())
    changed = float((read != clean.input_ids[5:]).float().mean())
    # each read token is redrawn with p = 0.5 and a redraw lands on the same code with p = 1/12:
    # 0.5 * 11/12 = 0.458 of them change (240 draws: sd 0.032)
    assert 0.36 < changed < 0.56
    again = model.training_example(utterance(speech=speech), torch.Generator().manual_seed(0))
    assert torch.equal(again.input_ids, ex.input_ids)  # from the example's own generator
    with pytest.raises(ValueError, match="input_noise"):
        build_paradigm("ar", VOCAB, TINY, input_noise=1.0)


def test_ar_greedy_decoding_equals_full_forward_argmax():
    torch.manual_seed(0)
    model = build_paradigm("ar", VOCAB, TINY).eval()
    request = SynthesisRequest(torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([4, 5, 6]), target_frames=6)
    out = model.generate(request, torch.Generator().manual_seed(0), temperature=0, ras_window=0)
    assert len(out.speech) == 6 and out.forward_passes == 6  # prefill + 5 cached steps
    # replay without the cache: each generated token is the argmax over speech codes of a full pass
    sequence = torch.tensor([SOS, 11, 9, 10, TURN, 22, 23, 24])
    for code in out.speech.tolist():
        logits = model.logits(sequence[None], torch.arange(len(sequence))[None])[0, -1]
        logits[: VOCAB.speech_offset] = -math.inf
        assert int(logits.argmax()) == code + VOCAB.speech_offset
        sequence = torch.cat([sequence, torch.tensor([code + VOCAB.speech_offset])])


def test_ar_stops_at_eos_and_respects_length_bounds():
    model = build_paradigm("ar", VOCAB, TINY).eval()
    with torch.no_grad():  # uniform over the 12 codes and <eos>: P(stop) = 1/13 per step
        model.head.weight.zero_()
    request = SynthesisRequest(torch.tensor([1, 2, 3]), torch.tensor([4]), torch.tensor([1, 2]))
    lengths, by_eos = [], []
    for seed in range(30):
        out = model.generate(request, torch.Generator().manual_seed(seed), min_ratio=1.0, max_ratio=4.0,
                             top_k=0, top_p=1.0, ras_window=0)
        lengths.append(len(out.speech))
        by_eos.append(out.info["stopped_by_eos"])
        assert out.forward_passes == len(out.speech) + (1 if out.info["stopped_by_eos"] else 0)
    assert min(lengths) >= 3 and max(lengths) <= 12  # min 1x, max 4x the 3 text tokens
    assert any(by_eos) and not all(by_eos)
    with pytest.raises(ValueError, match="unknown options"):
        model.generate(request, torch.Generator(), beam=4)


# ----------------------------------------------------------------------------- NAR

def test_nar_training_example_masks_only_target_and_scores_only_masks():
    model = build_paradigm("nar", VOCAB, TINY, prompt_max=0.4)
    utt = utterance(speech=tuple(range(10)))
    for seed in range(20):
        ex = model.training_example(utt, torch.Generator().manual_seed(seed))
        S = len(ex)
        assert ex.attention_mask.shape == (S, S) and ex.attention_mask.all()  # bidirectional
        assert ex.input_ids[:5].tolist() == [SOS, 9, 10, 11, TURN]
        speech_in = ex.input_ids[5:]
        masked = speech_in == MASK
        n_prompt = int((~masked).cumprod(0).sum()) if not masked[0] else 0
        assert n_prompt <= 4  # prompt_max 0.4 of 10 frames
        assert masked.any()
        # targets exactly at masked positions, holding the true codes
        assert ((ex.targets[5:] != IGNORE) == masked).all()
        true_ids = VOCAB.speech(torch.arange(10))
        assert (ex.targets[5:][masked] == true_ids[masked]).all()
        assert (speech_in[~masked] == true_ids[~masked]).all()
        assert (ex.targets[:5] == IGNORE).all()


def test_nar_input_noise_corrupts_unmasked_target_tokens_only():
    utt = utterance(speech=tuple(range(12)) * 20)  # 240 frames: the share replaced is measurable
    clean_model = build_paradigm("nar", VOCAB, TINY, prompt_max=0.4)
    noisy_model = build_paradigm("nar", VOCAB, TINY, prompt_max=0.4, input_noise=0.5)
    true_ids = VOCAB.speech(torch.arange(12).repeat(20))
    changed, visible = 0, 0
    for seed in range(5):
        clean = clean_model.training_example(utt, torch.Generator().manual_seed(seed))
        ex = noisy_model.training_example(utt, torch.Generator().manual_seed(seed))
        # the prompt, mask and schedule draws come first, so the same positions are masked and
        # scored against the same true codes: only what the model reads differs
        assert torch.equal(ex.targets, clean.targets) and torch.equal(ex.position_ids, clean.position_ids)
        speech_in, clean_in = ex.input_ids[5:], clean.input_ids[5:]
        masked = speech_in == MASK
        assert torch.equal(masked, clean_in == MASK)
        first_target = min(int(torch.rand((), generator=torch.Generator().manual_seed(seed)) * 0.4 * 240), 239)
        assert torch.equal(speech_in[:first_target], true_ids[:first_target])  # the prompt is real speech
        read = ~masked[first_target:]
        assert bool(VOCAB.is_speech(speech_in[first_target:][read]).all())
        visible += int(read.sum())
        changed += int((speech_in[first_target:][read] != true_ids[first_target:][read]).sum())
    # each visible target token is redrawn with p = 0.5, landing on the same code with p = 1/12:
    # 0.5 * 11/12 = 0.458 of them change
    assert visible > 100 and 0.36 < changed / visible < 0.56
    again = noisy_model.training_example(utt, torch.Generator().manual_seed(4))
    assert torch.equal(again.input_ids, ex.input_ids)  # from the example's own generator
    with pytest.raises(ValueError, match="input_noise"):
        build_paradigm("nar", VOCAB, TINY, input_noise=1.0)


def test_nar_mask_count_follows_cosine_schedule():
    # with prompt_max=0 the whole utterance is target: masked = ceil(cos(pi/2 u) * T)
    model = build_paradigm("nar", VOCAB, TINY, prompt_max=0.0)
    utt = utterance(speech=tuple(range(12)))
    for seed in range(10):
        g = torch.Generator().manual_seed(seed)
        ex = model.training_example(utt, g)
        g = torch.Generator().manual_seed(seed)
        torch.rand((), generator=g)  # the prompt draw
        u = float(torch.rand((), generator=g))
        assert int((ex.input_ids == MASK).sum()) == max(1, math.ceil(math.cos(math.pi / 2 * u) * 12))


def test_nar_decoding_fills_every_position_in_the_given_steps():
    torch.manual_seed(0)
    model = build_paradigm("nar", VOCAB, TINY).eval()
    request = SynthesisRequest(torch.tensor([1, 2, 3, 4]), torch.tensor([5, 6]), torch.tensor([1, 2, 3, 4]))
    out = model.generate(request, torch.Generator().manual_seed(0), steps=5)
    assert out.forward_passes == 5
    assert len(out.speech) == 8  # Eq. 11: 4 prompt frames * 4 / 2 text tokens
    assert ((out.speech >= 0) & (out.speech < VOCAB.speech_size)).all()
    again = model.generate(request, torch.Generator().manual_seed(0), steps=5)
    assert torch.equal(out.speech, again.speech)  # reproducible from the seed
    fixed = model.generate(SynthesisRequest(request.text, request.prompt_text, request.prompt_speech, target_frames=3),
                           torch.Generator().manual_seed(0), steps=5)
    assert len(fixed.speech) == 3


def test_nar_proportional_positions_spread_text_over_the_speech_frames():
    from arnar.paradigms.nar import nar_positions

    assert nar_positions(2, 3).tolist() == list(range(7))  # MaskGCT: one running range
    # T / L = 2: token i at 2 + floor((i + 1/2) * 2) = 3, 5, 7, 9; <sos> 0, <turn> 1, frame t at 2 + t
    assert nar_positions(4, 8, "proportional").tolist() == [0, 3, 5, 7, 9, 1, *range(2, 10)]
    # more text than frames: tokens share positions, in order, inside the speech range
    assert nar_positions(3, 2, "proportional").tolist() == [0, 2, 3, 3, 1, 2, 3]
    with pytest.raises(ValueError, match="text_positions"):
        build_paradigm("nar", VOCAB, TINY, text_positions="diagonal")

    model = build_paradigm("nar", VOCAB, TINY, text_positions="proportional")
    utt = utterance(speech=tuple(range(10)))  # 3 text tokens, 10 frames
    ex = model.training_example(utt, torch.Generator().manual_seed(0))
    assert ex.position_ids.tolist() == [0, 3, 7, 10, 1, *range(2, 12)]

    # decoding reads the layout training used: the text of prompt and target over all their frames
    seen = []
    original = model.backbone.forward
    model.backbone.forward = lambda x, positions, *a, **k: (seen.append(positions), original(x, positions, *a, **k))[1]
    request = SynthesisRequest(torch.tensor([1, 2, 3, 4]), torch.tensor([5, 6]), torch.tensor([1, 2, 3, 4]),
                               target_frames=8)
    model.eval().generate(request, torch.Generator().manual_seed(0), steps=2)
    assert len(seen) == 2 and all(torch.equal(p[0].cpu(), nar_positions(6, 12, "proportional")) for p in seen)


def test_unknown_paradigm_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown paradigm 'vits'"):
        paradigm_class("vits")


# ----------------------------------------------------------------------------- sampling, schedules

def test_top_k_and_top_p_filters():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_top_k_top_p(logits, top_k=2)).tolist() == [[False, False, True, True]]
    # top_p 0.8: 0.5 (mass before 0) and 0.3 (mass before 0.5) stay; 0.15 has 0.8 before it -> dropped
    assert torch.isinf(filter_top_k_top_p(logits, top_p=0.8)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_top_k_top_p(logits, top_p=0.81)).tolist() == [[False, False, False, True]]
    assert torch.isinf(filter_top_k_top_p(logits, top_p=0.1)).tolist() == [[False, True, True, True]]


def test_sampling_restricted_greedy_and_probabilities():
    logits = torch.tensor([[3.0, 1.0, 2.0]])
    allowed = torch.tensor([False, True, True])
    ids, probs = sample_tokens(restrict_logits(logits, allowed), temperature=0)
    assert ids.tolist() == [2]
    assert probs.item() == pytest.approx(math.exp(2) / (math.exp(1) + math.exp(2)))
    g = torch.Generator().manual_seed(0)
    draws = [int(sample_tokens(restrict_logits(logits, allowed), g)[0]) for _ in range(200)]
    assert set(draws) == {1, 2}


def test_repetition_aware_resamples_only_on_repeats():
    logits = torch.tensor([[0.0, 0.0]])
    g = torch.Generator().manual_seed(0)
    assert repetition_aware(torch.tensor([1]), logits, [0, 0, 0], g, window=3, max_ratio=0.5).tolist() == [1]
    redraws = {int(repetition_aware(torch.tensor([0]), logits, [0, 0, 0], g, window=3, max_ratio=0.5)[0])
               for _ in range(50)}
    assert redraws == {0, 1}  # a fresh draw from the full distribution


def test_cosine_schedule_and_steps():
    assert cosine_mask_ratio(0) == 1 and cosine_mask_ratio(1) == pytest.approx(0)
    assert cosine_mask_ratio(0.5) == pytest.approx(math.sqrt(0.5))
    # T=10, 4 steps: floor(10 cos(pi/8))=9, floor(10 cos(pi/4))=7, floor(10 cos(3pi/8))=3, 0
    assert masks_per_step(10, 4) == [9, 7, 3, 0]
    assert masks_per_step(3, 8) == [2, 1, 0, 0, 0, 0, 0, 0]  # never stalls, never negative
    with pytest.raises(ValueError):
        cosine_mask_ratio(1.5)


def test_total_length_estimate_palle_eq11():
    # T_gen(total) = T_ref (1 + L_gen/L_ref) = 75 (1 + 20/15) = 175 -> 100 target frames
    assert total_frames_estimate(75, 15, 20) == 100
    with pytest.raises(ValueError, match="empty"):
        total_frames_estimate(75, 0, 20)


def test_continuation_text_and_item_seed():
    assert continuation_text("Others fell among the thorns, and the thorns grew up.",
                             "Others fell among the thorns and the thorns") == "grew up."
    assert item_seed(1, "a") == item_seed(1, "a") != item_seed(1, "b") != item_seed(2, "a")
