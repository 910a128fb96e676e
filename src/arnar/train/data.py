"""Training data for the paradigms: token shards joined with BPE durations, and length buckets.

:func:`load_utterances` joins two files made by the pipeline:

* the speech tokens of one split (``data/<profile>/tokens/<codec>/<split>/``, read by
  :func:`arnar.codec.shards.read_token_shards`: utt_id -> codes ``[n_codebooks, T]``);
* the BPE durations of that split (``data/<profile>/align/durations_<rate>hz/<split>.jsonl``,
  one row per utterance: ``utt_id``, ``frame_rate``, ``num_frames``, ``bpe_ids`` and ``ends``,
  the frame one past each BPE token's last frame, SyncSpeech's a_n).

An utterance present in only one of them, or whose aligned length differs from its token length
by more than one frame, is skipped and counted (one log line says how many and why): the aligner
and the codec frame the same audio with their own rounding, so one frame of difference is
expected and absorbed by clipping ``ends`` to the token length; more means the two files do not
describe the same audio. A missing or malformed file raises :class:`TrainDataError` naming it.

:class:`BucketBatchSampler` groups utterances of similar length into batches bounded by a
padded-token budget, so that a batch of short utterances is not mostly padding, and shards the
batches over DDP ranks.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arnar.paradigms.base import Utterance, Vocab

__all__ = ["BucketBatchSampler", "TrainDataError", "join_utterances", "join_utterances_plain", "load_utterances",
           "prompt_pairs", "read_durations", "speaker_of", "vocab_for"]

log = logging.getLogger(__name__)

DURATION_KEYS = ("utt_id", "frame_rate", "num_frames", "bpe_ids", "ends")
MAX_FRAME_MISMATCH = 1  # frames of disagreement between aligner and codec that are absorbed


class TrainDataError(ValueError):
    """Training inputs that are missing or malformed (the message names the file)."""


def speaker_of(utt_id: str) -> str:
    """The speaker is the utt_id's prefix before the first '_' (``spk00_0001`` -> ``spk00``,
    LibriTTS ``1089_134686_000001_000000`` -> ``1089``)."""
    return utt_id.split("_", 1)[0]


def read_durations(path: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """utt_id -> row of a BPE durations JSONL file, each row checked for the keys and types the
    join needs (a bad row raises :class:`TrainDataError` naming ``file:line``)."""
    path = Path(path)
    if not path.is_file():
        raise TrainDataError(f"{path}: durations file not found — rerun the bpe_durations rule")
    rows: dict[str, dict[str, Any]] = {}
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                row = json.loads(line)
            except ValueError as err:
                raise TrainDataError(f"{where}: not JSON ({err})") from None
            if not isinstance(row, dict) or any(k not in row for k in DURATION_KEYS):
                raise TrainDataError(f"{where}: a durations row needs the keys {list(DURATION_KEYS)}")
            ids, ends = row["bpe_ids"], row["ends"]
            if not (isinstance(ids, list) and isinstance(ends, list) and len(ids) == len(ends)):
                raise TrainDataError(f"{where}: bpe_ids and ends must be lists of equal length")
            if not all(isinstance(v, int) for v in ids + ends) or any(v < 0 for v in ids + ends):
                raise TrainDataError(f"{where}: bpe_ids and ends must be non-negative integers")
            if any(b < a for a, b in zip(ends, ends[1:])):
                raise TrainDataError(f"{where}: ends must be non-decreasing")
            if not isinstance(row["num_frames"], int) or row["num_frames"] < 0:
                raise TrainDataError(f"{where}: num_frames must be a non-negative integer")
            if row["utt_id"] in rows:
                raise TrainDataError(f"{where}: utterance {row['utt_id']!r} appears twice")
            rows[row["utt_id"]] = row
    return rows


def join_utterances(
    tokens: Mapping[str, np.ndarray],
    durations: Mapping[str, Mapping[str, Any]],
    *,
    codebook: int = 0,
    codebooks: int = 1,
    max_frames: int | None = None,
) -> tuple[list[Utterance], Counter]:
    """Join codes (utt_id -> ``[n_codebooks, T]``) with durations rows; returns the utterances in
    sorted utt_id order and the counts of what was skipped or adjusted (keys ``no_durations``,
    ``no_tokens``, ``length_mismatch``, ``too_long``, ``empty``, ``clipped``). ``codebooks`` > 1:
    the first ``codebooks`` of the stack, the first as ``speech`` and the rest as ``acoustic``
    (``codebook`` must then be 0: a paradigm that generates a stack generates it from its start)."""
    if codebooks < 1 or (codebooks > 1 and codebook != 0):
        raise TrainDataError(f"codebooks {codebooks} from codebook {codebook}: a stack of codebooks starts at 0")
    counts: Counter = Counter()
    counts["no_durations"] = len(set(tokens) - set(durations))
    counts["no_tokens"] = len(set(durations) - set(tokens))
    utterances = []
    for utt_id in sorted(set(tokens) & set(durations)):
        codes, row = tokens[utt_id], durations[utt_id]
        if not 0 <= codebook < codes.shape[0]:
            raise TrainDataError(f"{utt_id}: codebook {codebook} asked for, the tokens have {codes.shape[0]}")
        if codebooks > codes.shape[0]:
            raise TrainDataError(f"{utt_id}: {codebooks} codebooks asked for (paradigm option codebooks), the tokens "
                                 f"have {codes.shape[0]}")
        T = int(codes.shape[1])
        if abs(int(row["num_frames"]) - T) > MAX_FRAME_MISMATCH:
            counts["length_mismatch"] += 1
            continue
        if T == 0 or not row["bpe_ids"]:
            counts["empty"] += 1
            continue
        if max_frames is not None and T > max_frames:
            counts["too_long"] += 1
            continue
        ends = torch.tensor(row["ends"], dtype=torch.long)
        if int(ends[-1]) != T:
            # a_L = T by definition (SyncSpeech Eq. 1): clip to the token length, stretch the last
            ends = ends.clamp(max=T)
            ends[-1] = T
            counts["clipped"] += 1
        utterances.append(Utterance(
            utt_id=utt_id,
            speaker=speaker_of(utt_id),
            text=torch.tensor(row["bpe_ids"], dtype=torch.long),
            speech=torch.from_numpy(np.asarray(codes[codebook], dtype=np.int64)),
            ends=ends,
            acoustic=torch.from_numpy(np.asarray(codes[1:codebooks], dtype=np.int64)) if codebooks > 1 else None,
        ))
    return utterances, counts


def load_utterances(
    tokens_dir: str | os.PathLike,
    durations_jsonl: str | os.PathLike,
    *,
    codebook: int = 0,
    codebooks: int = 1,
    max_frames: int | None = None,
    features: str | os.PathLike | None = None,
) -> list[Utterance]:
    """The utterances of one split: token shards of ``tokens_dir`` (a split folder with a
    ``manifest.json``) joined with the rows of ``durations_jsonl`` (see the module docstring);
    ``codebook`` / ``codebooks`` as :func:`join_utterances`.
    ``features``: a ``torch.save``d dict ``utt_id -> {name: tensor}`` of per-utterance inputs a
    paradigm needs (``Utterance.features``); utterances without an entry are skipped."""
    from arnar.codec.shards import TokenShardError, read_token_manifest, read_token_shards

    try:
        manifest = read_token_manifest(tokens_dir)
        tokens = read_token_shards(tokens_dir)
    except TokenShardError as err:
        raise TrainDataError(str(err)) from None
    durations = read_durations(durations_jsonl)
    token_rate = float(manifest["codec"]["frame_rate"])
    rates = {float(r["frame_rate"]) for r in durations.values()}
    if rates and rates != {token_rate}:
        raise TrainDataError(
            f"{durations_jsonl}: durations at {sorted(rates)} Hz, the tokens of "
            f"{Path(tokens_dir) / 'manifest.json'} are at {token_rate} Hz"
        )
    if codebooks > int(manifest["codec"].get("n_codebooks", 1)):
        raise TrainDataError(f"{Path(tokens_dir) / 'manifest.json'}: {manifest['codec'].get('n_codebooks', 1)} "
                             f"codebooks, the paradigm generates {codebooks} (option codebooks)")
    utterances, counts = join_utterances(tokens, durations, codebook=codebook, codebooks=codebooks,
                                         max_frames=max_frames)
    if features is not None:
        table = read_features(features)
        kept = []
        for utt in utterances:
            if utt.utt_id in table:
                utt.features = dict(table[utt.utt_id])
                kept.append(utt)
            else:
                counts["no_features"] += 1
        utterances = kept
    skipped = {k: v for k, v in counts.items() if v and k != "clipped"}
    log.info(
        "training data %s + %s: %d utterances, %d frames; skipped %d (%s); ends clipped to the "
        "token length in %d", tokens_dir, durations_jsonl, len(utterances),
        sum(u.num_frames for u in utterances), sum(skipped.values()),
        ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in sorted(skipped.items())) or "none",
        counts["clipped"],
    )
    if not utterances:
        raise TrainDataError(f"no utterance of {tokens_dir} joins with {durations_jsonl} ({dict(counts)})")
    return utterances


def prompt_pairs(utterances: Sequence[Utterance], fraction: float, seed: int,
                 join: Callable[[Utterance, Utterance], Utterance] | None = None) -> list[Utterance]:
    """The training set with a share of its utterances laid out as cross-sentence prompting lays
    out a test item: another utterance of the same speaker in front, text after text and speech
    after speech, as one utterance (``ends`` of the second shifted by the first's frames).

    ``fraction`` of the utterances whose speaker has another one (a seeded choice) get a prompt, itself a seeded choice among
    the speaker's other utterances; the rest stay single, so the epoch still holds every
    utterance once as a target. The papers train on single utterances; this is an option for a
    small corpus, where a model that never saw two sentences joined mis-reads the test layout
    (docs/lab-notes/2026-12-01-to-06-speak-recipe.md). Speakers with one utterance keep it single.

    ``join(prompt, target)``: how a paradigm with per-utterance features (``data.features``) joins
    two of its utterances (CoD: :meth:`arnar.paradigms.cod.CoD.join_prompt_pair`); without it such
    utterances are refused. Plain utterances are joined by :func:`join_utterances_plain`.
    """
    if not 0.0 <= fraction <= 1.0:
        raise TrainDataError(f"data.prompt_pairs must lie in [0, 1], got {fraction}")
    if fraction == 0.0:
        return list(utterances)
    if join is None and any(u.features for u in utterances):
        raise TrainDataError("data.prompt_pairs: utterances with per-utterance features (data.features) "
                             "and a paradigm that does not join them; use prompt_pairs 0 for this paradigm")
    gen = torch.Generator().manual_seed(stable_seed(seed, "prompt_pairs"))
    by_speaker: dict[str, list[int]] = {}
    for i, utt in enumerate(utterances):
        by_speaker.setdefault(utt.speaker, []).append(i)
    eligible = [i for i, utt in enumerate(utterances) if len(by_speaker[utt.speaker]) > 1]
    n_paired = round(fraction * len(eligible))
    paired = {eligible[j] for j in torch.randperm(len(eligible), generator=gen)[:n_paired].tolist()}
    out = []
    for i, target in enumerate(utterances):
        others = by_speaker[target.speaker]
        if i not in paired:
            out.append(target)
            continue
        pick = int(torch.randint(len(others) - 1, (1,), generator=gen))
        prompt = utterances[others[pick] if others[pick] != i else others[-1]]
        out.append((join or join_utterances_plain)(prompt, target))
    return out


def join_utterances_plain(prompt: Utterance, target: Utterance, prompt_frames: int | None = None) -> Utterance:
    """``prompt`` then ``target`` as one utterance: texts and speech concatenated, the target's
    ``ends`` shifted by the prompt's frames. ``prompt_frames``: keep only the prompt's first N
    frames (its ``ends`` clamped to them), for a paradigm whose layout needs a boundary on a grid."""
    n = prompt.num_frames if prompt_frames is None else int(prompt_frames)
    if not 0 < n <= prompt.num_frames:
        raise TrainDataError(f"{prompt.utt_id}: cannot keep {n} of its {prompt.num_frames} frames as a prompt")
    ends = None
    if prompt.ends is not None and target.ends is not None:
        ends = torch.cat([prompt.ends.clamp(max=n), target.ends + n])
    if (prompt.acoustic is None) != (target.acoustic is None):
        raise TrainDataError(f"{prompt.utt_id} + {target.utt_id}: one has the stack's other codebooks, one not")
    acoustic = None if prompt.acoustic is None else torch.cat([prompt.acoustic[:, :n], target.acoustic], dim=1)
    return Utterance(utt_id=f"{prompt.utt_id}+{target.utt_id}", speaker=target.speaker,
                     text=torch.cat([prompt.text, target.text]),
                     speech=torch.cat([prompt.speech[:n], target.speech]), ends=ends, acoustic=acoustic)


def read_features(path: str | os.PathLike) -> dict[str, dict[str, torch.Tensor]]:
    """``utt_id -> {name: tensor}`` from a features file (see :func:`load_utterances`)."""
    try:
        table = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise TrainDataError(f"{path}: features file not found") from None
    except Exception as err:  # noqa: BLE001 - any unpickling failure means a bad file
        raise TrainDataError(f"{path}: unreadable features file ({err})") from None
    if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
        raise TrainDataError(f"{path}: not a features file (expected a dict utt_id -> dict of tensors)")
    return table


def vocab_for(tokens_dir: str | os.PathLike, bpe_model_path: str | os.PathLike) -> Vocab:
    """The shared id space of a run: text size from its text tokenizer (sentencepiece model or
    phoneme JSON, :func:`arnar.text.load_text_tokenizer`), speech size from the codec's codebook
    size in the token manifest."""
    from arnar.codec.shards import TokenShardError, read_token_manifest
    from arnar.text import load_text_tokenizer

    try:
        manifest = read_token_manifest(tokens_dir)
    except TokenShardError as err:
        raise TrainDataError(str(err)) from None
    if not Path(bpe_model_path).is_file():
        raise TrainDataError(f"{bpe_model_path}: text tokenizer not found — rerun the tokenizers rule")
    return Vocab(text_size=load_text_tokenizer(bpe_model_path).vocab_size,
                 speech_size=int(manifest["codec"]["codebook_size"]))


# ----------------------------------------------------------------------------- batching

def stable_seed(*parts: Any) -> int:
    """A 63-bit seed from any printable parts, the same in every process and Python run (unlike
    ``hash``), so that (seed, epoch, batch, position) name one random stream everywhere."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class BucketBatchSampler:
    """Batches of utterance indices, similar lengths together, for one DDP rank.

    Per epoch: indices are sorted by length (ties broken at random from (seed, epoch) when
    ``shuffle``, by index otherwise) and cut greedily into batches whose padded size
    ``len(batch) * max(length)`` stays within ``max_tokens`` (an item longer than the budget
    alone is a batch of one); with ``batch_size`` instead, batches of that many items. The batch
    order is then shuffled from (seed, epoch). Every rank computes the same list and takes the
    batches ``rank, rank + world_size, ...``: disjoint, and the same number on every rank
    (``even=True``: the last ``len % world_size`` batches of the shuffled list are left out this
    epoch, so no rank waits in a collective the others never reach; for evaluation, where only
    the totals are reduced, ``even=False`` keeps them).

    ``len(self)`` and ``iter(self)`` are this rank's batches of the current epoch
    (:meth:`set_epoch`), from the local batch index given to :meth:`set_start` (exact resume);
    :meth:`indexed` also yields each batch's index in the epoch's global list, which with the
    epoch names the batch independently of the world size.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        *,
        max_tokens: int | None = None,
        batch_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        even: bool = True,
    ):
        if (max_tokens is None) == (batch_size is None):
            raise ValueError("give exactly one of max_tokens and batch_size")
        if (max_tokens is not None and max_tokens < 1) or (batch_size is not None and batch_size < 1):
            raise ValueError("max_tokens / batch_size must be >= 1")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world_size {world_size}")
        self.lengths = [int(n) for n in lengths]
        self.max_tokens, self.batch_size = max_tokens, batch_size
        self.shuffle, self.seed = shuffle, seed
        self.rank, self.world_size, self.even = rank, world_size, even
        self.epoch, self.start = 0, 0
        self._cached: tuple[int, list[tuple[int, list[int]]]] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (and start it from its first batch)."""
        self.epoch, self.start = int(epoch), 0

    def set_start(self, batch_index: int) -> None:
        """Skip this rank's first ``batch_index`` batches of the current epoch."""
        self.start = int(batch_index)

    def global_batches(self, epoch: int) -> list[list[int]]:
        """All batches of ``epoch`` in training order, before sharding over ranks."""
        n = len(self.lengths)
        if self.shuffle:
            gen = torch.Generator().manual_seed(stable_seed(self.seed, epoch, "buckets"))
            tiebreak = torch.randperm(n, generator=gen).tolist()
        else:
            tiebreak = list(range(n))
        order = sorted(range(n), key=lambda i: (self.lengths[i], tiebreak[i]))
        batches: list[list[int]] = []
        current: list[int] = []
        for i in order:
            if current:
                # sorted ascending, so the newcomer is the longest: padded size = count * its length
                full = (len(current) >= self.batch_size if self.batch_size is not None
                        else (len(current) + 1) * self.lengths[i] > self.max_tokens)
                if full:
                    batches.append(current)
                    current = []
            current.append(i)
        if current:
            batches.append(current)
        if self.shuffle:
            gen = torch.Generator().manual_seed(stable_seed(self.seed, epoch, "batches"))
            batches = [batches[j] for j in torch.randperm(len(batches), generator=gen).tolist()]
        return batches

    def _mine(self, epoch: int) -> list[tuple[int, list[int]]]:
        if self._cached is None or self._cached[0] != epoch:  # sorting 100k+ lengths is not free
            batches = self.global_batches(epoch)
            usable = len(batches) - len(batches) % self.world_size if self.even else len(batches)
            self._cached = (epoch, [(g, batches[g]) for g in range(self.rank, usable, self.world_size)])
        return self._cached[1]

    def __len__(self) -> int:
        return len(self._mine(self.epoch))

    def indexed(self) -> Iterator[tuple[int, list[int]]]:
        """(global batch index, item indices) of this rank's batches, from the start index."""
        yield from self._mine(self.epoch)[self.start:]

    def __iter__(self) -> Iterator[list[int]]:
        for _, batch in self.indexed():
            yield batch
