"""Token sets on disk: one folder per split, npz shards plus a manifest naming the codec.

Layout of ``<out>/<split>/``::

    shard-00000.npz   utt_id -> int16/int32 codes [n_codebooks, T] (numpy's .npz, np.load reads it)
    shard-00001.npz   ... ``shard_size`` utterances each (default 2000), in sorted utt_id order
    manifest.json     codec (name, package, package_version, config_hash, frame_rate,
                      n_codebooks, codebook_size, sample_rate), dtype, n_utterances, n_frames,
                      and per shard: file, n_utterances, n_frames, sha256

* **Never mixed.** :func:`read_token_shards` with ``expect_codec_hash`` refuses a token set made by
  other weights or settings (:class:`StaleTokensError`, naming the manifest); a missing,
  truncated or altered shard (sha256 checked on every read) raises :class:`TokenShardError`
  naming the file.
* **Atomic.** The old manifest is removed first, every shard and then the manifest are written
  to a temporary file and moved into place with ``os.replace``, and leftover shards of an older,
  larger set are deleted: an interrupted write leaves a folder with no manifest, which reads as
  an error, never as a mix of old and new tokens.
* **Deterministic bytes.** ``np.savez`` stamps each zip entry with the current time, so shards
  are written here with fixed entry metadata (1980-01-01 timestamp, fixed permissions and
  creator system) and stored uncompressed (zlib builds may compress differently); the manifest
  is canonical JSON with no timestamp. The same tokens and codec give the same bytes, so DVC
  caches and hashes of token sets are stable.
* Codes are stored as int16 when ``codebook_size <= 32768`` (S3: 6561, DAC: 1024), else int32;
  :func:`read_token_shards` returns them in that dtype (``dtype=`` to convert), since a token set
  as int64 would take four times the memory.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from arnar.atomic import atomic_path
from arnar.codec.base import Codec, codec_info

__all__ = [
    "FORMAT",
    "MANIFEST",
    "StaleTokensError",
    "TokenShardError",
    "read_token_manifest",
    "read_token_shards",
    "write_token_shards",
]

FORMAT = "arnar-token-shards/1"
MANIFEST = "manifest.json"
SHARD_PATTERN = re.compile(r"^shard-\d{5,}\.npz$")
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
CODEC_KEYS = ("name", "package", "package_version", "config_hash", "frame_rate", "n_codebooks",
              "codebook_size", "sample_rate")


class TokenShardError(RuntimeError):
    """A token set on disk is missing, incomplete or corrupt (the message names the file)."""


class StaleTokensError(TokenShardError):
    """A token set was made by a different codec (weights or settings) than expected."""


def _atomic_write(path: Path, data: bytes) -> None:
    with atomic_path(path) as tmp, tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())  # on disk before it is named: token sets are cached and shared (DVC)


def _unlink(path: str | Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """An .npz archive (as np.load reads it) with no varying metadata; entries in given order."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for key, array in arrays.items():
            info = zipfile.ZipInfo(f"{key}.npy", date_time=_ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_STORED
            info.create_system = 3  # unix, whatever the platform
            info.external_attr = 0o644 << 16
            with zf.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def _storage_dtype(codebook_size: int) -> np.dtype:
    return np.dtype(np.int16) if codebook_size <= 2**15 else np.dtype(np.int32)


def _codec_record(codec: Codec | Mapping[str, Any]) -> dict[str, Any]:
    info = dict(codec) if isinstance(codec, Mapping) else codec_info(codec)
    missing = [k for k in CODEC_KEYS if k not in info and k not in ("package", "package_version")]
    if missing:
        raise ValueError(f"codec info lacks {missing}")
    record = {k: info.get(k) for k in CODEC_KEYS}
    record["frame_rate"] = float(record["frame_rate"])
    for k in ("n_codebooks", "codebook_size", "sample_rate"):
        record[k] = int(record[k])
    return record


def write_token_shards(
    out_dir: str | os.PathLike,
    split: str,
    tokens: Mapping[str, np.ndarray],
    codec: Codec | Mapping[str, Any],
    shard_size: int = 2000,
) -> Path:
    """Write ``tokens`` (utt_id -> codes ``[n_codebooks, T]``) to ``<out_dir>/<split>/``.

    ``codec`` is the codec that made them or its :func:`~arnar.codec.base.codec_info` dict.
    Returns the split folder. Raises ValueError for tokens that do not fit the codec.
    """
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    if not split or "/" in split or split.startswith("."):
        raise ValueError(f"bad split name {split!r}")
    record = _codec_record(codec)
    dtype = _storage_dtype(record["codebook_size"])
    checked: dict[str, np.ndarray] = {}
    for utt in sorted(tokens):
        if not isinstance(utt, str) or not utt or "/" in utt:
            raise ValueError(f"bad utterance id {utt!r}")
        codes = np.asarray(tokens[utt])
        if codes.ndim != 2 or codes.shape[0] != record["n_codebooks"]:
            raise ValueError(f"{utt}: expected codes [{record['n_codebooks']}, T], got shape {codes.shape}")
        if not np.issubdtype(codes.dtype, np.integer):
            raise ValueError(f"{utt}: codes must be integers, got {codes.dtype}")
        if codes.size and (codes.min() < 0 or codes.max() >= record["codebook_size"]):
            raise ValueError(f"{utt}: codes outside [0, {record['codebook_size']})")
        checked[utt] = codes.astype(dtype)

    folder = Path(out_dir) / split
    folder.mkdir(parents=True, exist_ok=True)
    manifest_path = folder / MANIFEST
    _unlink(manifest_path)  # from here on the folder reads as "not written"

    ids = list(checked)
    shards = []
    names = set()
    for n, first in enumerate(range(0, len(ids), shard_size)):
        chunk = {u: checked[u] for u in ids[first : first + shard_size]}
        name = f"shard-{n:05d}.npz"
        data = _npz_bytes(chunk)
        _atomic_write(folder / name, data)
        names.add(name)
        shards.append({
            "file": name,
            "n_utterances": len(chunk),
            "n_frames": int(sum(c.shape[1] for c in chunk.values())),
            "sha256": hashlib.sha256(data).hexdigest(),
        })
    for old in folder.iterdir():  # shards of an earlier, larger token set
        if SHARD_PATTERN.match(old.name) and old.name not in names:
            old.unlink()

    manifest = {
        "format": FORMAT,
        "split": split,
        "codec": record,
        "dtype": dtype.name,
        "n_utterances": len(ids),
        "n_frames": int(sum(s["n_frames"] for s in shards)),
        "seconds": round(sum(s["n_frames"] for s in shards) / record["frame_rate"], 3),
        "shards": shards,
    }
    _atomic_write(manifest_path, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
    return folder


def read_token_manifest(split_dir: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a split folder written by :func:`write_token_shards`."""
    path = Path(split_dir) / MANIFEST
    if not path.is_file():
        raise TokenShardError(
            f"{path}: no token manifest (the tokens were never written or the write was "
            "interrupted) — rerun the tokenize rule"
        )
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise TokenShardError(f"{path}: unreadable token manifest ({err})") from err
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise TokenShardError(f"{path}: not a {FORMAT} manifest")
    return manifest


def read_token_shards(
    split_dir: str | os.PathLike,
    expect_codec_hash: str | None = None,
    dtype: np.dtype | type | None = None,
) -> dict[str, np.ndarray]:
    """utt_id -> codes ``[n_codebooks, T]`` of a split folder, in sorted utt_id order.

    ``expect_codec_hash`` (the pipeline codec's ``config_hash()``) makes a token set made by any
    other codec raise :class:`StaleTokensError`. Missing or corrupt shards raise
    :class:`TokenShardError`. Codes keep their storage dtype unless ``dtype`` is given.
    """
    folder = Path(split_dir)
    manifest = read_token_manifest(folder)
    codec = manifest["codec"]
    if expect_codec_hash is not None and codec.get("config_hash") != expect_codec_hash:
        raise StaleTokensError(
            f"{folder / MANIFEST}: stale token set: tokens were made by codec {codec.get('name')} "
            f"(hash {codec.get('config_hash')}), this pipeline uses hash {expect_codec_hash} "
            "— rerun the tokenize rule"
        )
    out: dict[str, np.ndarray] = {}
    for shard in manifest["shards"]:
        path = folder / shard["file"]
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise TokenShardError(f"{path}: token shard missing — rerun the tokenize rule") from None
        if hashlib.sha256(data).hexdigest() != shard["sha256"]:
            raise TokenShardError(
                f"{path}: token shard corrupt (sha256 differs from {folder / MANIFEST}) — rerun the "
                "tokenize rule"
            )
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
        except Exception as err:  # zipfile / format errors
            raise TokenShardError(f"{path}: token shard unreadable ({err})") from err
        if len(arrays) != shard["n_utterances"]:
            raise TokenShardError(f"{path}: {len(arrays)} utterances, manifest says {shard['n_utterances']}")
        for utt, codes in arrays.items():
            out[utt] = codes if dtype is None else codes.astype(dtype)
    if len(out) != manifest["n_utterances"]:
        raise TokenShardError(
            f"{folder / MANIFEST}: {len(out)} distinct utterances in shards, manifest says "
            f"{manifest['n_utterances']}"
        )
    return dict(sorted(out.items()))
