"""Every paradigm's ``generate`` gives the same codes for a fixed seed as it did before the decoding
loops were optimised (issue 23 item 1: loop overhead).

The expected outputs below (``EXPECTED``) were produced by the code *before* that optimisation
(commit 6421689, the decoding loops as they stood then), by running this module as a script
with that commit's ``src`` first on the path (``PYTHONPATH=<its src> python
tests/test_decode_identical.py`` prints them). They pin behaviour: an optimisation that changes
one sampled code, one random number consumed (each case also records the generator's next draw
after ``generate``), or one pass has changed the decoding, not just its speed. Small random-weight models (weights redrawn at a larger scale so that the
distributions are peaked and position-dependent, zero-initialised adapters included), vocabularies
larger than the top-k, each paradigm's default options plus the variants that take other code
paths (oracle vs predicted lengths and durations, greedy, cache off, refinement rules, guidance
forms).

The models are float32 on the CPU with one thread; the codes depend on exact float arithmetic, so
a different CPU (or BLAS build) could in principle flip a near-tie. If this test fails on another
machine while the same commit passes here, regenerate the lists there from the pre-optimisation
commit before concluding anything.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch

from arnar.paradigms import build_paradigm
from arnar.paradigms.base import SynthesisRequest, Vocab

VOCAB = Vocab(text_size=20, speech_size=40)  # larger than AR's top-k 25 over the whole id space
MODEL = {"dim": 32, "n_layers": 2, "n_heads": 4, "ffn_dim": 64, "dropout": 0.0}
COD_OPTIONS = {"speaker_dim": 8, "n_phonemes": 16, "duration_dim": 16, "duration_layers": 1, "duration_heads": 2}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def build(name: str, **options: Any) -> torch.nn.Module:
    """A random model whose every floating parameter (zero-initialised adapters, adaLN maps and
    conv outputs included) is redrawn from one seeded generator: N(0, 0.3^2) for matrices, N(0, 0.1^2)
    for vectors, so that distributions are peaked and every module matters."""
    torch.manual_seed(0)
    model = build_paradigm(name, VOCAB, MODEL, **options).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            if p.is_floating_point():
                p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() >= 2 else 0.1))
    return model


def request(seed: int, target_frames: int | None, text_len: int = 5, prompt_frames: int = 9,
            cod: bool = False, text_ends: bool = False) -> SynthesisRequest:
    g = torch.Generator().manual_seed(100 + seed)
    text = torch.randint(VOCAB.text_size, (text_len,), generator=g)
    prompt_text = torch.randint(VOCAB.text_size, (3,), generator=g)
    prompt = torch.randint(VOCAB.speech_size, (prompt_frames,), generator=g)
    req = SynthesisRequest(text, prompt_text, prompt, target_frames=target_frames)
    if text_ends:  # oracle a_n: 1..4 frames per text token
        req.text_ends = torch.randint(1, 5, (text_len,), generator=g).cumsum(0)
    if cod:
        req.features = {"phonemes": torch.randint(16, (2 * text_len,), generator=g),
                        "prompt_phonemes": torch.randint(16, (5,), generator=g),
                        "speaker": torch.randn(8, generator=g)}
    return req


# (case name, paradigm, build options, request options, decoding options)
CASES: list[tuple[str, str, dict, dict, dict]] = [
    ("ar", "ar", {}, {"target_frames": None}, {}),
    ("ar_given", "ar", {}, {"target_frames": 14}, {}),
    ("ar_greedy", "ar", {}, {"target_frames": 12}, {"temperature": 0}),
    ("ar_no_filter", "ar", {}, {"target_frames": None}, {"top_k": 0, "top_p": 1.0, "ras_window": 0}),
    ("nar", "nar", {}, {"target_frames": 17}, {}),
    ("nar_eq11", "nar", {}, {"target_frames": None}, {"steps": 5, "top_k": 6}),
    ("syncspeech_oracle", "syncspeech", {"max_duration": 6}, {"target_frames": None, "text_ends": True}, {}),
    ("syncspeech", "syncspeech", {"max_duration": 6}, {"target_frames": None}, {"chunk_size": 4}),
    ("syncspeech_sampled", "syncspeech", {"max_duration": 6}, {"target_frames": None}, {"speech_top_k": 3}),
    ("syncspeech_uncached", "syncspeech", {"max_duration": 6, "q": 2}, {"target_frames": None},
     {"cached": False, "speech_top_k": 2}),
    ("palle", "palle", {"stage": 2}, {"target_frames": 16}, {"steps": 10}),
    ("palle_defaults", "palle", {"stage": 2}, {"target_frames": 21}, {}),
    ("palle_stage_one_confidence", "palle", {"stage": 2}, {"target_frames": 16},
     {"steps": 5, "refine_rule": "stage_one_confidence", "gamma": 0.2}),
    ("palle_even_split", "palle", {"stage": 2}, {"target_frames": None},
     {"steps": 4, "stage_one_rule": "even_split", "refine_steps": 3}),
    ("delta", "delta", {}, {"target_frames": 18}, {}),
    ("delta_uniform", "delta", {}, {"target_frames": 11}, {"steps": 4, "schedule": "uniform", "top_k": 5}),
    ("delta_rule", "delta", {}, {"target_frames": None}, {"steps": 8}),
    ("cod", "cod", COD_OPTIONS, {"target_frames": 22, "cod": True}, {"steps": 6}),
    ("cod_predictor", "cod", COD_OPTIONS, {"target_frames": None, "cod": True},
     {"steps": 4, "guidance_form": "interpolate", "top_p": 0.8}),
    ("cod_unguided", "cod", COD_OPTIONS, {"target_frames": 13, "cod": True},
     {"steps": 5, "guidance_start": 0.0, "guidance_end": 0.0, "noise_start": 0.0, "top_k": 4}),
]
SEEDS = (0, 1, 2)


def run_case(name: str) -> list[tuple[list[int], int, int]]:
    """``[(codes, forward_passes, next draw)]`` of one case, one entry per seed (the request varies
    with it too); the next draw is the generator's next 31-bit integer after ``generate``, which
    pins how many random numbers decoding consumed."""
    _, paradigm, options, req_options, decoding = next(case for case in CASES if case[0] == name)
    model = build(paradigm, **options)
    out = []
    for seed in SEEDS:
        generator = torch.Generator().manual_seed(seed)
        generation = model.generate(request(seed, **req_options), generator, **decoding)
        next_draw = int(torch.randint(2 ** 31, (), generator=generator))
        out.append((generation.speech.tolist(), int(generation.forward_passes), next_draw))
    return out


# Produced by the code before the loop-overhead optimisation (see the module docstring).
EXPECTED: dict[str, list[tuple[list[int], int, int]]] = {
    'ar':
        [([30, 32, 4, 25, 8, 8, 0, 2, 17, 7, 12, 34, 11, 30, 15, 28, 1, 10, 16, 1, 25, 27, 9, 31, 34, 37, 10,
           38, 1, 25, 24, 12, 1, 26, 9, 38, 12, 33, 9, 23, 0, 28, 4, 28, 12, 30, 24],
          48, 361440020),
         ([34, 0, 25, 39, 30, 14, 33, 27, 18, 18, 14, 6, 39, 24, 28, 10, 30, 7, 28, 30, 2, 21, 9], 24,
          1876628773),
         ([2, 23, 17, 14, 30, 15, 13, 28, 10, 21, 0, 2, 23, 15, 33, 18, 20, 1, 18, 9, 7, 0, 38, 36, 39, 34, 10,
           7, 13, 3, 0, 35, 10, 23, 26, 29, 25],
          38, 1963865299)],
    'ar_given':
        [([30, 32, 4, 25, 8, 8, 0, 2, 17, 7, 12, 34, 11, 30], 14, 1681825388),
         ([34, 0, 25, 39, 30, 14, 33, 27, 18, 18, 14, 6, 39, 24], 14, 363051456),
         ([2, 23, 17, 14, 30, 15, 13, 28, 10, 21, 0, 2, 23, 15], 14, 1959560559)],
    'ar_greedy':
        [([26, 25, 8, 25, 8, 30, 28, 37, 30, 28, 37, 32], 12, 144418678),
         ([34, 25, 27, 23, 2, 7, 25, 8, 34, 0, 15, 25], 12, 1264917461),
         ([14, 30, 32, 2, 7, 25, 8, 25, 8, 13, 11, 34], 12, 1182996620)],
    'ar_no_filter':
        [([30, 32, 4, 25, 8, 8, 0, 2, 17, 0, 20, 34, 11, 30, 15, 28, 39, 31, 16, 15, 25, 27, 24, 9, 31, 34, 37,
           12, 15, 1, 25, 7, 10, 1, 26, 39, 38, 12, 33, 9, 32, 36, 36, 4, 28, 0, 29, 24],
          49, 361440020),
         ([34, 0, 25, 39, 30, 14, 33, 6, 13, 18, 11, 36, 33, 24, 28, 23, 30, 7, 28, 30, 2, 1, 30, 9, 19, 27, 19,
           4, 24, 39, 0, 13, 29, 22, 1, 5, 27, 14, 9, 36, 39, 32, 37, 18, 22, 5, 0, 0, 37, 15, 15, 25, 34, 32,
           39, 33, 22, 7, 2, 5, 6, 25, 8, 13, 13, 39, 16, 22, 30],
          70, 1886559358),
         ([13, 11, 3, 34, 30, 39, 4, 39, 34, 21, 0, 2, 23, 15, 33, 18, 20, 1, 18, 9, 7, 0, 38, 36, 2, 36, 10,
           24, 13, 27, 0, 35],
          33, 1365465791)],
    'nar':
        [([6, 34, 12, 5, 7, 25, 35, 32, 16, 34, 17, 16, 12, 32, 17, 3, 31], 16, 1002777971),
         ([34, 5, 17, 16, 21, 39, 5, 35, 27, 27, 15, 3, 36, 19, 29, 13, 20], 16, 1869121129),
         ([34, 32, 24, 20, 21, 35, 20, 25, 27, 22, 6, 2, 36, 14, 26, 32, 32], 16, 155929931)],
    'nar_eq11':
        [([19, 5, 28, 28, 5, 5, 34, 28, 5, 34, 28, 34, 5, 35, 35], 5, 965411274),
         ([35, 19, 36, 19, 28, 19, 36, 19, 19, 34, 35, 19, 35, 35, 28], 5, 835441654),
         ([5, 28, 19, 19, 19, 36, 19, 36, 34, 35, 34, 36, 28, 36, 19], 5, 191615210)],
    'syncspeech_oracle':
        [([13, 13, 16, 16, 16, 16, 16, 16, 16, 16, 16], 6, 398764591),
         ([23, 37, 37, 37, 37, 37, 37, 37], 6, 2135392491),
         ([9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9], 6, 794921487)],
    'syncspeech':
        [([16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 15, 15, 15, 15], 6,
          426405863),
         ([37, 37, 37, 37, 37, 37, 37, 37], 6, 1916133090),
         ([16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16], 6, 2118562592)],
    'syncspeech_sampled':
        [([16, 16, 16, 13, 29, 16, 16, 29, 13, 16, 13, 29, 3, 13, 13, 16, 13, 16], 6, 615980412),
         ([23, 16, 23, 23, 37, 23, 16, 23, 37, 37, 16, 16, 23, 37, 37, 23, 37, 16, 23, 16], 6, 328376135),
         ([29, 16, 29, 29, 29, 16, 16, 16, 13, 16], 6, 465442189)],
    'syncspeech_uncached':
        [([16, 16, 16, 13, 13, 16, 16, 16, 13, 16, 13, 16, 13, 13, 13, 16, 13, 16], 6, 615980412),
         ([23, 23, 23, 23, 37, 23, 37, 23, 37, 37, 37, 23, 23, 37, 37, 23, 37, 23, 23, 23], 6, 328376135),
         ([16, 16, 9, 16, 16, 16, 16, 16, 13, 16], 6, 465442189)],
    'palle':
        [([19, 19, 37, 19, 3, 37, 16, 0, 29, 17, 33, 23, 11, 1, 16, 31], 22, 2039615013),
         ([19, 37, 37, 1, 17, 0, 33, 16, 11, 0, 7, 23, 33, 0, 3, 31], 22, 1625841890),
         ([37, 17, 3, 19, 7, 20, 17, 29, 11, 37, 0, 37, 38, 3, 32, 20], 22, 1321648536)],
    'palle_defaults':
        [([31, 23, 19, 19, 3, 29, 19, 19, 16, 37, 33, 6, 11, 33, 1, 33, 17, 3, 16, 16, 31], 35, 451355229),
         ([16, 6, 19, 33, 7, 1, 29, 31, 11, 4, 11, 7, 33, 0, 3, 19, 0, 25, 23, 37, 37], 35, 1266867827),
         ([0, 1, 3, 19, 16, 20, 29, 16, 23, 19, 31, 6, 23, 3, 33, 37, 33, 17, 31, 3, 22], 35, 543048837)],
    'palle_stage_one_confidence':
        [([9, 33, 31, 29, 37, 4, 1, 31, 16, 16, 9, 23, 19, 4, 17, 23], 8, 680942458),
         ([28, 1, 37, 19, 33, 6, 7, 16, 19, 37, 31, 7, 23, 31, 32, 29], 8, 779913986),
         ([6, 1, 16, 31, 29, 37, 17, 37, 17, 37, 32, 17, 7, 16, 19, 1], 8, 1183136397)],
    'palle_even_split':
        [([19, 19, 37, 19, 3, 37, 1, 0, 33, 0, 33, 25, 11, 31, 37], 10, 2084604657),
         ([19, 0, 16, 1, 23, 0, 33, 17, 11, 0, 11, 0, 33, 0, 3], 10, 306117459),
         ([36, 11, 3, 19, 11, 17, 37, 17, 11, 37, 0, 37, 25, 3, 33], 10, 1328428579)],
    'delta':
        [([29, 17, 23, 4, 4, 4, 14, 14, 29, 14, 24, 29, 20, 4, 2, 2, 14, 32], 12, 1628831725),
         ([14, 14, 9, 35, 27, 23, 21, 14, 4, 14, 14, 14, 25, 23, 14, 38, 29, 2], 12, 922605020),
         ([2, 24, 29, 24, 17, 14, 4, 23, 36, 14, 14, 4, 2, 29, 14, 14, 4, 14], 12, 301586347)],
    'delta_uniform':
        [([23, 14, 4, 29, 14, 14, 14, 29, 14, 23, 23], 4, 1710222731),
         ([14, 29, 22, 14, 23, 29, 14, 14, 14, 23, 24], 4, 112614155),
         ([29, 14, 23, 23, 29, 14, 14, 14, 23, 14, 23], 4, 501587072)],
    'delta_rule':
        [([4, 18, 14, 4, 27, 14, 23, 0, 29, 14, 8, 4, 4, 22, 34], 7, 1922470869),
         ([14, 35, 1, 14, 2, 10, 14, 17, 33, 27, 14, 20, 23, 5, 29], 7, 1820247864),
         ([22, 2, 4, 24, 5, 14, 23, 14, 10, 24, 38, 4, 35, 27, 24], 7, 909018443)],
    'cod':
        [([3, 31, 11, 29, 19, 5, 12, 6, 1, 36, 24, 1, 24, 38, 20, 1, 23, 38, 1, 38, 14, 36], 18, 2072121675),
         ([33, 37, 1, 25, 38, 22, 19, 1, 1, 6, 4, 25, 27, 38, 25, 25, 19, 38, 25, 3, 25, 13], 18, 639026410),
         ([19, 7, 7, 7, 19, 7, 7, 7, 37, 32, 7, 7, 7, 7, 7, 7, 7, 19, 35, 7, 7, 7], 18, 1813497370)],
    'cod_predictor':
        [([38, 23, 17, 9, 3, 10, 38, 38], 10, 784703550), ([19, 19, 1, 1, 21, 25], 9, 1812944687),
         ([19, 32, 25, 19, 7, 4, 7, 7, 19, 32, 7, 25, 7], 12, 2139751740)],
    'cod_unguided':
        [([38, 19, 23, 38, 38, 38, 38, 23, 38, 38, 38, 36, 38], 14, 761673090),
         ([19, 19, 19, 19, 25, 38, 19, 19, 38, 19, 19, 19, 19], 14, 1012289781),
         ([7, 7, 7, 19, 7, 7, 7, 7, 19, 7, 7, 7, 19], 14, 1880136984)],
}


@pytest.mark.parametrize("name", [case[0] for case in CASES])
def test_generate_unchanged(name):
    assert run_case(name) == EXPECTED[name]


# ----------------------------------------------------------------------------- the sampler itself
# The sampling functions against the formulation they replaced (copied here as it stood before the
# optimisation): the same ids and the same generator state, on random rows and on the edges where
# the shortcuts must hand over to the exact computation.

def reference_filter(logits, top_k=0, top_p=1.0):
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        before = probs.cumsum(-1) - probs
        drop = torch.zeros_like(before, dtype=torch.bool).scatter(-1, order, before >= top_p)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def reference_sample(logits, generator, *, temperature=1.0, top_k=0, top_p=1.0):
    flat = logits.reshape(-1, logits.shape[-1]).float()
    full_probs = flat.softmax(-1)
    if temperature <= 0:
        ids = flat.argmax(-1)
    else:
        filtered = reference_filter(flat / temperature, top_k, top_p).softmax(-1)
        ids = torch.multinomial(filtered, 1, generator=generator).squeeze(-1)
    return ids, full_probs.gather(-1, ids[:, None]).squeeze(-1)


def same_draws(logits, seed, **options):
    """sample_tokens, sample_ids (and sample_ids with the row's allowed range) agree with the
    reference: ids, probabilities and the generator's state after."""
    from arnar.decode.sampling import filter_top_k_top_p, sample_ids, sample_tokens

    g_ref, g_new, g_ids = (torch.Generator().manual_seed(seed) for _ in range(3))
    ids, probs = reference_sample(logits, g_ref, **options)
    new_ids, new_probs = sample_tokens(logits, g_new, **options)
    assert torch.equal(ids, new_ids) and torch.equal(probs, new_probs)
    assert torch.equal(ids, sample_ids(logits, g_ids, **options))
    assert torch.equal(g_ref.get_state(), g_new.get_state()) and torch.equal(g_ref.get_state(), g_ids.get_state())
    top_k, top_p = options.get("top_k", 0), options.get("top_p", 1.0)
    assert torch.equal(reference_filter(logits, top_k, top_p), filter_top_k_top_p(logits, top_k, top_p))


def test_sampler_matches_the_reference_on_random_rows():
    g = torch.Generator().manual_seed(0)
    for case in range(400):
        rows, width = [(1, 1520), (1, 60), (3, 1520), (40, 512), (80, 512)][case % 5]
        logits = torch.randn(rows, width, generator=g) * [0.3, 1.0, 4.0][case % 3]
        if case % 4 == 0:
            logits[:, :width // 3] = float("-inf")  # restricted ids
        if case % 7 == 0:
            logits = (logits * 2).round() / 2  # ties, the sort's tie order decides
        options = {"temperature": [1.0, 0.7][case % 2], "top_k": [0, 25, 5][case % 3],
                   "top_p": [1.0, 0.9, 0.3, 0.99][case % 4]}
        same_draws(logits, case, **options)


def test_sampler_hands_over_at_the_nucleus_cut_and_at_near_tied_draws():
    """The host decisions of the one-row top-k/top-p path: a top_p equal to one of the float32
    cumulative masses (the comparison's edge), and two candidates whose p/q are equal in exact
    arithmetic (the draw's edge)."""
    import math

    g = torch.Generator().manual_seed(1)
    for case in range(200):
        logits = torch.randn(1, 1520, generator=g)
        values = torch.topk(logits, 25).values
        row = torch.full((1, 1520), float("-inf"))
        row[:, :25] = values
        p = row.softmax(-1)
        edge = float((p.cumsum(-1) - p)[0, 1 + case % 20])
        same_draws(logits, case, top_k=25, top_p=edge)
        q = torch.empty(1, 1520).exponential_(1, generator=torch.Generator().manual_seed(case))
        a, b = torch.topk(logits, 2).indices[0].tolist()
        logits[0, b] = logits[0, a] + math.log(float(q[0, b]) / float(q[0, a]))
        same_draws(logits, case, top_k=25, top_p=0.99)


def test_sampler_rows_with_nan_filter_alike_and_raise():
    from arnar.decode.sampling import filter_top_k_top_p, sample_ids, sample_tokens

    for rows in (3, 40):
        logits = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
        logits[1, 7] = float("nan")
        logits[2, :] = float("-inf")
        for top_k, top_p in ((0, 0.9), (25, 0.8), (0, 1.0)):
            expected, got = reference_filter(logits, top_k, top_p), filter_top_k_top_p(logits, top_k, top_p)
            assert torch.equal(expected.isnan(), got.isnan())
            assert torch.equal(expected.nan_to_num(), got.nan_to_num())
            for sample in (sample_tokens, sample_ids):
                with pytest.raises(RuntimeError, match="probability tensor"):
                    sample(logits, torch.Generator(), top_k=top_k, top_p=top_p)


def test_exponentials_taken_ahead_are_the_generators():
    from arnar.decode.sampling import ExponentialDraws, draw, sample_ids

    g = torch.Generator().manual_seed(2)
    for trial, (block, expected) in enumerate([(1, None), (7, None), (1520, None), (16 * 1520, None),
                                               (16 * 1520, 5 * 1520), (4 * 1520, 100 * 1520)]):
        plain, ahead = torch.Generator().manual_seed(trial), torch.Generator().manual_seed(trial)
        with ExponentialDraws(ahead, block, expected) as draws:
            for step in range(12):
                logits = torch.randn(1 if step % 3 else 4, 1520, generator=g) * 2
                options = {"top_k": [0, 25][step % 2], "top_p": [1.0, 0.8][step % 3 % 2]}
                assert torch.equal(sample_ids(logits, plain, **options),
                                   sample_ids(logits, ahead, draws=draws, **options))
                probs = logits[:1].softmax(-1)
                assert torch.equal(draw(probs, plain), draw(probs, ahead, draws))
        assert torch.equal(plain.get_state(), ahead.get_state())


if __name__ == "__main__":  # print EXPECTED from the current code
    torch.set_num_threads(1)
    import pprint

    print("EXPECTED: dict[str, list[tuple[list[int], int, int]]] = {")
    for case in CASES:
        body = pprint.pformat(run_case(case[0]), width=104, compact=True).replace("\n", "\n" + " " * 8)
        print(f"    {case[0]!r}:\n        {body},")
    print("}")
    sys.exit(0)


# ----------------------------------------------------------------------------- batched decoding

def decode_alone_and_batched(model, requests, first_seed: int, decoding: dict):
    """Each request decoded alone and all of them in one ``generate_batch``, from the same seeds:
    (alone, batched, generators of the batch, each alone generator's next draw)."""
    alone, next_draws = [], []
    for i, req in enumerate(requests):
        g = torch.Generator().manual_seed(first_seed + i)
        alone.append(model.generate(req, g, **decoding))
        next_draws.append(torch.rand(1, generator=g))
    generators = [torch.Generator().manual_seed(first_seed + i) for i in range(len(requests))]
    return alone, model.generate_batch(requests, generators, **decoding), generators, next_draws


def assert_same_items(alone, batched, generators, next_draws):
    """Every item: its batch-1 codes and info, and the same random numbers consumed."""
    assert len({len(out.speech) for out in alone}) > 1  # items of different lengths
    for one, many, g, next_draw in zip(alone, batched, generators, next_draws):
        assert many.speech.tolist() == one.speech.tolist() and many.info.keys() == one.info.keys()
        assert {k: v for k, v in many.info.items() if "seconds" not in k} == \
            {k: v for k, v in one.info.items() if "seconds" not in k}
        assert torch.equal(torch.rand(1, generator=g), next_draw)


@pytest.mark.parametrize("decoding", [{}, {"temperature": 0}, {"top_k": 0, "top_p": 1.0, "ras_window": 0}],
                         ids=["default", "greedy", "no_filter"])
def test_ar_generate_batch_gives_each_item_its_batch_one_codes(decoding):
    """B items of different prompt, text and output lengths (left padding, items finishing at
    different steps, fixed and sampled lengths) decoded together: each item's batch-1 codes, <eos>
    decision and draws."""
    requests = [request(0, None, text_len=5, prompt_frames=9), request(1, 14, text_len=3, prompt_frames=4),
                request(2, None, text_len=7, prompt_frames=12), request(3, 6, text_len=4, prompt_frames=7)]
    alone, batched, generators, next_draws = decode_alone_and_batched(build("ar"), requests, 50, decoding)
    assert_same_items(alone, batched, generators, next_draws)
    assert batched[0].forward_passes == max(out.forward_passes for out in alone)  # one pass per step for all


@pytest.mark.parametrize("decoding", [{}, {"steps": 5, "top_k": 6}], ids=["default", "few_steps"])
def test_nar_generate_batch_gives_each_item_its_batch_one_codes(decoding):
    """Right-padded sequences of different prompt, text and target lengths (given and Eq. 11),
    each on its own schedule."""
    requests = [request(0, 17), request(1, None, text_len=3, prompt_frames=4), request(2, 6, text_len=7)]
    assert_same_items(*decode_alone_and_batched(build("nar"), requests, 70, decoding))


def test_nar_proportional_positions_batch_as_alone():
    requests = [request(0, 17), request(1, None, text_len=3, prompt_frames=4), request(2, 6, text_len=7)]
    assert_same_items(*decode_alone_and_batched(build("nar", text_positions="proportional"), requests, 70, {}))


@pytest.mark.parametrize("decoding", [{}, {"steps": 4, "schedule": "uniform", "top_k": 5}, {"steps": 8}],
                         ids=["default", "uniform", "eight_steps"])
def test_delta_generate_batch_gives_each_item_its_batch_one_codes(decoding):
    """The converted model's batch (right padding next to the conv modules, per-item Eq. 3
    schedules, lengths given and from the rule)."""
    requests = [request(0, 18), request(1, None, text_len=3, prompt_frames=4), request(2, 5, text_len=7)]
    assert_same_items(*decode_alone_and_batched(build("delta"), requests, 90, decoding))


def test_delta_causal_baseline_batches_as_ar():
    requests = [request(0, 8), request(1, None, text_len=3, prompt_frames=4)]
    assert_same_items(*decode_alone_and_batched(build("delta", causal=True, conv=False), requests, 3, {}))


@pytest.mark.parametrize("decoding", [{"steps": 10}, {},
                                      {"steps": 5, "refine_rule": "stage_one_confidence", "gamma": 0.2},
                                      {"steps": 4, "stage_one_rule": "even_split", "refine_steps": 3}],
                         ids=["rescore", "defaults", "stage_one_confidence", "even_split"])
def test_palle_generate_batch_gives_each_item_its_batch_one_codes(decoding):
    """Both stages batched: items of different prompt, text and target lengths (given, Eq. 11,
    one lengthened to fit its text), so different spans per pass, different numbers of stage-one
    passes and, for the short items, refinements that run out of frames before the others' (they
    ride along)."""
    requests = [request(0, 16), request(1, None, text_len=3, prompt_frames=4), request(2, 5, text_len=7),
                request(3, 3, text_len=2, prompt_frames=6), request(4, 2, text_len=7, prompt_frames=4)]
    alone, batched, generators, next_draws = decode_alone_and_batched(build("palle", stage=2), requests, 30,
                                                                      decoding)
    assert_same_items(alone, batched, generators, next_draws)
    assert len({out.info["stage_one_passes"] for out in alone}) > 1 and alone[-1].info["extended_to_fit_text"]
    assert batched[0].forward_passes == max(out.info["stage_one_passes"] for out in alone) + \
        max(out.info["refine_passes"] for out in alone)


@pytest.mark.parametrize("decoding", [{"steps": 6}, {"steps": 4, "guidance_form": "interpolate", "top_p": 0.8},
                                      {"steps": 5, "guidance_start": 0.0, "guidance_end": 0.0, "noise_start": 0.0,
                                       "top_k": 4},
                                      {"steps": 3, "length": "prompt_rate"}],
                         ids=["guided", "interpolate", "unguided", "prompt_rate"])
def test_cod_generate_batch_gives_each_item_its_batch_one_codes(decoding):
    """Every level batched, both CFG inputs in the same pass: items of different phoneme, prompt and
    target lengths (given, predicted or from the prompt's rate), so different level lengths and
    schedules; the short item's coarse levels are done before the others' (it rides along)."""
    requests = [request(0, 22, cod=True), request(1, None, text_len=3, prompt_frames=4, cod=True),
                request(2, 3, text_len=7, prompt_frames=12, cod=True), request(3, None, text_len=6, cod=True)]
    alone, batched, generators, next_draws = decode_alone_and_batched(build("cod", **COD_OPTIONS), requests, 10,
                                                                      decoding)
    assert_same_items(alone, batched, generators, next_draws)
    assert len({tuple(out.info["level_lengths"]) for out in alone}) >= 3
    assert batched[0].forward_passes == max(out.forward_passes for out in alone)  # one pass per step for all


def test_cod_proportional_positions_batch_as_alone():
    requests = [request(0, 22, cod=True), request(1, None, text_len=3, prompt_frames=4, cod=True),
                request(2, 3, text_len=7, prompt_frames=12, cod=True)]
    model = build("cod", **COD_OPTIONS, text_positions="proportional")
    assert_same_items(*decode_alone_and_batched(model, requests, 10, {"steps": 4}))


@pytest.mark.parametrize("options,decoding,oracle", [
    ({"max_duration": 6}, {}, False),
    ({"max_duration": 6}, {"speech_top_k": 3, "chunk_size": 4}, False),
    ({"max_duration": 6}, {}, True),
    ({"max_duration": 6, "q": 2}, {"cached": False, "speech_top_k": 2}, False),
    ({"max_duration": 6, "attention": "causal"}, {"speech_top_k": 2}, False),
], ids=["default", "sampled", "oracle", "uncached", "causal"])
def test_syncspeech_generate_batch_gives_each_item_its_batch_one_codes(options, decoding, oracle):
    """Text-synchronous streams batched: items of different prompt and text lengths (so different
    numbers of passes, the short ones riding along as padding), different durations per pass (so
    rows padded to the widest, and last pass's masks turned into padding slots of the shared
    cache rather than cropped)."""
    requests = [request(0, None, text_len=5, text_ends=oracle), request(1, None, text_len=2, prompt_frames=4,
                                                                        text_ends=oracle),
                request(2, None, text_len=8, prompt_frames=12, text_ends=oracle),
                request(3, None, text_len=1, prompt_frames=6, text_ends=oracle)]
    alone, batched, generators, next_draws = decode_alone_and_batched(build("syncspeech", **options), requests, 20,
                                                                      decoding)
    assert_same_items(alone, batched, generators, next_draws)
    for one, many in zip(alone, batched):
        assert many.first_packet_passes == one.first_packet_passes
    assert batched[0].forward_passes == max(out.forward_passes for out in alone) == 9  # L + 1 for the longest


def test_a_padded_pass_gives_batch_one_hidden_states_up_to_rounding():
    """Why the batched tests above compare decisions (codes, info, draws) and not logits: a pass
    over a right-padded batch (``right_padded`` / ``padded_attention``, as NAR, DELTA, PALLE and
    CoD decode) gives each item's real positions its batch-1 hidden states only up to float
    rounding, since the attention and matmul kernels may sum in another order for another batch
    shape (a few float32 ulps; at dim 256 on this CPU, up to ~4e-7). A decision then differs from
    batch 1 only where two candidates lie closer than that, which the tests above check does not
    happen on their models; the difference itself is bounded here."""
    from arnar.paradigms.base import right_padded, padded_attention

    g = torch.Generator().manual_seed(0)
    lengths = (5, 13, 8)
    speech = [torch.randint(VOCAB.speech_offset, VOCAB.size, (n,), generator=g) for n in lengths]
    text = [torch.randint(VOCAB.text_offset, VOCAB.speech_offset, (n,), generator=g) for n in lengths]
    nar, palle = build("nar"), build("palle", stage=2).stage_one
    passes = {
        "nar": lambda ids, _, attention: nar.backbone(nar.embed(ids), torch.arange(ids.shape[1]), attention),
        "palle": lambda ids, texts, attention: palle.hidden(ids, texts, torch.arange(ids.shape[1]), attention),
    }
    batch, keys = right_padded(speech)
    texts, _ = right_padded(text)
    with torch.no_grad():
        for name, run in passes.items():
            together = run(batch, texts, padded_attention(keys))
            for b, n in enumerate(lengths):
                alone = run(speech[b][None], text[b][None], torch.ones(1, n, n, dtype=torch.bool))
                torch.testing.assert_close(together[b, :n], alone[0], rtol=0, atol=1e-5, msg=name)
