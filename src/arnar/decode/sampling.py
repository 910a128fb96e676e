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
* top-k followed by top-p on one CPU row (the AR loop's step) sorts nothing and, where the outcome
  is certain, computes no softmax: the nucleus and the draw are decided on the host from the
  top-k values in double precision when they are farther from the cut (and the second largest
  draw ratio) than the float32 computation can deviate, and by the exact float32 computation
  otherwise (:func:`_sample_row_token`);
* temperature 1 divides by nothing (``x / 1.0 == x`` exactly), and without filtering the
  filtered softmax is the full one, computed once;
* top-p on many CPU rows sorts the values with numpy (an AVX-512 sort, ~20x faster than
  ``torch.sort`` on rows of 512; the sorted values are the same numbers whatever the algorithm)
  and maps the kept prefix back by a threshold instead of scattering sort indices; where that
  mapping could differ from the scatter (a tie across the cut, a dropped set that is not a
  suffix of the sorted row) the row batch takes the plain path (:func:`_top_p_numpy`);
* on many CPU rows the draw's division and argmax run in numpy (IEEE division, first maximum).
"""

from __future__ import annotations

import itertools
import math
import operator
from array import array

import torch

# CPU float32 row batches of at least this many elements take the nucleus and the draw's argmax
# through numpy (below, torch's per-call cost is the smaller)
NUMPY_MIN_ELEMENTS = 16384


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


def _top_p_numpy(logits: torch.Tensor, top_p: float) -> torch.Tensor | None:
    """:func:`filter_top_k_top_p`'s nucleus on CPU float32 rows through numpy, or None where only
    the plain path is exact. The sorted values are those of ``torch.sort`` (the same numbers); the
    softmax and the cumulative mass are torch's; what numpy computes is exact in IEEE float32
    (comparison, selection). The scatter's drop set is then {ids at sorted positions >= kept} when the
    dropped positions are a suffix (the first dropped is the ``kept``-th) and the value at the cut
    is not repeated after it (a tie across the cut is ordered by torch.sort's tie rule); that is
    {ids whose logit < the last kept value}."""
    import numpy as np

    x = logits.detach().numpy()
    V = x.shape[-1]
    # NaN sorts last here and first in torch; either way a row with NaN is all NaN after the
    # softmax, drops nothing and stays as it is (its draw then raises in sample_tokens)
    sorted_desc = np.ascontiguousarray(np.sort(x, axis=-1)[:, ::-1])
    p = torch.from_numpy(sorted_desc).softmax(-1)
    drop = ((p.cumsum(-1) - p).numpy() >= np.float32(top_p))
    kept = V - np.count_nonzero(drop, axis=-1)  # >= 1: the first id has no mass before it
    rows = np.arange(len(x))
    threshold = sorted_desc[rows, kept - 1]
    some = kept < V
    if some.any():
        after = sorted_desc[rows, np.minimum(kept, V - 1)]
        exact = (drop.argmax(axis=-1) == kept) & (after < threshold)
        if not np.all(exact | ~some):
            return None
    return torch.from_numpy(np.where(x < threshold[:, None], np.float32(-np.inf), x))


def _top_p_plain(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    return logits.masked_fill(_top_p_drop_plain(logits, top_p), float("-inf"))


def _numpy_path(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and t.dim() == 2 and t.dtype == torch.float32 \
        and t.numel() >= NUMPY_MIN_ELEMENTS and not t.requires_grad


def filter_top_k_top_p(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Keep the ``top_k`` largest logits (0: all) and the smallest set of ids whose probability
    sums to at least ``top_p`` (1.0: all); the rest become -inf. The most likely id always stays."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        filtered = _top_p_numpy(logits, top_p) if _numpy_path(logits) and logits.shape[-1] > 1 else None
        logits = _top_p_plain(logits, top_p) if filtered is None else filtered
    return logits


class ExponentialDraws:
    """The ``Exp(1)`` draws of a CPU generator, taken ahead in blocks: ``take(shape)`` gives what
    ``torch.empty(shape).exponential_(1, generator=generator)`` would give at that point (a
    generator's exponentials are one sequence, element after element, whatever the shapes asked),
    and :meth:`close` puts the generator where those calls would have left it (it restores the
    state from before the last block and draws again what was taken of it).

    Why: a decoding step's draw is ``argmax(p / q)`` over a whole row (:func:`draw`); drawing
    one row per step pays the kernel's first-call cost after every forward pass (its code and the
    generator's state are out of the caches by then), one block of rows pays it once. Use it as a
    context manager (``with ExponentialDraws(g, row) as draws``) and hand ``draws`` to the
    sampling functions of one decoding loop instead of the generator. ``expected``: how many draws
    the loop will at least take (e.g. one row per step of a fixed length): blocks stop there, so
    that a loop that takes them all leaves nothing to draw again."""

    def __init__(self, generator: torch.Generator | None, block: int, expected: int | None = None):
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        self._expected = None if expected is None else int(expected)
        self.generator = generator if generator is not None else torch.default_generator
        if self.generator.device.type != "cpu":
            raise ValueError("ExponentialDraws takes ahead from a CPU generator")
        self.block = int(block)
        self._buffer = torch.zeros(0)
        self._used = 0
        self._state: torch.Tensor | None = None  # the generator's state before the current block
        self.positive = True  # every draw of the current block is > 0 (checked once per block)
        self.taken_from_buffer = False  # the last take came from the block (positive applies to it)

    def take(self, shape: tuple[int, ...] | torch.Size) -> torch.Tensor:
        n = 1
        for size in shape:
            n *= int(size)
        parts = []
        while n > 0:
            if self._used == len(self._buffer):
                size = self.block
                if self._expected is not None:
                    self._expected -= len(self._buffer)  # what the blocks so far covered
                    size = min(size, self._expected) if self._expected > 0 else size
                self._state = self.generator.get_state()
                self._buffer = torch.empty(max(size, n)).exponential_(1, generator=self.generator)
                self._used = 0
                self.positive = bool(self._buffer.min() > 0)
            k = min(n, len(self._buffer) - self._used)
            parts.append(self._buffer.narrow(0, self._used, k))
            self._used += k
            n -= k
        self.taken_from_buffer = len(parts) == 1  # else the take spans two blocks
        flat = parts[0] if len(parts) == 1 else torch.cat(parts)
        return flat.view(shape)

    def close(self) -> None:
        """Leave the generator as if only the draws taken had been made."""
        if self._state is not None and self._used < len(self._buffer):
            self.generator.set_state(self._state)
            if self._used:
                torch.empty(self._used).exponential_(1, generator=self.generator)
        self._buffer, self._used, self._state = torch.zeros(0), 0, None

    def __enter__(self) -> ExponentialDraws:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _exponentials(shape: torch.Size | tuple[int, ...], dtype: torch.dtype, device: torch.device,
                  generator: torch.Generator | None, draws: ExponentialDraws | None) -> torch.Tensor:
    """``torch.empty(shape, dtype, device).exponential_(1, generator)``, from ``draws`` when given
    (CPU float32: the dtype and device of its draws)."""
    if draws is not None and dtype == torch.float32 and device.type == "cpu":
        return draws.take(shape)
    return torch.empty(shape, dtype=dtype, device=device).exponential_(1, generator=generator)


def draw(probs: torch.Tensor, generator: torch.Generator | None = None,
         draws: ExponentialDraws | None = None) -> torch.Tensor:
    """One id per row of ``probs`` [R, V] (rows need not be normalised), exactly
    ``torch.multinomial(probs, 1, generator=generator).squeeze(-1)``: ``multinomial`` draws a
    single sample as ``argmax(probs / q)`` with ``q ~ Exp(1)`` over the whole tensor, and so does
    this, from the same generator (same ids, same generator state after), without
    ``multinomial``'s checks, of which one is kept: negative or NaN probabilities raise.
    ``draws``: the generator's exponentials taken ahead (:class:`ExponentialDraws`)."""
    if not bool((probs >= 0).all()):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    return _unchecked_draw(probs, generator, draws)


def _unchecked_draw(probs: torch.Tensor, generator: torch.Generator | None,
                    draws: ExponentialDraws | None = None) -> torch.Tensor:
    q = _exponentials(probs.shape, probs.dtype, probs.device, generator, draws)
    if _numpy_path(probs):  # IEEE division and first-maximum argmax, as torch's
        import numpy as np

        return torch.from_numpy(np.argmax(probs.numpy() / q.numpy(), axis=-1))
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


# Margins of the certified host decisions of _sample_row_token: an absolute margin on the
# nucleus's cumulative mass and a relative one between the two largest draw ratios, each > 20x
# the largest deviation of torch's float32 softmax from the exact values they are compared with
# (see _sample_row_token). Inside a margin the exact float32 computation decides.
NUCLEUS_MARGIN = 1e-4
DRAW_MARGIN = 1e-4


def _nucleus_exact(values: torch.Tensor, v: list[float], K: int, top_p: float, vocab_size: int) -> int | None:
    """Size of the nucleus among the sorted top-``K`` values, as the plain path computes it, or
    None where it differs from a prefix (a dropped set that is not a suffix, a tie across the cut).

    The row sorted after top-k is the ``K`` largest values, descending, then -inf, so the
    nucleus's softmax is that of ``cat([values, -inf...])`` (the same numbers, so the same floats
    as the sort's). ``before = cumsum(p) - p >= top_p`` is then evaluated on the host: torch's CPU
    cumsum of float32 accumulates in double and rounds each prefix to float32, the difference of
    two float32 numbers computed in double and rounded to float32 is the float32 difference (double
    rounding is innocuous for p' >= 2p + 2), and a float32 tensor compares with a Python float
    rounded to float32."""
    p = torch.cat([values[:, :K], _neg_inf_row(vocab_size - K, values.dtype)], dim=1).softmax(-1)[0, :K].tolist()
    before = _as_float32(map(operator.sub, _as_float32(itertools.accumulate(p)), p))
    threshold = _as_float32((top_p,))[0]
    n_kept = next((i for i, b in enumerate(before) if b >= threshold), K)
    if n_kept < K and not (v[n_kept] < v[n_kept - 1] and all(b >= threshold for b in before[n_kept:])):
        return None
    return n_kept


def _sample_row_token(scaled: torch.Tensor, generator: torch.Generator | None, top_k: int, top_p: float,
                      vocab_size: int, offset: int, draws: ExponentialDraws | None = None) -> int | None:
    """:func:`filter_top_k_top_p` then a draw, for one CPU float32 row: the id drawn, or None
    (nothing drawn) where this shortcut could differ from the plain path (a tie at the k-th value
    or across the nucleus's cut, a dropped set that is not a suffix). ``scaled`` ``[1, V']``
    holds the allowed ids ``offset .. offset + V' - 1`` of a row of ``vocab_size`` whose other ids
    are -inf (``0 < top_k < V' - 1``, ``top_p < 1``).

    Two decisions are taken on the host from the top-k values, in double precision, where their
    outcome is certain, and by the exact float32 computation otherwise:

    * the nucleus: the first sorted position whose preceding mass reaches ``top_p``. The plain
      path compares ``cumsum(p) - p`` of torch's float32 softmax; that differs from the exact mass
      by less than ~1e-5 (the rounding of ``x - max`` times ``|x - max| p``, summed, plus a few ulp
      of the exponential, sum, normalisation and cumulative sum), so a mass farther than
      :data:`NUCLEUS_MARGIN` from ``top_p`` (and no mass within it) decides the same way;
    * the draw, ``argmax(p / q)`` over the nucleus with ``q ~ Exp(1)`` drawn for the whole row as
      always: ``p`` is the float32 softmax of the nucleus, within ~1e-5 relative of the exact
      one, so a largest ratio above the second by more than :data:`DRAW_MARGIN` (relative) is the
      argmax of the float32 ratios too. Probabilities below 1e-30 (float32 loses precision in
      its subnormals) and a zero ``q`` (a 0/0 NaN outside the nucleus would win) take the exact
      path."""
    K = top_k
    values, ids = torch.topk(scaled, K + 1, dim=-1)
    v = values.tolist()[0]
    if not v[K] < v[K - 1]:  # the k-th value repeated outside the top k (or -inf, NaN): plain path
        return None
    top = v[0]
    weights = [math.exp(x - top) for x in v[:K]]  # float32 values, exact in double; descending
    total = sum(weights)
    threshold = _as_float32((top_p,))[0]
    # the first i whose preceding mass sum(weights[:i]) / total reaches the threshold, compared
    # as masses (bounds scaled by the total); -1 when a mass lies within the margin
    low, high = (threshold - NUCLEUS_MARGIN) * total, (threshold + NUCLEUS_MARGIN) * total
    n_kept, mass = K, 0.0
    for i, w in enumerate(weights):
        if mass >= low:
            n_kept = i if mass > high else -1
            break
        mass += w
    if n_kept < 0:
        n_kept = _nucleus_exact(values, v, K, top_p, vocab_size)
        if n_kept is None:
            return None
    elif n_kept < K and not v[n_kept] < v[n_kept - 1]:
        return None  # a tie across the cut: ordered by torch.sort's tie rule
    q = _exponentials((1, vocab_size), scaled.dtype, scaled.device, generator, draws)
    kept = [i + offset for i in ids.tolist()[0][:n_kept]]
    q_row = memoryview(q.numpy()).cast("B").cast("f")  # float32 values as Python floats, no copy
    # argmax of p / q over the nucleus: p is proportional to the weights (the common factor
    # changes neither the argmax nor the ratio of the two largest)
    ratios = [w / q_row[i] if q_row[i] > 0.0 else math.inf for w, i in zip(weights, kept)]
    largest = max(ratios)
    best = ratios.index(largest)
    second = max(ratios[:best] + ratios[best + 1:], default=0.0)
    certain = largest > second * (1.0 + DRAW_MARGIN) and largest < math.inf \
        and weights[n_kept - 1] > 1e-30 * total \
        and (draws.positive if draws is not None and draws.taken_from_buffer else float(q.min()) > 0.0)
    if certain:
        return kept[best]
    # the exact float32 draw with the same q
    ids_kept = ids[:, :n_kept]
    row = _neg_inf_row(vocab_size, scaled.dtype).scatter(1, ids_kept + offset if offset else ids_kept,
                                                        values[:, :n_kept])
    return int((row.softmax(-1) / q).argmax(-1)[0])


def _filtered_probs(flat: torch.Tensor, temperature: float, top_k: int, top_p: float,
                    full_probs: torch.Tensor | None) -> torch.Tensor:
    scaled = flat if temperature == 1.0 else flat / temperature  # x / 1.0 == x exactly
    filtered = filter_top_k_top_p(scaled, top_k, top_p)
    if filtered is flat and full_probs is not None:  # nothing filtered, nothing scaled
        return full_probs
    return filtered.softmax(-1)


def _row_token(logits: torch.Tensor, generator: torch.Generator | None, temperature: float, top_k: int,
               top_p: float, allowed_from: int, draws: ExponentialDraws | None) -> int | None:
    """The one-row top-k/top-p shortcut (:func:`_sample_row_token`) where it applies, else None."""
    rows, V = logits.shape if logits.dim() == 2 else (0, 0)
    if rows == 1 and temperature > 0 and 0 < top_k < V - allowed_from - 1 and top_p < 1.0 and logits.is_cpu \
            and logits.dtype == torch.float32 and (generator is None or generator.device.type == "cpu"):
        allowed = logits.narrow(1, allowed_from, V - allowed_from) if allowed_from else logits
        scaled = allowed if temperature == 1.0 else allowed / temperature
        return _sample_row_token(scaled, generator, top_k, top_p, V, allowed_from, draws)
    return None


def sample_token(
    logits: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    allowed_from: int = 0,
    draws: ExponentialDraws | None = None,
) -> int:
    """:func:`sample_ids` of one row ``[1, V]`` as a Python int (an autoregressive step's token)."""
    token = _row_token(logits, generator, temperature, top_k, top_p, allowed_from, draws)
    if token is None:
        token = int(sample_ids(logits, generator, temperature=temperature, top_k=top_k, top_p=top_p,
                               allowed_from=allowed_from, draws=draws)[0])
    return token


def sample_ids(
    logits: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    allowed_from: int = 0,
    draws: ExponentialDraws | None = None,
) -> torch.Tensor:
    """The ids of :func:`sample_tokens` alone (the same ids and draws), without the probabilities.
    ``allowed_from``: the ids below it are disallowed, as if :func:`restrict_logits` had set them
    to -inf first (e.g. all but the speech codes of the shared vocabulary), without writing that
    restricted copy where it is not needed. ``draws``: the generator's exponentials taken ahead
    (:class:`ExponentialDraws`)."""
    token = _row_token(logits, generator, temperature, top_k, top_p, allowed_from, draws)
    if token is not None:
        return torch.tensor([token], device=logits.device)
    V = logits.shape[-1]
    if allowed_from:
        logits = logits.masked_fill(torch.arange(V, device=logits.device) < allowed_from, float("-inf"))
    shape = logits.shape[:-1]
    flat = logits.reshape(-1, V).float()
    if temperature <= 0:
        return flat.argmax(-1).reshape(shape)
    return _sample_flat(flat, generator, temperature, top_k, top_p, None, draws=draws).reshape(shape)


def _sample_flat(flat: torch.Tensor, generator: torch.Generator | None, temperature: float, top_k: int,
                 top_p: float, full_probs: torch.Tensor | None, checked: bool = True,
                 draws: ExponentialDraws | None = None) -> torch.Tensor:
    probs_filtered = _filtered_probs(flat, temperature, top_k, top_p, full_probs)
    if generator is not None and generator.device != probs_filtered.device:
        # a CPU generator (reproducible across devices) draws on the CPU
        probs_filtered = probs_filtered.cpu()
    return (draw if checked else _unchecked_draw)(probs_filtered, generator, draws).to(flat.device)


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
    draws: ExponentialDraws | None = None,
) -> torch.Tensor:
    """Repetition-aware sampling (VALL-E 2; CosyVoice 2 decodes its LM with it).

    If the id just sampled (nucleus sampling) already fills more than ``max_ratio`` of the last
    ``window`` generated ids, draw again from the full distribution instead: an AR speech LM
    otherwise tends to lock into a loop of one token. ``ids`` [1], ``logits`` [1, V] (already
    restricted to the allowed ids); ``token``: ``int(ids[0])`` when the caller has it already;
    ``draws``: the generator's exponentials taken ahead (:class:`ExponentialDraws`)."""
    recent = history[-window:]
    if window > 0 and recent and recent.count(int(ids[0]) if token is None else token) > max_ratio * window:
        probs = logits.float().softmax(-1)
        if generator is not None and generator.device != probs.device:
            probs = probs.cpu()
        return draw(probs, generator, draws).to(logits.device)
    return ids
