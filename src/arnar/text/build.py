"""Build the text tokenizers of a corpus from its training transcripts (rule `tokenizers`)."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

from lhotse import load_manifest

from arnar.text.bpe import VocabSizeClampedWarning, train_bpe
from arnar.text.normalize import TokenizerError
from arnar.text.phonemes import PhonemeTokenizer

log = logging.getLogger(__name__)


def build_tokenizers(
    *, supervisions: Path, bpe_model: Path, phonemes: Path, vocab_size: int, seed: int
) -> dict:
    """Train BPE on the transcripts of ``supervisions``; save the phoneme tokenizer with its
    OOV statistics on the same text. Returns the report written to results/."""
    if not Path(supervisions).exists():
        raise FileNotFoundError(f"{supervisions}: supervision manifest not found")
    texts = [s.text for s in load_manifest(supervisions)]
    if not texts:
        raise TokenizerError(f"{supervisions}: no transcripts to train the tokenizers on")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", VocabSizeClampedWarning)
        bpe = train_bpe(texts, bpe_model, vocab_size=vocab_size, seed=seed)
    # train_bpe already logged the clamp; keep the message for the report
    clamped = [str(w.message) for w in caught if issubclass(w.category, VocabSizeClampedWarning)]
    lengths = [len(bpe.encode(t)) for t in texts]
    log.info("BPE: vocab %d, %.1f tokens per sentence", bpe.vocab_size, sum(lengths) / len(lengths))

    phoneme_tokenizer = PhonemeTokenizer()
    oov = phoneme_tokenizer.oov_report(texts)
    phoneme_tokenizer.save(phonemes)
    log.info("phonemes: %d symbols, OOV rate %.2f%% (%s)", phoneme_tokenizer.vocab_size,
             100 * oov["oov_rate"], oov["paths"])
    return {
        "sentences": len(texts),
        "bpe": {
            "vocab_size": bpe.vocab_size,
            "requested_vocab_size": vocab_size,
            "clamped": clamped,
            "mean_tokens_per_sentence": round(sum(lengths) / len(lengths), 3),
        },
        "phonemes": {
            "vocab_size": phoneme_tokenizer.vocab_size,
            "words": oov["words"],
            "oov_words_total": oov["oov_words_total"],
            "oov_rate": oov["oov_rate"],
            "paths": oov["paths"],
            "oov_words": sorted(oov["oov_words"]),
        },
    }
