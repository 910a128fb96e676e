"""Speaker tables of the LibriVox-derived corpora (LibriSpeech, LibriTTS): SPEAKERS.txt.

Both corpora ship a pipe-separated table, comment lines starting with ``;``::

    ;ID  |SEX| SUBSET           |MINUTES| NAME
    14   | F | train-clean-360  | 25.03 | Kristin LeMoine

Speaker ids are LibriVox reader ids in every corpus (LibriSpeech, LibriTTS, MLS), so one
reader has one id across them; the recipes rely on that to keep test readers out of training.
"""

from __future__ import annotations

from pathlib import Path

from arnar.corpus.manifests import CorpusError


def read_speaker_genders(table: Path) -> dict[str, str]:
    """speaker id -> 'F' | 'M' from a SPEAKERS.txt; a malformed line is an error naming it."""
    if not table.is_file():
        raise CorpusError(f"{table}: speaker table not found (is the archive fully extracted?)")
    genders = {}
    for number, line in enumerate(table.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith(";"):
            continue
        fields = [f.strip() for f in line.split("|")]
        if len(fields) < 3 or not fields[0].isdigit() or fields[1] not in ("F", "M"):
            raise CorpusError(f"{table}:{number}: expected 'ID | SEX | SUBSET | ...', got {line!r}")
        genders[fields[0]] = fields[1]
    return genders
