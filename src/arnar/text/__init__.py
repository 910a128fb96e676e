"""Text tokenizers: one normalisation, a sentencepiece BPE tokenizer and a CMUdict phoneme one."""

import os
from pathlib import Path

from arnar.text.bpe import BpeError, BpeTokenizer, VocabSizeClampedWarning, train_bpe
from arnar.text.normalize import TokenizerError, normalize_text
from arnar.text.phonemes import (
    PhonemeTokenizer,
    PhonemeTokenizerError,
    WordPron,
    analyze_words,
    cmudict_load_seconds,
    g2p,
)



def load_text_tokenizer(path: str | os.PathLike) -> "BpeTokenizer | PhonemeTokenizer":
    """The text units a run reads: a sentencepiece model (``bpe.model``) or a phoneme tokenizer
    (``phonemes.json``), told apart by the file's suffix. Both answer ``vocab_size``,
    ``encode(text)``, ``encode_with_words(text)`` and ``id_to_piece(id)``."""
    path = Path(path)
    if text_units_of(path) == "phonemes":
        return PhonemeTokenizer.load(path)
    return BpeTokenizer.load(path)


def text_units_of(path: str | os.PathLike) -> str:
    """``"phonemes"`` for a phoneme tokenizer file (``.json``), ``"bpe"`` for a sentencepiece model."""
    return "phonemes" if Path(path).suffix == ".json" else "bpe"


__all__ = [
    "BpeError",
    "BpeTokenizer",
    "PhonemeTokenizer",
    "PhonemeTokenizerError",
    "TokenizerError",
    "VocabSizeClampedWarning",
    "WordPron",
    "analyze_words",
    "cmudict_load_seconds",
    "g2p",
    "load_text_tokenizer",
    "normalize_text",
    "text_units_of",
    "train_bpe",
]
