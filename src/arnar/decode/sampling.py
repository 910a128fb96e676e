"""Token sampling: temperature, top-k, top-p (nucleus), greedy; restricted to allowed ids.

All functions work on the last dimension of ``logits`` and take an explicit
``torch.Generator`` so that a synthesis run is reproducible from its seed.

Speed (issue 23: the decoding loops' overhead outside the network). The results are those of
the plain formulation, bit for bit and draw for draw (tests/test_decode_identical.py pins
every paradigm's output; tests/test_paradigms.py checks these functions against the plain
formulation on random inputs). What makes them cheaper:

* a draw is ``torch.multinomial(probs, 1)`` without its input checks: ``argmax(probs / q)`` with
  ``q ~ Exp(1)`` drawn from the generator over the whole row (:func:`draw`), which is how
  ``multinomial`` draws one sample, so the same generator gives the same ids and ends in the
  same state;
* top-k followed by top-p on one CPU row (the AR loop's step) sorts nothing: the sorted filtered
  row is the top-k values followed by -inf, the cumulative mass of the nucleus is summed on the
  host exactly as ``torch.cumsum`` does it (float32 values, double accumulator) and compared in
  float32, and the kept ids are written into a row of -inf (:func:`_sample_row_top_k_top_p`);
* temperature 1 divides by nothing (``x / 1.0 == x`` exactly), and without filtering the
  filtered softmax is the full one, computed once;
* top-p on many CPU rows sorts the values with numpy (an AVX-512 sort, ~20x faster than
  ``torch.sort`` on rows of 512; the sorted values are the same numbers whatever the algorithm)
  and maps the kept prefix back by a threshold instead of scattering sort indices; where that
  mapping could differ from the scatter (a tie across the cut, a dropped set that is not a
  suffix of the sorted row) the row batch takes the plain path (:func:`top_p_drop`).
"""

from __future__ import annotations

import itertools
import operator
from array import array

import torch

# top-p rows at or above this many elements sort with numpy on the CPU (below, torch.sort's fixed
# cost is smaller than the conversions)
NUMPY_SORT_MIN_ELEMENTS = 16384


def restrict_logits(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Set the logits of ids outside ``allowed`` (a bool [V] vector) to -inf."""
    return logits.masked_fill(~allowed.to(logits.device), float("-inf"))


def _top_p_drop_sorted(sorted_logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Drop mask in sorted order (descending): an id is dropped once the mass before it reaches top_p."""
    probs = sorted_logits.softmax(-1)
    before = probs.cumsum(-1) - probs
    return before >= top_p


def _top_p_drop_plain(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    drop_sorted = _top_p_drop_sorted(sorted_logits, top_p)
    # every position of a row is in ``order`` once: the scatter writes the whole tensor
    return torch.empty_like(drop_sorted).scatter_(-1, order, drop_sorted)


def _top_p_drop_numpy(logits: torch.Tensor, top_p: float) -> torch.Tensor | None:
    """The drop mask from numpy-sorted values, or None where only the plain path is exact."""
    import numpy as np

    V = logits.shape[-1]
    ascending = np.sort(logits.detach().numpy(), axis=-1)
    sorted_logits = torch.from_numpy(np.ascontiguousarray(ascending[:, ::-1]))
    drop_sorted = _top_p_drop_sorted(sorted_logits, top_p)
    kept = V - drop_sorted.sum(-1, keepdim=True)  # >= 1: the first id has no mass before it
    position = torch.arange(V)
    # the scatter's drop set is {ids at sorted positions >= kept} when the dropped positions are a
    # suffix and the value at the cut is not repeated after it (a tie across the cut is ordered by
    # torch.sort's tie rule); then it is {ids whose logit < the last kept value}
    threshold = sorted_logits.gather(-1, kept - 1)
    after = sorted_logits.gather(-1, kept.clamp(max=V - 1))
    suffix = torch.equal(drop_sorted, position >= kept)
    untied = bool(((after < threshold) | (kept == V)).all())
    if not (suffix and untied):
        return None
    return logits < threshold


def top_p_drop(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Bool mask of the ids nucleus sampling drops (``[..., V]``, rows independent): sorted by
    logit, an id is dropped once the probability mass strictly before it reaches ``top_p``."""
    if logits.device.type == "cpu" and logits.dim() == 2 and logits.dtype == torch.float32 \
            and logits.numel() >= NUMPY_SORT_MIN_ELEMENTS and logits.shape[-1] > 1:
        drop = _top_p_drop_numpy(logits.contiguous(), top_p)
        if drop is not None:
            return drop
    return _top_p_drop_plain(logits, top_p)


def filter_top_k_top_p(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Keep the ``top_k`` largest logits (0: all) and the smallest set of ids whose probability
    sums to at least ``top_p`` (1.0: all); the rest become -inf. The most likely id always stays."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        logits = logits.masked_fill(top_p_drop(logits, top_p), float("-inf"))
    return logits


def draw(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One id per row of ``probs`` [R, V] (rows need not be normalised), exactly
    ``torch.multinomial(probs, 1, generator=generator).squeeze(-1)``: ``multinomial`` draws a
    single sample as ``argmax(probs / q)`` with ``q ~ Exp(1)`` over the whole tensor, and so does
    this, from the same generator (same ids, same generator state after), without
    ``multinomial``'s checks, of which one is kept: negative or NaN probabilities raise."""
    if not bool((probs >= 0).all()):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    return _unchecked_draw(probs, generator)


def _unchecked_draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    q = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / q).argmax(-1)


_NEG_INF_ROWS: dict[tuple[int, torch.dtype], torch.Tensor] = {}


def _neg_inf_row(length: int, dtype: torch.dtype) -> torch.Tensor:
    """A shared, never written ``[1, length]`` CPU row of -inf (out-of-place ops read it)."""
    row = _NEG_INF_ROWS.get((length, dtype))
    if row is None:
        row = _NEG_INF_ROWS[(length, dtype)] = torch.full((1, length), float("-inf"), dtype=dtype)
    return row


def _as_float32(values) -> array:
    return array("f", values)  # C's double -> float conversion: round to nearest, as a float32 tensor holds it


def _sample_row_top_k_top_p(scaled: torch.Tensor, generator: torch.Generator | None, top_k: int, top_p: float,
                            vocab_size: int, offset: int) -> torch.Tensor | None:
    """:func:`filter_top_k_top_p` then a draw, for one CPU float32 row, or None (nothing drawn)
    where this shortcut could differ from the plain path: a tie at the k-th value or across the
    nucleus's cut, a dropped set that is not a suffix. ``scaled`` ``[1, V']`` holds the allowed
    ids ``offset .. offset + V' - 1`` of a row of ``vocab_size`` whose other ids are -inf
    (``0 < top_k < V' - 1``, ``top_p < 1``).

    After top-k the row sorted is the ``top_k`` largest values, descending, then -inf, so the
    nucleus's softmax is that of ``cat([values, -inf...])`` (the same numbers, so the same floats
    as the sort's). ``before = cumsum(p) - p >= top_p`` is then evaluated on the host: torch's CPU
    cumsum of float32 accumulates in double and rounds each prefix to float32, the difference of
    two float32 numbers computed in double and rounded to float32 is the float32 difference (double
    rounding is innocuous for p' >= 2p + 2), and a float32 tensor compares with a Python float
    rounded to float32. The nucleus is then a prefix of the top-k ids, scattered into -inf."""
    K = top_k
    values, ids = torch.topk(scaled, K + 1, dim=-1)
    v = values[0].tolist()
    if not v[K] < v[K - 1]:  # the k-th value repeated outside the top k (or -inf, NaN): plain path
        return None
    p_sorted = torch.cat([values[:, :K], _neg_inf_row(vocab_size - K, scaled.dtype)], dim=1).softmax(-1)
    p = p_sorted[0, :K].tolist()
    before = _as_float32(map(operator.sub, _as_float32(itertools.accumulate(p)), p))
    threshold = _as_float32((top_p,))[0]
    n_kept = next((i for i, b in enumerate(before) if b >= threshold), K)
    if n_kept < K and not (v[n_kept] < v[n_kept - 1] and all(b >= threshold for b in before[n_kept:])):
        return None  # a tie across the cut (ordered by torch.sort's rule), or not a suffix (rounding)
    kept = ids[:, :n_kept]
    row = _neg_inf_row(vocab_size, scaled.dtype).scatter(1, kept + offset if offset else kept, values[:, :n_kept])
    return _unchecked_draw(row.softmax(-1), generator)


def _filtered_probs(flat: torch.Tensor, temperature: float, top_k: int, top_p: float,
                    full_probs: torch.Tensor | None) -> torch.Tensor:
    scaled = flat if temperature == 1.0 else flat / temperature  # x / 1.0 == x exactly
    filtered = filter_top_k_top_p(scaled, top_k, top_p)
    if filtered is flat and full_probs is not None:  # nothing filtered, nothing scaled
        return full_probs
    return filtered.softmax(-1)


def sample_ids(
    logits: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    allowed_from: int = 0,
) -> torch.Tensor:
    """The ids of :func:`sample_tokens` alone (the same ids and draws), without the probabilities.
    ``allowed_from``: the ids below it are disallowed, as if :func:`restrict_logits` had set them
    to -inf first (e.g. all but the speech codes of the shared vocabulary), without writing that
    restricted copy where it is not needed."""
    V = logits.shape[-1]
    if temperature > 0 and logits.dim() == 2 and logits.shape[0] == 1 and logits.device.type == "cpu" \
            and logits.dtype == torch.float32 and 0 < top_k < V - allowed_from - 1 and top_p < 1.0 \
            and (generator is None or generator.device.type == "cpu"):
        allowed = logits[:, allowed_from:] if allowed_from else logits
        scaled = allowed if temperature == 1.0 else allowed / temperature
        ids = _sample_row_top_k_top_p(scaled, generator, top_k, top_p, V, allowed_from)
        if ids is not None:
            return ids
    if allowed_from:
        logits = logits.masked_fill(torch.arange(V, device=logits.device) < allowed_from, float("-inf"))
    shape = logits.shape[:-1]
    flat = logits.reshape(-1, V).float()
    if temperature <= 0:
        return flat.argmax(-1).reshape(shape)
    return _sample_flat(flat, generator, temperature, top_k, top_p, None).reshape(shape)


def _sample_flat(flat: torch.Tensor, generator: torch.Generator | None, temperature: float, top_k: int,
                 top_p: float, full_probs: torch.Tensor | None, checked: bool = True) -> torch.Tensor:
    probs_filtered = _filtered_probs(flat, temperature, top_k, top_p, full_probs)
    if generator is not None and generator.device != probs_filtered.device:
        # a CPU generator (reproducible across devices) draws on the CPU
        probs_filtered = probs_filtered.cpu()
    return (draw if checked else _unchecked_draw)(probs_filtered, generator).to(flat.device)


def sample_tokens(
    logits: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one id per row of ``logits`` [..., V].

    Returns ``(ids, probs)`` where ``probs`` is the probability of each chosen id under the
    *unfiltered* distribution at temperature 1 (the confidence MaskGIT-style loops rank by).
    ``temperature == 0`` is greedy.
    """
    shape = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1]).float()
    full_probs = flat.softmax(-1)
    if temperature <= 0:
        ids = flat.argmax(-1)
    else:
        # at temperature 1 the draw's probabilities are checked through the unfiltered ones (below)
        ids = _sample_flat(flat, generator, temperature, top_k, top_p, full_probs, checked=temperature != 1.0)
    probs = full_probs.gather(-1, ids[:, None]).squeeze(-1)
    if temperature == 1.0 and bool(probs.isnan().any()):
        # a filtered row is NaN exactly where its unfiltered row is (NaN or +inf logits, or no
        # finite one: filters only add -inf and keep the largest), and a NaN row is NaN at every
        # id, so this is the draw's check on R values instead of R x V
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    return ids.reshape(shape), probs.reshape(shape)


def repetition_aware(
    ids: torch.Tensor,
    logits: torch.Tensor,
    history: list[int],
    generator: torch.Generator | None,
    *,
    window: int = 10,
    max_ratio: float = 0.1,
    token: int | None = None,
) -> torch.Tensor:
    """Repetition-aware sampling (VALL-E 2; CosyVoice 2 decodes its LM with it).

    If the id just sampled (nucleus sampling) already fills more than ``max_ratio`` of the last
    ``window`` generated ids, draw again from the full distribution instead: an AR speech LM
    otherwise tends to lock into a loop of one token. ``ids`` [1], ``logits`` [1, V] (already
    restricted to the allowed ids); ``token``: ``int(ids[0])`` when the caller has it already."""
    recent = history[-window:]
    if window > 0 and recent and recent.count(int(ids[0]) if token is None else token) > max_ratio * window:
        probs = logits.float().softmax(-1)
        if generator is not None and generator.device != probs.device:
            probs = probs.cpu()
        return draw(probs, generator).to(logits.device)
    return ids
