"""A per-user cache of derived files that every job of a run would otherwise rebuild.

Some inputs are the same in every process of a run and cost seconds to prepare: Moonshine's
graphs with their weights dequantised (:mod:`arnar.evaluate.moonshine_onnx`), CMUdict parsed into
the phone lexicon (:mod:`arnar.text.phonemes`). A DAG starts a process per job, so each of them
paid that again. Here the prepared form is kept in a file named by what it is derived from (a
checksum or package version, and a format number the code bumps when it changes what it
writes), so a stale file is never read: a new source or format simply gets a new name.

The folder is ``$ARNAR_CACHE_DIR``, else ``$XDG_CACHE_HOME/arnar``, else ``~/.cache/arnar``.
Nothing in it is an output of the pipeline; deleting it only costs the seconds again.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path


def cache_dir() -> Path:
    """The cache folder (see the module's docstring)."""
    if os.getenv("ARNAR_CACHE_DIR"):
        return Path(os.environ["ARNAR_CACHE_DIR"])
    return Path(os.getenv("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache"))) / "arnar"


def cached_file(name: str, make: Callable[[Path], None], folder: str | os.PathLike | None = None) -> Path:
    """``folder/name`` (default :func:`cache_dir`), made by ``make(path)`` if it is not there yet.
    ``make`` writes a temporary file of this call's own (a random name: pids repeat across the
    nodes of a cluster sharing one home folder), which is then renamed: a process killed while
    writing, or two processes making the same file at once, never leave half a file under ``name``."""
    target = (Path(folder) if folder is not None else cache_dir()) / name
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".tmp.{uuid.uuid4().hex}.{target.name}")
    try:
        make(tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target
