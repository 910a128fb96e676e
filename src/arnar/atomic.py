"""Atomic output writes: the one helper every writer of a pipeline output goes through.

A file is written under a temporary name in its own folder and moved onto its real name with
``os.replace`` (atomic on POSIX within one file system), so a process killed mid-write leaves
either the old file or the new one, never a truncated one that a resumed run would trust.

The temporary name is ``.tmp.<name>``: hidden, recognisable (tests look for leftovers), and it
keeps the real name's extensions, which lhotse (``.jsonl``), soundfile (``.wav``) and matplotlib
(``.png``) read the format from. It is the same name on every attempt, so a write killed before
its ``os.replace`` leaves a file that the rerun writing that output overwrites and moves away.

This module is named ``atomic`` rather than ``io`` so that it can never shadow the standard
library's ``io`` (e.g. for a script run from inside ``src/arnar``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TMP_PREFIX = ".tmp."


def temporary_name(path: str | os.PathLike) -> Path:
    """Where ``path`` is written before it is moved into place."""
    path = Path(path)
    return path.with_name(f"{TMP_PREFIX}{path.name}")


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` for a writer to fill; when the block ends without an
    exception it becomes ``path``, otherwise it is removed. The parent folder is created.

        with atomic_path(out / "final.pt") as tmp:
            torch.save(state, tmp)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    """UTF-8 text, written atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
