"""Text tokenizers: one normalisation, a sentencepiece BPE tokenizer and a CMUdict phoneme one."""

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
    "normalize_text",
    "train_bpe",
]
