"""The one text normalisation applied before any tokenization (BPE and phonemes alike).

``normalize_text`` is deliberately light: the BPE tokenizer sees case and punctuation (they
carry prosody), so nothing is lower-cased, no punctuation is removed and no number is expanded
here (the phoneme tokenizer does its own word-level normalisation on top of this). Steps, in
order:

1. Unicode NFKC: compatibility forms fold to their plain equivalents (full-width ``Ａ１`` ->
   ``A1``, ligatures ``ﬁ`` -> ``fi``, ``…`` -> ``...``, non-breaking and other exotic spaces ->
   space), and composed/decomposed accents become the same code points (``e`` + U+0301 ->
   ``é``).
2. Typographic punctuation to ASCII: single quotes and primes (``‘ ’ ‚ ‛ ′ ‹ ›``) -> ``'``;
   double quotes (``“ ” „ ‟ ″ « »``) -> ``"``; hyphen/en-dash/minus variants
   (``‐ ‑ ‒ – −``) -> ``-``; em dash and horizontal bar (``— ― ⸺ ⸻``) -> `` - `` (a
   free-standing dash, so ``word—word`` stays two words with a pause between them, not a
   hyphenated compound).
3. Removal of invisible characters that would otherwise reach the tokenizers as content:
   C0/C1 control characters other than whitespace, zero-width space U+200B, word joiner
   U+2060, BOM U+FEFF and soft hyphen U+00AD. Zero-width joiners (emoji sequences) are kept.
4. U+2581 ``▁`` (sentencepiece's own word-start marker) -> ``_``, so that a literal ``▁`` in
   the input cannot be confused with a word boundary (it would not round-trip otherwise).
5. Whitespace: every run of Unicode whitespace (spaces, tabs, newlines, ...) becomes one ASCII
   space, and leading/trailing whitespace is stripped.

The function is idempotent (``normalize_text(normalize_text(t)) == normalize_text(t)``), and its
output words are exactly ``normalize_text(t).split(" ")``: that is the word indexing both
tokenizers use for word-level alignment information.
"""

from __future__ import annotations

import unicodedata

__all__ = ["TokenizerError", "normalize_text"]


class TokenizerError(Exception):
    """Base of the text tokenizers' errors (a model/tokenizer file that cannot be trained or
    loaded); defined here, the one module every tokenizer imports."""

_SINGLE_QUOTES = "\u2018\u2019\u201a\u201b\u2032\u2035\u2039\u203a"
_DOUBLE_QUOTES = "\u201c\u201d\u201e\u201f\u2033\u2036\u00ab\u00bb"
_HYPHENS = "\u2010\u2011\u2012\u2013\u2212\ufe63\uff0d"
_LONG_DASHES = "\u2014\u2015\u2e3a\u2e3b\ufe58"
_INVISIBLE = "\u200b\u2060\ufeff\u00ad"

_TRANSLATION: dict[int, str] = {}
for _c in _SINGLE_QUOTES:
    _TRANSLATION[ord(_c)] = "'"
for _c in _DOUBLE_QUOTES:
    _TRANSLATION[ord(_c)] = '"'
for _c in _HYPHENS:
    _TRANSLATION[ord(_c)] = "-"
for _c in _LONG_DASHES:
    _TRANSLATION[ord(_c)] = " - "
for _c in _INVISIBLE:
    _TRANSLATION[ord(_c)] = ""
_TRANSLATION[0x2581] = "_"
# Control characters (Cc) that are not whitespace are dropped; whitespace ones (\t \n \r \x0b
# \x0c \x1c-\x1f \x85) are left for the whitespace step.
for _cp in list(range(0x00, 0x20)) + list(range(0x7F, 0xA0)):
    if not chr(_cp).isspace():
        _TRANSLATION[_cp] = ""


def _normalize_once(text: str) -> str:
    text = unicodedata.normalize("NFKC", text)
    text = text.translate(_TRANSLATION)
    return " ".join(text.split())


def normalize_text(text: str) -> str:
    """Normalise ``text`` for tokenization (see the module docstring for the exact steps).

    NFKC; typographic quotes and dashes to ASCII (em dashes become a free-standing `` - ``);
    invisible control/zero-width characters removed; ``▁`` -> ``_``; whitespace runs collapsed
    to one space and the ends stripped. Case and punctuation are kept.

    >>> normalize_text("  \u201cDon\u2019t\u201d \u2014 she said\u2026\\n")
    '"Don\\'t" - she said...'
    """
    if not isinstance(text, str):
        raise TypeError(f"normalize_text expects str, got {type(text).__name__}")
    out = _normalize_once(text)
    # One pass is a fixed point for everything seen so far; a second pass guards the idempotence
    # contract against exotic sequences (e.g. a removed control character between a base letter
    # and a combining mark, which NFKC can then compose).
    for _ in range(3):
        again = _normalize_once(out)
        if again == out:
            return out
        out = again
    return out
