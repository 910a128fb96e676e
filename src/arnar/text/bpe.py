"""BPE text tokenizer on sentencepiece (``model_type=bpe``).

Training (:func:`train_bpe`) is deterministic: every sentence goes through
:func:`~arnar.text.normalize.normalize_text`, then to sentencepiece in the given order (no
sampling: ``input_sentence_size=0``; no shuffling), on one thread, with sentencepiece's own
normalisation switched off (``normalization_rule_name=identity``; ours already did NFKC and
whitespace) and ``character_coverage=1.0``. ``byte_fallback`` is on, so any text round-trips:
a character the model never saw is encoded as its UTF-8 bytes (``<0xE6>`` ...), and
``decode(encode(normalize_text(t))) == normalize_text(t)`` for every ``t``.

The model is written through sentencepiece's ``model_writer`` rather than a ``model_prefix``,
so no temporary path ends up inside the model proto: two trainings on the same input give
byte-identical ``.model`` files. ``<prefix>.vocab`` (``piece<TAB>score`` per line, the same
layout sentencepiece writes) is written from the trained model. Both files are written
atomically (:mod:`arnar.atomic`; ``.vocab`` first, ``.model`` last), so a crash never leaves a
half-written model.

Special ids: ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, ``<pad>`` 3, then the 256 byte pieces, then
characters and merges. :meth:`BpeTokenizer.encode` adds no BOS/EOS.

Vocabulary size limits. With byte fallback, the smallest possible vocabulary is 4 specials +
256 bytes + every distinct character of the corpus; the largest is whatever BPE can reach on
the corpus (sentencepiece reports it as ``Vocabulary size too high (N). Please set it to a
value <= M.``, and a too-small one as ``Vocabulary size is smaller than required_chars. N vs
M.``). :func:`train_bpe` parses these messages, retrains with the limit, and emits a
:class:`VocabSizeClampedWarning` (also logged) instead of crashing.

Word alignment: :meth:`BpeTokenizer.encode_with_words` maps each id to the index of the
whitespace-separated word of ``normalize_text(text)`` it belongs to; sentencepiece marks a word
start with ``▁`` at the head of a piece (pieces never span whitespace), and byte-fallback pieces
stay inside their word.
"""

from __future__ import annotations

import io
import logging
import os
import re
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece as spm

from arnar import atomic
from arnar.text.normalize import TokenizerError, normalize_text

__all__ = ["BpeTokenizer", "BpeError", "VocabSizeClampedWarning", "train_bpe", "WORD_START"]

log = logging.getLogger(__name__)

WORD_START = "\u2581"  # sentencepiece's word-start marker
UNK_ID, BOS_ID, EOS_ID, PAD_ID = 0, 1, 2, 3
_SENTENCEPIECE_MAX_SENTENCE_LENGTH = 4192  # sentencepiece's default, in bytes

_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")
_TOO_LOW = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")


class BpeError(TokenizerError, RuntimeError):
    """A BPE model that cannot be trained or loaded (the message names the file)."""


class VocabSizeClampedWarning(UserWarning):
    """The requested vocab_size was out of what the corpus allows and was clamped."""


class BpeTokenizer:
    """A trained sentencepiece BPE model. Create with :meth:`load` or :func:`train_bpe`.

    ``encode``/``pieces``/``encode_with_words`` apply :func:`normalize_text` first (it is
    idempotent, so passing already-normalised text is fine).
    """

    def __init__(self, processor: spm.SentencePieceProcessor, path: Path | None = None) -> None:
        self._sp = processor
        self.path = path

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> BpeTokenizer:
        """Load ``<prefix>.model`` (the prefix alone is accepted too); a missing file or one
        that is no sentencepiece model raises :class:`FileNotFoundError` / :class:`BpeError`
        naming the file."""
        path = Path(path)
        with_suffix = path.with_name(path.name + ".model")
        if not path.is_file() and path.suffix != ".model" and with_suffix.is_file():
            path = with_suffix
        if not path.is_file():
            raise FileNotFoundError(f"BPE model file not found: {path}")
        data = path.read_bytes()
        if not data:
            raise BpeError(f"{path} is not a sentencepiece model (empty file)")
        try:
            sp = spm.SentencePieceProcessor(model_proto=data)
        except Exception as e:  # sentencepiece raises RuntimeError/OSError with C++ text
            raise BpeError(f"{path} is not a sentencepiece model ({e})") from e
        if sp.get_piece_size() <= 0:
            raise BpeError(f"{path} is not a sentencepiece model (empty vocabulary)")
        return cls(sp, path)

    @classmethod
    def from_bytes(cls, model_proto: bytes) -> BpeTokenizer:
        if not model_proto:
            raise BpeError("bytes are not a sentencepiece model (empty)")
        try:
            sp = spm.SentencePieceProcessor(model_proto=model_proto)
        except Exception as e:
            raise BpeError(f"bytes are not a sentencepiece model ({e})") from e
        return cls(sp)

    def to_bytes(self) -> bytes:
        """The serialized model (identical to the ``.model`` file's bytes)."""
        return self._sp.serialized_model_proto()

    def __getstate__(self) -> dict:  # picklable for DataLoader workers
        return {"model": self.to_bytes(), "path": self.path}

    def __setstate__(self, state: dict) -> None:
        self._sp = spm.SentencePieceProcessor(model_proto=state["model"])
        self.path = state["path"]

    # -- vocabulary ----------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    @property
    def unk_id(self) -> int:
        return self._sp.unk_id()

    @property
    def bos_id(self) -> int:
        return self._sp.bos_id()

    @property
    def eos_id(self) -> int:
        return self._sp.eos_id()

    @property
    def pad_id(self) -> int:
        return self._sp.pad_id()

    def id_to_piece(self, i: int) -> str:
        return self._sp.id_to_piece(int(i))

    def piece_to_id(self, piece: str) -> int:
        return self._sp.piece_to_id(piece)

    # -- coding --------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Ids of ``normalize_text(text)`` (no BOS/EOS)."""
        return list(self._sp.encode(normalize_text(text)))

    def decode(self, ids: Sequence[int]) -> str:
        ids = [int(i) for i in ids]
        n = self.vocab_size
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise ValueError(f"ids out of range [0, {n}): {bad[:5]}")
        return self._sp.decode(ids)

    def pieces(self, text: str) -> list[str]:
        return list(self._sp.encode(normalize_text(text), out_type=str))

    def encode_with_words(self, text: str) -> list[tuple[int, int]]:
        """``[(id, word_index), ...]``: the word index of each id in
        ``normalize_text(text).split(" ")``. A piece starting with ``▁`` opens the next word;
        every other piece (byte-fallback pieces included) belongs to the current word."""
        out: list[tuple[int, int]] = []
        word = -1
        for i in self._sp.encode(normalize_text(text)):
            if self._sp.id_to_piece(i).startswith(WORD_START) or word < 0:
                word += 1
            out.append((i, word))
        return out

    def __repr__(self) -> str:
        return f"BpeTokenizer(vocab_size={self.vocab_size}, path={self.path})"


def _vocab_text(sp: spm.SentencePieceProcessor) -> str:
    lines = []
    for i in range(sp.get_piece_size()):
        score = sp.get_score(i)
        s = str(int(score)) if float(score).is_integer() else repr(float(score))
        lines.append(f"{sp.id_to_piece(i)}\t{s}\n")
    return "".join(lines)


def _train_once(sentences: list[str], vocab_size: int, max_len: int) -> bytes:
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=buf,
        model_type="bpe",
        vocab_size=vocab_size,
        character_coverage=1.0,
        byte_fallback=True,
        num_threads=1,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        normalization_rule_name="identity",
        max_sentence_length=max_len,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        pad_id=PAD_ID,
        minloglevel=2,
    )
    return buf.getvalue()


def train_bpe(
    sentences: Iterable[str],
    out_prefix: str | os.PathLike[str],
    vocab_size: int,
    seed: int = 0,
) -> BpeTokenizer:
    """Train a BPE model on ``sentences`` and write ``<out_prefix>.model`` / ``.vocab``.

    ``out_prefix`` may also be given as ``<prefix>.model``.

    Deterministic for a given input order (see the module docstring). A ``vocab_size`` outside
    what the corpus allows is clamped to sentencepiece's limit with a
    :class:`VocabSizeClampedWarning`. ``seed`` seeds sentencepiece's global random generator
    (BPE training with these options draws no random numbers; it is set for completeness).
    Empty sentences (after normalisation) are skipped; an empty corpus raises ``ValueError``.
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    out_prefix = Path(out_prefix)
    if out_prefix.suffix == ".model":  # accept the model path itself as well as the prefix
        out_prefix = out_prefix.with_suffix("")
    data = [s for s in (normalize_text(t) for t in sentences) if s]
    if not data:
        raise ValueError("train_bpe: no non-empty sentence to train on")
    longest = max(len(s.encode("utf-8")) for s in data)
    max_len = max(_SENTENCEPIECE_MAX_SENTENCE_LENGTH, longest + 1)
    spm.set_random_generator_seed(int(seed))

    requested = size = int(vocab_size)
    model: bytes | None = None
    for _ in range(3):
        try:
            model = _train_once(data, size, max_len)
            break
        except RuntimeError as e:
            msg = str(e)
            hi, lo = _TOO_HIGH.search(msg), _TOO_LOW.search(msg)
            if hi:
                new = int(hi.group(2))
            elif lo:
                new = int(lo.group(2))
            else:
                raise BpeError(f"sentencepiece failed training {out_prefix}.model: {msg}") from e
            if new == size:
                raise BpeError(f"sentencepiece failed training {out_prefix}.model: {msg}") from e
            size = new
    if model is None:
        raise BpeError(f"could not find a vocab_size sentencepiece accepts for {out_prefix}.model")
    if size != requested:
        why = (
            "above the largest vocabulary BPE reaches on"
            if size < requested
            else "below the smallest vocabulary (4 specials + 256 bytes + characters) of"
        )
        text = (
            f"BPE vocab_size {requested} is {why} this corpus "
            f"({len(data)} sentences); clamped to {size}"
        )
        log.warning(text)
        warnings.warn(text, VocabSizeClampedWarning, stacklevel=2)

    tok = BpeTokenizer.from_bytes(model)
    out_prefix.parent.mkdir(parents=True, exist_ok=True)
    model_path = out_prefix.with_name(out_prefix.name + ".model")
    vocab_path = out_prefix.with_name(out_prefix.name + ".vocab")
    atomic.write_text(vocab_path, _vocab_text(tok._sp))
    atomic.write_bytes(model_path, model)
    tok.path = model_path
    log.info("trained BPE: %d sentences, vocab %d -> %s", len(data), tok.vocab_size, model_path)
    return tok
