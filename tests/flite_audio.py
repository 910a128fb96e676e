"""Shared by the tests that need real speech with phone timings: one flite utterance."""

from __future__ import annotations

import subprocess
from pathlib import Path


def flite_utterance(text: str, voice: str, wav: Path) -> list[tuple[str, float, float]]:
    """Synthesize ``text`` with flite's ``voice`` into ``wav``; return its phones as
    (symbol, start, end) seconds, from flite's own durations (``-psdur``)."""
    done = subprocess.run(["flite", "-voice", voice, "-psdur", "-t", text, "-o", str(wav)],
                          check=True, capture_output=True, text=True)
    phones, previous = [], 0.0
    for token in done.stdout.split():
        symbol, _, end = token.rpartition(":")
        phones.append((symbol, previous, float(end)))
        previous = float(end)
    return phones
