"""Word/phone intervals -> BPE-level duration tokens a_1..a_L in codec frames (SyncSpeech 2.1).

SyncSpeech defines, for every BPE token y_n, the end position a_n of its speech in the speech-token
sequence, with a_L = T. The papers convert an MFA phone alignment to BPE level but do not say how;
this module is that conversion, and these are its rules:

1. **Time -> frames.** The audio's duration D maps exactly onto the T codec frames: a time t is
   frame position t * T / D (so a_L = T is the end of the audio whatever the codec's padding).
2. **Words own their pauses.** Text words are the whitespace-separated words of the normalised
   text (the same indexing as ``BpeTokenizer.encode_with_words``). A spoken word's region starts
   where its speech starts and runs to where the next spoken word starts: the pause after a word
   belongs to that word (in streaming, the pause is spoken once the word's text has arrived).
   Leading silence belongs to the first spoken word, trailing silence to the last.
3. **Words without speech** (a free-standing dash, "&" not read, ...) get zero frames at the
   boundary where they stand.
4. **Pieces split their word's region.** Within a word, the spoken part (speech start to speech
   end) is shared among the pieces that carry letters or digits, in proportion to their number of
   characters; pieces of punctuation only get nothing of it. The pause after the word goes to the
   word's last piece, which is its punctuation when it has some ("hello," -> the "," piece holds
   the pause).
5. **Rounding.** Cumulative end positions are computed in real-valued frames and each is rounded
   once (never the individual durations, so errors do not accumulate), then forced to be
   non-decreasing and a_L = T exactly. Durations l_n = a_n - a_(n-1) may be 0.

Phone-level durations (for duration predictors) follow the same frame mapping: spoken phones
in order with a ``<sil>`` entry for every gap, summing to T.

**Phonemes as text units** (``text.units: phonemes``, :class:`arnar.text.PhonemeTokenizer`): the
same rules with phones as a word's pieces, each phone an equal share of its word's speech (rule 4
with one "character" per phone). The word separators between words (``|``, or ``<sil>`` where
punctuation marks a pause) belong to the word before them as its last piece, as a BPE word's
punctuation does: they get no speech and hold the pause after that word.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

from arnar.align.base import Interval, spoken_words

SILENCE = "<sil>"
_ALNUM = re.compile(r"[^\W_]", re.UNICODE)  # a letter or a digit
_BYTE_PIECE = re.compile(r"^<0x[0-9A-F]{2}>$")  # sentencepiece byte fallback: part of one character


class DurationError(ValueError):
    """The alignment and the text do not fit together (the item is quarantined with this)."""


def num_frames(duration: float, frame_rate: float) -> int:
    """Frames a codec at ``frame_rate`` gives for ``duration`` seconds (at least one)."""
    return max(1, math.ceil(duration * frame_rate - 1e-9))


def word_spans(text_words: Sequence[str], aligned: Sequence[Interval]) -> list[tuple[float, float] | None]:
    """Match the aligner's words to the text's words, in order.

    A text word may cover several aligned words ("well-known" is aligned as "well" + "known"),
    its span being their union; a text word with no letters or digits has no span (None). The
    aligner's symbols must equal the text's spoken tokens one for one, else DurationError.
    """
    spans: list[tuple[float, float] | None] = []
    position = 0
    for word in text_words:
        tokens = spoken_words(word)
        if not tokens:
            spans.append(None)
            continue
        matched = list(aligned[position:position + len(tokens)])
        symbols = [m.symbol.lower() for m in matched]
        if symbols != tokens:
            raise DurationError(
                f"alignment words {symbols} do not match text word {word!r} (expected {tokens}) "
                f"at aligned word {position}"
            )
        spans.append((matched[0].start, matched[-1].end))
        position += len(tokens)
    if position != len(aligned):
        extra = [a.symbol for a in aligned[position:]]
        raise DurationError(f"alignment has words the text does not: {extra}")
    return spans


@dataclass(frozen=True)
class BpeDurations:
    """a_1..a_L (end frames, a_L = T) for the BPE ids of one utterance."""

    ids: list[int]
    ends: list[int]
    num_frames: int

    @property
    def lengths(self) -> list[int]:
        """l_n = a_n - a_(n-1), with a_0 = 0."""
        return [end - start for start, end in zip([0] + self.ends[:-1], self.ends)]


def bpe_end_positions(
    pieces: Sequence[str],
    piece_words: Sequence[int],
    spans: Sequence[tuple[float, float] | None],
    duration: float,
    total_frames: int,
) -> list[int]:
    """The rules of the module docstring, for pieces (text without the "▁" word marker) each
    belonging to word ``piece_words[n]`` whose speech spans ``spans[w]`` (seconds, or None)."""
    if len(pieces) != len(piece_words):
        raise DurationError("pieces and their word indices differ in length")
    if not pieces:
        raise DurationError("no BPE pieces")
    if duration <= 0 or total_frames < 1:
        raise DurationError(f"duration {duration} s / {total_frames} frames: nothing to align to")
    scale = total_frames / duration  # frames per second, so that D -> T exactly
    spoken = [w for w, span in enumerate(spans) if span is not None]
    if not spoken:
        raise DurationError("no spoken word in the alignment")

    # Region of every word in real-valued frames: [region_start, speech_end) is speech,
    # [speech_end, region_end) is the pause it owns.
    region_start, speech_end, region_end = {}, {}, {}
    for k, w in enumerate(spoken):
        start, end = spans[w]
        region_start[w] = 0.0 if k == 0 else start * scale
        speech_end[w] = max(region_start[w], min(end * scale, total_frames))
        region_end[w] = float(total_frames) if k == len(spoken) - 1 else spans[spoken[k + 1]][0] * scale
        if region_end[w] < speech_end[w]:  # overlapping words: the next word's start wins
            speech_end[w] = region_end[w]

    if max(piece_words) >= len(spans) or min(piece_words) < 0:
        raise DurationError(f"pieces refer to word {max(piece_words)} of a text with {len(spans)} words")
    pieces_of: dict[int, list[int]] = {}
    for n, w in enumerate(piece_words):
        pieces_of.setdefault(w, []).append(n)

    boundary = [0.0] * len(pieces)  # real-valued end position of every piece
    cursor = 0.0
    for w in sorted(pieces_of):
        members = pieces_of[w]
        if spans[w] is None:
            for n in members:  # no speech: zero frames where the word stands
                boundary[n] = cursor
            continue
        cursor = region_start[w]
        weights = [1 if _BYTE_PIECE.match(pieces[n]) else len(_ALNUM.findall(pieces[n])) for n in members]
        if sum(weights) == 0:
            weights = [1] * len(members)
        speech = speech_end[w] - region_start[w]
        for n, weight in zip(members, weights):
            cursor += speech * weight / sum(weights)
            boundary[n] = cursor
        boundary[members[-1]] = region_end[w]  # the last piece also holds the pause after the word
        cursor = region_end[w]

    ends, previous = [], 0
    for value in boundary:
        previous = max(previous, min(total_frames, int(math.floor(value + 0.5))))
        ends.append(previous)
    ends[-1] = total_frames
    return ends


def bpe_durations(
    text: str,
    words: Sequence[Interval],
    duration: float,
    tokenizer,
    *,
    frame_rate: float | None = None,
    total_frames: int | None = None,
) -> BpeDurations:
    """a_n for the BPE tokens of ``text`` from an alignment's word intervals.

    ``total_frames`` is the codec's token count T for the utterance; without it,
    ``num_frames(duration, frame_rate)``.
    """
    from arnar.text.normalize import normalize_text

    if total_frames is None:
        if frame_rate is None:
            raise ValueError("give total_frames or frame_rate")
        total_frames = num_frames(duration, frame_rate)
    normalized = normalize_text(text)
    ids_words = tokenizer.encode_with_words(normalized)
    ids = [i for i, _ in ids_words]
    piece_words = [w for _, w in ids_words]
    if any(w < 0 for w in piece_words):  # phonemes: a separator is the last piece of the word before it
        pieces = ["" if w < 0 else "p" for w in piece_words]  # one share per phone, none per separator
        piece_words = [w if w >= 0 else piece_words[n - 1] for n, w in enumerate(piece_words)]
    else:
        pieces = [tokenizer.id_to_piece(i).replace("\u2581", "") for i in ids]
    spans = word_spans(normalized.split(" "), words)
    ends = bpe_end_positions(pieces, piece_words, spans, duration, total_frames)
    return BpeDurations(ids=ids, ends=ends, num_frames=total_frames)


def phone_durations(
    phones: Sequence[Interval], duration: float, total_frames: int
) -> list[tuple[str, int]]:
    """Spoken phones with ``<sil>`` for every gap, as (symbol, frames) summing to T."""
    if duration <= 0 or total_frames < 1:
        raise DurationError(f"duration {duration} s / {total_frames} frames: nothing to align to")
    scale = total_frames / duration
    segments: list[tuple[str, float]] = []  # (symbol, end in real frames)
    cursor = 0.0
    for phone in phones:
        start, end = phone.start * scale, min(phone.end * scale, total_frames)
        if start > cursor + 1e-9:
            segments.append((SILENCE, start))
        segments.append((phone.symbol, max(end, start)))
        cursor = max(cursor, end)
    if cursor < total_frames - 1e-9:
        segments.append((SILENCE, float(total_frames)))
    result, previous = [], 0
    for index, (symbol, end) in enumerate(segments):
        frame = total_frames if index == len(segments) - 1 else max(previous, min(total_frames, int(math.floor(end + 0.5))))
        result.append((symbol, frame - previous))
        previous = frame
    return result
