"""The embedded offline corpus ``synth``: a deterministic multi-speaker corpus synthesized
with Debian speech synthesizers, with oracle phone/word timings.

Output layout (a contract other code relies on)::

    out_dir/
      speakers.tsv              speaker voice synthesizer pitch_cents tempo split
      <speaker>/<utt_id>.wav    mono 16-bit PCM at sample_rate
      <speaker>/<utt_id>.txt    transcript, UTF-8, one line + newline
      <speaker>/<utt_id>.align.json
                                {"phones": [[sym, start, end], ...],
                                 "words": [[word, start, end], ...],   ([] if unavailable)
                                 "source": "festival-segs" | "flite-psdur"}
      summary.json              deterministic summary (no wall time)
      build_log.json            wall time, real-time factor, workers (not deterministic)

Speakers. Speaker ``i`` is a deterministic function of ``i``: first the plain voices of
:data:`BASE_VOICES` (ordered by how well pocketsphinx reads them, docs/design.md section 8),
then pitch/tempo variants (:data:`VARIANTS`, made with ``sox -R``) of the clearest voices
(:data:`VARIANT_BASES`), variant-major, so any ``1 <= n_speakers <= MAX_SPEAKERS`` works
and a smaller corpus is a prefix of a larger one. Held-out (``test``) speakers are drawn
with the seed, round-robin over base voices in a seeded order, so they span different base
voices. Sentences come from :func:`arnar.corpus.texts.load_sentences`, shuffled with the
seed; speaker ``i`` reads sentences ``i*U .. (i+1)*U - 1`` of that order, each once.

Timings. Phone timings come from the synthesizer itself: festival's Segment relation
(the same numbers as ``utt.save.segs``) and words from its Token/Word relations (a token's
words merged, named as the token is written); flite's ``-psdur`` segment end times, with
words found by splitting flite's phone string at the word boundaries of ``t2p`` (flite's
own lexicon and letter-to-sound) run on the comma-separated words; t2p's vowels may differ
(function words read phrase-finally), its consonants and phone count must agree, else
``words`` is ``[]``.
Times are in seconds of the output audio: scaled by the exact ratio of output to input
duration (sample counts over rates) when a pitch/tempo variant changes the length, clipped
to the audio, and the final pause is stretched/cut to end exactly at the end of the audio
(flite's diphone voice kal16 drops half of the final pause; festival's diphone voices add
~25 ms).

Every command's output is deterministic (``sox -R``); a second build with the same
arguments is byte-identical. Each job writes its files under temporary names in
``out_dir/.tmp`` and moves them into place with :func:`os.replace`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import wave
from dataclasses import dataclass
from pathlib import Path

from arnar import atomic

__all__ = [
    "BASE_VOICES",
    "MAX_SPEAKERS",
    "SpeakerSpec",
    "SynthError",
    "VARIANTS",
    "VARIANT_BASES",
    "build_synth_corpus",
    "main",
    "plan_speakers",
    "select_test_speakers",
]


class SynthError(RuntimeError):
    """A synthesizer (or sox) failed on an utterance."""


class SynthArgumentError(SynthError, ValueError):
    """Build arguments outside what the builder supports (e.g. too many speakers)."""


@dataclass(frozen=True)
class BaseVoice:
    voice: str
    synthesizer: str  # "flite" | "festival"


# Plain voices, clearest first (pocketsphinx WER in docs/design.md section 8: flite rms 7.5%, festival HTS
# slt 12.7%, flite awb 15.6%, slt 19.7%, kal16 21.4%, festival ked 24.9%, kal 26.6%).
BASE_VOICES: tuple[BaseVoice, ...] = (
    BaseVoice("rms", "flite"),
    BaseVoice("cmu_us_slt_arctic_hts", "festival"),
    BaseVoice("awb", "flite"),
    BaseVoice("slt", "flite"),
    BaseVoice("kal16", "flite"),
    BaseVoice("ked_diphone", "festival"),
    BaseVoice("kal_diphone", "festival"),
)
# Voices that get pitch/tempo variants (the five clearest), with the direction their pitch is
# moved: pocketsphinx reads low voices raised and high voices lowered, and falls apart the other
# way (measured on 15 sentences each, corpus WER: rms 16% plain, 21% at +250 cents, 67% at -250;
# HTS slt 15% plain, 11% at -250, 84% at +250; slt 31% plain, 25% at -250, 91% at +250).
VARIANT_BASES: tuple[str, ...] = ("rms", "cmu_us_slt_arctic_hts", "awb", "slt", "kal16")
PITCH_DIRECTION: dict[str, int] = {
    "rms": 1, "awb": 1, "kal16": 1, "cmu_us_slt_arctic_hts": -1, "slt": -1,
}
# (pitch shift in cents towards the voice's direction, tempo factor), in the order variant
# speakers are added; the actual shift is PITCH_DIRECTION[voice] * cents.
VARIANTS: tuple[tuple[int, float], ...] = (
    (150, 1.0),
    (250, 1.0),
    (100, 0.92),
    (200, 1.08),
    (-100, 1.0),
    (300, 0.95),
    (50, 1.1),
    (-50, 0.9),
)
MAX_SPEAKERS = len(BASE_VOICES) + len(VARIANT_BASES) * len(VARIANTS)

_SYNTH_OF = {v.voice: v.synthesizer for v in BASE_VOICES}
_JOB_SIZE = 24  # utterances per job (one festival process / one flite loop per job)
_TIME_DECIMALS = 5


@dataclass(frozen=True)
class SpeakerSpec:
    speaker: str
    voice: str
    synthesizer: str
    pitch_cents: int
    tempo: float
    split: str = "train"

    @property
    def plain(self) -> bool:
        return self.pitch_cents == 0 and self.tempo == 1.0


def _speaker_ids(n: int) -> list[str]:
    width = max(2, len(str(n - 1)))
    return [f"spk{i:0{width}d}" for i in range(n)]


def plan_speakers(n_speakers: int) -> list[SpeakerSpec]:
    """Speaker i's (voice, pitch, tempo): plain voices first, then variants (split unset)."""
    if not 1 <= n_speakers <= MAX_SPEAKERS:
        raise SynthArgumentError(f"n_speakers must be in 1..{MAX_SPEAKERS}, got {n_speakers}")
    combos: list[tuple[str, int, float]] = [(v.voice, 0, 1.0) for v in BASE_VOICES]
    for pitch, tempo in VARIANTS:
        combos += [(voice, PITCH_DIRECTION[voice] * pitch, tempo) for voice in VARIANT_BASES]
    ids = _speaker_ids(n_speakers)
    return [
        SpeakerSpec(ids[i], voice, _SYNTH_OF[voice], pitch, tempo)
        for i, (voice, pitch, tempo) in enumerate(combos[:n_speakers])
    ]


def select_test_speakers(speakers: list[SpeakerSpec], n_test: int, seed: int) -> set[str]:
    """Held-out speakers: seeded, round-robin over base voices so they span different ones."""
    if not 0 <= n_test < len(speakers):
        raise SynthArgumentError(
            f"n_test_speakers must be in 0..{len(speakers) - 1} (at least one training "
            f"speaker), got {n_test}"
        )
    rng = random.Random(f"arnar-synth-test-speakers-{seed}")
    groups: dict[str, list[str]] = {}
    for s in speakers:
        groups.setdefault(s.voice, []).append(s.speaker)
    order = sorted(groups)
    rng.shuffle(order)
    chosen: list[str] = []
    while len(chosen) < n_test:
        for voice in order:
            if len(chosen) == n_test:
                break
            pool = [s for s in groups[voice] if s not in chosen]
            if pool:
                chosen.append(rng.choice(pool))
    return set(chosen)


# --------------------------------------------------------------------------- tools


def _require_tools(synthesizers: set[str]) -> None:
    need = {"sox": "sox"}
    if "flite" in synthesizers:
        need.update(flite="flite", t2p="flite")
    if "festival" in synthesizers:
        need["festival"] = "festival"
    missing = [
        f"{prog} (Debian package {pkg})" for prog, pkg in need.items() if not shutil.which(prog)
    ]
    if missing:
        raise SynthError("missing programs: " + ", ".join(missing))


def _check_flite_voices(voices: set[str]) -> None:
    """flite silently falls back to its default voice for an unknown name: check first."""
    if not voices:
        return
    p = subprocess.run(["flite", "-lv"], capture_output=True, text=True, check=False)
    listed = set(p.stdout.replace("Voices available:", "").split())
    missing = sorted(voices - listed)
    if missing:
        raise SynthError(
            f"flite voices {missing} are not built in (flite -lv: {p.stdout.strip()!r}); "
            "the Debian package 'flite' provides rms, awb, slt, kal16"
        )


_FESTIVAL_VOICE_PKG = {
    "cmu_us_slt_arctic_hts": "festvox-us-slt-hts",
    "kal_diphone": "festvox-kallpc16k",
    "ked_diphone": "festvox-kdlpc16k",
}


def _tool_versions(synthesizers: set[str]) -> dict[str, str]:
    def first_line(cmd: list[str]) -> str:
        p = subprocess.run(cmd, capture_output=True, text=True, check=False)
        lines = [ln.strip() for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
        return lines[-1] if lines else "unknown"

    out = {"sox": first_line(["sox", "--version"])}
    if "flite" in synthesizers:
        out["flite"] = first_line(["flite", "--version"])
    if "festival" in synthesizers:
        out["festival"] = first_line(["festival", "--version"])
    return out


def _run(cmd: list[str], *, voice: str, utt_id: str, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, check=False, **kw)
    if p.returncode != 0:
        err = p.stderr.decode(errors="replace") if isinstance(p.stderr, bytes) else p.stderr
        raise SynthError(
            f"voice {voice!r}, utterance {utt_id}: command {' '.join(cmd[:6])}... failed "
            f"(rc {p.returncode}): {err.strip()[-2000:]}"
        )
    return p


# --------------------------------------------------------------------------- synthesis

Interval = tuple[str, float, float]


@dataclass
class _Raw:
    """One synthesized utterance before post-processing."""

    utt_id: str
    wav: Path
    phones: list[Interval]
    words: list[Interval] | None
    source: str


_FESTIVAL_SCM = r"""
(define (arnar_roots it) (if it (cons it (arnar_roots (item.next it))) nil))
(define (arnar_dump utt fname)
  (let ((fd (fopen fname "w")) (ti 0))
    (mapcar (lambda (s) (format fd "P\t%s\t%s\t%s\n" (item.name s)
                          (item.feat s "segment_start") (item.feat s "end")))
            (utt.relation.items utt 'Segment))
    (mapcar (lambda (tok)
              (mapcar (lambda (w)
                        (format fd "W\t%d\t%s\t%s\t%s\n" ti (item.name tok)
                          (item.feat w "R:SylStructure.daughter1.daughter1.segment_start")
                          (item.feat w "R:SylStructure.daughtern.daughtern.end")))
                      (item.daughters tok))
              (set! ti (+ ti 1)))
            (arnar_roots (utt.relation.first utt 'Token)))
    (fclose fd)))
(define (arnar_synth txt base)
  (let ((utt (SynthText txt)))
    (utt.save.wave utt (string-append base ".wav") 'riff)
    (arnar_dump utt (string-append base ".tim"))))
"""


def _scheme_string(text: str) -> str:
    if any(c in text for c in '"\\\n'):
        raise SynthError(f"text cannot be passed to festival: {text!r}")
    return f'"{text}"'


def _parse_festival_tim(path: Path) -> tuple[list[Interval], list[Interval]]:
    phones: list[Interval] = []
    tokens: dict[int, list] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        f = line.split("\t")
        if f[0] == "P":
            phones.append((f[1], float(f[2]), float(f[3])))
        elif f[0] == "W":
            ti, name, start, end = int(f[1]), f[2], float(f[3]), float(f[4])
            if end <= start:  # words without segments (punctuation, merged clitics)
                continue
            if ti in tokens:
                tokens[ti][1] = min(tokens[ti][1], start)
                tokens[ti][2] = max(tokens[ti][2], end)
            else:
                tokens[ti] = [name, start, end]
    words = [tuple(tokens[k]) for k in sorted(tokens)]
    return phones, words  # type: ignore[return-value]


def _synth_festival(voice: str, items: list[tuple[str, str]], tmp: Path) -> list[_Raw]:
    lines = [_FESTIVAL_SCM, f"(voice_{voice})"]
    for utt_id, text in items:
        lines.append(f'(arnar_synth {_scheme_string(text)} "{tmp / utt_id}")')
    script = tmp / "job.scm"
    script.write_text("\n".join(lines) + "\n", encoding="utf-8")
    p = subprocess.run(["festival", "-b", str(script)], capture_output=True, text=True, check=False)
    out = []
    for utt_id, text in items:
        wav, tim = tmp / f"{utt_id}.wav", tmp / f"{utt_id}.tim"
        if p.returncode != 0 or not wav.is_file() or not tim.is_file():
            hint = ""
            if f"unbound variable : voice_{voice}" in p.stderr and voice in _FESTIVAL_VOICE_PKG:
                hint = f" (install the Debian package {_FESTIVAL_VOICE_PKG[voice]})"
            raise SynthError(
                f"festival voice {voice!r} failed on utterance {utt_id} ({text!r}), "
                f"rc {p.returncode}{hint}: {(p.stderr or p.stdout).strip()[-2000:]}"
            )
        phones, words = _parse_festival_tim(tim)
        out.append(_Raw(utt_id, wav, phones, words, "festival-segs"))
    return out


_VOWELS = frozenset("aa ae ah ao aw ax axr ay eh er ey ih ix iy ow oy uh uw".split())
_PUNCT_END = re.compile(r"[,;:.?!]+$")


def _flite_words(
    text: str, phones: list[Interval], voice: str, utt_id: str
) -> list[Interval] | None:
    """Word intervals: split flite's phones at the word boundaries of t2p's transcription."""
    tokens = [_PUNCT_END.sub("", t) for t in text.split()]
    p = _run(["t2p", ", ".join(tokens)], voice=voice, utt_id=utt_id, text=True)
    groups: list[list[str]] = [[]]
    for ph in p.stdout.split():
        if ph == "pau":
            if groups[-1]:
                groups.append([])
        else:
            groups[-1].append(ph.rstrip("012"))
    groups = [g for g in groups if g]
    speech = [ph for ph in phones if ph[0] != "pau"]
    flat = [x for g in groups for x in g]
    if len(groups) != len(tokens) or len(flat) != len(speech):
        return None
    # t2p reads each word phrase-finally (its input is comma-separated), which changes only
    # vowels of function words ("a" ey/ax, "the" iy/ax); consonants must agree exactly.
    if any(a != b[0] and not (a in _VOWELS and b[0] in _VOWELS) for a, b in zip(flat, speech)):
        return None
    words: list[Interval] = []
    k = 0
    for tok, g in zip(tokens, groups):
        words.append((tok, speech[k][1], speech[k + len(g) - 1][2]))
        k += len(g)
    return words


def _synth_flite(voice: str, items: list[tuple[str, str]], tmp: Path) -> list[_Raw]:
    out = []
    for utt_id, text in items:
        wav = tmp / f"{utt_id}.wav"
        p = _run(
            ["flite", "-voice", voice, "-psdur", "-t", text, "-o", str(wav)],
            voice=voice,
            utt_id=utt_id,
            text=True,
        )
        phones: list[Interval] = []
        prev = 0.0
        for tok in p.stdout.split():
            sym, _, end = tok.rpartition(":")
            try:
                t_end = float(end)
            except ValueError:
                continue
            phones.append((sym, prev, t_end))
            prev = t_end
        if not phones or not wav.is_file():
            raise SynthError(
                f"flite voice {voice!r} gave no audio/phones for utterance {utt_id} "
                f"({text!r}): stdout {p.stdout.strip()[:300]!r} stderr {p.stderr.strip()[-1000:]!r}"
            )
        words = _flite_words(text, phones, voice, utt_id)
        out.append(_Raw(utt_id, wav, phones, words, "flite-psdur"))
    return out


def _wav_info(path: Path) -> tuple[int, int]:
    with wave.open(str(path), "rb") as w:
        return w.getnframes(), w.getframerate()


def _fix_times(
    intervals: list[Interval], scale: float, duration: float, *, stretch_last_pause: bool
) -> list[list]:
    out: list[list] = []
    prev = 0.0
    n = len(intervals)
    for i, (sym, start, end) in enumerate(intervals):
        s = min(max(start * scale, prev), duration)
        e = min(max(end * scale, s), duration)
        if stretch_last_pause and i == n - 1 and sym == "pau":
            e = duration
        s, e = round(s, _TIME_DECIMALS), round(e, _TIME_DECIMALS)
        out.append([sym, s, e])
        prev = e
    return out


def _postprocess(
    raw: _Raw, spk: SpeakerSpec, sample_rate: int, tmp: Path, final_dir: Path, text: str
) -> tuple[str, int, bool]:
    """Resample (+ pitch/tempo) with sox, fix the timings, move the three files in place."""
    out_wav = tmp / f"{raw.utt_id}.out.wav"
    cmd = ["sox", "-R", str(raw.wav), "-b", "16", "-e", "signed-integer", "-c", "1",
           "-r", str(sample_rate), str(out_wav)]
    if spk.pitch_cents:
        cmd += ["pitch", str(spk.pitch_cents)]
    if spk.tempo != 1.0:
        cmd += ["tempo", "-s", repr(spk.tempo)]
    _run(cmd, voice=spk.voice, utt_id=raw.utt_id)
    n_in, sr_in = _wav_info(raw.wav)
    n_out, sr_out = _wav_info(out_wav)
    if sr_out != sample_rate or n_out == 0:
        raise SynthError(
            f"voice {spk.voice!r}, utterance {raw.utt_id}: sox wrote {n_out} samples at {sr_out} Hz"
        )
    duration = n_out / sr_out
    scale = 1.0 if spk.plain else duration / (n_in / sr_in)
    phones = _fix_times(raw.phones, scale, duration, stretch_last_pause=True)
    words = _fix_times(raw.words, scale, duration, stretch_last_pause=False) if raw.words else []
    align = {"phones": phones, "words": words, "source": raw.source}

    tmp_txt, tmp_json = tmp / f"{raw.utt_id}.txt", tmp / f"{raw.utt_id}.align.json"
    tmp_txt.write_text(text + "\n", encoding="utf-8")
    tmp_json.write_text(json.dumps(align, separators=(",", ":")) + "\n", encoding="utf-8")
    os.replace(tmp_txt, final_dir / f"{raw.utt_id}.txt")
    os.replace(tmp_json, final_dir / f"{raw.utt_id}.align.json")
    os.replace(out_wav, final_dir / f"{raw.utt_id}.wav")
    return raw.utt_id, n_out, bool(words)


def _run_job(job: tuple) -> list[tuple[str, int, bool]]:
    spk, items, out_dir, sample_rate = job
    out_dir = Path(out_dir)
    final_dir = out_dir / spk.speaker
    final_dir.mkdir(parents=True, exist_ok=True)
    tmp_root = out_dir / ".tmp"
    tmp_root.mkdir(exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{items[0][0]}.", dir=tmp_root))
    try:
        if spk.synthesizer == "festival":
            raws = _synth_festival(spk.voice, items, tmp)
        else:
            raws = _synth_flite(spk.voice, items, tmp)
        texts = dict(items)
        return [_postprocess(r, spk, sample_rate, tmp, final_dir, texts[r.utt_id]) for r in raws]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------- builder


_UTT_FILE = re.compile(r"^(spk\d+)_\d+\.(wav|txt|align\.json)$")


def _remove_stale(out_dir: Path, keep_speakers: set[str], keep_utts: set[str]) -> None:
    """Remove corpus files of an earlier, different build in the same directory."""
    for d in out_dir.iterdir():
        if not (d.is_dir() and re.fullmatch(r"spk\d+", d.name)):
            continue
        for f in d.iterdir():
            if _UTT_FILE.match(f.name) and f.name.split(".", 1)[0] not in keep_utts:
                f.unlink()
        if d.name not in keep_speakers and not any(d.iterdir()):
            d.rmdir()


def build_synth_corpus(
    out_dir: Path,
    *,
    n_speakers: int,
    utterances_per_speaker: int,
    n_test_speakers: int,
    seed: int,
    sample_rate: int = 16000,
    workers: int = 2,
    progress: bool = True,
) -> dict:
    """Build the corpus into ``out_dir`` (layout in the module docstring); return its summary.

    The returned dict is ``summary.json`` plus ``build_seconds`` and ``x_real_time`` (also
    written to ``build_log.json``; kept out of ``summary.json`` so rebuilds are identical).
    """
    from arnar.corpus.texts import load_sentences

    t0 = time.perf_counter()
    if utterances_per_speaker < 1:
        raise SynthArgumentError("utterances_per_speaker must be >= 1")
    if sample_rate < 8000:
        raise SynthArgumentError("sample_rate must be >= 8000")
    out_dir = Path(out_dir)
    speakers = plan_speakers(n_speakers)
    test = select_test_speakers(speakers, n_test_speakers, seed)
    speakers = [
        SpeakerSpec(s.speaker, s.voice, s.synthesizer, s.pitch_cents, s.tempo,
                    "test" if s.speaker in test else "train")
        for s in speakers
    ]
    synths = {s.synthesizer for s in speakers}
    _require_tools(synths)
    _check_flite_voices({s.voice for s in speakers if s.synthesizer == "flite"})

    sentences = load_sentences()
    need = n_speakers * utterances_per_speaker
    if need > len(sentences):
        raise SynthArgumentError(
            f"{n_speakers} speakers x {utterances_per_speaker} utterances needs {need} "
            f"sentences, only {len(sentences)} are available"
        )
    order = list(range(len(sentences)))
    random.Random(f"arnar-synth-sentences-{seed}").shuffle(order)

    uwidth = max(4, len(str(utterances_per_speaker - 1)))
    jobs = []
    assignment: dict[str, list[tuple[str, str]]] = {}
    for i, spk in enumerate(speakers):
        idx = order[i * utterances_per_speaker:(i + 1) * utterances_per_speaker]
        items = [(f"{spk.speaker}_{j:0{uwidth}d}", sentences[k]) for j, k in enumerate(idx)]
        assignment[spk.speaker] = items
        for c in range(0, len(items), _JOB_SIZE):
            jobs.append((spk, items[c:c + _JOB_SIZE], str(out_dir), sample_rate))
    # festival jobs first (they are the slowest), for a better balance over the workers
    jobs.sort(key=lambda j: (j[0].synthesizer != "festival", j[0].speaker, j[1][0][0]))

    out_dir.mkdir(parents=True, exist_ok=True)
    header = "speaker\tvoice\tsynthesizer\tpitch_cents\ttempo\tsplit\n"
    rows = "".join(
        f"{s.speaker}\t{s.voice}\t{s.synthesizer}\t{s.pitch_cents}\t{s.tempo:g}\t{s.split}\n"
        for s in speakers
    )

    results: dict[str, tuple[int, bool]] = {}
    bar = None
    if progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=need, unit="utt", desc=f"synth {out_dir.name}", file=sys.stderr)
        except ImportError:  # pragma: no cover
            bar = None
    audio_s = 0.0
    last_log = time.perf_counter()

    def collect(res: list[tuple[str, int, bool]]) -> None:
        nonlocal audio_s, last_log
        for utt_id, n, has_words in res:
            results[utt_id] = (n, has_words)
            audio_s += n / sample_rate
        el = time.perf_counter() - t0
        if bar is not None:
            bar.update(len(res))
            bar.set_postfix_str(f"{audio_s / max(el, 1e-9):.0f}x real time")
        elif progress and time.perf_counter() - last_log > 5:
            last_log = time.perf_counter()
            rtf = audio_s / max(el, 1e-9)
            print(f"synth: {len(results)}/{need} utterances, {rtf:.0f}x real time",
                  file=sys.stderr, flush=True)

    try:
        if workers <= 1:
            for job in jobs:
                collect(_run_job(job))
        else:
            ctx = mp.get_context("spawn")
            with ctx.Pool(processes=min(workers, len(jobs))) as pool:
                for res in pool.imap_unordered(_run_job, jobs):
                    collect(res)
    finally:
        if bar is not None:
            bar.close()
        shutil.rmtree(out_dir / ".tmp", ignore_errors=True)

    atomic.write_text(out_dir / "speakers.tsv", header + rows)
    _remove_stale(out_dir, {s.speaker for s in speakers}, set(results))

    def split_stats(names: list[str]) -> dict:
        utts = [u for n in names for u, _ in assignment[n]]
        secs = sum(results[u][0] for u in utts) / sample_rate
        return {"speakers": len(names), "utterances": len(utts), "seconds": round(secs, 3),
                "hours": round(secs / 3600, 4)}

    total_s = sum(n for n, _ in results.values()) / sample_rate
    summary = {
        "corpus": "synth",
        "format_version": 1,
        "args": {
            "n_speakers": n_speakers,
            "utterances_per_speaker": utterances_per_speaker,
            "n_test_speakers": n_test_speakers,
            "seed": seed,
            "sample_rate": sample_rate,
        },
        "speakers": n_speakers,
        "utterances": len(results),
        "seconds": round(total_s, 3),
        "hours": round(total_s / 3600, 4),
        "splits": {
            split: split_stats([s.speaker for s in speakers if s.split == split])
            for split in ("train", "test")
        },
        "test_speakers": sorted(test),
        "voices": {v.voice: sum(s.voice == v.voice for s in speakers) for v in BASE_VOICES
                   if any(s.voice == v.voice for s in speakers)},
        "utterances_with_word_timings": sum(1 for _, w in results.values() if w),
        "sentences_available": len(sentences),
        "tools": _tool_versions(synths),
    }
    atomic.write_text(out_dir / "summary.json", json.dumps(summary, indent=2, sort_keys=False) + "\n")
    wall = time.perf_counter() - t0
    log = {"build_seconds": round(wall, 3), "x_real_time": round(total_s / wall, 1),
           "workers": workers, "jobs": len(jobs)}
    atomic.write_text(out_dir / "build_log.json", json.dumps(log, indent=2) + "\n")
    return {**summary, **log}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(
        prog="python -m arnar.corpus.synth",
        description="Build the embedded offline multi-speaker corpus 'synth'.",
    )
    ap.add_argument("--out", type=Path, required=True, help="output directory")
    ap.add_argument("--speakers", type=int, default=20,
                    help=f"number of speakers (1..{MAX_SPEAKERS})")
    ap.add_argument("--utterances-per-speaker", type=int, default=60)
    ap.add_argument("--test-speakers", type=int, default=4, help="held-out speakers (zero-shot)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sample-rate", type=int, default=16000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    summary = build_synth_corpus(
        a.out,
        n_speakers=a.speakers,
        utterances_per_speaker=a.utterances_per_speaker,
        n_test_speakers=a.test_speakers,
        seed=a.seed,
        sample_rate=a.sample_rate,
        workers=a.workers,
        progress=not a.no_progress,
    )
    print(
        f"synth: {summary['speakers']} speakers, {summary['utterances']} utterances, "
        f"{summary['hours']:.3f} h in {summary['build_seconds']:.1f} s "
        f"({summary['x_real_time']:.0f}x real time) -> {a.out}"
    )
    return summary


if __name__ == "__main__":
    main()
