"""Download corpus archives with HTTP Range resume, verify them, extract them.

One archive is an :class:`Archive`: its URL and, where one is published, its checksum. The
download goes to ``<name>.part`` next to the final file; an interrupted download (a dropped
connection, a killed job) leaves the ``.part`` file, and the next call asks the server for the
rest with ``Range: bytes=<size>-``. A server that ignores the range (answers 200) is read from
the start again. Only a complete, verified file is moved to its final name (``os.replace``).

Verification:
  - a published checksum (sha256 or md5): the whole file is hashed and compared; a mismatch
    removes the file (its bytes cannot be trusted, resuming would keep the bad part) and raises
    :class:`DownloadError` naming the file, both digests and where the published one comes from;
  - no published checksum (MLS): the size is checked against what the server declared, the
    gzip trailer (CRC-32 and length of the decompressed stream) is checked while extracting,
    and the sha256 is recorded in the stamp so a later download can be compared with it. The log
    says which of these applied; nothing is skipped silently.

Extraction reads the tar stream into ``<dest>.tmp`` (tarfile's ``data`` filter: no absolute
paths, no links out of the folder, no device files) and renames it to ``<dest>`` when done.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import json
import logging
import os
import re
import shutil
import tarfile
import time
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from arnar.corpus.manifests import CorpusError

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
USER_AGENT = "arnar-corpus-recipes (urllib)"


class DownloadError(CorpusError):
    """A download that cannot be completed or verified; the message names the file and why."""


@dataclass(frozen=True)
class Archive:
    """One downloadable archive of a corpus part."""

    source: str          # libritts | librispeech | mls
    part: str            # e.g. train-clean-100
    url: str
    checksum: str | None  # "sha256:<hex>" or "md5:<hex>"; None where no checksum is published
    checksum_origin: str  # where the published checksum comes from (or why there is none)

    @property
    def filename(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1]


def _hash_file(path: Path, algorithm: str, progress: bool) -> str:
    digest = hashlib.new(algorithm)
    with path.open("rb") as handle, tqdm(total=path.stat().st_size, unit="B", unit_scale=True,
                                         desc=f"{algorithm} {path.name}", disable=not progress) as bar:
        for block in iter(lambda: handle.read(CHUNK_BYTES), b""):
            digest.update(block)
            bar.update(len(block))
    return digest.hexdigest()


def _total_from_content_range(value: str | None) -> int | None:
    """The complete size from a Content-Range header ('bytes 0-99/1234' or 'bytes */1234')."""
    match = re.match(r"bytes\s+(?:\d+-\d+|\*)/(\d+)", value or "")
    return int(match.group(1)) if match else None


def _fetch_once(url: str, part: Path, *, timeout: float, progress: bool) -> int | None:
    """Append the missing bytes of ``url`` to ``part``; return the total size the server declared.

    Raises OSError-family errors (dropped connection, short read) to the caller, which retries.
    """
    have = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": USER_AGENT}
    if have:
        headers["Range"] = f"bytes={have}-"
    request = urllib.request.Request(url, headers=headers)
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as err:
        if err.code == 416 and have:  # nothing left to send: complete if the sizes agree
            total = _total_from_content_range(err.headers.get("Content-Range"))
            if total == have:
                return total
            log.warning("%s: server refused the range from byte %d (%s); downloading afresh", url, have, err)
            part.unlink()
            return _fetch_once(url, part, timeout=timeout, progress=progress)
        raise
    with response:
        if have and response.status == 206:
            total = _total_from_content_range(response.headers.get("Content-Range"))
            mode = "ab"
            log.info("%s: resuming at byte %d", url, have)
        else:  # 200: a fresh download, or a server that ignores Range (start over)
            if have:
                log.warning("%s: server ignored the range request; downloading afresh", url)
            have, mode = 0, "wb"
            length = response.headers.get("Content-Length")
            total = int(length) if length is not None else None
        with part.open(mode) as handle, tqdm(total=total, initial=have, unit="B", unit_scale=True,
                                             desc=part.name[: -len(".part")], disable=not progress) as bar:
            while True:
                block = response.read(CHUNK_BYTES)
                if not block:
                    break
                handle.write(block)
                bar.update(len(block))
    size = part.stat().st_size
    if total is not None and size < total:
        raise ConnectionError(f"connection closed after {size} of {total} bytes")
    return total


def download(archive: Archive, archive_dir: Path, *, retries: int = 3, timeout: float = 60.0,
             progress: bool = True) -> tuple[Path, dict]:
    """Download and verify one archive into ``archive_dir``; return its path and what was verified.

    An already complete file (final name present) is verified again rather than trusted.
    ``retries`` is the number of automatic resumes after a dropped connection.
    """
    archive_dir = Path(archive_dir)
    archive_dir.mkdir(parents=True, exist_ok=True)
    final = archive_dir / archive.filename
    part = archive_dir / f"{archive.filename}.part"
    declared_total = None
    if not final.exists():
        attempt = 0
        while True:
            try:
                declared_total = _fetch_once(archive.url, part, timeout=timeout, progress=progress)
                break
            except (OSError, http.client.HTTPException) as err:  # dropped connection, timeout, short read
                have = part.stat().st_size if part.exists() else 0
                if isinstance(err, urllib.error.HTTPError) or attempt >= retries:
                    raise DownloadError(
                        f"{archive.url}: download failed after {have} bytes ({type(err).__name__}: {err}); "
                        f"run again to resume from {part}"
                    ) from None
                attempt += 1
                log.warning("%s: %s; resuming (attempt %d of %d)", archive.url, err, attempt, retries)
                time.sleep(min(2.0 ** (attempt - 1) - 1.0, 30.0))  # 0 s, 1 s, 3 s, ... at most 30 s
        os.replace(part, final)
    return final, verify(archive, final, declared_total=declared_total, progress=progress)


def verify(archive: Archive, path: Path, *, declared_total: int | None = None, progress: bool = True) -> dict:
    """Check ``path`` against the published checksum; return a record of what was checked."""
    size = path.stat().st_size
    sha256 = _hash_file(path, "sha256", progress)
    record = {"file": path.name, "url": archive.url, "bytes": size, "sha256": sha256}
    if declared_total is not None and declared_total != size:
        path.unlink()
        raise DownloadError(f"{path}: {size} bytes but the server declared {declared_total}; removed, run again")
    if archive.checksum is None:
        record["verified"] = f"no published checksum ({archive.checksum_origin}); size and gzip CRC checked"
        log.warning("%s: %s has no published checksum (%s); checking its size and the gzip CRC on "
                    "extraction, sha256 %s recorded", archive.source, path.name, archive.checksum_origin, sha256)
        return record
    algorithm, expected = archive.checksum.split(":", 1)
    actual = sha256 if algorithm == "sha256" else _hash_file(path, algorithm, progress)
    if actual != expected.lower():
        path.unlink()
        raise DownloadError(
            f"{path}: {algorithm} {actual} differs from the published {expected} "
            f"({archive.checksum_origin}); the file was removed, run again to download it afresh"
        )
    record["verified"] = f"{algorithm} matches the published checksum ({archive.checksum_origin})"
    log.info("%s: %s", path.name, record["verified"])
    return record


def extract(archive_path: Path, dest: Path, *, progress: bool = True) -> Path:
    """Extract a .tar.gz into ``dest`` (all or nothing: a temporary folder renamed at the end)."""
    dest = Path(dest)
    if dest.is_dir():
        return dest
    tmp = dest.with_name(f"{dest.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        # One pass over the archive. tarfile's own gzip reader ignores the gzip trailer, so the
        # stream is decompressed by the gzip module, which checks the trailer's CRC-32 and length
        # when it reaches the end; the end is read explicitly because tar stops at its last member.
        with gzip.open(archive_path, "rb") as stream, tarfile.open(fileobj=stream, mode="r|") as tar, \
                tqdm(desc=f"extract {archive_path.name}", unit="file", disable=not progress) as bar:
            for member in tar:
                tar.extract(member, tmp, filter="data")
                bar.update(1)
            while stream.read(CHUNK_BYTES):
                pass
    except (tarfile.TarError, OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        shutil.rmtree(tmp, ignore_errors=True)
        raise DownloadError(f"{archive_path}: cannot extract ({type(err).__name__}: {err})") from None
    os.replace(tmp, dest)
    return dest


def fetch(archive: Archive, download_dir: Path, *, retries: int = 3, timeout: float = 60.0,
          keep_archive: bool = True, progress: bool = True) -> Path:
    """Download, verify and extract one archive; write its stamp ``<source>/<part>.json``.

    Layout under ``download_dir``: ``<source>/archives/<file>`` (the archive),
    ``<source>/<part>/`` (its extracted contents), ``<source>/<part>.json`` (the stamp: URL,
    size, sha256 and what was verified; no timestamps, so it is identical across machines).
    """
    source_dir = Path(download_dir) / archive.source
    stamp = source_dir / f"{archive.part}.json"
    extracted = source_dir / archive.part
    path, record = download(archive, source_dir / "archives", retries=retries, timeout=timeout, progress=progress)
    if extracted.exists():
        shutil.rmtree(extracted)  # a new verified archive replaces whatever was extracted before
    extract(path, extracted, progress=progress)
    if not keep_archive:
        path.unlink()
    record.update(source=archive.source, part=archive.part, extracted=str(extracted))
    tmp = stamp.with_name(f".tmp.{stamp.name}")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, stamp)
    return extracted
