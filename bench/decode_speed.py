"""Decoding speed of every paradigm at one backbone size, measured side by side.

    python bench/decode_speed.py [--model small] [--seconds 3 6 10 20] [--repeats 3] [--threads 2]
                                 [--device cpu|cuda] [--precision fp32|bf16] [--paradigms ar nar ...]
                                 [--decoding palle.steps=50 ...]

What is measured, per paradigm and utterance length, batch 1, random weights (speed does not
depend on what the weights learned, only the length does, and every length here is given):

* ``passes``: sequential forward passes of the decoding loop (``Generation.forward_passes``, a
  real counter of backbone calls in each paradigm);
* ``token_seconds``: wall time of ``generate`` (the token stage; the codec decoder is not timed);
* ``rtf``: token seconds per second of audio;
* ``fpl_seconds``: first-packet latency of the token stage (FPL-A): the time at which the first
  audio packet's tokens exist, ``info["first_packet_seconds"]`` for the paradigms that stream
  (AR, SyncSpeech: the first ``chunk_size`` tokens), else the whole token stage;
* ``overhead``: share of the decoding loop spent outside the network's forward passes,
  ``1 - forward_seconds / token_seconds`` (sampling, masks, bookkeeping in Python), from a
  second, instrumented run (see :class:`ForwardTimer`; the headline times come from runs without
  instrumentation);
* ``*_vs_ar``: each paradigm's passes, time and FPL-A over AR's at the same length, from the
  same run.

Requests. The same random text for every paradigm: ``round(T / 4.37)`` BPE tokens for ``T``
frames at 25 Hz (the mini corpus's 25 Hz alignments: 4.37 frames per BPE token), a 3 s prompt
(75 frames, 17 BPE tokens) and ``target_frames`` given, so that every paradigm generates the same
duration: AR then decodes exactly ``T`` tokens (no ``<eos>`` decision), SyncSpeech gets oracle
durations ``text_ends`` (a random split of ``T`` over the text tokens, at least one frame each),
NAR, PALLE and DELTA take ``target_frames``. CoD generates the offline codec's 50 Hz
first-quantizer stack (``offline_rvq``), so it gets ``2 T`` frames at 50 Hz (a 150-frame prompt)
and synthetic phonemes (2.23 per BPE token, the mini corpus's ratio) and a random speaker
embedding in ``request.features``, which is what :meth:`CoD.prepare_request` would put there
without running the speaker encoder.

Repetitions are interleaved (every length and paradigm once per repetition, the paradigm order
rotating) so machine load affects all alike; medians are reported. On a CPU the numbers are
compute-bound: a pass costs what its matrix products cost, so paradigms that run few passes
over long sequences (NAR, PALLE, DELTA, CoD) lose part of their advantage over AR's many
one-token passes with a KV cache; on a GPU a short pass costs about the launch overhead, which
favours few passes (bench/gpu_figures.py runs the paper size there, in bf16 autocast).

Writes JSON (default results/bench/decode_speed.json), the table as a Markdown section of
results/bench.md (between ``<!-- decode_speed -->`` and ``<!-- /decode_speed -->``, so other
benches can share the file) and a plot of passes and seconds against length
(results/bench/decode_scaling.png).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import yaml

import arnar
from arnar.paradigms import build_paradigm
from arnar.paradigms.base import Paradigm, SynthesisRequest, Vocab

CONF_DIR = Path(arnar.__file__).parent / "conf"
DEFAULT_PARADIGMS = ["ar", "nar", "syncspeech", "palle_stage2", "delta", "cod"]  # conf/paradigm/<name>.yaml
FRAME_RATE = 25.0  # the single-stream paradigms' tokens (offline codec, first codebook)
COD_FRAME_RATE = 50.0  # CoD's finest level: the offline_rvq first quantizer
FRAMES_PER_BPE = 4.37  # mini corpus, durations_25hz/train.jsonl: 49.4k frames over 11.3k BPE tokens
PHONEMES_PER_BPE = 2.23  # mini corpus, features/cod_train.pt phonemes over the same utterances' BPE tokens
PHONEME_IDS = 43  # the phoneme tokenizer's inventory (CoD's n_phonemes option is >= this)
PROMPT_SECONDS = 3.0
# the mini profile's vocabularies: BPE 1000 ids, offline codebook 512 codes, offline_rvq 256
TEXT_VOCAB, SPEECH_VOCAB, COD_SPEECH_VOCAB = 1000, 512, 256

# What one forward pass of each paradigm computes, as attribute paths on the model: modules (timed
# by forward hooks) or methods (timed by a wrapper). Nested calls count once (ForwardTimer).
NETWORK_CALLS = {
    "ar": ("embed", "backbone", "head"),
    "nar": ("embed", "backbone", "head", "speech_logits"),  # the head's speech rows alone (generate)
    "syncspeech": ("embed", "backbone", "head", "duration_head"),
    # two networks of their own; generate calls PalleNetwork.hidden (front end + backbone) then .head
    "palle": ("stage_one.hidden", "stage_two.hidden", "stage_one.head", "stage_two.head"),
    # runs the blocks and conv modules itself, then the head's speech rows through F.linear
    "delta": ("hidden_states", "speech_logits"),
    # embeddings + backbone (one batch of two rows under CFG), the head; the stack's head after the last pass
    "cod": ("level_hidden", "head", "acoustic_head"),
}


# ----------------------------------------------------------------------------- models

def sized_model(model_size: str, paradigm: str) -> str:
    """The model config a paradigm trains at this size: conf/model/<size>_<paradigm>.yaml where a
    paradigm's paper states a size of its own (at paper scale: paper_cod, paper_delta), else
    conf/model/<size>.yaml, the backbone the comparison shares (workflow/rules/runs.smk ``sized_model``)."""
    own = f"{model_size}_{paradigm}"
    return own if (CONF_DIR / "model" / f"{own}.yaml").exists() else model_size


def paradigm_yaml(config_name: str) -> dict[str, Any]:
    """conf/paradigm/<config_name>.yaml with the configs it extends (Hydra ``defaults`` of the same
    group, then ``_self_``) merged in, options key by key, as Hydra composes them."""
    own = yaml.safe_load((CONF_DIR / "paradigm" / f"{config_name}.yaml").read_text())
    defaults = own.pop("defaults", None) or ["_self_"]
    if "_self_" not in defaults:
        defaults = [*defaults, "_self_"]
    merged: dict[str, Any] = {}
    for entry in defaults:
        if not isinstance(entry, str):
            raise ValueError(f"conf/paradigm/{config_name}.yaml: a defaults entry this reader cannot follow: {entry!r}")
        part = own if entry == "_self_" else paradigm_yaml(entry)
        options = {**(merged.get("options") or {}), **(part.get("options") or {})}
        merged = {**merged, **part, "options": options}
    return merged


def load_config(config_name: str, model_size: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """``(paradigm name, model config, options)`` from conf/paradigm/<config_name>.yaml (with the
    configs it extends) and the model config the paradigm has at that size (:func:`sized_model`),
    read as plain YAML (the GPU image has no Hydra; tests/test_bench_decode.py and
    tests/test_bench_train.py check it is Hydra's composition). A ``# @package _global_`` model file
    (paper_cod.yaml) holds ``model:`` and the paradigm options it sets."""
    paradigm = paradigm_yaml(config_name)
    name = str(paradigm["name"])
    model = yaml.safe_load((CONF_DIR / "model" / f"{sized_model(model_size, name)}.yaml").read_text())
    options = dict(paradigm.get("options") or {})
    if isinstance(model.get("model"), dict):  # a global package: model + paradigm options
        options.update(((model.get("paradigm") or {}).get("options")) or {})
        model = model["model"]
    options.pop("ar_run", None)  # DELTA: speed does not depend on which AR weights it starts from
    return name, model, options


def resolved_options(options: dict[str, Any], model_size: str) -> dict[str, Any]:
    """``options`` with CoD's ``codebooks: all`` as the number of codebooks of the size's codec
    (training reads it from the tokens; here there are none)."""
    if options.get("codebooks") == "all":
        return {**options, "codebooks": STACK_CODEBOOKS.get(model_size, COD_STACK_CODEBOOKS)}
    return options


# the vocabularies: the mini profile's (BPE 1000, offline codebook 512, offline_rvq 256), at paper
# scale the libritts profile's (BPE 2000, S3Tokenizer v2's 6561 codes, DAC's 1024 for CoD): the
# heads and the sampling over them cost what they cost in those runs (requests draw ids below
# the mini sizes, valid in both)
VOCABS = {"paper": (2000, 6561, 1024)}
# codebooks of the acoustic stack CoD generates (option codebooks: all): offline_rvq's 8, DAC's 9 at paper scale
COD_STACK_CODEBOOKS = 8
STACK_CODEBOOKS = {"paper": 9}


def vocab_for(model_size: str, paradigm: str) -> Vocab:
    text, speech, stack = VOCABS.get(model_size, (TEXT_VOCAB, SPEECH_VOCAB, COD_SPEECH_VOCAB))
    return Vocab(text_size=text, speech_size=stack if paradigm == "cod" else speech)


@dataclass
class Setup:
    """One paradigm ready to decode: its model (whose vocabulary holds its codebook), the frame rate
    of its tokens, and the decoding options it gets (its defaults unless overridden)."""

    name: str
    model: Paradigm
    frame_rate: float
    decoding: dict[str, Any]
    autocast: torch.dtype | None = None  # generate under torch.autocast to this dtype (weights stay float32)


PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}  # --precision: bf16 = autocast, as training on CUDA


def build_setups(config_names: list[str], model_size: str, device: torch.device,
                 decoding: dict[str, dict[str, Any]], precision: str = "fp32") -> dict[str, Setup]:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
    setups: dict[str, Setup] = {}
    for config_name in config_names:
        name, model_cfg, options = load_config(config_name, model_size)
        if name in setups:
            raise ValueError(f"two configs of paradigm {name!r}: benchmark one of them")
        cod = name == "cod"
        vocab = vocab_for(model_size, name)
        with torch.random.fork_rng(devices=[]):  # random weights, the same on every run
            torch.manual_seed(0)
            model = build_paradigm(name, vocab, model_cfg, **resolved_options(options, model_size))
        model = model.to(device).eval()
        setups[name] = Setup(name, model, COD_FRAME_RATE if cod else FRAME_RATE, dict(decoding.get(name, {})),
                             PRECISIONS[precision])
    unknown = set(decoding) - set(setups)
    if unknown:
        raise ValueError(f"--decoding for paradigms not benchmarked: {sorted(unknown)}")
    return setups


# ----------------------------------------------------------------------------- requests

def text_tokens(frames_25hz: int) -> int:
    return max(1, round(frames_25hz / FRAMES_PER_BPE))


def random_ends(n_frames: int, n_text: int, generator: torch.Generator) -> torch.Tensor:
    """Oracle a_n: ``n_frames`` split at ``n_text - 1`` distinct random points (each token >= 1 frame)."""
    if not 1 <= n_text <= n_frames:
        raise ValueError(f"cannot give {n_text} text tokens at least one of {n_frames} frames each")
    cuts = (torch.randperm(n_frames - 1, generator=generator)[:n_text - 1] + 1).sort().values
    return torch.cat([cuts, torch.tensor([n_frames])])


def make_requests(seconds: float, setups: dict[str, Setup], seed: int) -> dict[str, SynthesisRequest]:
    """One request per paradigm for ``seconds`` of speech, all speaking the same text after the
    same prompt (the 25 Hz paradigms get the very same request; CoD its 50 Hz version)."""
    g = torch.Generator().manual_seed(seed)
    frames = round(seconds * FRAME_RATE)
    prompt_frames = round(PROMPT_SECONDS * FRAME_RATE)
    text = torch.randint(TEXT_VOCAB, (text_tokens(frames),), generator=g)
    prompt_text = torch.randint(TEXT_VOCAB, (text_tokens(prompt_frames),), generator=g)
    ends = random_ends(frames, len(text), g)
    prompt = torch.randint(SPEECH_VOCAB, (prompt_frames,), generator=g)
    scale = round(COD_FRAME_RATE / FRAME_RATE)
    cod_prompt = torch.randint(COD_SPEECH_VOCAB, (scale * prompt_frames,), generator=g)
    phonemes = torch.randint(PHONEME_IDS, (round(len(text) * PHONEMES_PER_BPE),), generator=g)
    prompt_phonemes = torch.randint(PHONEME_IDS, (round(len(prompt_text) * PHONEMES_PER_BPE),), generator=g)
    requests = {}
    for name, setup in setups.items():
        if name == "cod":
            # what CoD.prepare_request would add, without the phonemizer and the speaker encoder
            features = {"phonemes": phonemes, "prompt_phonemes": prompt_phonemes,
                        "speaker": torch.randn(setup.model.speaker_dim, generator=g)}
            stack = int(getattr(setup.model, "codebooks", 1))
            acoustic = torch.randint(setup.model.vocab.speech_size, (stack - 1, len(cod_prompt)), generator=g) \
                if stack > 1 else None
            requests[name] = SynthesisRequest(text, prompt_text, cod_prompt, target_frames=scale * frames,
                                              features=features, prompt_acoustic=acoustic)
        else:
            # SyncSpeech's length follows from the oracle durations; the others read target_frames
            requests[name] = SynthesisRequest(text, prompt_text, prompt, target_frames=frames, text_ends=ends)
    return requests


# ----------------------------------------------------------------------------- timing

def synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


class ForwardTimer:
    """Sums the wall time spent inside a paradigm's network calls (:data:`NETWORK_CALLS`) while
    attached: forward pre/post hooks on modules, a wrapper on methods. Calls nested inside an
    outer timed call count once (the outer one), so listing a module and its parent is safe.
    With CUDA every boundary synchronises, so the time is that of the kernels, not of launching
    them."""

    def __init__(self, sync: Callable[[], None], on_enter: Callable[[], None] | None = None,
                 on_exit: Callable[[], None] | None = None):
        self.sync = sync
        # called as the outermost timed call starts / after it ends (the breakdown pauses its
        # profiler there, so that it sees only the loop's own work)
        self.on_enter, self.on_exit = on_enter, on_exit
        self.seconds = 0.0
        self._depth = 0
        self._started = 0.0
        self._undo: list[Callable[[], None]] = []

    @property
    def inside(self) -> bool:
        """True while a timed call is running."""
        return self._depth > 0

    def _enter(self) -> None:
        if self._depth == 0:
            if self.on_enter is not None:
                self.on_enter()
            self.sync()
            self._started = time.perf_counter()
        self._depth += 1

    def _exit(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.sync()
            self.seconds += time.perf_counter() - self._started
            if self.on_exit is not None:
                self.on_exit()

    def attach(self, model: torch.nn.Module, paths: tuple[str, ...]) -> ForwardTimer:
        for path in paths:
            *parents, attribute = path.split(".")
            owner = model
            for part in parents:
                owner = getattr(owner, part)
            target = getattr(owner, attribute)
            if isinstance(target, torch.nn.Module):
                pre = target.register_forward_pre_hook(lambda module, args: self._enter())
                post = target.register_forward_hook(lambda module, args, out: self._exit(), always_call=True)
                self._undo += [pre.remove, post.remove]
            elif callable(target):
                self._undo.append(self._wrap(owner, attribute, target))
            else:
                raise TypeError(f"{path} is neither a module nor a method")
        return self

    def _wrap(self, owner: Any, attribute: str, method: Callable) -> Callable[[], None]:
        def timed(*args, **kwargs):
            self._enter()
            try:
                return method(*args, **kwargs)
            finally:
                self._exit()

        setattr(owner, attribute, timed)  # an instance attribute shadows the class's method
        return lambda: delattr(owner, attribute)

    def detach(self) -> None:
        while self._undo:
            self._undo.pop()()


def autocast(setup: Setup) -> contextlib.AbstractContextManager:
    """``torch.autocast`` to ``setup.autocast`` on the model's device, or nothing (float32)."""
    if setup.autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(next(setup.model.parameters()).device.type, dtype=setup.autocast)


def decode_once(setup: Setup, request: SynthesisRequest, seed: int, sync: Callable[[], None],
                profile: bool) -> dict[str, Any]:
    """One ``generate`` call, timed; with ``profile`` also the time inside the network calls."""
    timer = ForwardTimer(sync).attach(setup.model, NETWORK_CALLS[setup.name]) if profile else None
    generator = torch.Generator().manual_seed(seed)
    try:
        sync()
        started = time.perf_counter()
        with autocast(setup):
            generation = setup.model.generate(request, generator, **setup.decoding)
        sync()
        seconds = time.perf_counter() - started
    finally:
        if timer is not None:
            timer.detach()
    frames = int(generation.speech.shape[-1])  # [T], or [K, T] for a paradigm generating K codebooks (CoD)
    if frames != request.target_frames:
        raise RuntimeError(f"{setup.name} generated {frames} frames, asked for {request.target_frames}")
    record = {"passes": int(generation.forward_passes), "seconds": seconds,
              "fpl_seconds": float(generation.info.get("first_packet_seconds", seconds)),
              "streams": "first_packet_seconds" in generation.info, "frames": frames}
    if timer is not None:
        record["forward_seconds"] = timer.seconds
    return record


def overhead_breakdown(setup: Setup, request: SynthesisRequest, seed: int, sync: Callable[[], None],
                       top: int = 6) -> dict[str, Any]:
    """Where a ``generate`` call's time outside the network goes: cProfile runs during the call and
    is paused inside every network call (:data:`NETWORK_CALLS`), so its self times are the loop's
    own work (sampling, masks, bookkeeping). Returns the profiled overhead seconds and the ``top``
    functions by self time with their share of it (cProfile's own cost inflates Python-level
    entries, so read the shares, not the seconds, against the uninstrumented figures)."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    timer = ForwardTimer(sync, on_enter=profiler.disable, on_exit=profiler.enable).attach(
        setup.model, NETWORK_CALLS[setup.name])
    generator = torch.Generator().manual_seed(seed)
    try:
        profiler.enable()
        with autocast(setup):
            setup.model.generate(request, generator, **setup.decoding)
        profiler.disable()
    finally:
        timer.detach()
    stats = pstats.Stats(profiler).stats  # (file, line, name) -> (calls, _, self time, cumulative, callers)
    rows = [(label_function(key), value[2], value[0]) for key, value in stats.items()]
    rows = [r for r in rows if r[0] != "cProfile.Profile.disable"]  # the pause itself
    total = sum(seconds for _, seconds, _ in rows)
    rows.sort(key=lambda r: -r[1])
    return {"overhead_seconds": total, "top": [{"function": name, "seconds": seconds, "calls": calls,
                                                "share": seconds / total if total else 0.0}
                                               for name, seconds, calls in rows[:top]]}


def label_function(key: tuple[str, int, str]) -> str:
    """``sampling.py:sample_token`` for Python functions, the builtin's own name otherwise."""
    path, _, name = key
    if path == "~":  # a builtin: cProfile's name is "<built-in method torch.tensor>" or "<method 'x' of 'y'>"
        return name.strip("<>").replace("built-in method ", "").replace("method ", "")
    return f"{Path(path).name}:{name}"


def breakdown_section(breakdowns: dict[str, dict[str, Any]], seconds: float) -> str:
    """Markdown: per paradigm, the functions that take the loop overhead, with their shares."""
    lines = [f"### Where the loop overhead goes ({seconds:g} s, cProfile paused inside the network calls)", "",
             "| paradigm | profiled overhead s | functions by self time (share of the overhead) |", "|---|---:|---|"]
    for name, b in breakdowns.items():
        cells = "; ".join(f"`{t['function']}` {t['share']:.0%} ({t['calls']} calls)" for t in b["top"])
        lines.append(f"| `{name}` | {b['overhead_seconds']:.3f} | {cells} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- the benchmark

def benchmark(model_size: str = "small", seconds: list[float] | tuple[float, ...] = (3, 6, 10, 20), repeats: int = 3,
              paradigms: list[str] | None = None, device: str = "cpu",
              decoding: dict[str, dict[str, Any]] | None = None, seed: int = 0,
              log: Callable[[str], None] = lambda line: None, precision: str = "fp32",
              setups: dict[str, Setup] | None = None) -> dict[str, Any]:
    """Run the benchmark; returns ``{"config", "environment", "results", "runs"}``: ``results``
    one summary row per paradigm and length (medians, ratios to AR), ``runs`` every measurement.
    ``setups``: models already built by :func:`build_setups` from these arguments (else built here)."""
    device_ = torch.device(device)
    sync = synchronizer(device_)
    if setups is None:
        setups = build_setups(list(paradigms or DEFAULT_PARADIGMS), model_size, device_, decoding or {}, precision)
    names = list(setups)
    lengths = sorted(float(s) for s in seconds)
    requests = {s: make_requests(s, setups, seed=seed + int(round(s * 1000))) for s in lengths}
    for name in names:  # warm-up: allocator, first-call costs, lazy imports
        decode_once(setups[name], requests[lengths[0]][name], seed, sync, profile=False)

    runs = []
    for repeat in range(repeats):
        order = names[repeat % len(names):] + names[:repeat % len(names)]
        for s in lengths:
            for name in order:
                run_seed = seed + 7919 * (repeat + 1)
                plain = decode_once(setups[name], requests[s][name], run_seed, sync, profile=False)
                profiled = decode_once(setups[name], requests[s][name], run_seed, sync, profile=True)
                runs.append({"repeat": repeat, "audio_seconds": s, "paradigm": name, **plain,
                             "profiled_seconds": profiled["seconds"], "forward_seconds": profiled["forward_seconds"]})
                log(f"repeat {repeat + 1}/{repeats} {s:g} s {name}: {plain['passes']} passes {plain['seconds']:.3f} s")

    results = summarise(runs, setups, lengths)
    config = {"model": model_size, "seconds": lengths, "repeats": repeats, "device": device, "paradigms": names,
              "precision": precision,
              "paradigm_configs": list(paradigms or DEFAULT_PARADIGMS), "seed": seed,
              "decoding": {name: setup.decoding for name, setup in setups.items()},
              "frame_rates": {name: setup.frame_rate for name, setup in setups.items()},
              "frames_per_bpe_25hz": FRAMES_PER_BPE, "prompt_seconds": PROMPT_SECONDS,
              "parameters": {name: sum(p.numel() for p in setup.model.parameters()) for name, setup in setups.items()},
              "model_files": {name: sized_model(model_size, name) for name in names},
              "vocab": {name: [setup.model.vocab.text_size, setup.model.vocab.speech_size] for name, setup in setups.items()},
              "model_config": yaml.safe_load((CONF_DIR / "model" / f"{model_size}.yaml").read_text())}
    return {"config": config, "environment": environment(device_), "results": results, "runs": runs}


def summarise(runs: list[dict[str, Any]], setups: dict[str, Setup], lengths: list[float]) -> list[dict[str, Any]]:
    rows = []
    for s in lengths:
        by_name = {}
        for name, setup in setups.items():
            mine = [r for r in runs if r["paradigm"] == name and r["audio_seconds"] == s]
            passes = sorted({r["passes"] for r in mine})
            seconds = statistics.median(r["seconds"] for r in mine)
            forward = statistics.median(r["forward_seconds"] for r in mine)
            overheads = [1.0 - r["forward_seconds"] / r["profiled_seconds"] for r in mine]
            overhead_seconds = [r["profiled_seconds"] - r["forward_seconds"] for r in mine]
            row = {
                "paradigm": name, "audio_seconds": s, "frame_rate": setup.frame_rate, "frames": mine[0]["frames"],
                "text_tokens": text_tokens(round(s * FRAME_RATE)),
                "passes": passes[0] if len(passes) == 1 else statistics.median(r["passes"] for r in mine),
                "passes_vary": len(passes) > 1,
                "token_seconds": seconds, "rtf": seconds / s,
                "fpl_seconds": statistics.median(r["fpl_seconds"] for r in mine), "streams": mine[0]["streams"],
                "forward_seconds": forward, "overhead": statistics.median(overheads),
                "overhead_ms_per_pass": 1000 * statistics.median(overhead_seconds) / max(passes[0], 1),
                "forward_ms_per_pass": 1000 * forward / max(passes[0], 1),
                "repeats": len(mine),
            }
            by_name[name] = row
            rows.append(row)
        ar = by_name.get("ar")
        for row in by_name.values():
            for key in ("passes", "token_seconds", "fpl_seconds"):
                row[f"{key}_vs_ar"] = row[key] / ar[key] if ar else None
    return rows


def environment(device: torch.device) -> dict[str, Any]:
    env = {"torch": torch.__version__, "python": platform.python_version(), "threads": torch.get_num_threads(),
           "processor": platform.processor() or platform.machine()}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


# ----------------------------------------------------------------------------- output

COLUMNS = [  # (header, key, format)
    ("paradigm", "paradigm", "{}"), ("audio s", "audio_seconds", "{:g}"), ("frames", "frames", "{}"),
    ("passes", "passes", "{}"), ("token s", "token_seconds", "{:.3f}"), ("RTF", "rtf", "{:.3f}"),
    ("FPL-A s", "fpl_seconds", "{:.3f}"), ("loop overhead", "overhead", "{:.0%}"),
    ("overhead ms/pass", "overhead_ms_per_pass", "{:.2f}"),
    ("passes / AR", "passes_vs_ar", "{:.3f}"), ("time / AR", "token_seconds_vs_ar", "{:.2f}"),
    ("FPL-A / AR", "fpl_seconds_vs_ar", "{:.2f}"),
]


def cells(row: dict[str, Any]) -> list[str]:
    out = []
    for _, key, fmt in COLUMNS:
        value = row[key]
        text = "n/a" if value is None else fmt.format(value)
        if key == "fpl_seconds" and row["streams"]:
            text += "*"
        out.append(text)
    return out


def where_run(result: dict[str, Any]) -> str:
    env = result["environment"]
    return env.get("gpu", f"CPU ({env['threads']} thread{'s' if env['threads'] != 1 else ''})")


def describe_run(result: dict[str, Any]) -> str:
    c, env = result["config"], result["environment"]
    m = c["model_config"]
    where = where_run(result)
    precision = {"bf16": "bf16 autocast", "fp32": "float32"}[c.get("precision", "fp32")]
    own = [f"{name}: {file}" for name, file in c.get("model_files", {}).items() if file != c["model"]]
    sizes = f"; {', '.join(own)}" if own else ""
    return (f"model={c['model']} (dim {m['dim']}, {m['n_layers']} layers{sizes}; random weights), {where}, {precision}, batch 1, "
            f"median of {c['repeats']} interleaved repeats; 25 Hz tokens (CoD: 50 Hz first-quantizer stack, "
            f"twice the frames), {c['prompt_seconds']:g} s prompt, length given; torch {env['torch']}")


def text_table(result: dict[str, Any]) -> str:
    rows = [[h for h, _, _ in COLUMNS]] + [cells(r) for r in result["results"]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]
    footnote = "* first packet of a streaming paradigm (else the whole token stage)"
    return "\n".join([describe_run(result), *lines, footnote])


def markdown_section(result: dict[str, Any], command: str) -> str:
    header = [h for h, _, _ in COLUMNS]
    lines = [
        f"## Decoding speed: model {result['config']['model']}, {where_run(result)} (bench/decode_speed.py)", "",
        describe_run(result) + ".", "",
        f"`{command}`", "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|",
        *("| " + " | ".join(cells(r)) + " |" for r in result["results"]),
        "",
        "RTF: token-stage seconds per audio second. FPL-A: seconds until the first packet's tokens exist "
        "(\\* streaming: AR and SyncSpeech's first chunk; otherwise the whole token stage). Loop overhead: "
        "share of `generate` spent outside the network's forward passes (instrumented run). "
        "Ratios: to AR at the same length, same run.",
    ]
    return "\n".join(lines)


def replace_section(path: Path, name: str, body: str) -> None:
    """Put ``body`` between ``<!-- name -->`` and ``<!-- /name -->`` in the Markdown file ``path``
    (replacing what was there, appending the section if the file has none), leaving the rest."""
    start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    block = f"{start}\n{body.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else ""
    if start in text and end in text and text.index(start) < text.index(end):
        before, rest = text.split(start, 1)
        after = rest.split(end, 1)[1]
        text = before + block + after
    else:
        text = (text.rstrip() + "\n\n" if text.strip() else "") + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def plot_scaling(result: dict[str, Any], path: Path) -> None:
    """Forward passes and token-stage seconds against utterance length, one line per paradigm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (passes_ax, seconds_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in result["config"]["paradigms"]:
        rows = [r for r in result["results"] if r["paradigm"] == name]
        x = [r["audio_seconds"] for r in rows]
        passes_ax.plot(x, [r["passes"] for r in rows], marker="o", label=name)
        seconds_ax.plot(x, [r["token_seconds"] for r in rows], marker="o", label=name)
    passes_ax.set(xlabel="utterance length (s)", ylabel="sequential forward passes", yscale="log",
                  title="Forward passes")
    seconds_ax.set(xlabel="utterance length (s)", ylabel="token-stage wall time (s)", yscale="log",
                   title="Token-stage time")
    plain = matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}")
    for ax in (passes_ax, seconds_ax):
        ax.set_xticks(result["config"]["seconds"])
        ax.yaxis.set_major_formatter(plain)
        ax.grid(True, which="both", alpha=0.3)
    passes_ax.yaxis.set_minor_formatter(plain)  # the time axis spans more decades: majors only
    passes_ax.tick_params(axis="y", which="minor", labelsize=7)
    passes_ax.legend(fontsize=8)
    fig.suptitle(describe_run(result).split(";")[0], fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_decoding(items: list[str]) -> dict[str, dict[str, Any]]:
    """``["palle.steps=50", "nar.steps=8"]`` -> ``{"palle": {"steps": 50}, "nar": {"steps": 8}}``
    (values read as YAML: numbers, booleans, null)."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        name, dot, option = key.partition(".")
        if not (sep and dot and name and option):
            raise ValueError(f"--decoding wants PARADIGM.OPTION=VALUE, got {item!r}")
        out.setdefault(name, {})[option] = yaml.safe_load(value)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small", help="conf/model/<name>.yaml: tiny, small, paper")
    parser.add_argument("--paradigms", nargs="+", default=DEFAULT_PARADIGMS, help="conf/paradigm/<name>.yaml")
    parser.add_argument("--seconds", nargs="+", type=float, default=[3, 6, 10, 20], help="utterance lengths")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32",
                        help="bf16: generate under torch.autocast(bfloat16), float32 weights (as training on CUDA)")
    parser.add_argument("--decoding", nargs="*", default=[], metavar="PARADIGM.OPTION=VALUE",
                        help="decoding option overrides, e.g. palle.steps=50 (default: each paradigm's DECODING)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/bench/decode_speed.json")
    parser.add_argument("--markdown", default="results/bench.md", help="'' to skip")
    parser.add_argument("--section", default="decode_speed",
                        help="marker name of the Markdown section (<!-- NAME --> ... <!-- /NAME -->)")
    parser.add_argument("--plot", default="results/bench/decode_scaling.png", help="'' to skip")
    parser.add_argument("--breakdown", action="store_true",
                        help="also profile where each paradigm's loop overhead goes (longest length)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    log = (lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    result = benchmark(args.model, args.seconds, args.repeats, args.paradigms, args.device,
                       parse_decoding(args.decoding), args.seed, log, args.precision)
    result["config"]["threads"] = args.threads
    print(text_table(result))
    for row in result["results"]:
        if row["passes_vary"]:
            print(f"note: {row['paradigm']} at {row['audio_seconds']:g} s ran different numbers of passes "
                  "across repeats (median reported)")
    command = "python bench/decode_speed.py " + " ".join(argv if argv is not None else sys.argv[1:])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    section = markdown_section(result, command.strip())
    if args.breakdown:
        longest = max(args.seconds)
        setups = build_setups(list(args.paradigms), args.model, torch.device(args.device),
                              parse_decoding(args.decoding), args.precision)
        requests = make_requests(longest, setups, seed=args.seed + int(round(longest * 1000)))
        sync = synchronizer(torch.device(args.device))
        breakdowns = {name: overhead_breakdown(setup, requests[name], args.seed, sync) for name, setup in setups.items()}
        result["breakdown"] = {"audio_seconds": longest, "paradigms": breakdowns}
        out.write_text(json.dumps(result, indent=2) + "\n")
        table = breakdown_section(breakdowns, longest)
        print(table)
        section = section.rstrip("\n") + "\n\n" + table
    if args.markdown:
        replace_section(Path(args.markdown), args.section, section)
    if args.plot:
        plot_scaling(result, Path(args.plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
