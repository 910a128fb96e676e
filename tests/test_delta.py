"""DELTA-TTS (arnar/paradigms/delta.py, arnar/decode/delta_schedules.py): the conversion starts as
the AR model, the shift and the Eq. 2 weighting against hand-worked examples, Eq. 2's t ~ U(t_min, 1)
and per-token masking rate t over many draws, the Eq. 3 schedule against hand-worked counts, the
length rule, trainable parts, the decoding loop and its top-p default, and Table 5's causal-LoRA
baseline (option ``causal``) and its DAG wiring (``ar_lora``, ``delta_unfrozen``)."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pytest
import torch

from arnar.decode.delta_schedules import piece_weight, rule_based_frames, unmask_counts, unmasked_fraction
from arnar.nn import ConformerConvModule, LoRALinear, Transformer, TransformerConfig
from arnar.paradigms import build_paradigm
from arnar.paradigms.base import (
    EOS,
    IGNORE,
    MASK,
    SOS,
    TURN,
    Example,
    SynthesisRequest,
    Utterance,
    Vocab,
    causal_mask,
    collate,
)
from arnar.paradigms.delta import DeltaTTS, ar_from_cosyvoice_lm, convert_ar, delta_sequence

TINY = {"dim": 32, "n_layers": 2, "n_heads": 4, "dropout": 0.0}
VOCAB = Vocab(text_size=10, speech_size=12)  # text ids 8..17, speech ids 18..29
M = MASK


def utterance(text=(1, 2, 3), speech=(5, 6, 7, 8, 9)):
    return Utterance("spk00_0000", "spk00", torch.tensor(text), torch.tensor(speech))


def ar_model(seed=0):
    torch.manual_seed(seed)
    return build_paradigm("ar", VOCAB, TINY).eval()


def converted(seed=0, **options):
    return convert_ar(ar_model(seed), **options).eval()


def request(text=(1, 2), prompt_text=(3,), prompt_speech=(4, 5, 6), target_frames=None):
    return SynthesisRequest(torch.tensor(text), torch.tensor(prompt_text), torch.tensor(prompt_speech),
                            target_frames=target_frames)


# ----------------------------------------------------------------------------- conversion

def test_converted_model_starts_as_the_ar_model():
    ar = ar_model()
    delta = convert_ar(ar).eval()
    ids = ar.training_example(utterance(), torch.Generator().manual_seed(0)).input_ids[None]
    positions = torch.arange(ids.shape[1])
    with torch.no_grad():
        expected = ar.logits(ids, positions)  # the AR model's own causal path
        got = delta.logits(ids, positions, causal_mask(ids.shape[1]))
        bidirectional = delta.logits(ids, positions)  # delta's default mask
    assert torch.allclose(got, expected, atol=1e-5, rtol=0)
    # the mask switch is real: without the causal mask the same weights give other logits
    assert not torch.allclose(bidirectional, expected, atol=1e-3)


@pytest.mark.parametrize("part", ["lora", "conv"])
def test_lora_and_conv_branches_are_in_the_forward_path(part):
    """Zero-initialised branches keep the AR function; once non-zero they change it."""
    delta = converted()
    ids = delta_sequence(VOCAB, torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([4, 5]),
                         torch.tensor([True, False]))[None]
    positions = torch.arange(ids.shape[1])
    with torch.no_grad():
        before = delta.logits(ids, positions)
        if part == "lora":
            delta.backbone.layers[1].mlp.down_proj.lora_B.fill_(0.1)
        else:
            delta.conv_modules[0].pointwise_out.weight.fill_(0.1)
        after = delta.logits(ids, positions)
    assert not torch.allclose(before, after, atol=1e-4)


def test_mask_token_is_the_mean_speech_embedding_and_replaces_the_mask_row():
    ar = ar_model()
    delta = convert_ar(ar)
    mean = ar.embed.weight[VOCAB.speech_offset:].mean(0)
    assert torch.allclose(delta.mask_embedding, mean, atol=1e-7)
    assert not torch.allclose(mean, ar.embed.weight[MASK])  # so the next check can fail
    embedded = delta.embed_tokens(torch.tensor([[SOS, MASK, VOCAB.speech_offset]]))[0]
    assert torch.equal(embedded[1], delta.mask_embedding)
    assert torch.equal(embedded[0], ar.embed.weight[SOS]) and torch.equal(embedded[2], ar.embed.weight[18])


def test_only_lora_conv_and_mask_train_by_default():
    delta = converted()
    trainable = {n for n, p in delta.named_parameters() if p.requires_grad}
    frozen = {n for n, p in delta.named_parameters() if not p.requires_grad}
    assert trainable and all(".lora_" in n or n.startswith("conv_modules.") or n == "mask_embedding" for n in trainable)
    assert "mask_embedding" in trainable and any(n.startswith("conv_modules.") for n in trainable)
    assert {"embed.weight", "head.weight", "backbone.norm.weight", "backbone.layers.0.attn.q_proj.base.weight"} <= frozen
    # LoRA on all seven projections of every block
    wrapped = [n for n, m in delta.named_modules() if isinstance(m, LoRALinear)]
    assert len(wrapped) == 7 * TINY["n_layers"]
    assert {n.rsplit(".", 1)[1] for n in wrapped} == {"q_proj", "k_proj", "v_proj", "o_proj",
                                                      "gate_proj", "up_proj", "down_proj"}
    assert sum(isinstance(m, ConformerConvModule) for m in delta.modules()) == TINY["n_layers"]
    # gradients reach the trainable parts only
    delta.train()
    batch = collate([delta.training_example(utterance(), torch.Generator().manual_seed(s)) for s in range(4)])
    delta(batch).loss_sum.backward()
    assert all(p.grad is None for n, p in delta.named_parameters() if n in frozen)
    assert delta.backbone.layers[0].attn.q_proj.lora_B.grad.abs().sum() > 0
    assert delta.conv_modules[1].pointwise_out.weight.grad.abs().sum() > 0


def test_full_unfreeze_trains_everything():
    delta = converted(unfreeze=True)
    assert all(p.requires_grad for p in delta.parameters())
    no_lora = converted(unfreeze=True, lora_rank=0)
    assert all(p.requires_grad for p in no_lora.parameters())
    assert not any(isinstance(m, LoRALinear) for m in no_lora.modules())


def test_lora_rank_raised_to_the_conv_budget():
    # per block, dim 32 / kernel 15 / LayerNorm: conv = 64 + (32*64+64) + (32*15+32) + 64 + (32*32+32) = 3808;
    # LoRA per rank unit = q,o 2*(32+32) + k,v 2*(32+32) + gate,up,down 3*(32+128) = 736 (ffn 128 = 8/3*32 up to 64)
    delta = converted(conv=False, match_conv_budget=True)
    assert delta.lora_rank == 16 + math.ceil(3808 / 736) == 22
    with_conv = converted()
    count = lambda m: sum(p.numel() for p in m.parameters() if p.requires_grad)  # noqa: E731
    assert abs(count(delta) - count(with_conv)) <= 736 * TINY["n_layers"]  # within one rank unit per block
    with pytest.raises(ValueError, match="instead of"):
        converted(conv=True, match_conv_budget=True)


def test_ar_run_option_loads_the_ar_final_checkpoint(tmp_path):
    from arnar.train import FINAL_FORMAT

    ar = ar_model(seed=3)
    torch.save({"format": FINAL_FORMAT, "paradigm": "ar", "vocab": VOCAB.to_dict(), "step": 1,
                "config": {"model": TINY, "paradigm": {"name": "ar", "options": {}}}, "model": ar.state_dict()},
               tmp_path / "final.pt")
    delta = build_paradigm("delta", VOCAB, TINY, ar_run=str(tmp_path)).eval()
    assert torch.equal(delta.backbone.layers[1].attn.v_proj.base.weight, ar.backbone.layers[1].attn.v_proj.weight)
    assert torch.equal(delta.head.weight, ar.head.weight)
    assert torch.allclose(delta.mask_embedding, ar.embed.weight[VOCAB.speech_offset:].mean(0))
    with pytest.raises(ValueError, match="backbone config differs"):
        build_paradigm("delta", VOCAB, {**TINY, "n_heads": 2}, ar_run=str(tmp_path))


def test_unknown_option_is_an_error():
    with pytest.raises(ValueError, match="unknown options"):
        build_paradigm("delta", VOCAB, TINY, lora_rnk=4)


# ----------------------------------------------------------------------------- training example, shift, Eq. 2

def test_shift_targets_hand_worked_without_prompt():
    delta = converted(prompt_max=0.0, t_min=1.0)  # t = 1: every target token masked
    ex = delta.training_example(utterance(), torch.Generator().manual_seed(0))
    # <sos> t1 t2 t3 <turn> M M M M M <eos>; the output at i predicts the token at i + 1
    assert ex.input_ids.tolist() == [SOS, 9, 10, 11, TURN, M, M, M, M, M, EOS]
    assert ex.targets.tolist() == [IGNORE] * 4 + [23, 24, 25, 26, 27] + [IGNORE] * 2
    assert ex.position_ids.tolist() == list(range(11))
    assert ex.attention_mask.all()  # bidirectional
    assert float(ex.extras["t"]) == 1.0 and int(ex.extras["n_target"]) == 5


def test_shift_targets_hand_worked_with_prompt():
    delta = converted(prompt_max=0.9, t_min=1.0)
    for seed in range(100):  # the first seed that draws a 2-frame prompt
        ex = delta.training_example(utterance(), torch.Generator().manual_seed(seed))
        if int(VOCAB.is_speech(ex.input_ids).sum()) == 2:
            break
    # prompt c5 c6 stays visible; the last prompt token's output predicts the first target (c7)
    assert ex.input_ids.tolist() == [SOS, 9, 10, 11, TURN, 23, 24, M, M, M, EOS]
    assert ex.targets.tolist() == [IGNORE] * 6 + [25, 26, 27] + [IGNORE] * 2
    assert int(ex.extras["n_target"]) == 3


def test_masking_only_touches_the_target_and_scores_only_masked_tokens():
    delta = converted(prompt_max=0.4, t_min=0.02)
    utt = utterance(speech=tuple(range(12)) * 3)
    for seed in range(20):
        ex = delta.training_example(utt, torch.Generator().manual_seed(seed))
        n_target = int(ex.extras["n_target"])
        start = len(ex.input_ids) - 1 - n_target
        assert not (ex.input_ids[:start] == MASK).any() and ex.input_ids[-1] == EOS
        masked = ex.input_ids[start:-1] == MASK
        scored = ex.targets[start - 1:-2] != IGNORE
        assert torch.equal(masked, scored) and (ex.targets != IGNORE).sum() == masked.sum()
        assert torch.equal(ex.targets[start - 1:-2][scored], VOCAB.speech(utt.speech[-n_target:])[masked])


@pytest.mark.parametrize("t_min", [0.02, 0.3])
def test_t_is_uniform_between_t_min_and_one(t_min):
    # Eq. 2: t in (0, 1), here t = t_min + (1 - t_min) u, u ~ U(0, 1) (default floor 0.02, so the
    # 1/t weight is at most 50). U(a, 1): mean (1 + a) / 2, variance (1 - a)^2 / 12. N = 4000:
    # the mean's standard deviation is (1 - a) / sqrt(12 N) = 0.0045 at a = 0.02 (0.0032 at
    # 0.3); tolerance 4 sigma. The sample variance of a uniform has relative standard deviation
    # sqrt(0.8 / N) = 0.014 (kurtosis 1.8); tolerance 6 %. The smallest draw lies within 0.005 of a
    # unless all 4000 missed it: (1 - 0.005 / (1 - a))^4000 < e^-20; the largest likewise near 1.
    n = 4000
    delta = converted(t_min=t_min)
    assert converted().t_min == 0.02
    utt = utterance()
    t = torch.tensor([float(delta.training_example(utt, torch.Generator().manual_seed(s)).extras["t"])
                      for s in range(n)], dtype=torch.float64)
    assert float(t.min()) >= t_min - 1e-6 and float(t.max()) < 1.0
    assert float(t.min()) < t_min + 0.005 and float(t.max()) > 0.995
    sigma = (1 - t_min) / math.sqrt(12 * n)
    assert float(t.mean()) == pytest.approx((1 + t_min) / 2, abs=4 * sigma)
    assert float(t.var()) == pytest.approx((1 - t_min) ** 2 / 12, rel=0.06)


def test_each_target_token_is_masked_with_probability_t():
    # Eq. 2: each of the L target tokens is masked independently with probability t, so the masked
    # share of an example is Binomial(L, t) / L: mean t, variance s^2 = t (1 - t) / L. With L = 200
    # (no prompt) and N = 3000 examples, the mean of r = share - t has standard deviation at most
    # sqrt(1 / (4 L N)) = 0.00065: tolerance 4 sigma = 0.0026. The mean of r^2 estimates the mean
    # of s^2; r nearly Gaussian, Var r^2 = 2 s^4, and for t ~ U(0, 1) E[s^4] / E[s^2]^2 =
    # (1/30) / (1/6)^2 = 1.2, so its relative standard deviation is sqrt(2 * 1.2 / N) = 0.028:
    # tolerance 4 sigma = 11 %. Masking exactly round(t L) tokens would pass the first check and
    # fail the second (residuals within 1 / (2L): mean r^2 = 1 / (12 L^2), 1 / (2L) = 0.25 % of the
    # binomial's (1/6) / L).
    n, L = 3000, 200
    delta = converted(prompt_max=0.0)
    utt = utterance(speech=tuple(i % 12 for i in range(L)))
    shares, ts = [], []
    for seed in range(n):
        ex = delta.training_example(utt, torch.Generator().manual_seed(seed))
        assert int(ex.extras["n_target"]) == L
        shares.append(float((ex.input_ids == MASK).sum()) / L)
        ts.append(float(ex.extras["t"]))
    shares, ts = torch.tensor(shares, dtype=torch.float64), torch.tensor(ts, dtype=torch.float64)
    residual = shares - ts
    assert float(residual.mean()) == pytest.approx(0.0, abs=4 * math.sqrt(1 / (4 * L * n)))
    assert float((residual ** 2).mean()) == pytest.approx(float((ts * (1 - ts) / L).mean()),
                                                          rel=4 * math.sqrt(2 * 1.2 / n))


def test_loss_is_masked_cross_entropy_weighted_by_inverse_t():
    delta = converted()
    text = torch.tensor([1, 2])
    # example a: no prompt, target (3, 4, 5, 6, 7), t = 0.25, masked at 1 and 3
    masked_a = torch.tensor([False, True, False, True, False])
    ids_a = delta_sequence(VOCAB, text, torch.tensor([], dtype=torch.long), torch.tensor([3, 4, 5, 6, 7]), masked_a)
    targets_a = torch.full_like(ids_a, IGNORE)
    targets_a[4], targets_a[6] = VOCAB.speech(torch.tensor(4)), VOCAB.speech(torch.tensor(6))  # outputs at j-1
    # example b: prompt (1,), target (8, 9, 10), t = 0.5, masked at 0
    masked_b = torch.tensor([True, False, False])
    ids_b = delta_sequence(VOCAB, text, torch.tensor([1]), torch.tensor([8, 9, 10]), masked_b)
    targets_b = torch.full_like(ids_b, IGNORE)
    targets_b[4] = VOCAB.speech(torch.tensor(8))  # the prompt token's output predicts target 0
    examples = [
        Example(ids_a, torch.arange(len(ids_a)), targets_a, torch.ones(len(ids_a), len(ids_a), dtype=torch.bool),
                {"t": torch.tensor(0.25), "n_target": torch.tensor(5)}),
        Example(ids_b, torch.arange(len(ids_b)), targets_b, torch.ones(len(ids_b), len(ids_b), dtype=torch.bool),
                {"t": torch.tensor(0.5), "n_target": torch.tensor(3)}),
    ]
    out = delta(collate(examples))

    def nll(ids, position, code):  # -log p(code) over the speech codes, from the full-vocab logits
        with torch.no_grad():
            logits = delta.logits(ids[None], torch.arange(len(ids)))[0, position, VOCAB.speech_offset:]
        return -torch.log_softmax(logits, -1)[code]

    expected = (nll(ids_a, 4, 4) + nll(ids_a, 6, 6)) / 0.25 + nll(ids_b, 4, 8) / 0.5
    assert torch.allclose(out.loss_sum, expected, atol=1e-5)
    assert int(out.n_targets) == 8  # all target tokens, masked or not
    assert int(out.metrics["masked"]) == 3


def test_a_few_steps_fit_one_batch_with_the_backbone_frozen():
    ar = ar_model()
    with torch.no_grad():  # a trained AR head has long rows; the random one's bound the logits to about +-0.6
        ar.head.weight.mul_(30)
    delta = convert_ar(ar).train()
    batch = collate([delta.training_example(utterance(speech=tuple(range(12)) * 2), torch.Generator().manual_seed(s))
                     for s in range(4)])
    optimizer = torch.optim.AdamW([p for p in delta.parameters() if p.requires_grad], lr=1e-2)
    losses, accuracy = [], []
    for _ in range(20):
        optimizer.zero_grad()
        out = delta(batch)
        (out.loss_sum / out.n_targets).backward()
        optimizer.step()
        losses.append(float(out.loss_sum.detach() / out.n_targets))
        accuracy.append(float(out.metrics["correct"] / out.metrics["masked"]))
    assert losses[-1] < 0.1 * losses[0] and accuracy[0] < 0.5 and accuracy[-1] == 1.0


# ----------------------------------------------------------------------------- Eq. 3 schedule

@pytest.mark.parametrize("length,steps,mu,expected", [
    # mu = 0.3: c_n L = 3nL / (10T - 7n); L=20, T=4 -> floor(60/33, 120/26, 180/19, 240/12) = 1, 4, 9, 20
    (20, 4, 0.3, [1, 3, 5, 11]),
    # L=10, T=8 -> floor(30n / (80 - 7n)) = 0, 0, 1, 2, 3, 4, 6, 10
    (10, 8, 0.3, [0, 0, 1, 1, 1, 1, 2, 4]),
    # mu = 1 is uniform: floor(n L / T); L=10, T=4 -> 2, 5, 7, 10
    (10, 4, 1.0, [2, 3, 2, 3]),
    (7, 7, 1.0, [1] * 7),
])
def test_unmask_counts_hand_worked(length, steps, mu, expected):
    assert unmask_counts(length, steps, mu) == expected


def test_unmask_counts_always_sum_to_the_length():
    for mu in (0.3, 1.0, 0.1, 1 / 3, 0.7, 2.5):
        for steps in (1, 3, 4, 8, 16, 32):
            for length in (0, 1, 2, 5, 17, 50, 123):
                counts = unmask_counts(length, steps, mu)
                assert len(counts) == steps and sum(counts) == length and min(counts) >= 0
    assert unmasked_fraction(16, 16, 0.3) == 1 and unmasked_fraction(0, 16, 0.3) == 0
    # mu < 1 defers decisions: the second half of the steps commits most of the tokens
    assert sum(unmask_counts(100, 16, 0.3)[8:]) > 70
    with pytest.raises(ValueError):
        unmask_counts(10, 4, 0.0)


# ----------------------------------------------------------------------------- length

def test_piece_weights_hand_worked():
    assert piece_weight("\u2581He", 0.3, 0.5) == pytest.approx(2.3)
    assert piece_weight(",", 0.3, 0.5) == 0.5 and piece_weight("ld", 0.3, 0.5) == 2.0
    assert piece_weight("<0x33>", 0.3, 0.5) == 1.0  # byte '3'
    assert piece_weight("<0xC3>", 0.3, 0.5) == 1.0 and piece_weight("<0xA9>", 0.3, 0.5) == 0.0  # 'é' counts once
    assert piece_weight("<s>", control=True) == 0.0
    assert rule_based_frames(30, 7.5, 5.0) == 20


def test_rule_based_length_from_pieces_and_from_bpe_count():
    delta = converted()
    pieces = ["\u2581a", "b", ",", "\u2581cd", "e", ".", "<0x41>", "f", "\u2581", "g"]
    # prompt "▁a b ," = 1.3 + 1 + 0.5 = 2.8; target "▁cd e ." = 2.3 + 1 + 0.5 = 3.8; 14 prompt frames
    req = request(text=(3, 4, 5), prompt_text=(0, 1, 2), prompt_speech=tuple(i % 12 for i in range(14)))
    assert delta.generate(req, torch.Generator().manual_seed(0), steps=2).info["length_from"] == "rule_bpe_count"
    out = delta.generate(req, torch.Generator().manual_seed(0), steps=2)
    assert len(out.speech) == 14  # 14 / 3 ids * 3 ids (palle Eq. 11 without the pieces)
    delta.text_pieces = [(p, False) for p in pieces]
    out = delta.generate(req, torch.Generator().manual_seed(0), steps=2)
    assert out.info["length_from"] == "rule_characters" and len(out.speech) == round(14 / 2.8 * 3.8) == 19
    # the ground-truth length wins when given (auto), unless the rule is asked for
    given = request(text=(3, 4, 5), prompt_text=(0, 1, 2), prompt_speech=tuple(i % 12 for i in range(14)), target_frames=9)
    assert len(delta.generate(given, torch.Generator().manual_seed(0), steps=2).speech) == 9
    assert len(delta.generate(given, torch.Generator().manual_seed(0), steps=2, length="rule").speech) == 19
    with pytest.raises(ValueError, match="target_frames"):
        delta.generate(req, torch.Generator().manual_seed(0), length="given")


# ----------------------------------------------------------------------------- decoding

def test_decoding_commits_everything_in_exactly_T_passes():
    delta = converted()
    calls = []
    delta.backbone.norm.register_forward_hook(lambda *_: calls.append(1))  # once per backbone pass
    for steps in (4, 8):
        calls.clear()
        out = delta.generate(request(target_frames=40), torch.Generator().manual_seed(1), steps=steps)
        assert min(unmask_counts(40, steps, 0.3)) > 0  # every step commits something
        assert out.forward_passes == len(calls) == steps
        assert len(out.speech) == 40 and ((out.speech >= 0) & (out.speech < VOCAB.speech_size)).all()
    # a step with k_n = 0 runs no pass: L=10, T=8, mu=0.3 -> 0, 0, 1, 1, 1, 1, 2, 4
    calls.clear()
    out = delta.generate(request(target_frames=10), torch.Generator().manual_seed(1), steps=8)
    assert out.forward_passes == len(calls) == 6 and len(out.speech) == 10
    # same seed, same tokens
    again = delta.generate(request(target_frames=10), torch.Generator().manual_seed(1), steps=8)
    assert torch.equal(out.speech, again.speech)


def test_decoding_reads_the_shifted_output_and_commits_the_most_confident_first(monkeypatch):
    """A stand-in network whose output at sequence index j is sure of code j % 12, more sure the
    larger j: target i must come from index start-1+i, and the last positions commit first."""
    delta = converted()
    seen_masks = []

    def hidden_states(input_ids, position_ids, attention_mask=None):
        delta.backbone_calls += 1
        seen_masks.append((input_ids[0] == MASK).tolist())
        S = input_ids.shape[1]
        return torch.arange(S, dtype=torch.float32)[None, :, None].expand(1, S, VOCAB.speech_size)

    def speech_logits(hidden):
        index = hidden[..., 0]
        return (torch.nn.functional.one_hot(index.long() % VOCAB.speech_size, VOCAB.speech_size).float()
                * (5.0 + index[..., None]))

    monkeypatch.setattr(delta, "hidden_states", hidden_states)
    monkeypatch.setattr(delta, "speech_logits", speech_logits)
    req = request(text=(1, 2), prompt_text=(3,), prompt_speech=(4, 5, 6), target_frames=6)
    out = delta.generate(req, torch.Generator().manual_seed(0), steps=3, schedule="uniform", temperature=0)
    start = 1 + 3 + 1 + 3  # <sos> 3 text <turn> 3 prompt
    assert out.speech.tolist() == [(start - 1 + i) % 12 for i in range(6)]
    assert out.info["mu"] == 1.0 and out.forward_passes == 3
    # uniform: 2 per step, the most confident (latest) positions first
    targets = [mask[start:start + 6] for mask in seen_masks]
    assert targets == [[True] * 6, [True] * 4 + [False] * 2, [True] * 2 + [False] * 4]


# plain-text copies of the papers (syncspeech.txt, palle.txt, delta_tts.txt, chain_of_details.txt) where a
# machine has them: they are not in the repository; ARNAR_PAPERS_DIR names their folder
PAPERS = Path(os.environ["ARNAR_PAPERS_DIR"]) if os.environ.get("ARNAR_PAPERS_DIR") else None


def test_decoding_samples_with_top_p_by_default(monkeypatch):
    # Sec. 3.5: "draws each candidate with top-p nucleus sampling [20]" and ranks by "the
    # probability of the sampled token". The paper gives no p (nor a temperature, nor a top-k),
    # so the default is plain nucleus sampling: temperature 1, no top-k, and p = 0.9, the value
    # this module documents as its own choice (module docstring, "Choices the paper's text leaves
    # open"). Every pass of generate must hand exactly those to the sampler.
    import arnar.paradigms.delta as delta_module

    calls = []

    def recording(logits, generator, **kwargs):
        calls.append(kwargs)
        return logits.argmax(-1), logits.softmax(-1).amax(-1)

    monkeypatch.setattr(delta_module, "sample_tokens", recording)
    out = converted().generate(request(target_frames=6), torch.Generator().manual_seed(0), steps=2,
                               schedule="uniform")
    assert out.forward_passes == 2
    assert calls == [{"temperature": 1.0, "top_k": 0, "top_p": 0.9}] * 2
    calls.clear()
    converted().generate(request(target_frames=6), torch.Generator(), steps=1, top_p=0.5)
    assert calls == [{"temperature": 1.0, "top_k": 0, "top_p": 0.5}]
    if PAPERS is not None and (PAPERS / "delta_tts.txt").is_file():  # the passage, and no value of p anywhere in the paper
        paper = (PAPERS / "delta_tts.txt").read_text()
        assert "draws each candidate with top-$p$ nucleus sampling" in paper
        assert not re.search(r"\$?p\$?\s*=\s*0?\.\d|top-\$?p\$?[\s(=:]*(of\s*)?0?\.\d", paper)


def test_unknown_decoding_option_is_an_error():
    with pytest.raises(ValueError, match="unknown options"):
        converted().generate(request(target_frames=4), torch.Generator(), stepz=4)


# ----------------------------------------------------------------------------- Table 5: causal-LoRA baseline

def causal_lora(seed=0, **options):
    return converted(seed, causal=True, conv=False, **options)


def test_causal_lora_baseline_is_the_ar_model_with_delta_lora_only():
    model = causal_lora()
    assert model.conv_modules is None and model.mask_embedding is None
    wrapped = [n for n, m in model.named_modules() if isinstance(m, LoRALinear)]
    assert len(wrapped) == 7 * TINY["n_layers"]  # DELTA's LoRA: the seven projections of every block
    trainable = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable)
    # DELTA's LoRA budget: rank 16 x (in + out) per projection = 16 x 736 per block (see the conv budget test)
    assert sum(trainable.values()) == 16 * 736 * TINY["n_layers"] == 23552
    lora_of_delta = sum(p.numel() for n, p in converted().named_parameters() if ".lora_" in n)
    assert sum(trainable.values()) == lora_of_delta
    with pytest.raises(ValueError, match="conv: false"):
        converted(causal=True)  # the conv module sees future frames


def test_causal_lora_baseline_trains_with_the_ar_example_and_objective():
    ar, model = ar_model(), causal_lora()
    ex = model.training_example(utterance(), torch.Generator().manual_seed(0))
    # AR's layout, hand-worked: <sos> t1 t2 t3 <turn> c5..c9 (input), next token as target, text unscored
    assert ex.input_ids.tolist() == [SOS, 9, 10, 11, TURN, 23, 24, 25, 26, 27]
    assert ex.targets.tolist() == [IGNORE] * 4 + [23, 24, 25, 26, 27, EOS]
    assert ex.attention_mask is None  # causal
    assert model.sequence_length(utterance()) == 10
    batch = collate([ex, model.training_example(utterance(text=(4,), speech=(1, 2)), torch.Generator())])
    out, expected = model(batch), ar(batch)  # LoRA starts at zero: the AR model's own loss
    assert torch.allclose(out.loss_sum, expected.loss_sum, atol=1e-5) and int(out.n_targets) == 6 + 3
    out.loss_sum.backward()
    assert all(p.grad is None for n, p in model.named_parameters() if ".lora_" not in n)
    assert model.backbone.layers[0].mlp.up_proj.lora_B.grad.abs().sum() > 0


def test_causal_lora_baseline_decodes_as_the_ar_model():
    ar, model = ar_model(), causal_lora()
    req = request(text=(1, 2, 3), prompt_text=(4,), prompt_speech=(4, 5, 6))
    got = model.generate(req, torch.Generator().manual_seed(5))
    expected = ar.generate(req, torch.Generator().manual_seed(5))
    assert torch.equal(got.speech, expected.speech) and got.forward_passes == expected.forward_passes
    # AR decoding: one pass for the prefix, one per token after the first (KV cache), <eos> or the bound
    assert got.forward_passes == len(got.speech) + int(got.info["stopped_by_eos"])
    with pytest.raises(ValueError, match="unknown options"):
        model.generate(req, torch.Generator(), steps=16)  # AR's options, not the conversion's
    # the adapters are in the cached decoding path: non-zero LoRA changes what it says
    with torch.no_grad():
        for layer in model.backbone.layers:
            layer.mlp.down_proj.lora_B.normal_(std=0.5)
    assert not torch.equal(model.generate(req, torch.Generator().manual_seed(5)).speech, expected.speech)


def test_causal_lora_checkpoint_loads_strictly():
    model = causal_lora(seed=1)
    state = model.state_dict()
    assert not any(k.startswith(("conv_modules.", "mask_embedding")) for k in state)
    fresh = build_paradigm("delta", VOCAB, TINY, causal=True, conv=False)
    fresh.load_state_dict(state, strict=True)


def train_commands(workflow, profile, targets, profiles=None):
    """``run -> Hydra overrides`` of the train jobs a dry run plans (workflow/rules/runs.smk)."""
    import json
    import re

    from smoke_dag import BIN, run

    config = [f"profile={profile}"] + ([f"profiles={json.dumps(profiles)}"] if profiles else [])
    out = run([str(BIN / "snakemake"), "-n", "-p", "--cores", "1", *targets, "--config", *config], workflow).stdout
    jobs = re.finditer(r"arnar train --run-dir \S+/runs/(\w+) .*? -- (.*?) 2>", out)
    return {m.group(1): m.group(2).split() for m in jobs}


def test_table5_runs_in_the_dag(tmp_path):
    """delta_table5 plans the unfrozen run and the causal-LoRA baseline: the AR run DELTA converts,
    DELTA's options with causal=true conv=false, and the conversion's per-profile overrides (the
    same updates)."""
    from smoke_dag import copy_workflow

    workflow = copy_workflow(tmp_path / "wf")
    table5 = {"smoke": {"training": {"ablations": ["delta_table5"],
                                     "overrides": {"delta": ["train.max_steps=7"]}}}}
    runs = train_commands(workflow, "smoke", ["data/smoke/systems/ar_lora/cross_sentence",
                                              "data/smoke/systems/delta_unfrozen/cross_sentence"], table5)
    assert set(runs) == {"ar", "ar_lora", "delta_unfrozen"}
    assert runs["ar_lora"] == ["paradigm=delta", "model=tiny", "train=smoke", "train.seed=1234",
                               "paradigm.options.ar_run=data/smoke/runs/ar",
                               "paradigm.options.bpe_model=data/smoke/tokenizers/bpe.model",
                               "paradigm.options.causal=true", "paradigm.options.conv=false", "train.max_steps=7"]
    assert runs["delta_unfrozen"][0] == "paradigm=delta_unfrozen" and runs["delta_unfrozen"][-1] == "train.max_steps=7"
    assert "paradigm.options.ar_run=data/smoke/runs/ar" in runs["delta_unfrozen"]


# ----------------------------------------------------------------------------- paper-scale mapping

HF_NAMES = {"attn_norm.weight": "input_layernorm.weight", "mlp_norm.weight": "post_attention_layernorm.weight",
            **{f"attn.{p}.{w}": f"self_attn.{p}.{w}" for p in ("q_proj", "k_proj", "v_proj") for w in ("weight", "bias")},
            "attn.o_proj.weight": "self_attn.o_proj.weight",
            **{f"mlp.{p}.weight": f"mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")}}
QWEN = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
        "intermediate_size": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu"}


def cosyvoice_lm(version, speech_size=5, text_size=10):
    """A random CosyVoice-shaped LM state dict (keys as in llm.pt) and its backbone."""
    torch.manual_seed(7)
    backbone = Transformer(TransformerConfig(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=64, qkv_bias=True))
    state = {"llm.model.model.norm.weight": backbone.norm.weight.detach(),
             "llm.model.model.embed_tokens.weight": torch.randn(text_size, 32)}
    for ours, hf in HF_NAMES.items():
        state[f"llm.model.model.layers.0.{hf}"] = backbone.state_dict()[f"layers.0.{ours}"]
    extra = 3 if version == 2 else 200
    state["speech_embedding.weight"] = torch.randn(speech_size + extra, 32)
    state["llm_decoder.weight"] = torch.randn(speech_size + extra, 32)
    if version == 2:
        state["llm_embedding.weight"] = torch.randn(2, 32)
        state["llm_decoder.bias"] = torch.randn(speech_size + extra)
    return state, backbone.eval()


@pytest.mark.parametrize("version", [2, 3])
def test_cosyvoice_lm_maps_onto_the_ar_layout(version):
    S = 5
    state, backbone = cosyvoice_lm(version, S)
    if version == 2:
        with pytest.raises(ValueError, match="bias"):
            ar_from_cosyvoice_lm(state, QWEN, version=2, speech_size=S)
    ar = ar_from_cosyvoice_lm(state, QWEN, version=version, speech_size=S, drop_head_bias=True).eval()
    text, codes = torch.tensor([0, 4, 9]), torch.tensor([2, 0, 4])
    # CosyVoice's own input: sos, Qwen2 text embeddings, task id, speech embeddings
    speech_table = state["speech_embedding.weight"]
    if version == 2:
        sos, task = state["llm_embedding.weight"]
        eos = S
    else:
        sos, task, eos = speech_table[S], speech_table[S + 2], S + 1
    inputs = torch.cat([sos[None], state["llm.model.model.embed_tokens.weight"][text], task[None], speech_table[codes]])
    with torch.no_grad():
        hidden = backbone(inputs[None], torch.arange(len(inputs)))
        expected = hidden @ state["llm_decoder.weight"].T  # [1, 8, S + extra] (bias dropped)
        ids = torch.cat([torch.tensor([SOS]), ar.vocab.text(text), torch.tensor([TURN]), ar.vocab.speech(codes)])
        got = ar.logits(ids[None], torch.arange(len(ids)))
    assert torch.allclose(got[..., ar.vocab.speech_offset:], expected[..., :S], atol=1e-5)
    assert torch.allclose(got[..., EOS], expected[..., eos], atol=1e-5)
    assert torch.equal(ar.embed.weight[EOS], speech_table[eos])
    delta = convert_ar(ar)  # and it converts
    assert torch.allclose(delta.mask_embedding, speech_table[:S].mean(0), atol=1e-6)
