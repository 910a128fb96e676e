"""SyncSpeech: a Temporal Masked Transformer (TMT) that speaks text while it arrives (SyncSpeech, arXiv:2502.11094, section 2).

Each text (BPE) token ``y_n`` owns the span of speech frames ``s_{a_{n-1}:a_n}`` (``a`` from the forced
alignment, :attr:`Utterance.ends`, ``a_0 = 0``). One forward pass emits *all* the speech tokens of one
text token in parallel (masked prediction) and the duration of the next one, so decoding costs
``L + 1`` passes for ``L`` text tokens instead of ``T`` (section 2.1).

Sequence (Eq. 3, fine-tuning): for a random ``n`` in ``[1, L]`` and look-ahead ``q``::

    y_1 .. y_L'  E  D s_{1:a_1}  D s_{a_1:a_2} ... D <mask> x l_n  D        L' = min(L, n + q)

``E`` (end of text, id :data:`END_OF_TEXT`) closes the text and opens the speech stream; every ``D``
(duration placeholder, id :data:`DURATION`) stands before the span of one text token and predicts that
span's length. The spans of ``y_1 .. y_{n-1}`` are real speech tokens, the span of ``y_n`` is all
``<mask>`` (Eq. 1-2). Losses: cross-entropy of the true tokens at the masked span through the shared
head (Eq. 4) and of ``l_{n+1} = a_{n+1} - a_n`` at the last ``D`` through a duration head (Eq. 5; no
target when ``n = L``). Durations are classes ``0 .. max_duration``; longer targets are clamped to
``max_duration`` (option; on the 25 Hz corpora here no BPE token is longer than 20 frames).

Decision (option ``prefill_duration``, default on): the ``D`` before the masked span also learns
``l_n``. That ``D`` sees exactly what the *first* duration prediction of a decoding sees (all spans
before it real, text up to ``y_{n+q}``): the paper notes that this first prediction is the one pass
that is not merged with speech prediction, but Eq. 5 never trains it, so a model fine-tuned without
pre-training (the Table 2 ablation) would guess its first duration from an untrained placeholder.

Input noise (option ``input_noise``, not in the paper; default 0 = the paper's teacher forcing): in
fine-tuning, a share of the *real* speech tokens the sequence holds (the spans that stand for speech
already spoken, the prompt's among them) is replaced by random codes; the masked spans' targets stay
true. Decoding reads its own earlier spans, as AR reads its own earlier frames, and training shows it
only true ones; AR's option of the same name measured that gap (cross-sentence WER 31.6 -> 23.9 % on
``speak``). Pre-training (Eq. 6) is left as the paper has it.

Variant (option ``finetune_spans``, default ``one`` = Eq. 3): ``all`` scores every span of an
utterance in one sequence, each through a masked copy that sees exactly what its decoding pass sees
(:func:`packed_finetune_sequence`). Eq. 3 trains one text token per sequence, which section 2.1
names as the reason for pre-training; on a CPU budget of a few thousand updates it leaves the
fine-tuning stage with a few speech targets per example.

Pre-training (Eq. 6, ``stage: pretrain``): the whole text, every span present::

    y_1 .. y_L  E  D ŝ_{1:a_1}  D ŝ_{a_1:a_2} ... D ŝ_{a_{L-1}:a_L}

where a text-level mask ``m̂_bpe`` decides which spans are ``<mask>``: its first value is
Bernoulli(0.5) and adjacent values differ (so it alternates), expanded to frames through ``a``. The
loss is Eq. 4 on every masked frame plus Eq. 5 at every ``D`` (``D`` before span ``k`` predicts
``l_k``: it always sees the whole text and only the spans before it, so each is a valid target).

Hybrid attention mask (Fig. 1, right): text and the special tokens ``E``/``D`` attend causally;
speech and mask tokens attend everything before them and, in both directions, every speech/mask
token of the same text token. ``attention: causal`` (Table 2 ablation) drops the bidirectional part.

Positions: text and speech stream have separate ranges (section 2.1 "Inference"): text token ``j``
at ``j`` (0-based), the speech stream (``E``, ``D``s, speech, masks) from 0 in its own order, RoPE
over both. Nothing in the speech stream moves when text tokens arrive, which is what lets the KV
cache survive streaming text. The mask is therefore written in terms of these positions, not of the
order in which positions sit in the cache (:func:`hybrid_attention_mask`): a text query sees text
keys up to its own position, a speech-stream query sees the text that had arrived when it was
computed (``text_seen``), stream keys up to its own stream position, and its own span. For a
training sequence (text first, all of it seen) this is exactly "causal + same-span blocks".

Streaming decoding (:meth:`SyncSpeech.stream`), with ``P`` prompt text tokens whose speech is known:

1. wait for ``q + 1`` target text tokens; one pass over ``[prompt text, y_1..y_{q+1}, E, D, prompt
   spans with their D's, D]`` predicts the first duration (top-k, default k = 3, Table 3);
2. for target token ``n = 1, 2, ..``: wait for ``y_{n+q}`` (or the end of the text); one pass over
   ``[the text tokens that arrived, the real tokens of span n-1, its D again, <mask> x l_n, D]``,
   after cropping the masks of span ``n-1`` and the ``D`` after them from the cache (they attended
   masks; in training every span before the masked one is real). The masks give the speech tokens
   of ``y_n`` (greedy, Table 3), the last ``D`` the duration of ``y_{n+1}``.

So ``L + 1`` passes, the first audio after ``q + 1`` text tokens. Each cached position keeps the text
it saw when it was computed (the paper's KV cache with inserted text implies this; in training every
speech token sees all ``L'`` text tokens). The uncached path (``cached=False``) recomputes the whole
sequence every pass under the same positions and mask, so it must give the same tokens.

Batched synthesis (:meth:`SyncSpeech.generate_batch`, test lists): B items' streams advance one pass
together, each adding its own positions (its text, its spans, its durations) to its row of one
table; rows are padded to the widest with padding columns, and the masks a pass drops become padding
columns of the shared KV cache instead of being cropped (the cache's slots are shared by the rows),
so every real position sees exactly what it sees alone. An item whose text is spoken rides along.

Prompts: the prompt's speech is split into one ``D`` + span per prompt text token as in training
(one block for the whole prompt would break the count of ``D``s the model uses to know where it is),
at the prompt's own a_n when the caller has them (``request.features["prompt_ends"]``, which
:class:`arnar.synthesize.Synthesizer` derives from the forced alignment of the prompt's recording),
else spread uniformly over its text tokens (:func:`uniform_ends`); ``info["prompt_ends"]`` says
which (``aligned`` or ``uniform``). ``request.text_ends`` (oracle durations of the target) replace
the predicted ones (Table 3 "Ground Truth"); ``request.target_frames`` is not used (the length
follows from the durations).

Latency (:mod:`arnar.evaluate.metrics`): ``info["first_packet_seconds"]`` is the time until the first
``chunk_size`` speech tokens exist (FPL-A, c passes: ``Generation.first_packet_passes``),
``info["text_tokens_to_start"]`` the text tokens read before the first pass (Eq. 7's ``q + 1``, or
the whole text when it is shorter), ``info["text_tokens_waited"]`` those read by the time the first
packet was complete.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from arnar.decode.sampling import restrict_logits, sample_tokens
from arnar.paradigms import register_paradigm
from arnar.paradigms.base import (
    corrupt,
    decoding_options,
    IGNORE,
    MASK,
    N_SPECIAL,
    Batch,
    Example,
    Generation,
    LossOutput,
    Paradigm,
    SynthesisRequest,
    Utterance,
)

# The two spare special ids of arnar.paradigms.base (6 and 7).
END_OF_TEXT = 6  # E of Eq. 3 (<EOS> in Fig. 1): end of the text part, start of the speech stream
DURATION = 7  # D of Eq. 3 (<DPH> in Fig. 1): placeholder whose output predicts the next span's length
assert max(END_OF_TEXT, DURATION) < N_SPECIAL

STAGES = ("finetune", "pretrain")
FINETUNE_SPANS = ("one", "all")  # Eq. 3's one random span per sequence | every span (packed_finetune_sequence)
ATTENTIONS = ("hybrid", "causal")
DECODING = {
    "duration_top_k": 3,  # Table 3: top-k 3 for durations (1 = greedy)
    "speech_top_k": 1,  # Table 3: greedy for speech tokens (k > 1 samples among the k best)
    "temperature": 1.0,  # of whichever of the two samples (k > 1)
    "chunk_size": 15,  # speech decoder chunk (section 3.1): the first packet is this many tokens
    "cached": True,  # KV cache across passes; False recomputes everything (same tokens)
}


# ----------------------------------------------------------------------------- layout and mask

@dataclass
class Layout:
    """A TMT sequence with what the attention mask and the losses need per position ([S] each).

    ``position_ids``: index in the text for text tokens, index in the speech stream for the rest;
    ``span``: 0-based index of the text token a speech/mask position belongs to, -1 elsewhere;
    ``text_seen``: how many text tokens (from the first) a speech-stream position may attend, 0 for
    text; ``duration_of``: for a ``D``, the 0-based index of the text token whose span follows it
    (whose duration it predicts), -1 elsewhere.
    """

    input_ids: Tensor
    position_ids: Tensor
    is_text: Tensor
    span: Tensor
    text_seen: Tensor
    duration_of: Tensor

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @staticmethod
    def cat(parts: Sequence[Layout]) -> Layout:
        fields = ("input_ids", "position_ids", "is_text", "span", "text_seen", "duration_of")
        return Layout(*(torch.cat([getattr(p, f) for p in parts]) for f in fields))

    def __getitem__(self, index: slice) -> Layout:
        """The positions of a slice (``layout[:n]``, ``layout[n:]``)."""
        return Layout(self.input_ids[index], self.position_ids[index], self.is_text[index], self.span[index],
                      self.text_seen[index], self.duration_of[index])


def _layout(ids: Tensor, positions: Tensor, *, is_text: bool, span: int = -1, text_seen: int = 0,
            duration_of: int = -1) -> Layout:
    n = len(ids)
    return Layout(ids.long(), positions.long(), torch.full((n,), is_text), torch.full((n,), span),
                  torch.full((n,), text_seen), torch.full((n,), duration_of))


def text_part(ids: Tensor, start: int) -> Layout:
    """Text tokens (shared ids) at text positions ``start, start + 1, ..``."""
    return _layout(ids, torch.arange(start, start + len(ids)), is_text=True)


def marker(token: int, position: int, text_seen: int, duration_of: int = -1) -> Layout:
    """One ``E`` or ``D`` at speech-stream ``position``."""
    return _layout(torch.tensor([token]), torch.tensor([position]), is_text=False, text_seen=text_seen,
                   duration_of=duration_of)


def span_part(ids: Tensor, start: int, text_seen: int, token: int) -> Layout:
    """The speech/mask tokens (shared ids) of text token ``token`` from speech-stream ``start``."""
    return _layout(ids, torch.arange(start, start + len(ids)), is_text=False, span=token, text_seen=text_seen)


def hybrid_attention_mask(keys: Layout, queries: Layout | None = None, *, bidirectional: bool = True) -> Tensor:
    """``[len(queries), len(keys)]`` bool, True where the query may attend the key (Fig. 1, right).

    Text queries: text keys at or before their text position (causal over text). Speech-stream
    queries (``E``, ``D``, speech, mask): the first ``text_seen`` text tokens, stream keys at or before
    their stream position (causal), and, if ``bidirectional``, every key of the same span. Only
    positions and the per-position fields matter, not where a key sits in the sequence or cache,
    so a text token appended after speech (streaming) is handled by the same rule.
    ``queries`` defaults to ``keys`` (the full square mask)."""
    queries = keys if queries is None else queries
    key_text = keys.is_text[None, :]
    key_pos, query_pos = keys.position_ids[None, :], queries.position_ids[:, None]
    not_later = key_pos <= query_pos
    text_rows = key_text & not_later
    stream_rows = (key_text & (key_pos < queries.text_seen[:, None])) | (~key_text & not_later)
    if bidirectional:
        query_span = queries.span[:, None]
        stream_rows = stream_rows | ((query_span >= 0) & (query_span == keys.span[None, :]))
    return torch.where(queries.is_text[:, None], text_rows, stream_rows)


# ----------------------------------------------------------------------------- training sequences

def durations(ends: Tensor) -> Tensor:
    """``l_n = a_n - a_{n-1}`` with ``a_0 = 0``."""
    ends = torch.as_tensor(ends).long()
    return ends - torch.cat([ends.new_zeros(1), ends[:-1]])


def check_ends(ends: Tensor | None, n_text: int, n_frames: int, what: str) -> Tensor:
    if ends is None:
        raise ValueError(f"{what}: SyncSpeech needs the BPE-level alignment (a_n, Utterance.ends)")
    ends = torch.as_tensor(ends).long()
    if len(ends) != n_text or n_text == 0:
        raise ValueError(f"{what}: {len(ends)} ends for {n_text} text tokens")
    if int(ends[-1]) != n_frames or bool((durations(ends) < 0).any()):
        raise ValueError(f"{what}: ends must be non-decreasing and end at the {n_frames} frames, got {ends.tolist()}")
    return ends


def tmt_sequence(vocab, text: Tensor, speech: Tensor, ends: Tensor, *, n_text: int, masked: Sequence[bool],
                 trailing_duration: bool) -> tuple[Layout, Tensor]:
    """``[y_1..y_{n_text}, E, D, span_1, D, span_2, .., D, span_m, (D)]`` for ``m = len(masked)`` spans,
    span ``k`` all ``<mask>`` where ``masked[k]`` (Eq. 3 and Eq. 6). Every speech-stream position sees
    the ``n_text`` text tokens. Returns the layout and the speech targets (true shared ids at
    masked positions, IGNORE elsewhere)."""
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    parts = [text_part(vocab.text(text[:n_text]), 0), marker(END_OF_TEXT, 0, n_text)]
    targets = [torch.full((n_text + 1,), IGNORE)]
    position = 1
    for k, is_masked in enumerate(masked):
        parts.append(marker(DURATION, position, n_text, duration_of=k))
        true_ids = vocab.speech(speech[int(starts[k]):int(ends[k])])
        ids = torch.full_like(true_ids, MASK) if is_masked else true_ids
        parts.append(span_part(ids, position + 1, n_text, token=k))
        targets += [torch.tensor([IGNORE]), true_ids if is_masked else torch.full_like(true_ids, IGNORE)]
        position += 1 + len(ids)
    if trailing_duration:
        parts.append(marker(DURATION, position, n_text, duration_of=len(masked)))
        targets.append(torch.tensor([IGNORE]))
    return Layout.cat(parts), torch.cat(targets).long()


def finetune_sequence(vocab, text: Tensor, speech: Tensor, ends: Tensor, n: int, q: int) -> tuple[Layout, Tensor]:
    """Eq. 3 for the 1-based text token ``n``: text up to ``L' = min(L, n + q)``, spans 1..n-1 real,
    span n masked (Eq. 1-2), a trailing ``D`` for ``l_{n+1}``."""
    L = len(text)
    if not 1 <= n <= L:
        raise ValueError(f"n must be in [1, {L}], got {n}")
    return tmt_sequence(vocab, text, speech, ends, n_text=min(L, n + q), masked=[False] * (n - 1) + [True],
                        trailing_duration=True)


def packed_finetune_sequence(vocab, text: Tensor, speech: Tensor, ends: Tensor, q: int, *,
                             bidirectional: bool = True) -> tuple[Layout, Tensor, Tensor, Tensor]:
    """Every ``n`` of Eq. 3 in one sequence (option ``finetune_spans: all``): the whole utterance real,
    then a masked copy of each span, each copy seeing what decoding pass ``n`` sees::

        y_1 .. y_L  E  D s_{1:a_1} .. D s_{a_{L-1}:a_L}  <mask> x l_1 D'  ..  <mask> x l_L D'

    Why: Eq. 3 scores one span per sequence, so "the gradient was backpropagated for only one text
    token" (section 2.1); at a few thousand CPU updates that is a few speech targets per example
    against AR's every frame. Here every span is a target, at about twice the sequence length.

    What each position sees (the cached decoding of :class:`_ItemStream` fed the true spans, exactly):
    a text token the text before it; ``E`` and ``D_1`` the first ``q + 1`` text tokens; the real span
    ``k`` (1-based) and the ``D`` after it the first ``k + 1 + q`` (they enter the cache at pass
    ``k + 1``); real stream positions the real stream up to their own position and, if
    ``bidirectional``, their own span. The copy of span ``n`` (its masks and the ``D'`` after them)
    sees the first ``n + q`` text tokens, the real stream before span ``n`` (``D_n`` included) and
    itself: its masks each other (``bidirectional``) or causally, ``D'`` all of them. A copy sits
    at the stream positions of its real span, so RoPE places it as decoding does. Eq. 3 instead gives
    every position of the sequence for ``n`` the first ``n + q`` text tokens; the two agree on what
    the masks of span ``n`` see from span ``n - 1`` on, and this layout is what decoding computes.

    Returns the layout (a copy's ``span`` is its span's index, as in decoding), the speech targets
    (the true ids at every copy's masks), the index of the copy each position belongs to (-1: the
    real part) and the attention mask ``[S, S]``. ``D'`` of copy ``n`` predicts ``l_{n+1}``
    (``duration_of``), the real ``D_n`` ``l_n`` (what ``prefill_duration`` trains)."""
    L = len(text)
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    parts = [text_part(vocab.text(text), 0), marker(END_OF_TEXT, 0, min(L, q + 1))]
    span_start = []  # the stream position of each span's first frame
    position = 1
    for k in range(L):  # 0-based k: D_{k+1} sees k + 1 + q text tokens, span k + 1 one more
        parts.append(marker(DURATION, position, min(L, k + 1 + q), duration_of=k))
        true_ids = vocab.speech(speech[int(starts[k]):int(ends[k])])
        span_start.append(position + 1)
        parts.append(span_part(true_ids, position + 1, min(L, k + 2 + q), token=k))
        position += 1 + len(true_ids)
    n_real = sum(len(p) for p in parts)
    targets = [torch.full((n_real,), IGNORE)]
    copy_of = [torch.full((n_real,), -1)]
    for n in range(L):
        true_ids = vocab.speech(speech[int(starts[n]):int(ends[n])])
        seen = min(L, n + 1 + q)
        parts.append(span_part(torch.full_like(true_ids, MASK), span_start[n], seen, token=n))
        parts.append(marker(DURATION, span_start[n] + len(true_ids), seen, duration_of=n + 1))
        targets += [true_ids, torch.tensor([IGNORE])]
        copy_of.append(torch.full((len(true_ids) + 1,), n))
    layout, copy_of = Layout.cat(parts), torch.cat(copy_of)

    key_text, query_text = layout.is_text[None, :], layout.is_text[:, None]
    key_pos, query_pos = layout.position_ids[None, :], layout.position_ids[:, None]
    key_copy, query_copy = copy_of[None, :], copy_of[:, None]
    text_keys = key_text & (key_pos < layout.text_seen[:, None])
    real_keys = ~key_text & (key_copy < 0)
    first_of_copy = torch.tensor(span_start)[copy_of.clamp(min=0)][:, None]  # the copy's span start
    real_rows = text_keys | (real_keys & (key_pos <= query_pos))
    copy_rows = text_keys | (real_keys & (key_pos < first_of_copy)) | ((key_copy == query_copy) & (key_pos <= query_pos))
    if bidirectional:
        same_span = (layout.span[:, None] >= 0) & (layout.span[:, None] == layout.span[None, :])
        real_rows = real_rows | (same_span & real_keys)
        copy_rows = copy_rows | (same_span & (key_copy == query_copy))
    stream_rows = torch.where(query_copy < 0, real_rows, copy_rows)
    mask = torch.where(query_text, key_text & (key_pos <= query_pos), stream_rows)
    return layout, torch.cat(targets).long(), copy_of, mask


def pretrain_text_mask(n_text: int, generator: torch.Generator) -> list[bool]:
    """``m̂_bpe`` of Eq. 6: the first value ~ Bernoulli(0.5), adjacent values never equal."""
    first = bool(torch.rand((), generator=generator) < 0.5)
    return [first if k % 2 == 0 else not first for k in range(n_text)]


def pretrain_sequence(vocab, text: Tensor, speech: Tensor, ends: Tensor,
                      text_mask: Sequence[bool]) -> tuple[Layout, Tensor]:
    """Eq. 6: the whole text, every span, span k masked where ``text_mask[k]``, no trailing ``D``."""
    return tmt_sequence(vocab, text, speech, ends, n_text=len(text), masked=list(text_mask), trailing_duration=False)


def uniform_ends(n_text: int, n_frames: int) -> Tensor:
    """Ends that spread ``n_frames`` as evenly as integers allow over ``n_text`` tokens (the prompt's
    alignment when none is given): ``a_k = floor(k * T / n)``."""
    if n_text == 0:
        if n_frames:
            raise ValueError(f"a prompt of {n_frames} speech frames needs its transcript (no prompt text given)")
        return torch.zeros(0, dtype=torch.long)
    return torch.div(torch.arange(1, n_text + 1) * n_frames, n_text, rounding_mode="floor")


# ----------------------------------------------------------------------------- streaming results

@dataclass
class StreamStep:
    """What one forward pass of :meth:`SyncSpeech.stream` produced."""

    speech: Tensor  # codes of one text token's span (empty for the first pass)
    text_tokens_read: int  # target text tokens taken from the input so far
    forward_passes: int  # backbone calls so far
    next_duration: int  # the duration predicted (or given) for the next text token


@dataclass
class Chunk:
    """A packet of speech tokens for the speech decoder (:func:`speech_chunks`)."""

    speech: Tensor  # codes: ``chunk_size`` of them, except the last chunk (the rest, maybe none)
    text_tokens_read: int  # target text tokens that had arrived when this chunk was complete
    forward_passes: int  # backbone calls made when it was complete
    last: bool


def speech_chunks(steps: Iterable[StreamStep], chunk_size: int) -> Iterator[Chunk]:
    """Regroup the spans of a stream into packets of ``chunk_size`` tokens, each yielded as soon as
    the pass that completes it has run; after the stream ends, one ``last`` chunk with the rest
    (possibly empty, so that the consumer always learns the final counts)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    pieces: list[Tensor] = []  # the pending codes, joined only when a chunk is complete
    n_pending = 0
    step = None
    for step in steps:
        if len(step.speech):
            pieces.append(step.speech.long().cpu())
            n_pending += len(step.speech)
        if n_pending >= chunk_size:
            pending = torch.cat(pieces)
            while len(pending) >= chunk_size:
                yield Chunk(pending[:chunk_size], step.text_tokens_read, step.forward_passes, last=False)
                pending = pending[chunk_size:]
            pieces, n_pending = [pending], len(pending)
    if step is not None:
        rest = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long)
        yield Chunk(rest, step.text_tokens_read, step.forward_passes, last=True)


class _Decoder:
    """Runs the backbone over a growing, croppable layout: with a KV cache (only the new positions
    go through the network) or without (the whole layout every pass). Same positions and mask either
    way. ``passes`` counts backbone calls.

    The layout lives in one preallocated int64 table, one column per position, rows :data:`FIELDS`:
    what the network and the mask read of the :class:`Layout` fields (ids, positions, text or
    stream, span) and, per position as a query, the bounds of the hybrid mask
    (:func:`hybrid_attention_mask`) in the form ``key allowed <=> key position < limit`` (the
    limit for text keys and the one for stream keys) plus the span it shares with its keys (-2:
    none). A pass's new positions are collected as Python ints (``add_*``) and written with one
    copy; its mask rows are then a few elementwise operations over ``[new, all]``, the same booleans
    as :func:`hybrid_attention_mask` (tests/test_syncspeech.py compares them).

    One row of a batch (``in_batch``, :class:`_BatchDecoder`): the table's columns are the batch's
    cache slots, so :meth:`drop_last` cannot cut them; it turns them into :data:`PADDING` columns
    instead (attended by no real query), and the batch cuts the slots that are padding in every row."""

    FIELDS = ("input_ids", "position_ids", "is_text", "span", "text_limit", "stream_limit", "query_span")
    # a column that is no position: its key position is never below a limit and its span (-3) is no
    # real query's, so no real query attends it; as a query it attends only such columns (itself
    # among them, so that no attention row is empty)
    PADDING = (0, 1 << 30, 0, -3, 0, 0, -3)

    def __init__(self, model: SyncSpeech, cached: bool, capacity: int = 256, *, in_batch: bool = False):
        from arnar.nn import KVCache

        self.model = model
        self.bidirectional = model.attention == "hybrid"
        self.device = model.embed.weight.device
        self.cache = KVCache() if cached and not in_batch else None
        self.in_batch = in_batch
        self.passes = 0
        self.table = torch.zeros(len(self.FIELDS), capacity, dtype=torch.long)
        self.length = 0  # positions in the layout
        self.pending: list[list[int]] = [[] for _ in self.FIELDS]

    def _add(self, ids: list[int], positions: range, *, is_text: bool, span: int = -1, text_seen: int = 0) -> None:
        n = len(ids)
        columns = self.pending
        columns[0].extend(ids)
        columns[1].extend(positions)
        columns[2].extend([int(is_text)] * n)
        columns[3].extend([span] * n)
        if is_text:  # text queries: text keys up to their own position, no stream key
            columns[4].extend(p + 1 for p in positions)
            columns[5].extend([0] * n)
        else:  # stream queries: the text seen, stream keys up to their own position
            columns[4].extend([text_seen] * n)
            columns[5].extend(p + 1 for p in positions)
        columns[6].extend([span if self.bidirectional and span >= 0 else -2] * n)

    def add_text(self, ids: list[int], start: int) -> None:
        """Text tokens (shared ids) at text positions ``start, start + 1, ..`` (:func:`text_part`)."""
        self._add(ids, range(start, start + len(ids)), is_text=True)

    def add_span(self, ids: list[int], start: int, text_seen: int, token: int) -> None:
        """Speech/mask tokens of text token ``token`` from stream position ``start`` (:func:`span_part`)."""
        self._add(ids, range(start, start + len(ids)), is_text=False, span=token, text_seen=text_seen)

    def add_marker(self, token: int, position: int, text_seen: int) -> None:
        """One ``E`` or ``D`` at stream ``position`` (:func:`marker`; which token's duration a ``D``
        predicts is the caller's bookkeeping)."""
        self._add([token], range(position, position + 1), is_text=False, text_seen=text_seen)

    def take_pending(self, width: int | None = None) -> Tensor:
        """The positions added since the last pass as new table columns ``[FIELDS, n]``, followed
        by :data:`PADDING` columns up to ``width`` (a batch's widest row)."""
        pending = self.pending
        n = len(pending[0])
        if width is not None and width > n:
            pending = [column + [value] * (width - n) for column, value in zip(pending, self.PADDING)]
        new = torch.tensor(pending, dtype=torch.long).reshape(len(self.FIELDS), -1)
        self.pending = [[] for _ in self.FIELDS]
        start, end = self.length, self.length + new.shape[1]
        if end > self.table.shape[1]:
            grown = torch.zeros(len(self.FIELDS), max(2 * self.table.shape[1], end), dtype=torch.long)
            grown[:, :start] = self.table[:, :start]
            self.table = grown
        self.table[:, start:end] = new
        self.length = end
        return new

    def run(self) -> Tensor:
        """Hidden states ``[n, dim]`` of the ``n`` positions added since the last pass, now part of
        the layout."""
        new = self.take_pending()
        n = new.shape[1]
        keys = self.table[:, :self.length]
        queries = new if self.cache is not None else keys.clone()  # inputs never alias the table
        mask = self.attention_mask(keys, queries)
        model = self.model
        hidden = model.backbone(model.embed(queries[0].to(self.device))[None], queries[1].to(self.device)[None],
                                mask.to(self.device)[None], cache=self.cache)
        self.passes += 1
        return hidden[0] if self.cache is not None else hidden[0, -n:]

    @staticmethod
    def attention_mask(keys: Tensor, queries: Tensor) -> Tensor:
        """``[..., len(queries), len(keys)]`` hybrid mask from table columns ``[..., FIELDS, n]`` (see
        the class docstring)."""
        key_text = keys[..., 2, None, :].bool()
        limit = torch.where(key_text, queries[..., 4, :, None], queries[..., 5, :, None])
        return (keys[..., 1, None, :] < limit) | (keys[..., 3, None, :] == queries[..., 6, :, None])

    def drop_last(self, n: int) -> None:
        """Forget the last ``n`` positions (layout and cache; in a batch, the last ``n`` that are
        not padding become padding)."""
        if not self.in_batch:
            self.length -= n
            if self.cache is not None:
                self.cache.crop(self.length)
            return
        real = (self.table[3, :self.length] != self.PADDING[3]).nonzero().flatten()
        for column in real[len(real) - n:].tolist():
            self.table[:, column] = torch.tensor(self.PADDING)


class _BatchDecoder:
    """:class:`_Decoder` passes for B layouts at once (``rows``, one per item), one backbone call
    each: every row's new positions padded with :data:`_Decoder.PADDING` columns to the widest
    row's, one KV cache whose slots are the rows' table columns. Before a pass, slots at the end
    that are padding in every row are cut from the tables and the cache (for one row that is
    exactly :meth:`_Decoder.drop_last`'s crop)."""

    def __init__(self, model: SyncSpeech, cached: bool, rows: int):
        from arnar.nn import KVCache

        self.model, self.device = model, model.embed.weight.device
        self.rows = [_Decoder(model, cached, in_batch=True) for _ in range(rows)]
        self.cache = KVCache() if cached else None
        self.passes = 0

    def run(self) -> list[Tensor]:
        """Hidden states ``[n_b, dim]`` of the positions each row added since the last pass."""
        rows = self.rows
        length = rows[0].length
        while length > 0 and all(int(row.table[3, length - 1]) == _Decoder.PADDING[3] for row in rows):
            length -= 1
        if length < rows[0].length:
            for row in rows:
                row.length = length
            if self.cache is not None:
                self.cache.crop(length)
        counts = [len(row.pending[0]) for row in rows]
        width = max(counts)
        new = torch.stack([row.take_pending(width) for row in rows])
        keys = torch.stack([row.table[:, :row.length] for row in rows])
        queries = new if self.cache is not None else keys.clone()
        mask = _Decoder.attention_mask(keys, queries)
        model = self.model
        hidden = model.backbone(model.embed(queries[:, 0].to(self.device)), queries[:, 1].to(self.device),
                                mask.to(self.device), cache=self.cache)
        self.passes += 1
        for row in rows:
            row.passes = self.passes
        first = 0 if self.cache is not None else length
        return [hidden[b, first:first + n] for b, n in enumerate(counts)]


# ----------------------------------------------------------------------------- the paradigm

@register_paradigm
class SyncSpeech(Paradigm):
    name = "syncspeech"

    def __init__(self, vocab, model, *, stage: str = "finetune", q: int = 1, max_duration: int = 50,
                 attention: str = "hybrid", prefill_duration: bool = True, finetune_spans: str = "one",
                 input_noise: float = 0.0, **options: Any):
        if options:
            raise ValueError(f"syncspeech: unknown options {sorted(options)}; known: stage, q, max_duration, "
                             "attention, prefill_duration, finetune_spans, input_noise")
        if not 0.0 <= float(input_noise) < 1.0:
            raise ValueError(f"syncspeech: input_noise must lie in [0, 1), got {input_noise}")
        if finetune_spans not in FINETUNE_SPANS:
            raise ValueError(f"syncspeech: finetune_spans must be one of {FINETUNE_SPANS}, got {finetune_spans!r}")
        if stage not in STAGES:
            raise ValueError(f"syncspeech: stage must be one of {STAGES}, got {stage!r}")
        if attention not in ATTENTIONS:
            raise ValueError(f"syncspeech: attention must be one of {ATTENTIONS}, got {attention!r}")
        if int(q) < 0 or int(max_duration) < 1:
            raise ValueError(f"syncspeech: need q >= 0 and max_duration >= 1, got q={q}, max_duration={max_duration}")
        super().__init__(vocab, model, stage=stage, q=int(q), max_duration=int(max_duration), attention=attention,
                         prefill_duration=bool(prefill_duration), finetune_spans=finetune_spans,
                         input_noise=float(input_noise))
        self.stage, self.q, self.max_duration = stage, int(q), int(max_duration)
        self.attention, self.prefill_duration = attention, bool(prefill_duration)
        self.finetune_spans = finetune_spans
        self.input_noise = float(input_noise)
        # Eq. 5: a second linear layer on the same hidden states, over durations 0..max_duration
        self.duration_head = torch.nn.Linear(self.model_config.dim, self.max_duration + 1)
        torch.nn.init.normal_(self.duration_head.weight, std=0.02)
        torch.nn.init.zeros_(self.duration_head.bias)

    # -- training
    def sequence_length(self, utt: Utterance) -> int:
        """Longest training sequence of ``utt`` (n = L: all text, L + 1 D's, all frames; packed: the
        masked copies' frames and D's on top), for the engine's token budget."""
        if self.stage == "finetune" and self.finetune_spans == "all":
            return 3 * len(utt.text) + 2 * utt.num_frames + 1
        return 2 * len(utt.text) + utt.num_frames + 2

    def training_example(self, utt: Utterance, generator: torch.Generator) -> Example:
        ends = check_ends(utt.ends, len(utt.text), utt.num_frames, utt.utt_id)
        L = len(utt.text)
        target_durations = durations(ends).clamp(max=self.max_duration)
        if self.stage == "pretrain":
            layout, targets = pretrain_sequence(self.vocab, utt.text, utt.speech, ends,
                                                pretrain_text_mask(L, generator))
            scored = layout.duration_of >= 0  # every D predicts the span after it
            mask = None
        elif self.finetune_spans == "all":
            layout, targets, copy_of, mask = packed_finetune_sequence(
                self.vocab, utt.text, utt.speech, ends, self.q, bidirectional=self.attention == "hybrid")
            # D' of each copy predicts the next span's length (Eq. 5); D_n before it l_n (prefill)
            scored = (layout.duration_of >= 0) & ((copy_of >= 0) | self.prefill_duration)
        else:
            n = int(torch.randint(1, L + 1, (), generator=generator))
            layout, targets = finetune_sequence(self.vocab, utt.text, utt.speech, ends, n, self.q)
            scored = layout.duration_of == n  # Eq. 5: l_{n+1} (0-based index n); none when n = L
            if self.prefill_duration:
                scored = scored | (layout.duration_of == n - 1)  # l_n from the D before the mask
            mask = None
        scored = scored & (layout.duration_of < L)
        duration_targets = torch.full((len(layout),), IGNORE, dtype=torch.long)
        duration_targets[scored] = target_durations[layout.duration_of[scored]]
        if mask is None:
            mask = hybrid_attention_mask(layout, bidirectional=self.attention == "hybrid")
        input_ids = layout.input_ids
        if self.stage == "finetune" and self.input_noise > 0:  # drawn only when set: other runs keep their draws
            input_ids = self.corrupt_spoken_spans(input_ids, generator)
        return Example(input_ids, layout.position_ids, targets, mask,
                       extras={"duration_targets": duration_targets})

    def corrupt_spoken_spans(self, input_ids: Tensor, generator: torch.Generator) -> Tensor:
        """``input_ids`` with a share ``input_noise`` of its real speech tokens (never ``<mask>``, text
        or markers) replaced by uniform random codes: the spans decoding would have produced itself."""
        spoken = self.vocab.is_speech(input_ids)
        codes = self.vocab.speech_codes(input_ids[spoken])
        noisy = input_ids.clone()
        noisy[spoken] = self.vocab.speech(corrupt(codes, self.input_noise, self.vocab.speech_size, generator))
        return noisy

    def forward(self, batch: Batch) -> LossOutput:
        """Eq. 4 + Eq. 5 as sums over their targets, with one count for both."""
        hidden = self.backbone(self.embed(batch.input_ids), batch.position_ids, batch.attention_mask)
        speech_keep = batch.targets != IGNORE
        speech_logits = self.head(hidden[speech_keep]).float()
        speech_gold = batch.targets[speech_keep]
        # collate pads extras with 0, a valid duration: padding positions get no target
        real = torch.arange(batch.input_ids.shape[1], device=hidden.device)[None, :] < batch.lengths[:, None]
        duration_targets = batch.extras["duration_targets"].masked_fill(~real, IGNORE)
        duration_keep = duration_targets != IGNORE
        duration_logits = self.duration_head(hidden[duration_keep]).float()
        duration_gold = duration_targets[duration_keep]
        ce = torch.nn.functional.cross_entropy
        speech_loss = ce(speech_logits, speech_gold, reduction="sum")
        duration_loss = ce(duration_logits, duration_gold, reduction="sum")
        with torch.no_grad():
            duration_guess = duration_logits.argmax(-1)
            correct = (speech_logits.argmax(-1) == speech_gold).sum() + (duration_guess == duration_gold).sum()
            metrics = {  # the engine divides each by the number of targets (speech + duration)
                "correct": correct.float(),
                "speech_loss": speech_loss.detach(),
                "duration_loss": duration_loss.detach(),
                "duration_abs_error": (duration_guess - duration_gold).abs().sum().float(),
            }
        return LossOutput(speech_loss + duration_loss, speech_keep.sum() + duration_keep.sum(), metrics)

    # -- decoding
    def decoding_options(self, decoding: dict[str, Any]) -> dict[str, Any]:
        return decoding_options("SyncSpeech", DECODING, decoding)

    def _choose(self, logits: Tensor, generator: torch.Generator, top_k: int, temperature: float) -> Tensor:
        """Greedy when ``top_k == 1`` (or temperature 0), else sample among the ``top_k`` best; on the
        CPU, where the caller's generator lives."""
        if top_k == 1 or temperature <= 0:
            return logits.argmax(-1).cpu()
        ids, _ = sample_tokens(logits.float().cpu(), generator, temperature=temperature, top_k=top_k)
        return ids

    @torch.no_grad()
    def stream(self, text: Iterable[int], prompt_text: Tensor, prompt_speech: Tensor, generator: torch.Generator, *,
               prompt_ends: Tensor | None = None, text_ends: Tensor | None = None,
               **decoding: Any) -> Iterator[StreamStep]:
        """Text-synchronous decoding (see the module docstring): pulls target BPE ids from ``text``
        only when a pass needs them (``y_{n+q}`` before the pass for ``y_n``) and yields one
        :class:`StreamStep` per forward pass (the first carries no speech). ``prompt_ends``: the
        prompt's a_n (default :func:`uniform_ends`); ``text_ends``: oracle a_n of the target."""
        opts = self.decoding_options(decoding)
        decoder = _Decoder(self, cached=bool(opts["cached"]))
        item = _ItemStream(self, decoder, text, prompt_text, prompt_speech, generator, opts,
                           prompt_ends=prompt_ends, text_ends=text_ends)
        while item.prepare():
            yield item.finish(decoder.run())

    def _span_codes(self, span_hidden: Tensor, generator: torch.Generator, top_k: int, temperature: float) -> Tensor:
        """Speech codes ``[n]`` of one span's hidden states: :meth:`_choose` over the head's logits
        restricted to the speech ids. Greedy reads the speech columns (the same argmax, no
        restricted copy)."""
        logits = self.head(span_hidden)
        if top_k == 1 or temperature <= 0:
            return logits[:, self.vocab.speech_offset:].argmax(-1).cpu()
        allowed = torch.zeros(self.vocab.size, dtype=torch.bool)
        allowed[self.vocab.speech_offset:] = True
        ids = self._choose(restrict_logits(logits, allowed), generator, top_k, temperature)
        return self.vocab.speech_codes(ids.reshape(-1))

    @torch.no_grad()
    def generate(self, request: SynthesisRequest, generator: torch.Generator, **decoding: Any) -> Generation:
        """The whole text at once, the batch of one of :meth:`generate_batch`."""
        return self.generate_batch([request], [generator], **decoding)[0]

    @torch.no_grad()
    def generate_batch(self, requests: list[SynthesisRequest], generators: list[torch.Generator],
                       **decoding: Any) -> list[Generation]:
        """The streams of B requests (:meth:`stream`'s passes, each item's text still consumed token
        by token as the look-ahead dictates, so the tokens equal those of a live stream), one
        backbone pass for all of them each time (:class:`_BatchDecoder`): each item adds its own
        positions, with its own durations, sampled from its own generator exactly as alone; an
        item whose text is spoken rides along as padding until the longest text is. Timing fields
        and ``forward_passes`` are the batch's (the papers' FPL and RTF are batch-1 figures:
        measure those with :meth:`generate`); ``first_packet_passes`` is the item's own."""
        if len(requests) != len(generators):
            raise ValueError(f"{len(requests)} requests but {len(generators)} generators")
        opts = self.decoding_options(decoding)
        start = time.perf_counter()
        batch = _BatchDecoder(self, cached=bool(opts["cached"]), rows=len(requests))
        items = [_ItemStream(self, row, request.text.tolist(), request.prompt_text, request.prompt_speech, generator,
                             opts, prompt_ends=request.features.get("prompt_ends"), text_ends=request.text_ends)
                 for row, request, generator in zip(batch.rows, requests, generators)]
        steps: list[list[StreamStep]] = [[] for _ in items]
        seconds = []  # after each pass, since the start
        running = [item.prepare() for item in items]
        while any(running):
            hidden = batch.run()
            seconds.append(time.perf_counter() - start)
            for b, item in enumerate(items):
                if running[b]:
                    steps[b].append(item.finish(hidden[b]))
                    running[b] = item.prepare()
        return [self._generation(request, item_steps, seconds, batch.passes, opts)
                for request, item_steps in zip(requests, steps)]

    def _generation(self, request: SynthesisRequest, steps: list[StreamStep], seconds: list[float], passes: int,
                    opts: dict[str, Any]) -> Generation:
        """One item's :class:`Generation` from its stream's steps: its spans regrouped into packets
        of ``chunk_size`` (:func:`speech_chunks`), the first packet's passes, time and text read;
        ``seconds[k]``: the time after pass ``k + 1``."""
        chunks = list(speech_chunks(steps, int(opts["chunk_size"])))
        speech = torch.cat([chunk.speech for chunk in chunks]) if chunks else torch.zeros(0, dtype=torch.long)
        info: dict[str, Any] = {
            "chunk_size": int(opts["chunk_size"]),
            "durations_from": "oracle" if request.text_ends is not None else "predicted",
            "prompt_ends": "uniform" if request.features.get("prompt_ends") is None else "aligned",
            "cached": bool(opts["cached"]),
        }
        if steps:  # the text tokens read before the first pass: Eq. 7's q + 1
            info["text_tokens_to_start"] = steps[0].text_tokens_read
        first = chunks[0] if chunks else None
        if first is not None:
            info.update(text_tokens_waited=first.text_tokens_read,
                        first_packet_seconds=seconds[first.forward_passes - 1])
        return Generation(speech, forward_passes=passes if steps else 0,
                          first_packet_passes=first.forward_passes if first else None, info=info)


class _ItemStream:
    """One item of text-synchronous decoding (the module docstring's steps 1 and 2): :meth:`prepare`
    waits for the text the next pass needs and adds that pass's positions to the item's layout
    (``decoder``); :meth:`finish` reads the pass's hidden states of those positions: the span's
    speech codes and the next duration. Shared by :meth:`SyncSpeech.stream` (one item, its own
    :class:`_Decoder`) and :meth:`SyncSpeech.generate_batch` (a row of a :class:`_BatchDecoder`),
    so both take the same decisions."""

    def __init__(self, model: SyncSpeech, decoder: _Decoder, text: Iterable[int], prompt_text: Tensor,
                 prompt_speech: Tensor, generator: torch.Generator, opts: dict[str, Any], *,
                 prompt_ends: Tensor | None = None, text_ends: Tensor | None = None):
        self.model, self.decoder, self.generator, self.q = model, decoder, generator, model.q
        self.prompt_text = torch.as_tensor(prompt_text).long().cpu()
        self.prompt_speech = torch.as_tensor(prompt_speech).long().cpu()
        self.P = P = len(self.prompt_text)
        self.prompt_ends = (uniform_ends(P, len(self.prompt_speech)) if prompt_ends is None
                            else check_ends(prompt_ends, P, len(self.prompt_speech), "prompt"))
        self.given = None if text_ends is None else durations(text_ends).tolist()
        self.duration_top_k, self.speech_top_k = int(opts["duration_top_k"]), int(opts["speech_top_k"])
        self.temperature = float(opts["temperature"])
        self.source, self.arrived, self.ended = iter(text), [], False
        self.n = -1  # the pass prepared last: 0 is the first (duration only), n >= 1 speaks y_n
        self.position = 0  # the next free stream position
        self.in_sequence = 0  # target text tokens already placed in the sequence
        self.duration = 0  # of the text token spoken next
        self.previous_ids: list[int] | None = None  # the span decoded last pass, shared ids (None: none yet)

    def wait_for(self, count: int) -> None:
        while len(self.arrived) < count and not self.ended:
            try:
                self.arrived.append(int(next(self.source)))
            except StopIteration:
                self.ended = True

    def next_duration(self, hidden_of_d: Tensor, index: int) -> int:
        """Duration of target token ``index`` (0-based): the oracle's if given, else sampled."""
        if self.given is not None:
            return int(self.given[index]) if index < len(self.given) else 0
        logits = self.model.duration_head(hidden_of_d)
        return int(self.model._choose(logits, self.generator, self.duration_top_k, self.temperature))

    def prepare(self) -> bool:
        """Add the next pass's positions; False when the stream is over (no pass to run)."""
        self.n += 1
        decoder, vocab, P, arrived = self.decoder, self.model.vocab, self.P, self.arrived
        text_offset, speech_offset = vocab.text_offset, vocab.speech_offset
        if self.n == 0:  # 1. the first pass: once q + 1 text tokens are there, predict the first duration
            self.wait_for(self.q + 1)
            if not arrived:
                return False
            seen = P + len(arrived)
            decoder.add_text([i + text_offset for i in self.prompt_text.tolist() + arrived], 0)
            decoder.add_marker(END_OF_TEXT, 0, seen)
            position = 1
            prompt_ids = [c + speech_offset for c in self.prompt_speech.tolist()]
            prompt_starts = [0] + self.prompt_ends.tolist()[:-1]
            for k, (a, b) in enumerate(zip(prompt_starts, self.prompt_ends.tolist())):
                decoder.add_marker(DURATION, position, seen)
                decoder.add_span(prompt_ids[a:b], position + 1, seen, token=k)
                position += 1 + len(prompt_ids[a:b])
            decoder.add_marker(DURATION, position, seen)
            self.position = position + 1
            return True
        # 2. one pass per target text token: wait for y_{n+q} (or the end of the text)
        n = self.n
        self.wait_for(n + self.q)
        if len(arrived) < n:
            return False
        token = P + n - 1  # 0-based index, prompt included, of the text token spoken now
        seen = P + len(arrived)
        decoder.add_text([i + text_offset for i in arrived[self.in_sequence:]], P + self.in_sequence)
        self.in_sequence = len(arrived)
        position, previous_ids, duration = self.position, self.previous_ids, self.duration
        if previous_ids is not None:
            # the last pass's masks and the D after them attended masks: replace them by the real
            # tokens (and that D again), as every span before the masked one is in training
            decoder.drop_last(len(previous_ids) + 1)
            position -= len(previous_ids) + 1
            decoder.add_span(previous_ids, position, seen, token=token - 1)
            decoder.add_marker(DURATION, position + len(previous_ids), seen)
            position += len(previous_ids) + 1
        decoder.add_span([MASK] * duration, position, seen, token=token)
        decoder.add_marker(DURATION, position + duration, seen)
        self.position = position + duration + 1
        return True

    def finish(self, hidden: Tensor) -> StreamStep:
        """The prepared pass's result from ``hidden``, the hidden states of its positions."""
        if self.n == 0:
            self.duration = self.next_duration(hidden[-1], 0)
            self.in_sequence = len(self.arrived)
            return StreamStep(torch.zeros(0, dtype=torch.long), len(self.arrived), self.decoder.passes, self.duration)
        previous, self.previous_ids = torch.zeros(0, dtype=torch.long), []
        duration = self.duration
        if duration > 0:
            previous = self.model._span_codes(hidden[len(hidden) - 1 - duration:len(hidden) - 1], self.generator,
                                              self.speech_top_k, self.temperature)
            self.previous_ids = [c + self.model.vocab.speech_offset for c in previous.tolist()]
        self.duration = self.next_duration(hidden[-1], self.n)
        return StreamStep(previous, len(self.arrived), self.decoder.passes, self.duration)
