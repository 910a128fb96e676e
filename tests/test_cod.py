"""Chain-of-Details: level sampling, the training mask count (hand-worked for fixed seeds, and its
2/pi mean), conditioning corruption and dropout rates, the CFG null-condition path, the guidance
(both forms) and noise that ``generate`` applies at each step against hand-worked logits, its
confidence re-masking on a scripted decoder, level lengths (T not divisible by 4), the
forward-pass count, the loss contract (hand-worked), the features builder on data the test
writes, and the DAC path on a small random-initialised DAC."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from arnar.codec.hierarchy import level_lengths, levels as decimated_levels, upsample
from arnar.paradigms import build_paradigm
from arnar.paradigms.base import IGNORE, MASK, PAD, SynthesisRequest, Utterance, Vocab, collate, token_cross_entropy
import arnar.paradigms.cod as cod_module
from arnar.paradigms.cod import (
    DECODING,
    corrupt,
    default_level_probs,
    guided_logits,
    sample_level,
    trim_prompt,
)

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "src" / "arnar" / "conf" / "paradigm"
TINY = {"dim": 32, "n_layers": 2, "n_heads": 2, "dropout": 0.0}
VOCAB = Vocab(text_size=10, speech_size=12)  # speech ids 18..29
SMALL = {"speaker_dim": 8, "n_phonemes": 16, "duration_dim": 16, "duration_layers": 1, "duration_heads": 2}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads; on a shared machine they only contend."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def model(**options):
    torch.manual_seed(0)
    return build_paradigm("cod", VOCAB, TINY, **{**SMALL, **options}).eval()


def utterance(T=23, P=5, seed=0, speech=None):
    g = torch.Generator().manual_seed(seed)
    speech = torch.randint(12, (T,), generator=g) if speech is None else speech
    features = {"phonemes": torch.randint(1, 16, (P,), generator=g), "speaker": torch.randn(8, generator=g)}
    return Utterance(f"spk00_{seed:04d}", "spk00", torch.tensor([1, 2]), speech, features=features)


def examples(paradigm, n, utt=None, seed=0):
    utt = utt or utterance()
    return [paradigm.training_example(utt, torch.Generator().manual_seed(seed * 100003 + i)) for i in range(n)]


def request(prompt_frames=10, target_frames=23, P_text=4, P_prompt=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    features = {"phonemes": torch.randint(1, 16, (P_text,), generator=g),
                "prompt_phonemes": torch.randint(1, 16, (P_prompt,), generator=g),
                "speaker": torch.randn(8, generator=g)}
    req = SynthesisRequest(torch.tensor([1, 2, 3]), torch.tensor([4, 5]),
                           torch.randint(12, (prompt_frames,), generator=g), target_frames=target_frames)
    req.features = features  # SynthesisRequest.features (set as an attribute too where the field is absent)
    return req


def record_passes(paradigm):
    """Wrap ``level_logits``: every pass's inputs (copies) in a list."""
    seen, original = [], paradigm.level_logits

    def recording(input_ids, **kwargs):
        seen.append({"input_ids": input_ids.clone(), **{k: v.clone() for k, v in kwargs.items()}})
        return original(input_ids, **kwargs)

    paradigm.level_logits = recording
    return seen


# ----------------------------------------------------------------------------- options, schedules

def test_level_probabilities_default_and_checked():
    assert default_level_probs(3) == pytest.approx([0.2, 0.3, 0.5])
    assert default_level_probs(2) == pytest.approx([0.375, 0.625])  # the finest two, renormalised
    assert default_level_probs(1) == pytest.approx([1.0])
    with pytest.raises(ValueError, match="give level_probs"):
        default_level_probs(4)
    assert model(levels=4, level_probs=[0.1, 0.2, 0.3, 0.4]).n_levels == 4
    with pytest.raises(ValueError, match="level_probs"):
        model(level_probs=[0.5, 0.5])
    with pytest.raises(ValueError, match="unknown options"):
        model(level=3)


def test_speaker_reaches_the_backbone_adaln():
    # cond_dim 0 in the model config -> dim (32). Wire a path where only the speaker can act: the
    # projection copies the 8 speaker values into cond[:8], the final adaLN has scale -1 (so the
    # normalised hidden state is multiplied by 0) and shift = silu(cond), and the head reads
    # shift[j] into speech code j. Every position's logits are then silu of the speaker, by hand:
    # silu(1) = 0.7311, silu(-1) = -0.2689, silu(2) = 1.7616, silu(0) = 0
    m = model()
    assert m.model_config.cond_dim == TINY["dim"] and model_with_cond(24).model_config.cond_dim == 24
    final = m.backbone.final_modulation  # [2 * dim] = shift then scale
    with torch.no_grad():
        m.speaker_proj.weight.zero_()
        m.speaker_proj.bias.zero_()
        m.speaker_proj.weight[:8, :8] = torch.eye(8)
        final.weight.zero_()
        final.bias.zero_()
        final.weight[:32, :32] = torch.eye(32)
        final.bias[32:] = -1.0
        m.head.weight.zero_()
        m.head.weight[VOCAB.speech_offset:VOCAB.speech_offset + 8, :8] = torch.eye(8)
    speaker = torch.tensor([[1.0, -1.0, 2.0, 0.0, 1.0, -1.0, 2.0, 0.0]])
    ids = torch.tensor([[PAD, PAD, MASK, MASK]])
    with torch.no_grad():
        logits = m.level_logits(ids, torch.arange(4), torch.tensor([[3, 4, 0, 0]]),
                                torch.zeros(1, 4, dtype=torch.long), torch.tensor([1]), torch.tensor([False]), speaker)
    silu = [0.7311, -0.2689, 1.7616, 0.0] * 2
    for position in range(4):
        speech = logits[0, position, VOCAB.speech_offset:]
        assert speech[:8].tolist() == pytest.approx(silu, abs=1e-4)
        assert speech[8:].abs().max() == 0


def model_with_cond(cond_dim):
    return build_paradigm("cod", VOCAB, {**TINY, "cond_dim": cond_dim}, **SMALL)


def test_guided_logits_hand_checked():
    cond, uncond = torch.tensor([1.0, 2.0, -1.0]), torch.tensor([0.0, 4.0, -1.0])
    # extrapolate, c + w (c - u), w = 3: [1 + 3, 2 - 6, -1 + 0]; w = 0 is c
    assert guided_logits(cond, uncond, 3.0).tolist() == [4.0, -4.0, -1.0]
    assert guided_logits(cond, uncond, 0.0).tolist() == cond.tolist()
    assert guided_logits(cond, uncond, 0.75).tolist() == [1.75, 0.5, -1.0]
    # interpolate, u + w (c - u), w = 3: [0 + 3, 4 - 6, -1 + 0]; w = 1 is c, w = 0 is u
    assert guided_logits(cond, uncond, 3.0, "interpolate").tolist() == [3.0, -2.0, -1.0]
    assert guided_logits(cond, uncond, 1.0, "interpolate").tolist() == cond.tolist()
    assert guided_logits(cond, uncond, 0.0, "interpolate").tolist() == uncond.tolist()
    assert guided_logits(cond, uncond, 0.75, "interpolate").tolist() == [0.75, 2.5, -1.0]
    with pytest.raises(ValueError, match="guidance_form"):
        guided_logits(cond, uncond, 1.0, "paper")


# conditional / unconditional logits of the scripted decoder over the 12 speech codes (rest 0)
COND, UNCOND = [1.0, 2.0, -1.0], [0.0, 4.0, -1.0]
# guided by the paper's schedule over 4 steps, w = 3, 2.25, 1.5, 0.75:
GUIDED = {"extrapolate": [[4.0, -4.0, -1.0], [3.25, -2.5, -1.0], [2.5, -1.0, -1.0], [1.75, 0.5, -1.0]],  # [1 + w, 2 - 2w, -1]
          "interpolate": [[3.0, -2.0, -1.0], [2.25, -0.5, -1.0], [1.5, 1.0, -1.0], [0.75, 2.5, -1.0]]}  # [w, 4 - 2w, -1]


def scripted_decoder(paradigm):
    """Replace the decoder by a script: row 0 of every pass (the conditional input) gives COND at
    every speech position, row 1 (the null condition) UNCOND. Returns the passes' ``drop`` rows."""
    drops = []

    def level_logits(input_ids, **kwargs):
        paradigm.backbone_calls += 1
        drops.append(kwargs["drop"].tolist())
        logits = torch.zeros(*input_ids.shape, VOCAB.size)
        for row, values in enumerate((COND, UNCOND)[:len(input_ids)]):
            logits[row, :, VOCAB.speech_offset:VOCAB.speech_offset + 3] = torch.tensor(values)
        return logits

    paradigm.level_logits = level_logits
    return drops


def record_sampled_logits(monkeypatch):
    """Every step's logits as ``generate`` hands them to the sampler (guided, noised); greedy, and
    no draw from the generator, so the only draws are the noise's."""
    seen = []

    def greedy(logits, generator, **kwargs):
        seen.append(logits.clone())
        ids = logits.argmax(-1)
        return ids, logits.softmax(-1).gather(-1, ids[:, None]).squeeze(-1)

    monkeypatch.setattr(cod_module, "sample_tokens", greedy)
    return seen


def one_level_model():
    return model(levels=1, level_probs=[1.0], speech_prompt=False)


@pytest.mark.parametrize("form", ["extrapolate", "interpolate"])
def test_generate_applies_the_guidance_form_and_weight_of_each_step(monkeypatch, form):
    m = one_level_model()
    drops = scripted_decoder(m)
    seen = record_sampled_logits(monkeypatch)
    options = {} if form == DECODING["guidance_form"] else {"guidance_form": form}  # the default is extrapolate
    gen = m.generate(request(target_frames=4), torch.Generator(), steps=4, noise_start=0.0, **options)
    assert drops == [[False, True]] * 4 and gen.forward_passes == 4 and gen.info["guidance_form"] == form
    assert len(seen) == 4
    for step, logits in enumerate(seen):
        assert logits.shape == (4, 12)  # the 4 target frames, speech codes only
        assert logits[:, :3].tolist() == [GUIDED[form][step]] * 4, step
        assert logits[:, 3:].abs().max() == 0
    # at the last weight the forms pick different codes: 0 (1.75) extrapolating, 1 (2.5) interpolating
    # (one frame a step: masks_per_step(4, 4) = 3, 2, 1, 0; the frame that waits is a tie)
    assert sorted(gen.speech.tolist()) == ([0] * 4 if form == "extrapolate" else [0, 0, 0, 1])


def test_generate_adds_the_noise_of_each_step(monkeypatch):
    # variance 3, 2, 1, 0 over 4 steps (the defaults, 3 -> 0): step s adds sqrt(var_s) N(0, 1) drawn
    # from the caller's generator, nothing at the last step; replay the draws from the same seed
    m = one_level_model()
    scripted_decoder(m)
    seen = record_sampled_logits(monkeypatch)
    m.generate(request(target_frames=4), torch.Generator().manual_seed(5), steps=4)
    replay = torch.Generator().manual_seed(5)
    for step, variance in enumerate([3.0, 2.0, 1.0, 0.0]):
        clean = torch.zeros(4, 12)
        clean[:, :3] = torch.tensor(GUIDED["extrapolate"][step])
        noise = torch.randn(4, 12, generator=replay) if variance else torch.zeros(4, 12)
        torch.testing.assert_close(seen[step], clean + math.sqrt(variance) * noise)


@pytest.mark.parametrize("form,weight", [("extrapolate", 0.0), ("interpolate", 1.0)])
def test_guidance_at_the_neutral_weight_runs_the_conditional_model_alone(monkeypatch, form, weight):
    # w = 0 extrapolating and w = 1 interpolating are the conditional logits: no unconditional row
    m = one_level_model()
    drops = scripted_decoder(m)
    seen = record_sampled_logits(monkeypatch)
    m.generate(request(target_frames=4), torch.Generator(), steps=2, noise_start=0.0, guidance_form=form,
               guidance_start=weight, guidance_end=weight)
    assert drops == [[False]] * 2
    assert [logits[:, :3].tolist() for logits in seen] == [[COND] * 4] * 2
    with pytest.raises(ValueError, match="guidance_form"):
        m.generate(request(target_frames=4), torch.Generator(), guidance_form="paper")


def test_generate_remasks_the_least_confident_fresh_tokens_and_never_a_committed_one():
    # One level, 6 target frames, 3 steps: masks_per_step(6, 3) keeps floor(6 cos(pi s / 6)) masked
    # after step s = 5, 3, 0, so the steps commit 1, 2, 3 tokens. A scripted decoder (no guidance,
    # no noise, greedy) puts strength s_j on one code at each still-masked frame j and gives a
    # committed frame all-zero logits, i.e. confidence 1/12 = 0.083, below any e^s / (e^s + 11) with
    # s >= 1 (0.198 at s = 1): a committed frame would be the first re-masked if it were not pinned.
    #   step 1, code j, s = 2 5 1 6 3 4 -> commits frame 3 (s = 6)
    #   step 2, code j + 6, s = 4 1 6 . 2 5 on the masked frames 0 1 2 4 5 -> commits frames 2 (6)
    #     and 5 (5); frames 0, 1, 4 stay masked (step one's strengths would have kept 0, 2, 4)
    #   step 3, code j: commits frames 0, 1, 4
    # so the codes are frame 3 -> 3, frames 2, 5 -> 8, 11, frames 0, 1, 4 -> 0, 1, 4
    m = one_level_model()
    P = 4  # text phonemes (no prompt)
    strengths = {0: [2, 5, 1, 6, 3, 4], 1: [4, 1, 6, 0, 2, 5], 2: [2, 5, 1, 6, 3, 4]}
    seen = []

    def level_logits(input_ids, **kwargs):
        step = len(seen)
        m.backbone_calls += 1
        seen.append(input_ids[0, P:].clone())
        logits = torch.zeros(*input_ids.shape, VOCAB.size)
        for j in range(6):
            if input_ids[0, P + j] == MASK:
                logits[:, P + j, VOCAB.speech_offset + j + 6 * (step == 1)] = strengths[step][j]
        return logits

    m.level_logits = level_logits
    gen = m.generate(request(target_frames=6), torch.Generator().manual_seed(0), steps=3, temperature=0,
                     guidance_start=0.0, guidance_end=0.0, noise_start=0.0)
    assert [masked_positions(inputs) for inputs in seen] == [[0, 1, 2, 3, 4, 5], [0, 1, 2, 4, 5], [0, 1, 4]]
    # committed tokens are carried unchanged into the next pass
    assert VOCAB.speech_codes(seen[1][3]).item() == 3
    assert VOCAB.speech_codes(seen[2][[2, 3, 5]]).tolist() == [8, 3, 11]
    assert gen.speech.tolist() == [0, 1, 8, 3, 4, 11] and gen.forward_passes == 3


def masked_positions(inputs):
    return (inputs == MASK).nonzero().flatten().tolist()


# ----------------------------------------------------------------------------- training examples

def test_level_sampling_frequencies():
    g = torch.Generator().manual_seed(0)
    probs = torch.tensor([0.2, 0.3, 0.5])
    draws = torch.tensor([sample_level(probs, g) for _ in range(20000)])
    freq = [(draws == level).float().mean().item() for level in (1, 2, 3)]
    assert freq == pytest.approx([0.2, 0.3, 0.5], abs=0.015)
    # and through training_example, which records its level
    levels = torch.stack([e.extras["level"] for e in examples(model(), 3000)])
    assert [(levels == level).float().mean().item() for level in (1, 2, 3)] == pytest.approx([0.2, 0.3, 0.5], abs=0.03)


def test_level_lengths_follow_the_decimation_factors():
    # T = 23 (not divisible by 4): levels of ceil(23/4) = 6, ceil(23/2) = 12, 23 tokens
    assert level_lengths(23, 3) == [6, 12, 23]
    speech = torch.arange(23) % 12
    utt = utterance(T=23, P=5, speech=speech)
    for level, n in zip((1, 2, 3), (6, 12, 23)):
        probs = [float(level == k) for k in (1, 2, 3)]
        m = model(level_probs=probs, speech_prompt=False, previous_noise=0.0, condition_dropout=0.0)
        e = m.training_example(utt, torch.Generator().manual_seed(level))
        assert len(e) == 5 + n and int(e.extras["level"]) == level
        assert e.input_ids[:5].tolist() == [PAD] * 5
        assert e.extras["phonemes"].tolist() == (utt.features["phonemes"] + 1).tolist() + [0] * n
        assert e.position_ids.tolist() == list(range(5 + n)) and bool(e.attention_mask.all())
        # speech positions: the level's tokens or <mask>; targets at the masks only, the true tokens
        truth = VOCAB.speech(speech[:: 2 ** (3 - level)])
        masked = e.input_ids[5:] == MASK
        assert masked.any()
        assert torch.equal(e.input_ids[5:][~masked], truth[~masked])
        assert torch.equal(e.targets[5:][masked], truth[masked]) and bool((e.targets[5:][~masked] == IGNORE).all())
        assert bool((e.targets[:5] == IGNORE).all())
        # the previous level, upsampled: level 2 sees level 1 = speech[::4], each token twice
        previous = e.extras["previous"]
        assert previous[:5].tolist() == [0] * 5
        if level == 1:
            assert previous.tolist() == [0] * (5 + n)
        else:
            coarse = speech[:: 2 ** (4 - level)]
            expected = [int(coarse[min(j // 2, len(coarse) - 1)]) + 1 for j in range(n)]
            assert previous[5:].tolist() == expected
    assert m.sequence_length(utt) >= 5 + 23


def test_proportional_positions_spread_the_phonemes_over_each_level():
    from arnar.paradigms.base import spread_positions

    assert spread_positions(4, 8).tolist() == [1, 3, 5, 7]
    with pytest.raises(ValueError, match="text_positions"):
        model(text_positions="diagonal")
    utt = utterance(T=23, P=5)
    for level, n, phoneme_positions in ((1, 6, [0, 1, 3, 4, 5]), (3, 23, [2, 6, 11, 16, 20])):
        # 5 phonemes over n speech positions: floor((i + 1/2) n / 5)
        probs = [float(level == k) for k in (1, 2, 3)]
        m = model(level_probs=probs, text_positions="proportional")
        e = m.training_example(utt, torch.Generator().manual_seed(level))
        assert e.position_ids.tolist() == phoneme_positions + list(range(n))

    # decoding: every level's pass reads the layout training used, both CFG rows alike
    m = model(text_positions="proportional")
    seen = record_passes(m)
    req = request(prompt_frames=8, target_frames=16)  # 7 phonemes; prompt 8 + 16 frames: 6 / 12 / 24 per level
    m.generate(req, torch.Generator().manual_seed(0), steps=2)
    by_length = {int(p["position_ids"].shape[1]): p["position_ids"] for p in seen}
    for n in (6, 12, 24):
        expected = torch.cat([spread_positions(7, n), torch.arange(n)])
        assert all(torch.equal(row, expected) for row in by_length[7 + n])


@pytest.mark.parametrize("seed,u,count", [
    # MaskGIT (III-B): u ~ U(0, 1), ceil(cos(pi u / 2) n) of the n target tokens masked. One level,
    # no prompt, T = 23: u is the generator's draw after the level's (the prompt draws nothing
    # without speech_prompt). seed 1: u = 0.40307, cos(0.63314) = 0.80617, x 23 = 18.54 -> 19;
    # seed 2: u = 0.63711, cos(1.00078) = 0.53965, x 23 = 12.41 -> 13; seed 5: u = 0.90747,
    # cos(1.42545) = 0.14484, x 23 = 3.33 -> 4
    (1, 0.40307, 19), (2, 0.63711, 13), (5, 0.90747, 4),
])
def test_training_mask_count_hand_worked(seed, u, count):
    replay = torch.Generator().manual_seed(seed)
    torch.multinomial(torch.tensor([1.0]), 1, generator=replay)
    assert float(torch.rand((), generator=replay)) == pytest.approx(u, abs=1e-5)
    e = one_level_model().training_example(utterance(T=23), torch.Generator().manual_seed(seed))
    assert int((e.input_ids == MASK).sum()) == int((e.targets != IGNORE).sum()) == count


def test_training_mask_share_averages_two_over_pi():
    # E[cos(pi u / 2)] = (2 / pi) [sin(pi u / 2)]_0^1 = 2 / pi = 0.63662; the ceil adds under one
    # token, 1 / 200 of the share at n = 200 (0.0025 on average). Var[cos(pi u / 2)] = 1/2 - 4/pi^2
    # = 0.0947, so the mean of 2000 draws has a standard deviation of sqrt(0.0947 / 2000) = 0.0069:
    # tolerance 4 sigma = 0.028 around 0.63662 + 0.0025. (A uniform ratio would average 0.5.)
    m = one_level_model()
    utt = utterance(T=200)
    shares = [float((e.input_ids == MASK).sum()) / 200 for e in examples(m, 2000, utt)]
    assert float(np.mean(shares)) == pytest.approx(2 / math.pi + 0.0025, abs=0.028)
    assert min(shares) > 0 and max(shares) <= 1


def test_previous_level_corruption_rate():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(12, (200_000,), generator=g)
    changed = (corrupt(tokens, 0.1, 12, g) != tokens).float().mean().item()
    assert changed == pytest.approx(0.1 * (1 - 1 / 12), abs=0.003)  # a replacement can draw the same code
    # in training examples: level 3 conditioned on level 2, compared with the clean upsampled level 2
    speech = torch.randint(12, (40,), generator=g)
    utt = utterance(T=40, speech=speech)
    clean = torch.from_numpy(upsample(speech[::2].numpy(), 2, 40)) + 1
    m = model(level_probs=[0, 0, 1])
    diffs = [(e.extras["previous"][5:] != clean).float().mean().item() for e in examples(m, 400, utt)]
    assert float(np.mean(diffs)) == pytest.approx(0.1 * (1 - 1 / 12), abs=0.015)
    assert all(d == 0 for d in (
        (e.extras["previous"][5:] != clean).float().mean().item()
        for e in examples(model(level_probs=[0, 0, 1], previous_noise=0.0), 20, utt)))


def test_condition_dropout_rate():
    drops = torch.stack([e.extras["drop"] for e in examples(model(), 3000)]).float().mean().item()
    assert drops == pytest.approx(0.1, abs=0.02)
    assert not any(bool(e.extras["drop"]) for e in examples(model(condition_dropout=0.0), 200))


def test_training_prompt_prefix_is_whole_level_one_tokens_and_unscored():
    # the prompt is drawn right after the level (same generator); replay the draws to know it
    for levels, level_probs in ((3, [0.2, 0.3, 0.5]), (2, None)):
        m = model(levels=levels, level_probs=level_probs, prompt_max=0.9)
        F, T = 2 ** (levels - 1), 41
        prompts = []
        for i, e in enumerate(examples(m, 300, utterance(T=T))):
            replay = torch.Generator().manual_seed(i)
            level = sample_level(m.level_probs, replay)
            n_frames = m.prompt_frames(T, replay)
            assert level == int(e.extras["level"])
            assert n_frames % F == 0 and 0 <= n_frames <= 0.9 * T
            n_prompt = n_frames // 2 ** (levels - level)
            speech_targets = e.targets[5:]
            assert bool((speech_targets[:n_prompt] == IGNORE).all())  # the prompt is never scored
            assert bool((e.input_ids[5:5 + n_prompt] != MASK).all())  # nor masked
            assert bool((speech_targets[n_prompt:] != IGNORE).any())  # a target remains
            prompts.append(n_frames)
        assert min(prompts) == 0 and max(prompts) >= 0.6 * T  # from none to long prompts
    assert model(speech_prompt=False).prompt_frames(41, torch.Generator()) == 0


def test_every_parameter_is_in_the_graph_of_every_batch():
    """DDP without find_unused_parameters needs a gradient for every parameter at every step, also
    for batches with no dropped condition (null embeddings) or only level-1 examples."""
    m = model(condition_dropout=0.0, level_probs=[1, 0, 0]).train()
    m(collate(examples(m, 3))).loss_sum.backward()
    assert [n for n, p in m.named_parameters() if p.grad is None] == []


# ----------------------------------------------------------------------------- the CFG null condition

def test_dropped_condition_uses_the_null_embeddings():
    m = model()
    ids = torch.tensor([[PAD, PAD, MASK, VOCAB.speech(torch.tensor(3)).item()]] * 2)
    phonemes_a, phonemes_b = torch.tensor([[2, 5, 0, 0]] * 2), torch.tensor([[9, 1, 0, 0]] * 2)
    previous_a, previous_b = torch.tensor([[0, 0, 4, 7]] * 2), torch.tensor([[0, 0, 11, 2]] * 2)
    level, drop = torch.tensor([2, 2]), torch.tensor([True, False])
    xa = m.embed_inputs(ids, phonemes_a, previous_a, level, drop)
    xb = m.embed_inputs(ids, phonemes_b, previous_b, level, drop)
    # row 0 (dropped): phoneme positions are null_phoneme + level, speech positions get null_previous
    lev = m.level_embed.weight[1]
    assert torch.allclose(xa[0, :2], (m.null_phoneme + lev).expand(2, -1))
    assert torch.allclose(xa[0, 2], m.embed.weight[MASK] + m.null_previous + lev)
    assert torch.equal(xa[0], xb[0])  # the condition's content is gone
    assert not torch.allclose(xa[1], xb[1])  # row 1 (kept) sees it
    assert torch.allclose(xa[1, 0], m.phoneme_embed.weight[1] + lev)
    assert torch.allclose(xa[1, 3], m.embed.weight[ids[1, 3]] + m.previous_embed.weight[7] + lev)
    # through the whole decoder as well
    speaker = torch.randn(2, 8)
    out_a = m.level_logits(ids, torch.arange(4), phonemes_a, previous_a, level, drop, speaker)
    out_b = m.level_logits(ids, torch.arange(4), phonemes_b, previous_b, level, drop, speaker)
    assert torch.allclose(out_a[0], out_b[0]) and not torch.allclose(out_a[1], out_b[1])


def test_null_embeddings_get_gradients_from_dropped_examples():
    m = model(condition_dropout=0.5).train()
    batch = collate(examples(m, 16))
    assert batch.extras["drop"].any() and (~batch.extras["drop"]).any()
    m(batch).loss_sum.backward()
    assert m.null_phoneme.grad is not None and m.null_phoneme.grad.abs().sum() > 0
    assert m.null_previous.grad.abs().sum() > 0


# ----------------------------------------------------------------------------- loss contract

def test_forward_sums_ce_and_token_weighted_duration_error():
    # a zero head gives uniform logits: CE = log 30 (the shared vocabulary) per masked token; the
    # fresh duration predictor says one frame per phoneme (log 5 for 5 phonemes), so an utterance
    # of T frames is off by |log 5 - log T|: log(23 / 5) = 1.52606, log(40 / 5) = 2.07944. Each
    # utterance's error counts once per masked token of it (n_b, read off the targets):
    # loss_sum = sum_b n_b (log 30 + 0.5 |log 5 - log T_b|), n_targets = sum_b n_b
    m = model(duration_weight=0.5)
    with torch.no_grad():
        m.head.weight.zero_()
    short, long = utterance(T=23, P=5, seed=0), utterance(T=40, P=5, seed=1)
    batch = collate(examples(m, 3, short) + examples(m, 2, long, seed=1))
    n = (batch.targets != IGNORE).sum(1).tolist()
    errors = [1.52606] * 3 + [2.07944] * 2
    with torch.no_grad():
        out = m(batch)
    assert int(out.n_targets) == sum(n)
    assert float(out.loss_sum) == pytest.approx(sum(n_b * (3.40120 + 0.5 * e) for n_b, e in zip(n, errors)), rel=1e-5)
    assert float(out.metrics["duration_abs_log_error"]) == pytest.approx(sum(n_b * e for n_b, e in zip(n, errors)),
                                                                         rel=1e-5)


def test_fresh_duration_predictor_says_one_frame_per_phoneme():
    m = model()
    assert m.predict_frames(torch.tensor([1, 2, 3, 4, 5, 6, 7]), torch.randn(8)) == 7


# ----------------------------------------------------------------------------- decoding

def test_generation_levels_lengths_prompt_and_forward_passes():
    m = model()
    calls = []
    m.backbone.register_forward_hook(lambda mod, args, out: calls.append(tuple(args[0].shape)))
    seen = record_passes(m)
    req = request(prompt_frames=10, target_frames=23)
    gen = m.generate(req, torch.Generator().manual_seed(0), steps=4)
    # 3 levels x 4 steps, one backbone call each; CFG doubles the batch, not the calls
    assert gen.forward_passes == 12 == len(calls) == len(seen)
    assert all(shape[0] == 2 for shape in calls)
    assert gen.speech.shape == (23,) and int(gen.speech.min()) >= 0 and int(gen.speech.max()) < 12
    # the 10-frame prompt is cut to its last 8 frames (a multiple of 4): levels of 2 / 4 / 8 prompt
    # tokens then 6 / 12 / 23 target tokens (= ceil(31 / 4), ceil(31 / 2), 31 with the prompt)
    prompt = req.prompt_speech[2:]
    P = 3 + 4  # prompt phonemes + text phonemes
    assert gen.info["level_lengths"] == [8, 16, 31] == level_lengths(31, 3)
    prompt_levels = decimated_levels(prompt.numpy(), 3)
    for i, rec in enumerate(seen):
        level = i // 4 + 1
        assert rec["input_ids"].shape == (2, P + [8, 16, 31][level - 1])
        assert rec["drop"].tolist() == [False, True] and bool((rec["level"] == level).all())
        # the prompt prefix is never masked
        n_prompt = len(prompt_levels[level - 1])
        prompt_ids = VOCAB.speech(torch.from_numpy(prompt_levels[level - 1]))
        assert rec["input_ids"][0, P:P + n_prompt].tolist() == prompt_ids.tolist()
        # every target token starts masked at a level's first step; then the cosine schedule's
        # count stays masked, floor(n cos(pi s / 8)) after step s: 6 -> 5, 4, 2; 12 -> 11, 8, 4;
        # 23 -> 21, 16, 8 (and 0 after the last step: the next level's previous, below)
        masked = int((rec["input_ids"][0, P + n_prompt:] == MASK).sum())
        assert masked == [6, 5, 4, 2, 12, 11, 8, 4, 23, 21, 16, 8][i], i
        if i % 4 == 0:
            assert bool((rec["input_ids"][0, P + n_prompt:] == MASK).all())
    # level 1 has no previous level; the prompt part of level l+1's previous level is the decimated
    # prompt of level l, each token twice (level l's output conditions level l+1: next test)
    assert bool((seen[0]["previous"] == 0).all())
    level2_previous = seen[4]["previous"][0, P:] - 1
    level3_previous = seen[8]["previous"][0, P:] - 1
    assert level2_previous[:4].tolist() == np.repeat(prompt_levels[0], 2).tolist()
    assert level3_previous[:8].tolist() == np.repeat(prompt_levels[1], 2).tolist()
    assert bool((level2_previous >= 0).all()) and bool((level3_previous >= 0).all())
    # the finest level's output (after the prompt) is the generation
    last = seen[-1]["input_ids"][0, P + 8:]
    assert bool(((last == MASK) | (VOCAB.speech_codes(last) == gen.speech)).all())


def test_level_three_conditions_on_level_two_output():
    m = model()
    seen = record_passes(m)
    gen = m.generate(request(prompt_frames=0, target_frames=21), torch.Generator().manual_seed(3), steps=3)
    assert gen.info["level_lengths"] == [6, 11, 21] and gen.forward_passes == 9
    P = 7
    # level 2's final tokens = level 2's last pass inputs with its last masks filled; the last pass of
    # level 2 leaves no mask, so level 3's previous must agree with level 2's last input where unmasked
    last_level2 = seen[5]["input_ids"][0, P:]
    level3_previous = seen[6]["previous"][0, P:] - 1
    stretched = torch.from_numpy(upsample(np.arange(11), 2, 21))
    for j in range(21):
        token = last_level2[stretched[j]]
        if token != MASK:
            assert int(level3_previous[j]) == int(VOCAB.speech_codes(token))


def test_without_guidance_one_row_per_pass_and_same_count():
    m = model()
    calls = []
    m.backbone.register_forward_hook(lambda mod, args, out: calls.append(args[0].shape[0]))
    gen = m.generate(request(), torch.Generator().manual_seed(0), steps=5, guidance_start=0.0, guidance_end=0.0,
                     noise_start=0.0)
    assert gen.forward_passes == 15 and calls == [1] * 15


@pytest.mark.parametrize("levels,lengths", [(1, [27]), (2, [14, 27])])
def test_level_ablation_same_code_path(levels, lengths):
    m = model(levels=levels)
    gen = m.generate(request(prompt_frames=4, target_frames=27), torch.Generator().manual_seed(0), steps=3)
    assert gen.forward_passes == 3 * levels and gen.speech.shape == (27,)
    F = 2 ** (levels - 1)
    assert gen.info["prompt_frames_used"] == F * (4 // F)
    assert gen.info["level_lengths"] == level_lengths(gen.info["prompt_frames_used"] + 27, levels)
    examples(m, 5)  # trains with the same layout


def test_generation_is_reproducible_and_uses_the_length_options():
    m = model()
    req = request(target_frames=None, P_text=6, P_prompt=3, prompt_frames=12)
    a = m.generate(req, torch.Generator().manual_seed(7), steps=2)
    b = m.generate(req, torch.Generator().manual_seed(7), steps=2)
    assert torch.equal(a.speech, b.speech)
    # fresh predictor: one frame per text phoneme
    assert (a.info["length_from"], a.info["target_frames"], a.info["duration_passes"]) == ("predictor", 6, 1)
    c = m.generate(req, torch.Generator().manual_seed(7), steps=2, length="prompt_rate")
    assert (c.info["length_from"], c.info["target_frames"]) == ("prompt_rate", round(12 * 6 / 3))
    with pytest.raises(ValueError, match="unknown options"):
        m.generate(req, torch.Generator(), stepz=2)


def test_speaker_only_mode_ignores_the_prompt_tokens():
    m = model(speech_prompt=False)
    seen = record_passes(m)
    gen = m.generate(request(prompt_frames=12, target_frames=10), torch.Generator().manual_seed(0), steps=2)
    assert gen.info["level_lengths"] == [3, 5, 10] and gen.info["prompt_frames_used"] == 0
    assert seen[0]["input_ids"].shape[1] == 4 + 3  # text phonemes only
    assert bool((seen[0]["input_ids"][0, 4:] == MASK).all())


def test_coarse_levels_from_features_replace_the_decimations():
    # Table V: with coarse_tokenizer, levels 1 and 2 are the features' tokens (any codes, here
    # 11 - j), level 3 is still the speech; the layout and the conditioning are unchanged
    speech = torch.arange(23) % 12
    utt = utterance(T=23, P=5, speech=speech)
    coarse = [torch.tensor([11 - j for j in range(6)]), torch.tensor([(11 - j) % 12 for j in range(12)])]
    utt.features["coarse"] = coarse
    truth_of = {1: coarse[0], 2: coarse[1], 3: speech}
    for level, n in zip((1, 2, 3), (6, 12, 23)):
        probs = [float(level == k) for k in (1, 2, 3)]
        m = model(level_probs=probs, speech_prompt=False, previous_noise=0.0, condition_dropout=0.0,
                  coarse_tokenizer="coarse_units")  # the folder is only read at synthesis
        e = m.training_example(utt, torch.Generator().manual_seed(level))
        assert len(e) == 5 + n
        truth = VOCAB.speech(truth_of[level])
        masked = e.input_ids[5:] == MASK
        assert torch.equal(e.input_ids[5:][~masked], truth[~masked])
        assert torch.equal(e.targets[5:][masked], truth[masked])
        if level > 1:  # the previous level is the features' level, each token twice
            below = truth_of[level - 1]
            assert e.extras["previous"][5:].tolist() == [int(below[j // 2]) + 1 for j in range(n)]
    m = model(coarse_tokenizer="coarse_units")
    bad = utterance(T=23)
    with pytest.raises(ValueError, match="coarse-tokens"):  # no coarse levels in the features
        m.training_example(bad, torch.Generator())
    bad.features["coarse"] = [torch.zeros(5, dtype=torch.long), torch.zeros(12, dtype=torch.long)]
    with pytest.raises(ValueError, match="coarse level 1 has 5 tokens, 23 frames need 6"):
        m.training_example(bad, torch.Generator())
    bad.features["coarse"] = [torch.full((6,), 12), torch.zeros(12, dtype=torch.long)]
    with pytest.raises(ValueError, match=r"outside 0\.\.11"):
        m.training_example(bad, torch.Generator())
    with pytest.raises(ValueError, match="levels >= 2"):
        model(levels=1, level_probs=[1.0], coarse_tokenizer="coarse_units")


def test_coarse_prompt_levels_come_from_the_request():
    m = model(coarse_tokenizer="coarse_units")
    seen = record_passes(m)
    req = request(prompt_frames=10, target_frames=7)  # trimmed to 8 frames: 2 / 4 / 8 prompt tokens
    req.features["prompt_coarse"] = [torch.tensor([9, 10]), torch.tensor([1, 2, 3, 4])]
    gen = m.generate(req, torch.Generator().manual_seed(0), steps=2)
    assert gen.info["level_lengths"] == [2 + 2, 4 + 4, 8 + 7]
    P = 7
    assert VOCAB.speech_codes(seen[0]["input_ids"][0, P:P + 2]).tolist() == [9, 10]
    assert VOCAB.speech_codes(seen[2]["input_ids"][0, P:P + 4]).tolist() == [1, 2, 3, 4]
    assert VOCAB.speech_codes(seen[4]["input_ids"][0, P:P + 8]).tolist() == req.prompt_speech[2:].tolist()
    req.features["prompt_coarse"] = [torch.tensor([9]), torch.tensor([1, 2, 3, 4])]
    with pytest.raises(ValueError, match="coarse level 1 has 1 tokens"):
        m.generate(req, torch.Generator(), steps=1)


def test_trim_prompt_keeps_the_end():
    assert trim_prompt(torch.arange(10), 4).tolist() == list(range(2, 10))
    assert trim_prompt(torch.arange(3), 4).tolist() == []


def test_missing_or_bad_features_are_clear_errors():
    m = model()
    bare = Utterance("spk00_0000", "spk00", torch.tensor([1]), torch.arange(8) % 12)
    with pytest.raises(ValueError, match="cod-features"):
        m.training_example(bare, torch.Generator())
    bad = utterance()
    bad.features["phonemes"] = torch.tensor([3, 16])
    with pytest.raises(ValueError, match="n_phonemes"):
        m.training_example(bad, torch.Generator())
    bad = utterance()
    bad.features["speaker"] = torch.zeros(5)
    with pytest.raises(ValueError, match="speaker_dim"):
        m.training_example(bad, torch.Generator())
    req = SynthesisRequest(torch.tensor([1]), torch.tensor([2]), torch.arange(4))
    with pytest.raises(ValueError, match="prepare_request"):
        m.generate(req, torch.Generator(), steps=1)


def test_prepare_request_fills_phonemes_and_speaker():
    from arnar.text.phonemes import PhonemeTokenizer

    class FixedEncoder:  # stands in for resemblyzer: the test is about the plumbing
        name, dim = "fixed", 8

        def embed(self, audio, sample_rate):
            assert len(audio) == 1 and sample_rate == 16000
            return np.full((1, 8), float(len(audio[0])), dtype=np.float32)

    m = model(n_phonemes=64)
    m._speaker_encoder_cache = FixedEncoder()
    req = SynthesisRequest(torch.tensor([1]), torch.tensor([2]), torch.arange(8) % 12)
    out = m.prepare_request(req, text="Their son said grace.", prompt_text="A plan.",
                            prompt_audio=np.zeros(1600, np.float32), sample_rate=16000)
    tokenizer = PhonemeTokenizer()
    assert out.features["phonemes"].tolist() == tokenizer.encode("Their son said grace.")
    assert out.features["prompt_phonemes"].tolist() == tokenizer.encode("A plan.")
    assert out.features["speaker"].tolist() == [1600.0] * 8
    assert torch.equal(out.prompt_speech, req.prompt_speech)
    gen = m.generate(out, torch.Generator().manual_seed(0), steps=1)
    assert gen.info["length_from"] == "predictor"
    with pytest.raises(ValueError, match="n_phonemes"):  # 43 phoneme ids do not fit 16 rows
        model().prepare_request(req, text="a", prompt_text="b", prompt_audio=np.zeros(10, np.float32),
                                sample_rate=16000)


# ----------------------------------------------------------------------------- configs

@pytest.mark.parametrize("name,levels", [("cod", 3), ("cod_l2", 2), ("cod_l1", 1)])
def test_paradigm_configs_build(name, levels):
    cfg = OmegaConf.load(CONF / f"{name}.yaml")
    options = OmegaConf.to_container(cfg.options)
    assert cfg.name == "cod" and options["levels"] == levels
    assert options["level_probs"] == pytest.approx(default_level_probs(levels))
    # complete acoustic tokens: every codebook of the stack, a count the training engine reads from the tokens
    assert options["codebooks"] == "all"
    with pytest.raises(ValueError, match="resolved from the token set"):
        build_paradigm("cod", VOCAB, TINY, **options)
    m = build_paradigm("cod", VOCAB, TINY, **{**options, "codebooks": 8, "duration_dim": 16, "duration_layers": 1})
    assert m.n_levels == levels and m.speaker_dim == 256 and m.codebooks == 8


# ----------------------------------------------------------------------------- the features builder

def test_features_builder_on_written_data(tmp_path, monkeypatch):
    """``build_features`` on a cut manifest the test writes: phoneme ids of each cut's text by hand,
    the speaker encoder fed exactly the cut's samples (offset within its recording, channels
    averaged), a text without phonemes left out, and the engine's loader joining the table with
    token shards into CoD training examples."""
    import soundfile as sf

    from arnar.codec.shards import write_token_shards
    from arnar.train.features import build_features, main
    from arnar.train.data import load_utterances, read_features

    rate = 16000
    ramp = (np.arange(rate) / (2 * rate)).astype(np.float32)  # 1 s, sample i = i / 32000
    sf.write(tmp_path / "r1.wav", ramp, rate, subtype="FLOAT")
    stereo = np.stack([ramp[:9600], 3 * ramp[:9600]], axis=1)  # 0.6 s, two channels: mean 2 x ramp
    sf.write(tmp_path / "r2.wav", stereo, rate, subtype="FLOAT")

    def cut(utt, recording, start, duration, text, channels=(0,)):
        info = sf.info(str(tmp_path / f"{recording}.wav"))
        return {"id": utt, "start": start, "duration": duration, "channel": 0, "type": "MonoCut",
                "supervisions": [{"id": utt, "recording_id": recording, "start": 0.0, "duration": duration,
                                  "channel": 0, "text": text, "speaker": "spk"}],
                "recording": {"id": recording, "sources": [{"type": "file", "channels": list(channels),
                                                           "source": str(tmp_path / f"{recording}.wav")}],
                              "sampling_rate": rate, "num_samples": info.frames, "duration": info.duration,
                              "channel_ids": list(channels)}}

    cuts = tmp_path / "cuts.jsonl"
    cuts.write_text("".join(json.dumps(c) + "\n" for c in [
        cut("u1", "r1", 0.25, 0.5, "A plan."),  # samples 4000 .. 11999 of r1
        cut("u2", "r2", 0.0, 0.6, "Bob", channels=(0, 1)),
        cut("u3", "r1", 0.0, 1.0, "..."),  # no phonemes: left out
    ]))

    class RecordingEncoder:  # the builder's plumbing is the point; resemblyzer is tested in test_similarity
        name, dim = "recording", 8

        def embed(self, audio, sample_rate):
            (a,) = audio
            return np.array([[len(a), a[0], a[-1], sample_rate / 1000, 0, 0, 0, 0]], dtype=np.float32)

    monkeypatch.setattr("arnar.evaluate.similarity.load_speaker_encoder", lambda name, model=None: RecordingEncoder())
    out = tmp_path / "cod_dev.pt"
    summary = build_features(cuts, out, progress=False)
    assert summary == {"utterances": 2, "left_out": ["u3"], "phoneme_vocab_size": 43, "speaker_dim": 8,
                       "speaker_encoder": "recording"}
    table = read_features(out)
    assert sorted(table) == ["u1", "u2"]
    # default inventory: 4 specials (<pad> <unk> <sil> |) then ARPAbet AA AE AH ... (AA = 4):
    # "A plan." = AH | P L AE N, "Bob" = B AA B
    assert table["u1"]["phonemes"].tolist() == [6, 3, 30, 24, 5, 26]
    assert table["u2"]["phonemes"].tolist() == [10, 4, 10] and table["u2"]["phonemes"].dtype == torch.long
    assert table["u1"]["speaker"].tolist() == pytest.approx([8000, 4000 / 32000, 11999 / 32000, 16, 0, 0, 0, 0])
    assert table["u2"]["speaker"].tolist() == pytest.approx([9600, 0.0, 2 * 9599 / 32000, 16, 0, 0, 0, 0])

    # the engine's loader joins the table with token shards (u3 has tokens but no features: skipped)
    codec = {"name": "offline_rvq", "config_hash": "test", "frame_rate": 50.0, "n_codebooks": 1,
             "codebook_size": 12, "sample_rate": rate}
    codes = {"u1": np.arange(25)[None] % 12, "u2": np.arange(30)[None] % 12, "u3": np.arange(50)[None] % 12}
    tokens_dir = write_token_shards(tmp_path / "tokens", "dev", codes, codec)
    durations = tmp_path / "dev.jsonl"
    durations.write_text("".join(json.dumps({"utt_id": u, "frame_rate": 50.0, "num_frames": c.shape[1],
                                             "bpe_ids": [1], "ends": [c.shape[1]]}) + "\n" for u, c in codes.items()))
    utterances = {u.utt_id: u for u in load_utterances(tokens_dir, durations, features=out)}
    assert sorted(utterances) == ["u1", "u2"] and utterances["u1"].num_frames == 25
    assert torch.equal(utterances["u1"].features["phonemes"], table["u1"]["phonemes"])
    m = model(n_phonemes=64, level_probs=[0, 0, 1], speech_prompt=False)
    example = m.training_example(utterances["u1"], torch.Generator().manual_seed(0))
    assert example.extras["phonemes"][:6].tolist() == [7, 4, 31, 25, 6, 27]  # id + 1 on the prefix
    assert example.extras["log_frames"].item() == pytest.approx(math.log(25))
    batch = collate([m.training_example(u, torch.Generator().manual_seed(i)) for i, u in enumerate(utterances.values())])
    assert torch.isfinite(m(batch).loss_sum)

    # the CLI: a missing file is a one-line error naming it
    assert main(["--cuts", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "x.pt"), "--no-progress"]) == 2


# ----------------------------------------------------------------------------- the DAC path

def test_decimated_first_quantizer_of_a_small_dac_fits_the_paradigm(tmp_path):
    pytest.importorskip("dac")
    from arnar.codec import load_codec

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.script / weight_norm deprecations inside dac
        from dac.model.dac import DAC

        net = DAC(encoder_dim=16, encoder_rates=[2, 4, 5, 8], decoder_dim=64, decoder_rates=[8, 5, 4, 2],
                  n_codebooks=4, codebook_size=256, codebook_dim=8, sample_rate=16000)
    path = tmp_path / "dac_small.pth"
    net.save(str(path), package=False)
    full, first = load_codec("dac", model=path), load_codec("dac", model=path, n_codebooks=1)
    t = np.arange(14880) / 16000  # 0.93 s -> ceil(14880 / 320) = 47 frames, not a multiple of 4
    noise = np.random.default_rng(0).standard_normal(t.size)
    audio = (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * noise).astype(np.float32)
    codes = full.encode([audio], 16000)[0]
    T = codes.shape[1]
    assert T == 47 and first.frame_rate == 50.0
    # the first quantizer alone is the first row of the stack (RVQ: later codebooks refine, never change it)
    assert np.array_equal(first.encode([audio], 16000)[0], codes[:1])
    tiers = decimated_levels(codes, 3)
    assert [len(x) for x in tiers] == level_lengths(T, 3) == [12, 24, 47]
    assert np.array_equal(tiers[-1], codes[0]) and np.array_equal(tiers[0], codes[0, ::4])

    vocab = Vocab(text_size=10, speech_size=first.codebook_size)
    m = build_paradigm("cod", vocab, TINY, **SMALL, codebooks=4).eval()  # complete acoustic tokens
    utt = utterance(T=T, speech=torch.from_numpy(codes[0]))
    utt.acoustic = torch.from_numpy(codes[1:]).long()
    for level in (1, 2, 3):
        e = build_paradigm("cod", vocab, TINY, **{**SMALL, "codebooks": 4,
                                                 "level_probs": [float(level == k) for k in (1, 2, 3)]}) \
            .training_example(utt, torch.Generator().manual_seed(level))
        assert len(e) - 5 == level_lengths(T, 3)[level - 1]
    # a prompt of the clip's first 20 frames (its whole stack) and 27 frames to generate
    req = request(prompt_frames=20, target_frames=T - 20)
    req.prompt_speech, req.prompt_acoustic = torch.from_numpy(codes[0, :20]), torch.from_numpy(codes[1:, :20])
    gen = m.generate(req, torch.Generator().manual_seed(0), steps=2)
    assert gen.speech.shape == (4, T - 20) and int(gen.speech.max()) < 256
    # the stack is what the codec decodes: through the codec of 4 codebooks the audio is that of
    # the same codes, and codebooks 2..4 change it (the first quantizer alone decodes to other audio)
    stack = gen.speech.numpy()
    decoded = full.decode([stack])[0]
    assert len(decoded) == (T - 20) * 320
    alone = first.decode([stack[:1]])[0]
    rms = float(np.sqrt(np.mean((decoded - alone) ** 2)))
    assert rms > 1e-3 * float(np.sqrt(np.mean(decoded ** 2))) + 1e-6
    zeroed = stack.copy()
    zeroed[1:] = 0
    assert not np.allclose(full.decode([zeroed])[0], decoded)
    # the synthesizer's decoding of a generation: the audio of the whole generated stack, after the
    # prompt's whole stack as the codec's decoding context
    from arnar.synthesize import SynthesisJob, Synthesizer

    synth = Synthesizer.__new__(Synthesizer)  # its codec and decoding only: no run folder here
    synth.codec, synth._decode_takes_prompt_audio = full, False
    job = SynthesisJob(req, audio[:6400], torch.from_numpy(codes[:, :20]), start=0.0)
    spoken, record = synth.finish(job, gen, token_seconds=0.0)
    np.testing.assert_allclose(spoken, full.decode([stack], prompt=[codes[:, :20]])[0], rtol=0, atol=1e-6)
    assert not np.allclose(spoken, first.decode([stack[:1]], prompt=[codes[:1, :20]])[0])
    assert record["generated_frames"] == T - 20 and record["codebooks"] == 4


def test_prompt_pairs_join_phonemes_speaker_and_levels_as_a_test_item():
    """data.prompt_pairs for CoD (issue 53): a 23-frame prompt is cut to 20 frames (5 level-1
    tokens of F = 4), its phonemes come first, the speaker embedding is the prompt's (synthesis
    embeds the prompt audio), and every decimated level of the pair is the prompt's levels
    followed by the target's; with coarse tokens of another kind, each level is the prompt's
    first 20 / f tokens then the target's."""
    from arnar.codec.hierarchy import levels as decimated_levels
    from arnar.train.data import prompt_pairs

    m = model()
    prompt, target = utterance(T=23, P=5, seed=1), utterance(T=10, P=3, seed=2)
    pair = m.join_prompt_pair(prompt, target)
    assert pair.utt_id == f"{prompt.utt_id}+{target.utt_id}" and pair.num_frames == 20 + 10
    assert pair.speech.tolist() == prompt.speech[:20].tolist() + target.speech.tolist()
    assert pair.features["phonemes"].tolist() == prompt.features["phonemes"].tolist() + target.features["phonemes"].tolist()
    assert torch.equal(pair.features["speaker"], prompt.features["speaker"])
    for whole, first, second in zip(decimated_levels(pair.speech.numpy(), 3),
                                    decimated_levels(prompt.speech[:20].numpy(), 3),
                                    decimated_levels(target.speech.numpy(), 3)):
        assert whole.tolist() == first.tolist() + second.tolist()
    example = m.training_example(pair, torch.Generator().manual_seed(0))
    assert len(example) == 8 + len(decimated_levels(pair.speech.numpy(), 3)[example.extras["level"] - 1])
    # a prompt under one level-1 token leaves the target alone
    assert m.join_prompt_pair(utterance(T=3, seed=3), target) is target
    # through prompt_pairs: the utterances have features, CoD joins them
    utts = [utterance(T=23, seed=s) for s in range(4)]
    joined = prompt_pairs(utts, 1.0, seed=0, join=m.join_prompt_pair)
    assert all("+" in u.utt_id and u.num_frames == 20 + 23 for u in joined)

    coarse_model = model(coarse_tokenizer="coarse_units")
    for utt, n in ((prompt, 23), (target, 10)):
        utt.features["coarse"] = [torch.arange(-(-n // 4)) % 12, torch.arange(-(-n // 2)) % 12]
    pair = coarse_model.join_prompt_pair(prompt, target)
    assert pair.features["coarse"][0].tolist() == list(range(5)) + list(range(3))  # 20 / 4, then ceil(10 / 4)
    assert pair.features["coarse"][1].tolist() == list(range(10)) + list(range(5))
    coarse_model.training_example(pair, torch.Generator().manual_seed(1))  # lengths agree with 30 frames


# ----------------------------------------------------------------------------- complete acoustic tokens

def stacked(utt, K, seed=0):
    """``utt`` with random codes of codebooks 2..K (``Utterance.acoustic``)."""
    g = torch.Generator().manual_seed(1000 + seed)
    utt.acoustic = torch.randint(12, (K - 1, utt.num_frames), generator=g)
    return utt


def test_finest_level_example_gives_the_prompt_stack_and_scores_the_given_frames():
    """K = 3, the finest level: the prompt's frames carry codebooks 2..3 (code + 1), the target
    frames whose first quantizer is given (not masked) are the acoustic targets, masked and prompt
    frames are not; the first quantizer's sequence, mask and targets are those of the same draw
    with codebooks = 1 (the stack adds inputs, it draws nothing)."""
    utt = stacked(utterance(T=23, P=5), K=3)
    full, first = model(codebooks=3, level_probs=[0, 0, 1]), model(level_probs=[0, 0, 1])
    seen_prompt = False
    for seed in range(12):
        e = full.training_example(utt, torch.Generator().manual_seed(seed))
        e1 = first.training_example(utt, torch.Generator().manual_seed(seed))
        assert torch.equal(e.input_ids, e1.input_ids) and torch.equal(e.targets, e1.targets)
        assert "acoustic" not in e1.extras
        speech_in, targets = e.extras["acoustic"][5:], e.extras["acoustic_targets"][5:]
        assert e.extras["acoustic"][:5].abs().sum() == 0 and e.extras["acoustic_targets"][:5].abs().sum() == 0
        masked = e.targets[5:] != IGNORE
        for j in range(23):
            in_prompt = bool(speech_in[j].any())
            if in_prompt:  # a prompt frame: the whole stack in, nothing scored
                seen_prompt = True
                assert speech_in[j].tolist() == (utt.acoustic[:, j] + 1).tolist() and not masked[j]
                assert targets[j].tolist() == [0, 0]
            elif masked[j]:
                assert targets[j].tolist() == [0, 0]
            else:  # a given target frame: codebooks 2..3 are its targets
                assert targets[j].tolist() == (utt.acoustic[:, j] + 1).tolist()
        # the prompt is a prefix: once a frame has no stack in, none after it has
        has = speech_in[:, 0] > 0
        assert not bool((has[1:] & ~has[:-1]).any())
    assert seen_prompt
    coarse = model(codebooks=3, level_probs=[1, 0, 0]).training_example(utt, torch.Generator().manual_seed(0))
    assert coarse.extras["acoustic"].abs().sum() == 0 and coarse.extras["acoustic_targets"].abs().sum() == 0


def test_finest_level_loss_counts_each_frame_prediction_once():
    """Zero heads: the first quantizer's CE is log 30 (the shared vocabulary) per masked token,
    the stack's is log 12 (the codebook) per codebook, so log 12 per given frame after the mean
    over codebooks 2..3. Each given frame counts as one target, and the duration error
    log(23 / 5) = 1.52606 is added once per target of its utterance (masked tokens + frames):
    loss_sum = sum_b n_b log 30 + f_b log 12 + 0.5 (n_b + f_b) 1.52606."""
    m = model(codebooks=3, level_probs=[0, 0, 1], duration_weight=0.5)
    with torch.no_grad():
        m.head.weight.zero_()
        m.acoustic_head.weight.zero_()
    utt = stacked(utterance(T=23, P=5), K=3)
    batch = collate(examples(m, 4, utt))
    n = (batch.targets != IGNORE).sum(1)
    f = (batch.extras["acoustic_targets"][..., 0] > 0).sum(1)
    assert int(f.sum()) > 0
    with torch.no_grad():
        out = m(batch)
    assert int(out.n_targets) == int(n.sum() + f.sum())
    expected = float((n * math.log(30) + f * math.log(12) + 0.5 * (n + f) * 1.52606).sum())
    assert float(out.loss_sum) == pytest.approx(expected, rel=1e-5)


def test_which_parameters_learn_from_the_stack():
    """A finest-level batch: the stack's head learns, and of its embedding exactly the rows of the
    prompt codes seen (row (k - 2) (V + 1) + code + 1 for codebook k). A level-1 batch: both are in
    the graph (DDP needs every parameter every step) with zero gradients."""
    utt = stacked(utterance(T=23, P=5), K=3)
    fine = model(codebooks=3, level_probs=[0, 0, 1]).train()
    batch = collate(examples(fine, 6, utt))
    fine(batch).loss_sum.backward()
    assert fine.acoustic_head.weight.grad.abs().sum() > 0
    given = batch.extras["acoustic"]
    rows = (given + torch.arange(2) * 13)[given > 0].unique()
    learned = fine.acoustic_embed.weight.grad.abs().sum(1).nonzero().flatten()
    assert len(rows) > 0 and learned.tolist() == rows.tolist()
    assert [n for n, p in fine.named_parameters() if p.grad is None] == []

    coarse = model(codebooks=3, level_probs=[1, 0, 0], condition_dropout=0.0).train()
    coarse(collate(examples(coarse, 3, utt))).loss_sum.backward()
    assert [n for n, p in coarse.named_parameters() if p.grad is None] == []
    assert coarse.acoustic_head.weight.grad.abs().sum() == 0 and coarse.acoustic_embed.weight.grad.abs().sum() == 0


def stacked_request(K, prompt_frames=10, target_frames=23, seed=1):
    req = request(prompt_frames=prompt_frames, target_frames=target_frames, seed=seed)
    req.prompt_acoustic = torch.randint(12, (K - 1, prompt_frames), generator=torch.Generator().manual_seed(seed))
    return req


def test_generation_reads_the_stack_in_one_more_pass_from_the_prompt_stack():
    """K = 3, 2 steps per level: 3 x 2 MaskGIT passes and one conditional pass that reads
    codebooks 2..3 greedily. A head that favours code 5 for codebook 2 and code 7 for codebook 3
    gives exactly those rows; the last pass sees every first-quantizer token, the last 8 prompt
    frames' stack (10 frames trimmed to whole level-1 tokens, F = 4) and no dropped condition."""
    m = model(codebooks=3)
    with torch.no_grad():
        m.acoustic_head.weight.zero_()
        m.acoustic_head.bias.zero_()
        m.acoustic_head.bias[5] = 10.0  # codebook 2: code 5
        m.acoustic_head.bias[12 + 7] = 10.0  # codebook 3: code 7
    calls, original = [], m.level_hidden

    def recording(input_ids, **kwargs):
        calls.append({"input_ids": input_ids.clone(), **kwargs})
        return original(input_ids, **kwargs)

    m.level_hidden = recording
    req = stacked_request(K=3)
    gen = m.generate(req, torch.Generator().manual_seed(0), steps=2)
    assert gen.speech.shape == (3, 23) and gen.forward_passes == 3 * 2 + 1 and len(calls) == 7
    assert gen.speech[1].tolist() == [5] * 23 and gen.speech[2].tolist() == [7] * 23
    assert gen.info["codebooks"] == 3
    last = calls[-1]
    P = 3 + 4  # prompt phonemes + text phonemes
    assert len(last["input_ids"]) == 1 and not bool(last["drop"].any())
    assert not bool((last["input_ids"] == MASK).any())
    assert VOCAB.speech_codes(last["input_ids"][0, P + 8:]).tolist() == gen.speech[0].tolist()
    assert last["acoustic"][0, P:P + 8].tolist() == (req.prompt_acoustic[:, 2:].T + 1).tolist()
    assert last["acoustic"][0, :P].abs().sum() == 0 and last["acoustic"][0, P + 8:].abs().sum() == 0
    # the coarse levels never see the stack
    assert all(c.get("acoustic") is None for c in calls[:4])
    # the same request decoded with codebooks = 1 is one pass shorter and [T]
    q1 = model().generate(request(prompt_frames=10, target_frames=23, seed=1), torch.Generator().manual_seed(0), steps=2)
    assert q1.speech.shape == (23,) and q1.forward_passes == 6


def test_stack_sampling_and_missing_prompt_stack():
    logits = torch.tensor([[[0.0, 3.0, 1.0], [2.0, 0.0, 0.0]]])
    assert cod_module.CoD.acoustic_sample(logits, 0.0, torch.Generator()).tolist() == [[1, 0]]
    drawn = [cod_module.CoD.acoustic_sample(logits, 1.0, torch.Generator().manual_seed(s)) for s in range(200)]
    share = sum(int(d[0, 0]) == 1 for d in drawn) / 200  # softmax(0, 3, 1)[1] = 0.844
    assert 0.77 < share < 0.91
    with pytest.raises(ValueError, match="acoustic_temperature"):
        cod_module.CoD.acoustic_sample(logits, -1.0, torch.Generator())
    with pytest.raises(ValueError, match="prompt_acoustic"):
        model(codebooks=3).generate(request(), torch.Generator(), steps=1)
    with pytest.raises(ValueError, match="codebooks 2..3"):
        model(codebooks=3, level_probs=[0, 0, 1]).training_example(utterance(), torch.Generator())
    with pytest.raises(ValueError, match="whole number"):
        model(codebooks=0)


def test_loader_gives_the_stack_and_joins_carry_it(tmp_path):
    from arnar.codec import write_token_shards
    from arnar.train.data import TrainDataError, join_utterances_plain, load_utterances

    codec = {"name": "offline_rvq", "config_hash": "test", "frame_rate": 50.0, "n_codebooks": 3,
             "codebook_size": 12, "sample_rate": 16000}
    codes = {"spk00_0001": np.arange(30).reshape(3, 10) % 12, "spk00_0002": (np.arange(24).reshape(3, 8) * 5) % 12}
    tokens_dir = write_token_shards(tmp_path / "tokens", "train", codes, codec)
    durations = tmp_path / "train.jsonl"
    durations.write_text("".join(json.dumps({"utt_id": u, "frame_rate": 50.0, "num_frames": c.shape[1],
                                             "bpe_ids": [1, 2], "ends": [2, c.shape[1]]}) + "\n" for u, c in codes.items()))
    single = load_utterances(tokens_dir, durations)
    assert all(u.acoustic is None for u in single)
    a, b = load_utterances(tokens_dir, durations, codebooks=3)
    assert a.speech.tolist() == codes["spk00_0001"][0].tolist()
    assert a.acoustic.tolist() == codes["spk00_0001"][1:].tolist()
    with pytest.raises(TrainDataError, match="manifest.json: 3 codebooks, the paradigm generates 4"):
        load_utterances(tokens_dir, durations, codebooks=4)
    pair = join_utterances_plain(a, b, prompt_frames=4)
    assert pair.acoustic.tolist() == np.concatenate([codes["spk00_0001"][1:, :4], codes["spk00_0002"][1:]], 1).tolist()
    with pytest.raises(TrainDataError, match="one has the stack"):
        join_utterances_plain(a, single[1])


def test_engine_resolves_all_to_the_tokens_codebooks():
    from arnar.train import TrainError
    from arnar.train.loop import _resolve_codebooks

    codec = {"name": "offline_rvq", "n_codebooks": 8}
    cfg = OmegaConf.create({"paradigm": {"name": "cod", "options": {"codebooks": "all"}}})
    assert _resolve_codebooks(cfg, codec, "tokens") == 8 and cfg.paradigm.options.codebooks == 8
    assert _resolve_codebooks(OmegaConf.create({"paradigm": {"name": "ar"}}), codec, "tokens") == 1
    with pytest.raises(TrainError, match="have 8 codebooks"):
        _resolve_codebooks(OmegaConf.create({"paradigm": {"name": "cod", "options": {"codebooks": 9}}}), codec, "t")


# ----------------------------------------------------------------------------- forced levels (the ladder's rung)

def forced_request(truth, K=1, prompt_frames=10):
    req = stacked_request(K, prompt_frames=prompt_frames, target_frames=len(truth)) if K > 1 \
        else request(prompt_frames=prompt_frames, target_frames=len(truth))
    req.features["forced_speech"] = truth
    return req


def test_forced_levels_take_the_targets_decimations_and_generate_only_the_rest():
    # 23 target frames after a prompt trimmed to 8; levels of 6 / 12 / 23 target tokens. Forcing
    # levels 1-2 runs only level 3's 4 passes, which read the truth's level 2 (every 2nd code,
    # each covering two frames) as their previous level, and fill level 3 from there
    truth = torch.tensor([(5 * t + 3) % 12 for t in range(23)])
    m = model()
    seen = record_passes(m)
    gen = m.generate(forced_request(truth), torch.Generator().manual_seed(0), steps=4, forced_levels=2)
    assert gen.forward_passes == 4 == len(seen) and gen.info["level_lengths"] == [8, 16, 31]
    P = 3 + 4
    level2 = truth[::2]  # [12]
    previous = seen[0]["previous"][0, P + 8:] - 1  # the target part of level 3's previous level
    assert previous.tolist() == [int(level2[j // 2]) for j in range(23)]
    assert bool((seen[0]["input_ids"][0, P + 8:] == MASK).all()) and bool((seen[0]["level"] == 3).all())
    assert gen.speech.shape == (23,)
    # forcing every level leaves nothing to generate: the truth itself, in no pass
    all_forced = m.generate(forced_request(truth), torch.Generator(), steps=4, forced_levels=3)
    assert all_forced.speech.tolist() == truth.tolist() and all_forced.forward_passes == 0
    # with the stack, the one more pass reads codebooks 2..K from the true first quantizer
    stack = model(codebooks=3).generate(forced_request(truth, K=3), torch.Generator(), steps=4, forced_levels=3)
    assert stack.speech.shape == (3, 23) and stack.speech[0].tolist() == truth.tolist()
    assert stack.forward_passes == 1


def test_forced_levels_errors():
    m = model()
    truth = torch.arange(23) % 12
    with pytest.raises(ValueError, match="forced_levels must be a whole number from 0 to the 3 levels"):
        m.generate(forced_request(truth), torch.Generator(), forced_levels=4)
    with pytest.raises(ValueError, match="features\\['forced_speech'\\]"):
        m.generate(request(target_frames=23), torch.Generator(), forced_levels=1)
    with pytest.raises(ValueError, match="same length"):
        mismatched = forced_request(truth)
        mismatched.target_frames = 24
        m.generate(mismatched, torch.Generator(), forced_levels=1)
