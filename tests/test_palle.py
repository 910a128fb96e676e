"""PALLE: training masks against PALLE (arXiv:2504.10352) Eqs. 7-10 (hand-worked for T = 20), the fused two-stream
network (frame-by-frame text fusion on a hand-wired network), the stage-one step rule (Eq. 14,
hand-worked for a 3 s prompt + 10 s target at 25 Hz), stage-two refinement (Eqs. 15-16) on
scripted networks whose confidences are set by hand, the forward-pass count, stage freezing and
the stage-1 -> stage-2 initialisation; the ``concat`` layout (text in front of the speech, AR's
layout and weights) against the fused one."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

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


def scripted(network, scores, offset=0):
    """Turn ``network`` into a script: ``scores(speech_ids [S])`` gives one ``(code, strength)`` per
    position, and the logits there are ``strength`` at that speech code and 0 at every other id, so
    the confidence ``log P^max`` of Eq. 16 grows with ``strength`` (``log(e^s / (e^s + 11))`` over
    the 12 speech codes). Passes are counted; every pass's speech input is kept (a copy). With
    ``offset`` (layout concat: the text's length), the first ``offset`` input positions are the
    text: ``scores`` sees only the speech after them, and the text positions get logits 0."""
    seen = []

    def hidden(input_ids, *args):
        network.passes += 1
        speech_ids = input_ids[0, offset:]
        seen.append(speech_ids.clone())
        logits = torch.zeros(1, input_ids.shape[1], VOCAB.size)
        for j, (code, strength) in enumerate(scores(speech_ids)):
            logits[0, offset + j, VOCAB.speech_offset + code] = strength
        return logits

    network.hidden = hidden
    network.head = nn.Linear(VOCAB.size, VOCAB.size, bias=False)
    nn.init.eye_(network.head.weight)
    return seen


def masked_frames(inputs):
    return (inputs == MASK).nonzero().flatten().tolist()


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


def test_stage_one_suffix_scoring_option_scores_every_masked_frame():
    # span_scoring: suffix (not in the paper): the same input as Eq. 8, the loss on all of s..T-1
    for seed in range(40):
        ref_masked, ref_scored, ref_s = span_mask(20, torch.Generator().manual_seed(seed))
        masked, scored, s = span_mask(20, torch.Generator().manual_seed(seed), span_scoring="suffix")
        assert s == ref_s and masked.tolist() == ref_masked.tolist()  # the same draw of Eq. 7
        assert scored.nonzero().flatten().tolist() == list(range(s, 20))
        assert int(ref_scored.sum()) == 2
    model = build_paradigm("palle", VOCAB, TINY, span_scoring="suffix")
    utt = utterance(20)
    ex = model.training_example(utt, torch.Generator().manual_seed(3))
    s = int((ex.input_ids == MASK).int().argmax())
    assert (ex.targets[s:] == VOCAB.speech(utt.speech)[s:]).all() and (ex.targets[:s] == IGNORE).all()
    with pytest.raises(ValueError, match="span_scoring"):
        build_paradigm("palle", VOCAB, TINY, span_scoring="all")
    with pytest.raises(ValueError, match="span_scoring"):
        span_mask(20, torch.Generator(), span_scoring="right_most")


def test_input_noise_corrupts_only_the_unmasked_frames_after_the_prompt_share():
    # input_noise (not in the paper): frames floor(0.3 T) .. s-1 (stage one) or the unmasked frames
    # after floor(0.3 T) (stage two) are read as random codes; the first floor(0.3 T) frames, the
    # masked frames and every target stay as without the option
    T, n_prompt = 40, 12
    utt = Utterance("spk00_0000", "spk00", torch.tensor([1, 2, 3]), torch.arange(T) % 12)
    codes = VOCAB.speech(utt.speech)
    for stage in (1, 2):
        plain = stage_two_model() if stage == 2 else build_paradigm("palle", VOCAB, TINY)
        noisy = stage_two_model(input_noise=0.5) if stage == 2 else build_paradigm("palle", VOCAB, TINY, input_noise=0.5)
        changed = eligible = 0
        for seed in range(30):
            ref = plain.training_example(utt, torch.Generator().manual_seed(seed))
            ex = noisy.training_example(utt, torch.Generator().manual_seed(seed))
            masked = ex.input_ids == MASK
            assert (masked == (ref.input_ids == MASK)).all()  # the mask is drawn first: the same
            assert torch.equal(ex.targets, ref.targets)
            assert torch.equal(ex.input_ids[:n_prompt], codes[:n_prompt])
            assert VOCAB.is_speech(ex.input_ids[~masked]).all()
            after = ~masked & (torch.arange(T) >= n_prompt)
            changed += int((ex.input_ids[after] != codes[after]).sum())
            eligible += int(after.sum())
            again = noisy.training_example(utt, torch.Generator().manual_seed(seed))
            assert torch.equal(again.input_ids, ex.input_ids)  # reproducible from the example's generator
        # rate 0.5, a draw of the same code 1 time in 12: 0.5 * 11 / 12 = 0.458 of the eligible frames change
        assert eligible > 200 and abs(changed / eligible - 0.458) < 0.08
    with pytest.raises(ValueError, match="input_noise"):
        build_paradigm("palle", VOCAB, TINY, input_noise=1.0)


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


def test_stretched_text_spreads_each_token_evenly_in_training_and_decoding():
    from arnar.paradigms.palle import stretched_text

    # frame t reads token floor(t L / T)
    assert stretched_text(VOCAB, torch.tensor([0, 9]), 5).tolist() == [8, 8, 8, 17, 17]
    assert stretched_text(VOCAB, torch.tensor([1, 2, 3]), 7).tolist() == [9, 9, 9, 10, 10, 11, 11]
    assert stretched_text(VOCAB, torch.tensor([1, 2, 3]), 2).tolist() == [9, 10]  # cut as padding cuts
    with pytest.raises(ValueError, match="text_layout"):
        build_paradigm("palle", VOCAB, TINY, text_layout="interleave")
    model = build_paradigm("palle", VOCAB, TINY, text_layout="stretch").eval()
    ex = model.training_example(utterance(7, text=(4, 5)), torch.Generator().manual_seed(0))
    assert ex.extras["text_ids"].tolist() == [12, 12, 12, 12, 13, 13, 13]
    # decoding: prompt transcript + target text stretched over prompt + target frames, as in training
    request = SynthesisRequest(torch.tensor([4, 5]), torch.tensor([1]), torch.tensor([2, 3, 4]), target_frames=5)
    plan = model._plan(request, model._decoding_options({}))
    assert plan["text"].tolist() == stretched_text(VOCAB, torch.tensor([1, 4, 5]), 8).tolist()
    assert plan["text"].tolist() == [9, 9, 9, 12, 12, 12, 13, 13]


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


def test_text_token_of_frame_i_is_fused_into_frame_i():
    # Eqs. 6 / 13: the padded text stream is fused with the speech stream frame by frame, along the
    # feature dimension. Wire a network where that is all it does: every residual branch writes
    # zero (ConvNeXt's last pointwise conv, the conv position embedding's second conv, every
    # block's o_proj and down_proj), both positional scales are 0, text id 8 + k embeds as the
    # one-hot e_k, speech code c as e_{16+c}, <mask> and <pad> as 0; fuse = [I | I] adds the two
    # halves; the head reads hidden dim j into speech code j (j < 12). The final RMSNorm (gain 1)
    # scales a vector with n unit entries by sqrt(32 / n). So at frame i the speech logits are 0
    # except at code k_i (the text token of frame i): sqrt(32) = 5.65685 after a <mask> frame,
    # sqrt(32 / 2) = 4 after a code frame (the speech half shares the frame), and all 0 at <pad>.
    model = build_paradigm("palle", VOCAB, TINY).eval()
    network = model.stage_one
    with torch.no_grad():
        for module in (network.text_encoder.pointwise_out, network.conv_position.conv2,
                       *(layer.attn.o_proj for layer in network.backbone.layers),
                       *(layer.mlp.down_proj for layer in network.backbone.layers)):
            module.weight.zero_()
            if module.bias is not None:
                module.bias.zero_()
        network.speech_position_scale.zero_()
        network.text_position_scale.zero_()
        network.embed.weight.zero_()
        for k in range(VOCAB.text_size):
            network.embed.weight[VOCAB.text_offset + k, k] = 1.0
        for c in range(VOCAB.speech_size):
            network.embed.weight[VOCAB.speech_offset + c, 16 + c] = 1.0
        network.fuse.weight.copy_(torch.cat([torch.eye(32), torch.eye(32)], dim=1))
        network.fuse.bias.zero_()
        network.head.weight.zero_()
        network.head.weight[VOCAB.speech_offset:, :12] = torch.eye(12)
    speech = torch.cat([VOCAB.speech(torch.tensor([3, 5])), torch.tensor([MASK, MASK, MASK])])[None]

    def speech_logits(text):
        with torch.no_grad():
            logits = model.logits(speech, torch.arange(5)[None], text_ids=padded_text(VOCAB, torch.tensor(text), 5)[None])
        return logits[0, :, VOCAB.speech_offset:]

    def expected(codes_and_values):
        out = torch.zeros(5, 12)
        for frame, (code, value) in enumerate(codes_and_values):
            out[frame, code] = value
        return out

    # text (1, 2, 4) on frames 0-2 (frames 0, 1 hold codes, frame 2 <mask>), <pad> on frames 3, 4
    torch.testing.assert_close(speech_logits((1, 2, 4)), expected([(1, 4.0), (2, 4.0), (4, 5.65685)]),
                               atol=1e-4, rtol=0)
    # another text moves the logits with it, frame by frame: (7, 0, 9, 6)
    torch.testing.assert_close(speech_logits((7, 0, 9, 6)),
                               expected([(7, 4.0), (0, 4.0), (9, 5.65685), (6, 5.65685)]), atol=1e-4, rtol=0)


# ----------------------------------------------------------------------------- decoding schedules

def test_stage_one_spans_fixed_ratio_hand_worked():
    # Eq. 14 / 5.1: k' = min(floor(0.01 T), N_left), T = prompt + target. A 3 s prompt and a 10 s
    # target at 25 Hz: T = 75 + 250 = 325, k' = floor(3.25) = 3; 83 passes of 3 frames make 249,
    # the 84th commits the one left: 84 passes, not 100
    assert stage_one_spans(250, 100, 325) == [3] * 83 + [1]
    # the ratio is 1 / steps (Fig. 4 varies the steps): at 25 steps k' = floor(325 / 25) = 13,
    # 250 = 19 * 13 + 3 -> 20 passes
    assert stage_one_spans(250, 25, 325) == [13] * 19 + [3]
    # floor can round away more than the prompt covers: T = 199 after a 60-frame prompt gives
    # k' = floor(1.99) = 1, so the 139 target frames take 139 passes, more than 100
    assert stage_one_spans(139, 100, 199) == [1] * 139
    # k' is at least one frame: T = 50 < 100 steps
    assert stage_one_spans(5, 100, 50) == [1] * 5
    # an explicit r' overrides 1 / steps: floor(0.02 * 325) = 6, 250 = 41 * 6 + 4
    assert stage_one_spans(250, 100, 325, r=0.02) == [6] * 41 + [4]
    assert stage_one_spans(0, 100, 75) == []
    with pytest.raises(ValueError, match="r must be in"):
        stage_one_spans(10, 5, 20, r=1.5)
    with pytest.raises(ValueError, match="stage_one_rule"):
        stage_one_spans(10, 5, 20, rule="uniform")


def test_stage_one_spans_even_split_option():
    # the project's earlier rule: the target split evenly over exactly `steps` passes
    assert stage_one_spans(250, 100, 325, rule="even_split") == [2, 3] * 50  # 250 / 100 = 2.5 a pass
    assert stage_one_spans(23, 5, rule="even_split") == [4, 5, 4, 5, 5]  # floor(23 i / 5) steps
    assert stage_one_spans(7, 10, rule="even_split") == [1] * 7  # fewer frames than steps
    with pytest.raises(ValueError, match="even_split"):
        stage_one_spans(10, 5, 20, rule="even_split", r=0.1)


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
    spans = [5, 5, 5, 5, 3]  # T = 6 + 23 = 29, k' = floor(29 / 5) = 5
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


@pytest.mark.parametrize("rule,passes,span", [("fixed_ratio", 84, 3), ("even_split", 100, None)])
def test_stage_one_passes_for_a_10_s_target_after_a_3_s_prompt(rule, passes, span):
    # 25 Hz: 75 prompt frames, 250 target frames, T = 325. Eq. 14 commits floor(0.01 * 325) = 3
    # frames a pass (the last pass the 1 left): 84 passes; the even split takes exactly 100
    model = build_paradigm("palle", VOCAB, TINY).eval()
    seen = record_inputs(model.stage_one)
    out = model.generate(request(n_prompt=75, n_generate=250), torch.Generator().manual_seed(0),
                         stage_one_rule=rule)
    assert out.forward_passes == out.info["stage_one_passes"] == len(seen) == passes
    assert out.info["stage_one_rule"] == rule and len(out.speech) == 250
    committed = [75 + int((inputs != MASK)[75:].sum()) for inputs in seen]
    if span:
        assert committed == [75 + span * t for t in range(84)]  # 75, 78, ..., 324
    else:
        assert committed == [75 + (5 * t) // 2 for t in range(100)]  # 2 and 3 frames in turn


def _stage_one_strength(speech_ids):
    # stage one says code 1 everywhere; its strength ranks the generated frames g0..g7 (positions 2..9)
    # as g1 < g4 < g6 < g2 < g0 < g3 < g5 < g7
    return [(0, 9)] * 2 + [(1, a) for a in (5, 1, 4, 6, 2, 7, 3, 8)]


def _stage_two_strength(speech_ids):
    # stage two: a masked frame is re-predicted as code 2 (strength 9); a visible frame whose right
    # neighbour holds code 2 is as unsure as can be (strength 0, uniform); otherwise its own
    # ranking, which disagrees with stage one's: g7 < g6 < g2 < g4 < g5 < g3 < g1 < g0
    code_2 = VOCAB.speech(torch.tensor(2))
    out = [(0, 9)] * 2
    for i, b in enumerate((8, 7, 3, 6, 4, 5, 2, 1)):
        p = 2 + i
        if speech_ids[p] == MASK:
            out.append((2, 9))
        elif p + 1 < len(speech_ids) and speech_ids[p + 1] == code_2:
            out.append((1, 0))
        else:
            out.append((1, b))
    return out


@pytest.mark.parametrize("rule,remasked,passes,codes", [
    # Eqs. 15-16: step 1 scores the stage-one output with stage two: g7 and g6 are its least sure,
    # positions 9 and 8, re-predicted as code 2. Step 2 scores the *new* sequence: g5 (position 7)
    # now sits before a code 2 and drops to 0, g6 also does but is pinned (g7 is pinned too), so
    # g5 and g2 (positions 7 and 4). Scoring once would have taken g2, g4; no pinning g5, g6.
    ("rescore", [[8, 9], [4, 7]], 4, [1, 1, 2, 1, 1, 2, 2, 2]),
    # the option: stage one's list, fixed before step 1: g1, g4 then g6, g2 (positions 3, 6 / 4, 8)
    ("stage_one_confidence", [[3, 6], [4, 8]], 2, [1, 2, 2, 1, 2, 1, 2, 1]),
])
def test_refinement_rule_picks_the_hand_worked_frames(rule, remasked, passes, codes):
    model = stage_two_model().eval()
    scripted(model.stage_one, _stage_one_strength)
    seen = scripted(model.stage_two, _stage_two_strength)
    # 2 prompt + 8 target frames; gamma 0.2: floor(0.2 * 7) + 1 = 2 frames a step; greedy
    out = model.generate(request(n_prompt=2, n_generate=8), torch.Generator(), steps=8, refine_steps=2,
                         gamma=0.2, temperature=0, refine_rule=rule)
    assert [masked_frames(inputs) for inputs in seen if (inputs == MASK).any()] == remasked
    if rule == "rescore":  # each step: a scoring pass on the sequence as it is, then the re-prediction
        assert [masked_frames(inputs) for inputs in seen[::2]] == [[], []]
    assert len(seen) == passes and out.info["refine_passes"] == passes and out.info["refine_rule"] == rule
    assert out.speech.tolist() == codes and out.info["refined_frames"] == 4
    assert out.forward_passes == 8 + passes  # T = 10, k' = floor(10 / 8) = 1: 8 stage-one passes


@pytest.mark.parametrize("rule,per_step", [("rescore", 2), ("stage_one_confidence", 1)])
def test_refinement_remasks_lowest_quantile_and_never_a_pinned_frame(rule, per_step):
    model = stage_two_model().eval()
    seen = record_inputs(model.stage_two)
    n_prompt, n_gen, gamma = 5, 40, 0.1
    out = model.generate(request(n_prompt, n_gen), torch.Generator().manual_seed(1), steps=8, refine_steps=6,
                         gamma=gamma, refine_rule=rule)
    assert len(seen) == 6 * per_step
    count = quantile_count(n_gen, gamma)  # floor(0.1 * 39) + 1 = 4
    assert count == 4
    remasked = set()
    for inputs in seen[per_step - 1::per_step]:
        frames = set(masked_frames(inputs))
        assert len(frames) == count
        assert min(frames) >= n_prompt  # never the prompt
        assert not frames & remasked  # never a frame refined before
        remasked |= frames
    assert out.info["refined_frames"] == 6 * count
    # T = 45, k' = floor(45 / 8) = 5: 8 stage-one passes
    assert out.forward_passes == 8 + 6 * per_step


def test_refinement_stops_when_every_frame_is_refined():
    # 6 frames, one a step (gamma 0.05): the 9 steps asked for stop after 6, 2 passes each
    model = stage_two_model().eval()
    out = model.generate(request(6, 6), torch.Generator().manual_seed(0), steps=6, refine_steps=9)
    assert out.info["refined_frames"] == 6 and out.info["refine_passes"] == 12


def test_forward_passes_with_the_even_split_do_not_depend_on_length():
    model = stage_two_model().eval()
    for n_gen in (12, 31):
        out = model.generate(request(6, n_gen), torch.Generator().manual_seed(0), steps=10, refine_steps=3,
                             stage_one_rule="even_split", refine_rule="stage_one_confidence")
        assert out.forward_passes == 13 and len(out.speech) == n_gen
        assert out.info["stage_one_passes"] == 10 and out.info["refine_passes"] == 3


def test_forward_passes_at_paper_defaults():
    # 8 prompt + 100 target frames: T = 108, k' = 1, 100 passes; 8 + 300: T = 308, k' = 3, 100 passes;
    # then 7 refinement steps of a scoring and a re-prediction pass
    model = stage_two_model().eval()
    for n_gen, stage_one, per_step in ((100, 100, 5), (300, 100, 15)):
        calls_before = model.stage_one.passes + model.stage_two.passes
        out = model.generate(request(8, n_gen), torch.Generator().manual_seed(0))
        assert out.forward_passes == stage_one + 14 == model.stage_one.passes + model.stage_two.passes - calls_before
        assert out.info["stage_one_passes"] == stage_one
        assert out.info["refined_frames"] == 7 * per_step  # floor(0.05 * 99) + 1 = 5, floor(0.05 * 299) + 1 = 15


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
    # T = 16, k' = floor(16 / 4) = 4: spans 4, 4, 2
    assert stage_one.generate(request(6, 10), torch.Generator(), steps=4).forward_passes == 3
    with pytest.raises(ValueError, match="gamma"):
        stage_two_model().eval().generate(request(6, 10), torch.Generator(), gamma=0.0)
    with pytest.raises(ValueError, match="refine_rule"):
        stage_two_model().eval().generate(request(6, 10), torch.Generator(), refine_rule="once")
    with pytest.raises(ValueError, match="stage_one_rule"):
        stage_one.generate(request(6, 10), torch.Generator(), stage_one_rule="even")
    with pytest.raises(ValueError, match="takes no commit ratio"):
        stage_one.generate(request(6, 10), torch.Generator(), stage_one_rule="even_split", r=0.1)


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
    assert one["options"]["conv_pos_kernel"] == 7  # PALLE (arXiv:2504.10352) Sec. 5.1
    model = build_paradigm("palle", VOCAB, TINY, stage=1, **one["options"])
    assert model.describe()["stage"] == 1
    with pytest.raises(ValueError, match="unknown options"):
        build_paradigm("palle", VOCAB, TINY, stage=1, conv_kernel=7)


# ----------------------------------------------------------------------------- layout concat

def concat_model(stage=1, **options):
    """A model of layout concat as a run of ``stage`` has it (stage 2: stage two from stage one)."""
    model = build_paradigm("palle", VOCAB, TINY, stage=stage, layout="concat", **options)
    if stage == 2:
        model.init_stage_two_from_stage_one()
    return model


def peaked(model, seed=1, scale=0.3):
    """Redraw every weight at a larger scale (N(0, scale^2) matrices, N(0, 0.1^2) vectors), so that the
    distributions are peaked and position-dependent and a sampled code depends on every input
    (a greedy code too at ``scale=2``)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.copy_(torch.randn(p.shape, generator=g) * (scale if p.dim() >= 2 else 0.1))
    return model.eval()


@pytest.mark.parametrize("stage,noise", [(1, 0.0), (2, 0.0), (1, 0.5)])
def test_concat_example_is_the_text_then_the_fused_speech_stream(stage, noise):
    # T = 20 frames (codes 0..11, 0..7 -> shared ids 18 + code) after the text (1, 2, 3) -> 9, 10, 11.
    # Stage one: the mask of Eqs. 7-9 from the same generator (frames s.. masked, s and s + 1 scored);
    # stage two: Eq. 10's. The speech part, targets included, is the fused example's, draw for draw.
    utt = utterance(20, text=(1, 2, 3))
    if stage == 2:
        fused = stage_two_model(input_noise=noise)
    else:
        fused = build_paradigm("palle", VOCAB, TINY, input_noise=noise)
    concat = concat_model(stage, input_noise=noise)
    code = [18 + t % 12 for t in range(20)]
    for seed in range(6):
        ex = concat.training_example(utt, torch.Generator().manual_seed(seed))
        ref = fused.training_example(utt, torch.Generator().manual_seed(seed))
        assert ex.position_ids.tolist() == list(range(23))
        assert ex.attention_mask.shape == (23, 23) and ex.attention_mask.all()
        assert ex.extras == {}
        assert ex.input_ids[:3].tolist() == [9, 10, 11] and ex.targets[:3].tolist() == [IGNORE] * 3
        assert torch.equal(ex.input_ids[3:], ref.input_ids) and torch.equal(ex.targets[3:], ref.targets)
        if noise:
            continue
        if stage == 1:
            _, _, s = span_mask(20, torch.Generator().manual_seed(seed))
            speech = code[:s] + [MASK] * (20 - s)
            targets = [IGNORE] * s + code[s:s + 2] + [IGNORE] * (18 - s)
        else:
            masked = refine_mask(20, torch.Generator().manual_seed(seed)).tolist()
            speech = [MASK if m else c for m, c in zip(masked, code)]
            targets = [c if m else IGNORE for m, c in zip(masked, code)]
        assert ex.input_ids.tolist() == [9, 10, 11] + speech
        assert ex.targets.tolist() == [IGNORE] * 3 + targets
    assert concat.sequence_length(utt) == 23 and fused.sequence_length(utt) == 20
    # the text is never cut to the speech length (the fused stream is): 4 tokens before 2 frames
    ex = concat.training_example(utterance(2, text=(1, 2, 3, 4)), torch.Generator())
    assert ex.input_ids[:4].tolist() == [9, 10, 11, 12] and len(ex) == 6


def test_concat_model_is_the_ar_model_in_both_stages():
    from arnar.train.checkpoints import matching_tensors

    torch.manual_seed(0)
    ar = build_paradigm("ar", VOCAB, TINY).eval()
    source = ar.state_dict()
    assert set(source) == {"embed.weight", "head.weight"} | {k for k in source if k.startswith("backbone.")}
    ids = torch.cat([VOCAB.text(torch.tensor([1, 2, 3])), VOCAB.speech(torch.tensor([5, 0, 7, 7, 2, 11, 3, 1]))])[None]
    positions, full = torch.arange(11)[None], torch.ones(1, 11, 11, dtype=torch.bool)
    with torch.no_grad():
        ar_hidden = ar.backbone(ar.embed(ids), positions, full)
        ar_logits = ar.logits(ids, positions, full)
        ar_causal = ar.logits(ids, positions)
    assert not torch.allclose(ar_logits, ar_causal, atol=1e-3)  # the comparison below sees the mask
    for stage in (1, 2):
        model = build_paradigm("palle", VOCAB, TINY, stage=stage, layout="concat").eval()
        own = model.state_dict()
        loaded = matching_tensors(source, own)
        # every tensor but the stage-two flag, each stage's from the AR tensor of the same role
        assert set(own) - set(loaded) == {"stage_two_initialised"}
        for prefix in ("stage_one.", "stage_two."):
            assert {k[len(prefix):] for k in loaded if k.startswith(prefix)} == set(source)
        assert all(k.startswith(("stage_one.", "stage_two.")) for k in loaded)  # no top-level copy to load twice
        assert all(loaded[k] is source[k.split(".", 1)[1]] for k in loaded)
        model.load_state_dict({**own, **loaded})
        assert bool(model.stage_two_initialised) == (stage == 2)  # stage 2: stage two := stage one (the same)
        with torch.no_grad():
            for network in (model.stage_one, model.stage_two):
                assert torch.equal(network.hidden(ids, None, positions, full), ar_hidden)
            assert torch.equal(model.logits(ids, positions, stage=1), ar_logits)  # default mask: bidirectional
            assert torch.equal(model.logits(ids, positions, stage=2), ar_logits)


@pytest.mark.parametrize("stage", [1, 2])
def test_concat_loss_reads_the_speech_positions_and_trains_only_the_selected_stage(stage):
    model = concat_model(stage)
    trained, frozen = (model.stage_one, model.stage_two) if stage == 1 else (model.stage_two, model.stage_one)
    assert {name for name, _ in trained.named_children()} == {"embed", "backbone", "head"}
    # different text lengths: each item's speech starts at its own offset (1 and 4)
    examples = [model.training_example(utterance(T, text), torch.Generator().manual_seed(T))
                for T, text in ((12, (1,)), (20, (1, 2, 3, 4)))]
    out = model(collate(examples))
    scored = [int(((e.targets != IGNORE) & (torch.arange(len(e)) >= len(t))).sum())
              for e, t in zip(examples, ((1,), (1, 2, 3, 4)))]
    if stage == 1:
        assert scored == [1, 2]  # k = floor(0.1 T), all of them on speech positions
    else:
        assert scored == [int((e.input_ids == MASK).sum()) for e in examples]
    assert int(out.n_targets) == sum(scored) and torch.isfinite(out.loss_sum)
    with torch.no_grad():  # the batch's loss is each example's alone, read at its speech positions
        alone = sum(torch.nn.functional.cross_entropy(
            model.logits(e.input_ids[None], e.position_ids[None])[0][e.targets != IGNORE],
            e.targets[e.targets != IGNORE], reduction="sum") for e in examples)
    torch.testing.assert_close(out.loss_sum.detach(), alone, atol=1e-4, rtol=1e-5)
    out.loss_sum.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in trained.parameters())
    assert all(p.grad is None for p in frozen.parameters())
    assert model.describe()["trainable_parameters"] == sum(p.numel() for p in trained.parameters())


def test_concat_stage_one_commits_left_to_right_after_the_text():
    model = concat_model().eval()
    seen = record_inputs(model.stage_one)
    req = request(n_prompt=6, n_generate=23)  # text: prompt transcript (4, 5) + (1, 2, 3) -> 12, 13, 9, 10, 11
    out = model.generate(req, torch.Generator().manual_seed(0), steps=5, top_p=1.0)
    prompt = VOCAB.speech(req.prompt_speech)
    final = torch.cat([prompt, VOCAB.speech(out.speech)])
    assert len(seen) == 5 and len(out.speech) == 23
    committed = 6
    for inputs, span in zip(seen, [5, 5, 5, 5, 3]):  # T = 29, k' = floor(29 / 5) = 5, as in the fused layout
        assert inputs[:5].tolist() == [12, 13, 9, 10, 11]
        speech = inputs[5:]
        assert (speech[:committed] == final[:committed]).all() and (speech[committed:] == MASK).all()
        committed += span
    assert VOCAB.is_speech(final).all()
    assert out.forward_passes == 5 and out.info["stage_one_passes"] == 5 and out.info["refine_passes"] == 0


@pytest.mark.parametrize("rule,remasked,passes,codes", [
    ("rescore", [[8, 9], [4, 7]], 4, [1, 1, 2, 1, 1, 2, 2, 2]),
    ("stage_one_confidence", [[3, 6], [4, 8]], 2, [1, 2, 2, 1, 2, 1, 2, 1]),
])
def test_concat_decoding_picks_the_hand_worked_frames_of_the_fused_layout(rule, remasked, passes, codes):
    # test_refinement_rule_picks_the_hand_worked_frames with the speech after 5 text positions: the
    # scripted logits sit at the speech positions only, so the same spans, re-masked frames and codes
    # come out only if every read and write is offset by the text (logits 0 there: code 0 if misread)
    model = concat_model(stage=2).eval()
    first = scripted(model.stage_one, _stage_one_strength, offset=5)
    seen = scripted(model.stage_two, _stage_two_strength, offset=5)
    out = model.generate(request(n_prompt=2, n_generate=8), torch.Generator(), steps=8, refine_steps=2,
                         gamma=0.2, temperature=0, refine_rule=rule)
    # stage one: one frame a pass, left to right (T = 10, k' = 1)
    assert [int((inputs == MASK).sum()) for inputs in first] == list(range(8, 0, -1))
    assert [masked_frames(inputs) for inputs in seen if (inputs == MASK).any()] == remasked
    assert len(seen) == passes and out.info["refine_passes"] == passes
    assert out.speech.tolist() == codes and out.info["refined_frames"] == 4
    assert out.forward_passes == 8 + passes


def test_concat_decodes_as_many_frames_in_as_many_passes_as_fused():
    fused, concat = stage_two_model().eval(), concat_model(stage=2).eval()
    cases = [
        (request(8, 100), {}, 100 + 14),  # T = 108, k' = 1: 100 passes; 7 steps of 2 passes
        # Eq. 11: 12 * 3 / 2 = 18 frames, T = 30, k' = floor(30 / 4) = 7: spans 7, 7, 4; 3 one-pass steps
        (request(12, None), {"steps": 4, "refine_steps": 3, "refine_rule": "stage_one_confidence"}, 3 + 3),
        # 1 frame asked for 5 text tokens after 2 prompt frames: 3 frames, 3 passes; 2 steps of 2 passes
        (request(2, 1), {"steps": 4, "stage_one_rule": "even_split", "refine_steps": 2}, 3 + 4),
    ]
    for req, decoding, passes in cases:
        a = fused.generate(req, torch.Generator().manual_seed(0), **decoding)
        b = concat.generate(req, torch.Generator().manual_seed(0), **decoding)
        assert a.forward_passes == b.forward_passes == passes
        assert a.info == b.info and len(b.speech) == b.info["target_frames"]
        assert ((b.speech >= 0) & (b.speech < VOCAB.speech_size)).all()


@pytest.mark.parametrize("readout", ["own", "previous"])
@pytest.mark.parametrize("decoding", [{"steps": 4}, {"steps": 3, "refine_rule": "stage_one_confidence", "gamma": 0.3}],
                         ids=["rescore", "stage_one_confidence"])
def test_concat_generate_batch_gives_each_item_its_generate_codes(decoding, readout):
    # text lengths 5, 6 and 7 (so the speech starts at 5, 6 and 7), prompts of 6, 3 and 9 frames,
    # targets of 10 frames, Eq. 11's estimate (lengthened to fit the text) and 7 frames
    torch.manual_seed(0)
    model = peaked(concat_model(stage=2, readout=readout))
    requests = [request(6, 10), request(3, None, prompt_text=(2, 3, 4, 5, 6), text=(7,)),
                request(9, 7, prompt_text=(8,), text=(1, 2, 3, 4, 5, 6))]
    alone, draws = [], []
    for i, req in enumerate(requests):
        g = torch.Generator().manual_seed(40 + i)
        alone.append(model.generate(req, g, **decoding))
        draws.append(torch.rand(1, generator=g))
    generators = [torch.Generator().manual_seed(40 + i) for i in range(3)]
    batched = model.generate_batch(requests, generators, **decoding)
    assert len({len(out.speech) for out in alone}) == 3 and alone[1].info["extended_to_fit_text"]
    for one, many, g, draw in zip(alone, batched, generators, draws):
        assert many.speech.tolist() == one.speech.tolist() and many.info == one.info
        assert torch.equal(torch.rand(1, generator=g), draw)  # the same random numbers consumed
    assert batched[0].forward_passes == max(o.info["stage_one_passes"] for o in alone) + \
        max(o.info["refine_passes"] for o in alone)


# ----------------------------------------------------------------------------- readout previous

def test_readout_previous_example_is_ars_sequence_with_each_target_one_position_earlier():
    # the own readout's example (text 9 10 11, then 20 frames) with <sos> before the text and <turn>
    # after it: frame t sits at input position 5 + t and is scored at 4 + t (frame 0 at <turn>'s)
    from arnar.paradigms.base import SOS, TURN

    utt = utterance(20, text=(1, 2, 3))
    own, previous = concat_model(), concat_model(readout="previous")
    for seed in range(4):
        ref = own.training_example(utt, torch.Generator().manual_seed(seed))
        ex = previous.training_example(utt, torch.Generator().manual_seed(seed))
        assert ex.input_ids.tolist() == [SOS, 9, 10, 11, TURN] + ref.input_ids[3:].tolist()
        assert ex.targets.tolist() == [IGNORE] * 4 + ref.targets[3:].tolist() + [IGNORE]
        assert ex.position_ids.tolist() == list(range(25)) and ex.attention_mask.all()
        _, _, s = span_mask(20, torch.Generator().manual_seed(seed))
        assert ex.targets[4 + s] == 18 + s % 12 and ex.input_ids[4 + s] == (18 + (s - 1) % 12)
    assert previous.sequence_length(utt) == 25


def test_readout_previous_from_ar_predicts_the_first_masked_frame_as_ar_does():
    # AR's weights in stage one; under AR's causal mask the frames after the first masked one cannot
    # be seen, so the logits read for frame s (at the position of frame s - 1) are AR's next-token
    # logits for the same history, and the example's target there is AR's target
    from arnar.paradigms.ar import ar_sequence
    from arnar.train.checkpoints import matching_tensors

    torch.manual_seed(0)
    ar = build_paradigm("ar", VOCAB, TINY).eval()
    model = concat_model(readout="previous").eval()
    model.load_state_dict({**model.state_dict(), **matching_tensors(ar.state_dict(), model.state_dict())})
    own = concat_model().eval()
    own.load_state_dict(model.state_dict())
    utt = utterance(20, text=(1, 2, 3))
    sequence = ar_sequence(VOCAB, utt.text, utt.speech)
    differs = 0
    for seed in range(5):
        ex = model.training_example(utt, torch.Generator().manual_seed(seed))
        read = int((ex.targets != IGNORE).nonzero()[0])  # the position that holds frame s - 1
        assert ex.input_ids[read + 1] == MASK and (ex.input_ids[:read + 1] == sequence[:read + 1]).all()
        assert ex.targets[read] == sequence[read + 1]
        S = len(ex)
        with torch.no_grad():
            causal = model.logits(ex.input_ids[None], ex.position_ids[None], torch.ones(S, S).tril().bool()[None])
            expected = ar.logits(sequence[None, :read + 1], torch.arange(read + 1)[None])[0, -1]
            torch.testing.assert_close(causal[0, read], expected, atol=1e-5, rtol=1e-5)
            # the paper's readout of the same weights reads frame s at its own <mask>: another prediction
            mine = own.training_example(utt, torch.Generator().manual_seed(seed))
            at = int((mine.targets != IGNORE).nonzero()[0])
            S = len(mine)
            other = own.logits(mine.input_ids[None], mine.position_ids[None], torch.ones(S, S).tril().bool()[None])
            differs += int(not torch.allclose(other[0, at], expected, atol=1e-3))
    assert differs == 5


def test_readout_previous_greedy_decoding_is_the_ladders_teacher_forced_reading_of_its_own_output():
    # greedy stage one commits, span by span, the argmax read one position before each frame; the
    # ladder's teacher-forced rung, given those codes as the target, reads the same argmax from the
    # same inputs: every code must come back (a misaligned readout in either would break it)
    from arnar.evaluate.ladder import palle_teacher_forced_codes

    torch.manual_seed(0)
    for readout in ("own", "previous"):
        model = peaked(concat_model(readout=readout), scale=2.0)
        req = request(n_prompt=6, n_generate=30)
        # 5 steps: spans of floor(36 / 5) = 7 frames, each read at its own position within one pass
        out = model.generate(req, torch.Generator(), steps=5, temperature=0)
        codes, right = palle_teacher_forced_codes(model, req.text, req.prompt_text, req.prompt_speech, out.speech,
                                                  steps=5)
        assert codes.tolist() == out.speech.tolist() and right == 1.0
        assert len(set(out.speech.tolist())) > 3  # the peaked weights give a varied sequence


def test_layout_option_errors():
    with pytest.raises(ValueError, match="layout must be one of"):
        build_paradigm("palle", VOCAB, TINY, layout="interleave")
    with pytest.raises(ValueError, match="readout must be one of"):
        build_paradigm("palle", VOCAB, TINY, layout="concat", readout="next")
    with pytest.raises(ValueError, match="readout 'previous'.*layout 'concat'"):
        build_paradigm("palle", VOCAB, TINY, readout="previous")
    with pytest.raises(ValueError, match="text_layout 'stretch'.*layout 'concat'"):
        build_paradigm("palle", VOCAB, TINY, layout="concat", text_layout="stretch")
    model = concat_model()
    with pytest.raises(ValueError, match="text_ids"):  # the text is in input_ids
        model.logits(torch.tensor([[9, 18]]), torch.arange(2)[None], text_ids=torch.tensor([[9, 0]]))
    # the configs' options (layout fused, text_layout pad) build with layout concat
    options = OmegaConf.to_container(OmegaConf.load(CONF / "palle_stage1.yaml"))["options"]
    assert options["layout"] == "fused"
    assert build_paradigm("palle", VOCAB, TINY, **{**options, "layout": "concat"}).layout == "concat"
