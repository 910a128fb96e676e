"""Offline forced alignment with CMU PocketSphinx 5 (the wheel ships the US English model).

How it aligns one utterance:

1. **Text.** The words are :func:`arnar.align.base.spoken_words` of the transcript
   (``normalize_text``, lower-cased, punctuation removed, internal apostrophes kept, hyphenated
   compounds split into their parts). Each word is looked up in pocketsphinx's own dictionary
   (``cmudict-en-us.dict`` in the wheel, with its alternative pronunciations ``word(2)``...,
   which the alignment search chooses between). A word it lacks is added to the decoder's
   dictionary (``Decoder.add_word``) with the stress-free ARPAbet of
   :func:`arnar.text.phonemes.analyze_words` (CMUdict's first pronunciation, or its OOV
   fallback: numbers read out, compounds by parts, spelled letters).
2. **Audio** is read with ``arnar.evaluate.audio.load_mono`` at 16 kHz (soxr resampling when
   needed). A fixed, seeded Gaussian noise floor (``noise_floor``, std 3e-4 = about -70 dBFS,
   10 LSB of 16-bit audio) is added before conversion to 16-bit PCM; see the settings below.
3. **Word alignment** (first pass): ``Decoder.set_align_text`` builds a left-to-right graph
   over the words with optional silences/fillers between them; the utterance is decoded in one
   piece (``full_utt=True``).
4. **Phone alignment** (second pass): ``Decoder.set_alignment`` + a second decode give the
   phone (and state) segmentation inside the word sequence the first pass found; the reported
   word *and* phone intervals come from this pass.
5. **Times**: pocketsphinx counts frames of ``1 / frate`` s (10 ms at ``frate=100``). A
   boundary at frame ``f`` is reported at ``f / frate + time_offset`` seconds, clipped to
   ``[0, duration]``. Silences (``<sil>``, fillers, ``SIL``/``+NSN+`` phones) are not listed.

Before every pass the front end is rebuilt (``Decoder.reinit_feat``, ~60 us) and the cepstral
mean set back to the model's initial value. ``set_cmn`` alone (as the ASR backend does) was
measured to leave state behind: a boundary then moved by a frame depending on which utterance
came before (6 of 20 utterances differed between a fresh and a used decoder). With the reset,
results are identical whatever the batch order or composition (a test checks this).

If the first pass finds no path through the whole text, it is retried with wider beams
(``retry_beams``: each value is used for ``beam``, ``pbeam`` and ``wbeam``, on a second
decoder kept for that purpose) before the item fails.

Failure kinds (``AlignmentFailure.reason`` = ``"align: <kind> (<details>)"``):
``empty text`` (no spoken word), ``unreadable audio`` (cannot be read, no samples, not
finite), ``silent audio`` (peak below ``min_peak`` = -60 dBFS), ``no pronunciation``,
``audio too short`` (fewer frames than 3 per phone of the text's shortest pronunciations),
``no alignment found`` (no search path reached the end of the text, with every beam),
``implausible alignment`` (more than ``max_short_phone_share`` = 60 % of the phones at the
3-frame minimum, or one phone longer than ``max_phone_duration`` = 1 s: the text was forced
onto audio that is not that speech, e.g. noise; on the 1440 corpus utterances at most 19 % of
an utterance's phones are that short and no phone lasts over 0.35 s), ``word sequence
mismatch`` (pocketsphinx returned other words than the text's: not seen), ``pocketsphinx
error`` (it raised anything else). A wrong transcript of plausible length for the audio is
*not* detected: a forced aligner aligns what it is given (check transcripts with ASR).

Options (``load_aligner("pocketsphinx", **options)``): ``hmm`` / ``dict`` (paths; default the
wheel's model), ``frate``, ``time_offset``, ``noise_floor``, ``min_peak``,
``max_phone_duration``, ``max_short_phone_share``, ``retry_beams`` (``()`` disables retries)
and any ``pocketsphinx.Decoder`` parameter (``beam``, ``silprob``, ``bestpath``, ...).
``settings`` lists all of them for reports.

Settings, chosen on the mini corpus's train split (every 4th utterance, 283) and checked on
dev (71) and test (240, four held-out voices), word-boundary error against the synthesizers'
own timings (every word start and end; :mod:`arnar.align.accuracy`):

=========================================  =========  ============  ===========  ========
configuration                              test: med  test: mean    dev: median  failures
                                           (ms)       (ms)          / mean (ms)  test/dev
=========================================  =========  ============  ===========  ========
pocketsphinx defaults (bestpath on)        10.7       16.5          11.5 / 16.2  17 / 4
+ ``bestpath=False``                       10.7       15.6          12.0 / 16.3  0 / 0
+ ``silprob=0.1`` (was 0.005)              10.7       14.8          12.0 / 15.3  0 / 0
+ ``noise_floor=3e-4`` (the defaults)      10.5       14.4          11.5 / 15.0  0 / 0
=========================================  =========  ============  ===========  ========

* ``bestpath=False`` (the important one): with pocketsphinx's default lattice best-path
  rescoring, the first pass can hand the phone-alignment pass a zero-length ``<s>`` word
  ("phone 0 has impossible duration", then "Failed to stop utterance processing"): every
  failure of the stock settings was this, none was a search failure. (docs/design.md section 8 records 72/200
  failures on an espeak-ng corpus: probably the same bug.)
* ``silprob=0.1``: more willing to insert a pause between words; fewer large errors where the
  synthesizer pauses (mean -1 ms on all splits), median unchanged.
* ``noise_floor``: synthetic speech has near-digital silence (-70 dBFS and below) that the
  acoustic model's silence, trained on real recordings, explains worse than a stop closure:
  an utterance-initial "please" took the whole 136 ms leading pause into its P. A -70 dBFS
  floor fixes that (and costs nothing audible on real recordings, whose noise is higher).
* Left at their defaults, measured no better: ``frate`` 125/150/200 (5 ms frames: median 13 ms,
  slower; the model was trained at 100 frames/s), ``topn`` 8/16, ``compallsen``,
  ``remove_noise`` off, ``fsgusealtpron`` off, ``fsgusefiller`` off (worse, and failures),
  ``wlen`` 0.02; ``time_offset`` +4 ms lowers the train/dev bias (-3 to -4 ms) but raises the
  test one (+1.6 ms): the bias depends on the voice, so no offset is applied.

Measured with the defaults (one CPU thread, ~14 utterances/s, ~45x real time, 2 passes):
test median 10.5 ms, mean 14.4 ms, 75 % of boundaries within 20 ms, 0/240 failures; dev
11.5 / 15.0 ms, 74 %, 0/71; train 11.3 / 14.6 ms, 75 %, 0/1129. Most of the error is at
pauses: a word after a pause starts ~10-15 ms before the synthesizer's timing, a word before
a pause ends ~12-15 ms after it (the synthesizers' diphone/unit boundaries put the edge of the
pause where the speech sound is already/still audible); within phrases the median signed error
is -5 to +2 ms and the absolute median one 10 ms frame.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from arnar.align.base import (
    AlignItem,
    Alignment,
    AlignmentFailure,
    Interval,
    failure,
    spoken_words,
    word_pronunciations,
)

SAMPLE_RATE = 16_000
FILLER_PREFIXES = ("<", "[", "+")  # <s> </s> <sil> [NOISE] +NSN+ ...
NOISE_SEED = 0
STATES_PER_PHONE = 3  # emitting states of the en-us HMMs: a phone lasts >= 3 frames
SILENCE_PHONES = frozenset({"SIL", "SP", "SPN", ""})

DEFAULTS: dict[str, Any] = {
    "frate": 100,
    "time_offset": 0.0,
    "noise_floor": 3e-4,
    "min_peak": 1e-3,
    "max_phone_duration": 1.0,
    "max_short_phone_share": 0.6,
    "beam": 1e-48,
    "wbeam": 7e-29,
    "pbeam": 1e-48,
    "retry_beams": (1e-80, 1e-120),
    "bestpath": False,
    "silprob": 0.1,
}


class PocketSphinxAligner:
    """Forced alignment with pocketsphinx (see the module docstring)."""

    name = "pocketsphinx"

    def __init__(self, workers: int = 1, **options: Any):
        import pocketsphinx

        self._pocketsphinx = pocketsphinx
        # processes that align in parallel: each utterance's result is independent of the others
        # (see the reset above), so the output is the same for any number of workers
        self.workers = int(workers)
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self._options = dict(options)
        opts = {**DEFAULTS, **options}
        self.frate = int(opts.pop("frate"))
        self.time_offset = float(opts.pop("time_offset"))
        self.noise_floor = float(opts.pop("noise_floor"))
        self.min_peak = float(opts.pop("min_peak"))
        self.max_phone_duration = float(opts.pop("max_phone_duration"))
        self.max_short_phone_share = float(opts.pop("max_short_phone_share"))
        self.retry_beams = tuple(float(b) for b in (opts.pop("retry_beams") or ()))
        if self.frate <= 0:
            raise ValueError("frate must be positive")
        if "samprate" in opts and int(opts["samprate"]) != SAMPLE_RATE:
            raise ValueError("the pocketsphinx aligner decodes 16 kHz audio; leave samprate alone")
        for key in ("hmm", "dict"):
            if opts.get(key) is not None:
                path = Path(opts[key]).expanduser()
                if not path.exists():
                    raise FileNotFoundError(f"pocketsphinx {key}: {path} does not exist")
                opts[key] = str(path)
            else:
                opts.pop(key, None)
        self.config: dict[str, Any] = {"loglevel": "FATAL", "lm": None, "frate": self.frate, **opts}
        self._decoders: dict[int, Any] = {}  # attempt -> Decoder (0: the configured beams)
        self._added: dict[int, set[str]] = {}  # attempt -> words added to that decoder
        self._prons: dict[str, str] = {}  # word -> phones we add (words not in the dictionary)
        self._cmn_init = self._decoder(0).get_cmn()
        version = importlib.metadata.version("pocketsphinx")
        custom = [f"{k}={opts[k]}" for k in ("hmm", "dict") if opts.get(k) is not None]
        self.model_id = f"pocketsphinx-{version}:" + (",".join(custom) if custom else "en-us")

    @property
    def settings(self) -> dict[str, Any]:
        """Everything that determines the output (for reports and cache keys)."""
        return {**self.config, "time_offset": self.time_offset, "noise_floor": self.noise_floor,
                "min_peak": self.min_peak, "max_phone_duration": self.max_phone_duration,
                "max_short_phone_share": self.max_short_phone_share,
                "retry_beams": list(self.retry_beams), "model_id": self.model_id}

    # ------------------------------------------------------------------ public
    def align_batch(
        self, items: Sequence[AlignItem], progress: bool = True
    ) -> list[Alignment | AlignmentFailure]:
        from tqdm import tqdm

        workers = min(self.workers, len(items))
        if workers <= 1:
            bar = tqdm(items, desc="align (pocketsphinx)", unit="utt", disable=not progress)
            return [self.align_item(item) for item in bar]
        import multiprocessing

        # fork: the workers inherit the loaded module; each builds its own decoders once
        context = multiprocessing.get_context("fork")
        with context.Pool(workers, initializer=_init_worker, initargs=(self._options,)) as pool:
            results = pool.imap(_align_in_worker, items, chunksize=8)
            return list(tqdm(results, total=len(items), desc=f"align (pocketsphinx, {workers} workers)",
                             unit="utt", disable=not progress))

    def align_item(self, item: AlignItem) -> Alignment | AlignmentFailure:
        from arnar.evaluate.audio import AudioError, load_mono

        words = spoken_words(item.text)
        if not words:
            return failure(item.utt_id, "empty text", f"no spoken word in {item.text!r}")
        try:
            audio, _ = load_mono(item.audio_path, SAMPLE_RATE)
        except AudioError as err:
            return failure(item.utt_id, "unreadable audio", str(err))
        return self.align_audio(item.utt_id, audio, words)

    def align_audio(
        self, utt_id: str, audio: np.ndarray, words: Sequence[str]
    ) -> Alignment | AlignmentFailure:
        """Align 16 kHz mono float ``audio`` to ``words`` (spoken words, see ``spoken_words``)."""
        words = list(words)
        if not words:
            return failure(utt_id, "empty text", "no spoken word")
        audio = np.asarray(audio, dtype=np.float32)
        if audio.ndim != 1 or audio.size == 0 or not np.all(np.isfinite(audio)):
            return failure(utt_id, "unreadable audio", f"shape {audio.shape}, expected mono samples")
        duration = audio.size / SAMPLE_RATE
        peak = float(np.abs(audio).max())
        if peak < self.min_peak:
            level = f"{20 * np.log10(peak):.0f} dBFS" if peak > 0 else "digital silence"
            return failure(utt_id, "silent audio", f"peak {level}")
        missing = [w for w in dict.fromkeys(words) if w not in self._prons]
        missing = [w for w in missing if self._decoder(0).lookup_word(w) is None]
        for word, phones in zip(missing, word_pronunciations(missing)):
            if not phones:
                return failure(utt_id, "no pronunciation", f"word {word!r}")
            self._prons[word] = " ".join(phones)
        frames = int(duration * self.frate)
        needed = STATES_PER_PHONE * sum(self._min_phones(w) for w in words)
        if frames < needed:
            return failure(
                utt_id, "audio too short",
                f"{duration:.2f} s = {frames} frames < {needed} for {len(words)} words",
            )
        if self.noise_floor > 0:
            noise = np.random.default_rng(NOISE_SEED).standard_normal(audio.size, dtype=np.float32)
            audio = audio + np.float32(self.noise_floor) * noise
        pcm = np.round(np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
        try:
            return self._align(utt_id, pcm, duration, words)
        except RuntimeError as err:
            return failure(utt_id, "pocketsphinx error", str(err))

    # ------------------------------------------------------------------ internals
    def _decoder(self, attempt: int):
        """The decoder of an attempt: 0 = configured beams, k = ``retry_beams[k - 1]``."""
        if attempt not in self._decoders:
            config = dict(self.config)
            if attempt:
                wide = self.retry_beams[attempt - 1]
                for key in ("beam", "pbeam", "wbeam"):
                    config[key] = min(float(config.get(key, 1.0)), wide)
            try:
                self._decoders[attempt] = self._pocketsphinx.Decoder(**config)
            except KeyError as err:  # pocketsphinx reports an unknown parameter as KeyError
                raise ValueError(f"pocketsphinx: {err.args[0] if err.args else err}") from None
            self._added[attempt] = set()
        dec = self._decoders[attempt]
        new = [w for w in self._prons if w not in self._added[attempt]]
        for word in new:
            dec.add_word(word, self._prons[word], False)
            self._added[attempt].add(word)
        return dec

    def _min_phones(self, word: str) -> int:
        if word in self._prons:
            return len(self._prons[word].split())
        dec = self._decoder(0)
        counts, k = [], 1
        while (pron := dec.lookup_word(word if k == 1 else f"{word}({k})")) is not None:
            counts.append(len(pron.split()))
            k += 1
        return min(counts, default=1)

    def _decode(self, dec, pcm: bytes) -> None:
        # The same starting point for every pass of every utterance: set_cmn alone (as the ASR
        # backend does) leaves part of the live-CMN state behind and results then depend (by a
        # frame here and there) on the previous utterance; rebuilding the front end (~60 us)
        # and then setting the initial mean makes each pass independent of the history.
        dec.reinit_feat()
        dec.set_cmn(self._cmn_init)
        dec.start_utt()
        dec.process_raw(pcm, no_search=False, full_utt=True)
        dec.end_utt()

    def _align(
        self, utt_id: str, pcm: bytes, duration: float, words: list[str]
    ) -> Alignment | AlignmentFailure:
        text = " ".join(words)
        dec = None
        for attempt in range(1 + len(self.retry_beams)):
            candidate = self._decoder(attempt)
            candidate.set_align_text(text)
            try:
                self._decode(candidate, pcm)
            except RuntimeError:  # "Failed to stop utterance processing": no path to the end
                continue
            hyp = candidate.hyp()
            if hyp is not None and [_base_word(w) for w in hyp.hypstr.split()] == words:
                dec = candidate
                break
        if dec is None:
            beams = [self.config.get("beam", 1e-48), *self.retry_beams]
            return failure(
                utt_id, "no alignment found",
                f"{len(words)} words, {duration:.2f} s, beams {', '.join(f'{b:g}' for b in beams)}",
            )
        dec.set_alignment()
        try:
            self._decode(dec, pcm)
        except RuntimeError as err:
            return failure(utt_id, "no alignment found", f"phone alignment pass: {err}")
        ali = dec.get_alignment()
        if ali is None:
            return failure(utt_id, "no alignment found", "phone alignment pass returned nothing")
        def sec(frame: int) -> float:  # rounded to 1 us: no 0.35000000000000003
            return min(max(round(frame / self.frate + self.time_offset, 6), 0.0), duration)

        spans = []
        for w in ali.words():
            if not w.name.startswith(FILLER_PREFIXES):
                spans.append((_base_word(w.name), sec(w.start), sec(w.start + w.duration)))
        phones = []
        for p in ali.phones():
            symbol = p.name.upper()
            if symbol in SILENCE_PHONES or symbol.startswith(FILLER_PREFIXES):
                continue
            phones.append(Interval(symbol, sec(p.start), sec(p.start + p.duration)))
        names = [name for name, _, _ in spans]
        if names != words:
            return failure(utt_id, "word sequence mismatch", f"expected {words}, got {names}")
        frame = 1.0 / self.frate
        shortest = [p for p in phones if p.end - p.start < STATES_PER_PHONE * frame + 1e-6]
        if len(phones) >= 4 and len(shortest) > self.max_short_phone_share * len(phones):
            return failure(
                utt_id, "implausible alignment",
                f"{len(shortest)} of {len(phones)} phones at the minimum "
                f"{1000 * STATES_PER_PHONE * frame:.0f} ms: no speech matching the text found",
            )
        longest = max(phones, key=lambda p: p.end - p.start, default=None)
        if longest is not None and longest.end - longest.start > self.max_phone_duration:
            return failure(
                utt_id, "implausible alignment",
                f"phone {longest.symbol} at {longest.start:.2f} s lasts "
                f"{longest.end - longest.start:.2f} s > {self.max_phone_duration:g} s",
            )
        return Alignment(utt_id, [Interval(*span) for span in spans], phones, duration)


def _base_word(name: str) -> str:
    """``the(2)`` -> ``the`` (pocketsphinx names alternative pronunciations so)."""
    if name.endswith(")") and "(" in name:
        head, _, tail = name[:-1].rpartition("(")
        if tail.isdigit():
            return head
    return name


_WORKER_ALIGNER: PocketSphinxAligner | None = None


def _init_worker(options: dict[str, Any]) -> None:
    global _WORKER_ALIGNER
    _WORKER_ALIGNER = PocketSphinxAligner(**options)


def _align_in_worker(item: AlignItem) -> Alignment | AlignmentFailure:
    return _WORKER_ALIGNER.align_item(item)
