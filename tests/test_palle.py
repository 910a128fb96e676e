"""PALLE: training masks against palle.txt Eqs. 7-10 (hand-worked for T = 20), the fused two-stream
network, the stage-one commit loop and stage-two refinement on tiny random models, the forward-pass
count, stage freezing and the stage-1 -> stage-2 initialisation."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from arnar.paradigms import build_paradigm
from arnar.paradigms.base import IGNORE, MASK, PAD, SynthesisRequest, Utterance, Vocab, collate
from arnar.paradigms.palle import (
    PINNED,
    lowest_confidence,
    padded_text,
    quantile_count,
    refine_mask,
    span_mask,
    stage_one_spans,
)

TINY = {"dim": 32, "n_layers": 2, "n_heads": 4, "dropout": 0.0}
VOCAB = Vocab(text_size=10, speech_size=12)  # text ids 8..17, speech ids 18..29
CONF = Path(__file__).resolve().parents[1] / "src" / "arnar" / "conf" / "paradigm"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads; on a shared machine they only contend."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def utterance(T=20, text=(1, 2, 3)):
    return Utterance("spk00_0000", "spk00", torch.tensor(text), torch.arange(T) % 12)


def stage_two_model(**options):
    """A stage-2 model as a stage-2 run has it: both networks, stage two started from stage one."""
    model = build_paradigm("palle", VOCAB, TINY, stage=2, **options)
    model.init_stage_two_from_stage_one()
    return model


def request(n_prompt=6, n_generate=None, prompt_text=(4, 5), text=(1, 2, 3)):
    return SynthesisRequest(torch.tensor(text), torch.tensor(prompt_text), torch.arange(n_prompt) % 12,
                            target_frames=n_generate)


def record_inputs(network):
    """Wrap ``network.hidden`` so that every pass's speech-stream input is kept (a copy)."""
    seen, hidden = [], network.hidden

    def recording(speech_ids, *args):
        seen.append(speech_ids[0].clone())
        return hidden(speech_ids, *args)

    network.hidden = recording
    return seen


# ----------------------------------------------------------------------------- training masks

def test_stage_one_span_mask_hand_worked_T20():
    # T = 20: prompt floor(0.3 * 20) = 6, k = floor(0.1 * 20) = 2, s in {6, ..., 20 - 2 - 1 = 17}
    model = build_paradigm("palle", VOCAB, TINY)
    utt = utterance(20)
    codes = VOCAB.speech(utt.speech)
    starts = set()
    for seed in range(300):
        ex = model.training_example(utt, torch.Generator().manual_seed(seed))
        masked = ex.input_ids == MASK
        s = int(masked.int().argmax())
        starts.add(s)
        assert masked.tolist() == [i >= s for i in range(20)]  # Eq. 8: everything from s on
        assert (ex.input_ids[:s] == codes[:s]).all()
        scored = (ex.targets != IGNORE).nonzero().flatten().tolist()
        assert scored == [s, s + 1]  # Eq. 9: the left-most k = 2 masked frames
        assert (ex.targets[scored] == codes[scored]).all()
        assert ex.position_ids.tolist() == list(range(20))
        assert ex.attention_mask.shape == (20, 20) and ex.attention_mask.all()
        assert ex.extras["text_ids"].tolist() == [9, 10, 11] + [PAD] * 17  # Eq. 6
    assert starts == set(range(6, 18))  # Eq. 7: every start of the range, and only those


@pytest.mark.parametrize("T", [1, 2, 3, 5, 9, 10, 11, 19, 33])
def test_stage_one_span_mask_short_utterances_score_at_least_one_frame(T):
    k = max(1, math.floor(0.1 * T))
    for seed in range(40):
        masked, scored, s = span_mask(T, torch.Generator().manual_seed(seed))
        assert math.floor(0.3 * T) <= s <= T - math.floor(0.1 * T) - 1
        assert masked.tolist() == [i >= s for i in range(T)]
        assert scored.nonzero().flatten().tolist() == list(range(s, s + k))


def test_stage_two_mask_only_after_prompt_at_rate_p():
    T, n_prompt, draws = 40, 12, 2000
    counts = torch.zeros(T)
    for seed in range(draws):
        masked = refine_mask(T, torch.Generator().manual_seed(seed))
        assert masked.any() and not masked[:n_prompt].any()
        counts += masked
    rate = float(counts[n_prompt:].sum()) / (draws * (T - n_prompt))
    # p = 0.1, plus the forced frame when none was drawn: 0.9^28 / 28 = 0.0021; std of the estimate 0.0013
    assert abs(rate - 0.1) < 0.008
    assert counts[n_prompt:].min() > 0.05 * draws  # every frame after the prompt is masked sometimes


def test_stage_two_example_scores_exactly_the_masked_frames():
    model = stage_two_model()
    utt = utterance(30)
    codes = VOCAB.speech(utt.speech)
    for seed in range(20):
        ex = model.training_example(utt, torch.Generator().manual_seed(seed))
        masked = ex.input_ids == MASK
        assert masked.any() and not masked[:9].any()
        assert ((ex.targets != IGNORE) == masked).all()
        assert (ex.targets[masked] == codes[masked]).all() and (ex.input_ids[~masked] == codes[~masked]).all()


# ----------------------------------------------------------------------------- the network

def test_text_padding_and_fusion_shapes():
    assert padded_text(VOCAB, torch.tensor([0, 9]), 5).tolist() == [8, 17, PAD, PAD, PAD]
    assert padded_text(VOCAB, torch.tensor([1, 2, 3]), 2).tolist() == [9, 10]  # cut, never longer
    model = build_paradigm("palle", VOCAB, TINY).eval()
    short, long = utterance(7, text=(4,)), utterance(13)
    examples = [model.training_example(u, torch.Generator().manual_seed(0)) for u in (short, long)]
    batch = collate(examples)
    assert batch.extras["text_ids"].shape == batch.input_ids.shape == (2, 13)
    assert batch.extras["text_ids"][0].tolist() == [12] + [PAD] * 12
    network = model.stage_one
    speech = network.embed(batch.input_ids)
    fused_in = torch.cat([speech, network.text_encoder(network.embed(batch.extras["text_ids"]))], dim=-1)
    assert fused_in.shape == (2, 13, 64) and network.fuse(fused_in).shape == (2, 13, 32)
    with torch.no_grad():
        logits = model.logits(batch.input_ids, batch.position_ids, batch.attention_mask,
                              text_ids=batch.extras["text_ids"])
        alone = model.logits(examples[0].input_ids[None], examples[0].position_ids[None],
                             text_ids=examples[0].extras["text_ids"][None])
    assert logits.shape == (2, 13, VOCAB.size)
    # batch padding changes nothing at the real frames (convolutions and GRN see zeros there)
    torch.testing.assert_close(logits[0, :7], alone[0], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="text_ids"):
        model.logits(batch.input_ids, batch.position_ids)


def test_text_stream_changes_the_prediction():
    model = build_paradigm("palle", VOCAB, TINY).eval()
    ids = torch.tensor([[18, 19, MASK, MASK]])
    with torch.no_grad():
        a = model.logits(ids, torch.arange(4)[None], text_ids=torch.tensor([[9, 10, PAD, PAD]]))
        b = model.logits(ids, torch.arange(4)[None], text_ids=torch.tensor([[11, 12, PAD, PAD]]))
    assert not torch.allclose(a, b)


# ----------------------------------------------------------------------------- decoding schedules

def test_stage_one_spans_even_and_literal():
    for n, steps in [(150, 100), (100, 100), (237, 100), (12, 5), (7, 10)]:
        spans = stage_one_spans(n, steps)
        assert sum(spans) == n and len(spans) == min(n, steps)
        assert min(spans) >= 1 and max(spans) - min(spans) <= 1
    # literal Eq. 4: k' = floor(0.01 * 250) = 2 of the whole (prompt + target) length
    assert stage_one_spans(75, 100, r=0.01, total_frames=250) == [2] * 37 + [1]
    # k' = floor(0.01 * 150) = 1: the 100th pass commits what 99 passes of one frame left
    spans = stage_one_spans(150, 100, r=0.01, total_frames=150)
    assert len(spans) == 100 and spans[:99] == [1] * 99 and spans[-1] == 51
    assert stage_one_spans(5, 100, r=0.01, total_frames=50) == [1] * 5  # k' at least one frame
    with pytest.raises(ValueError):
        stage_one_spans(10, 5, r=1.5)


def test_quantile_count_is_the_number_at_or_below_the_quantile():
    assert quantile_count(100, 0.05) == 5 and quantile_count(20, 0.05) == 1 and quantile_count(1, 0.05) == 1
    generator = torch.Generator().manual_seed(0)
    for n in (1, 2, 7, 20, 21, 40, 100, 257):
        for gamma in (0.05, 0.1, 0.3, 0.5):
            scores = torch.rand(n, generator=generator, dtype=torch.float64)
            expected = int((scores <= torch.quantile(scores, gamma)).sum())
            assert quantile_count(n, gamma) == expected, (n, gamma)


def test_lowest_confidence_skips_pinned_frames():
    confidence = torch.tensor([-0.5, PINNED, -3.0, -0.1, PINNED, -2.0])
    assert lowest_confidence(confidence, 3).tolist() == [0, 2, 5]
    assert lowest_confidence(confidence, 4).tolist() == [0, 2, 3, 5]


# ----------------------------------------------------------------------------- decoding loops

def test_stage_one_commits_left_to_right_and_never_changes_committed_or_prompt():
    model = build_paradigm("palle", VOCAB, TINY).eval()
    seen = record_inputs(model.stage_one)
    req = request(n_prompt=6, n_generate=23)
    out = model.generate(req, torch.Generator().manual_seed(0), steps=5, top_p=1.0)
    prompt = VOCAB.speech(req.prompt_speech)
    final = torch.cat([prompt, VOCAB.speech(out.speech)])
    spans = stage_one_spans(23, 5)
    assert len(seen) == 5 and len(out.speech) == 23
    committed = 6
    for inputs, span in zip(seen, spans):
        assert (inputs[:6] == prompt).all()
        # before each pass: the prompt and earlier spans as they end up, then only <mask>
        assert (inputs[:committed] == final[:committed]).all()
        assert (inputs[committed:] == MASK).all()
        committed += span
    assert VOCAB.is_speech(final).all()
    assert out.forward_passes == 5 and out.info["stage_one_passes"] == 5 and out.info["refine_passes"] == 0


def test_refinement_remasks_lowest_quantile_and_never_a_pinned_frame():
    model = stage_two_model().eval()
    seen = record_inputs(model.stage_two)
    n_prompt, n_gen, gamma = 5, 40, 0.1
    out = model.generate(request(n_prompt, n_gen), torch.Generator().manual_seed(1), steps=8, refine_steps=6,
                         gamma=gamma)
    assert len(seen) == 6
    count = quantile_count(n_gen, gamma)  # floor(0.1 * 39) + 1 = 4
    assert count == 4
    remasked = set()
    for inputs in seen:
        frames = set((inputs == MASK).nonzero().flatten().tolist())
        assert len(frames) == count
        assert min(frames) >= n_prompt  # never the prompt
        assert not frames & remasked  # never a frame refined before
        remasked |= frames
    assert out.info["refined_frames"] == 6 * count
    assert out.forward_passes == 8 + 6


def test_refinement_takes_the_least_confident_stage_one_frames_first():
    # greedy decoding: the frames stage one was least sure of are the first ones re-masked
    model = stage_two_model().eval()
    seen_one, seen_two = record_inputs(model.stage_one), record_inputs(model.stage_two)
    n_prompt, n_gen = 4, 30
    req = request(n_prompt, n_gen)
    model.generate(req, torch.Generator(), steps=30, refine_steps=1, gamma=0.2, temperature=0)
    # replay stage one's passes: each committed one frame; its confidence is the log max-probability
    text = padded_text(VOCAB, torch.cat([req.prompt_text, req.text]), n_prompt + n_gen)
    confidence = []
    with torch.no_grad():
        for i, inputs in enumerate(list(seen_one)):  # (the replay passes are recorded too)
            logits = model.logits(inputs[None], torch.arange(len(inputs))[None], text_ids=text[None], stage=1)
            logits = logits[0, n_prompt + i].masked_fill(~VOCAB.is_speech(torch.arange(VOCAB.size)), -math.inf)
            confidence.append(float(logits.log_softmax(-1).max()))
    lowest = sorted(range(n_gen), key=lambda i: confidence[i])[:quantile_count(n_gen, 0.2)]
    remasked = (seen_two[0] == MASK).nonzero().flatten() - n_prompt
    assert sorted(remasked.tolist()) == sorted(lowest)


def test_forward_passes_do_not_depend_on_length():
    model = stage_two_model().eval()
    for n_gen in (12, 31):
        out = model.generate(request(6, n_gen), torch.Generator().manual_seed(0), steps=10, refine_steps=3)
        assert out.forward_passes == 13 and len(out.speech) == n_gen
        assert out.info["stage_one_passes"] == 10 and out.info["refine_passes"] == 3


def test_forward_passes_at_paper_defaults_are_100_plus_7():
    model = stage_two_model().eval()
    for n_gen in (100, 137):
        calls_before = model.stage_one.passes + model.stage_two.passes
        out = model.generate(request(8, n_gen), torch.Generator().manual_seed(0))
        assert out.forward_passes == 107 == model.stage_one.passes + model.stage_two.passes - calls_before
        assert out.info["refined_frames"] == 7 * quantile_count(n_gen, 0.05)


def test_length_from_eq11_duration_multiplier_and_text_fit():
    model = build_paradigm("palle", VOCAB, TINY).eval()
    g = torch.Generator().manual_seed(0)
    # Eq. 11: the target gets T_ref * L_gen / L_ref = 12 * 3 / 2 = 18 frames
    out = model.generate(request(12, None), g, steps=4)
    assert len(out.speech) == 18 and out.info["length_from"] == "eq11"
    out = model.generate(request(12, None), g, steps=4, duration_multiplier=1.5)
    assert len(out.speech) == 27
    out = model.generate(request(12, 20), g, steps=4, duration_multiplier=0.7)
    assert len(out.speech) == 14 and out.info["length_from"] == "given"
    # 2 prompt frames for 2 + 3 text tokens: the speech grows until every token has a frame
    out = model.generate(request(2, 1), g, steps=4)
    assert len(out.speech) == 3 and out.info["extended_to_fit_text"]


def test_decoding_option_errors():
    stage_one = build_paradigm("palle", VOCAB, TINY).eval()
    with pytest.raises(ValueError, match="unknown options"):
        stage_one.generate(request(6, 10), torch.Generator(), beam=4)
    with pytest.raises(ValueError, match="refine_steps=0"):  # stage two of a stage-1 model is untrained
        stage_one.generate(request(6, 10), torch.Generator(), refine_steps=7)
    assert stage_one.generate(request(6, 10), torch.Generator(), steps=4).forward_passes == 4
    with pytest.raises(ValueError, match="gamma"):
        stage_two_model().eval().generate(request(6, 10), torch.Generator(), gamma=0.0)


# ----------------------------------------------------------------------------- stages

@pytest.mark.parametrize("stage", [1, 2])
def test_only_the_selected_stage_trains(stage):
    model = stage_two_model() if stage == 2 else build_paradigm("palle", VOCAB, TINY)
    trained, frozen = (model.stage_one, model.stage_two) if stage == 1 else (model.stage_two, model.stage_one)
    assert all(p.requires_grad for p in trained.parameters())
    assert not any(p.requires_grad for p in frozen.parameters())
    batch = collate([model.training_example(utterance(T), torch.Generator().manual_seed(T)) for T in (12, 20)])
    model(batch).loss_sum.backward()
    assert all(p.grad is not None for p in trained.parameters())
    assert all(p.grad is None for p in frozen.parameters())
    assert model.describe()["trainable_parameters"] == sum(p.numel() for p in trained.parameters())


def test_stage_two_starts_from_stage_one_on_init_only():
    stage_one_run = build_paradigm("palle", VOCAB, TINY)
    assert not bool(stage_one_run.stage_two_initialised)
    fresh = build_paradigm("palle", VOCAB, TINY, stage=2)
    batch = collate([fresh.training_example(utterance(), torch.Generator())])
    with pytest.raises(RuntimeError, match="init_from"):
        fresh(batch)
    # train.init_from: the stage-1 state dict, loaded strictly, copies stage one into stage two
    fresh.load_state_dict(stage_one_run.state_dict())
    assert bool(fresh.stage_two_initialised)
    for a, b, c in zip(fresh.stage_two.parameters(), fresh.stage_one.parameters(), stage_one_run.stage_one.parameters()):
        assert torch.equal(a, b) and torch.equal(b, c)
    # resume / load a finished stage-2 run: its own stage two is kept
    with torch.no_grad():
        fresh.stage_two.head.weight.add_(1.0)
    reloaded = build_paradigm("palle", VOCAB, TINY, stage=2)
    reloaded.load_state_dict(fresh.state_dict())
    assert torch.equal(reloaded.stage_two.head.weight, fresh.stage_two.head.weight)
    assert not torch.equal(reloaded.stage_two.head.weight, reloaded.stage_one.head.weight)
    # a stage-1 model never copies
    again = build_paradigm("palle", VOCAB, TINY)
    again.load_state_dict(stage_one_run.state_dict())
    assert not torch.equal(again.stage_two.head.weight, again.stage_one.head.weight)


def test_paradigm_configs_build_and_differ_only_in_stage():
    one = OmegaConf.to_container(OmegaConf.load(CONF / "palle_stage1.yaml"))
    two = OmegaConf.to_container(OmegaConf.load(CONF / "palle_stage2.yaml"))
    assert one["name"] == two["name"] == "palle"
    assert one["options"].pop("stage") == 1 and two["options"].pop("stage") == 2
    assert one["options"] == two["options"]
    assert one["options"]["conv_pos_kernel"] == 7  # palle.txt 5.1
    model = build_paradigm("palle", VOCAB, TINY, stage=1, **one["options"])
    assert model.describe()["stage"] == 1
    with pytest.raises(ValueError, match="unknown options"):
        build_paradigm("palle", VOCAB, TINY, stage=1, conv_kernel=7)
