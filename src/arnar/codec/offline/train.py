"""Training of the offline codec, one function per stage: the features (log-mel, speaker statistics,
encoder inputs, frame labels, the held-out split), the phone encoder (frame-level phone
cross-entropy on random crops), the semantic tokens (k-means on the encoder's bottleneck), the
token decoder (L1 on the normalised mel, prompted with another utterance of the speaker), the RVQ
stack (residual k-means on the globally normalised mel) and the held-out report;
:func:`train_offline_codec` runs them in that order under one seeded, deterministic torch state
and writes the model folder. The shared helpers (crops, learning-rate schedule, the AdamW loop,
input augmentations) are here too."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from arnar import atomic
from arnar.codec.base import CodecError
from arnar.codec.offline.config import BUILD_LOG, CONFIG, DEFAULTS, FORMAT, REPORT, RETIRED_OPTIONS, WEIGHTS
from arnar.codec.offline.data import SILENCE, _frame_labels, _phone_key, _read_alignments, _read_cuts
from arnar.codec.offline.features import (
    HOP,
    N_MELS,
    RVQ_STACK,
    SAMPLE_RATE,
    SEMANTIC_STACK,
    _speaker_stats,
    _torch,
    _utterance_norm,
    log_mel,
    mel_analysis,
)
from arnar.codec.offline.kmeans import _assign, _assign2, _kmeans
from arnar.codec.offline.nets import _frontend, _make_decoder, _make_encoder

log = logging.getLogger("arnar.codec")


# --------------------------------------------------------------------------- training helpers


def _augment(x, rng: np.random.Generator, warp: float, masks: int):
    """Encoder input augmentation on stacked normalised mel ``[B, T, 4 * 80]``: a random warp of
    the mel axis (factor ``exp(U(-warp, warp))``, a crude vocal-tract-length / pitch change that
    CMVN cannot undo) and up to ``masks`` time and band masks of up to 8 frames / bins (set to the
    mean, 0), as SpecAugment."""
    torch = _torch()
    if warp <= 0 and masks <= 0:
        return x
    b, t, d = x.shape
    mel = x.reshape(b, t * SEMANTIC_STACK, N_MELS).clone()
    bins = torch.arange(N_MELS, dtype=torch.float32)
    for i in range(b):
        if warp > 0:
            factor = float(np.exp(rng.uniform(-warp, warp)))
            src = torch.clamp(bins * factor, 0, N_MELS - 1)
            lo = src.floor().long()
            hi = torch.clamp(lo + 1, max=N_MELS - 1)
            frac = src - lo
            mel[i] = mel[i][:, lo] * (1 - frac) + mel[i][:, hi] * frac
        for _ in range(int(rng.integers(0, masks + 1))):
            width = int(rng.integers(1, 9))
            start = int(rng.integers(0, max(1, mel.shape[1] - width)))
            mel[i, start:start + width] = 0.0
        for _ in range(int(rng.integers(0, masks + 1))):
            width = int(rng.integers(1, 9))
            start = int(rng.integers(0, N_MELS - width))
            mel[i, :, start:start + width] = 0.0
    return mel.reshape(b, t, d)


def _warp_mel(mel: np.ndarray, factor: float) -> np.ndarray:
    """A log-mel ``[T, 80]`` with its mel axis stretched by ``factor`` (linear interpolation,
    clamped at the top band): a crude vocal-tract-length change, which makes a new voice."""
    src = np.clip(np.arange(N_MELS, dtype=np.float32) * factor, 0, N_MELS - 1)
    lo = np.floor(src).astype(np.int64)
    hi = np.minimum(lo + 1, N_MELS - 1)
    frac = (src - lo).astype(np.float32)
    return (mel[:, lo] * (1 - frac) + mel[:, hi] * frac).astype(np.float32)


@contextmanager
def _deterministic(threads: int | None):
    torch = _torch()
    previous_threads = torch.get_num_threads()
    previous_det = torch.are_deterministic_algorithms_enabled()
    if threads:
        torch.set_num_threads(int(threads))
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous_det)
        torch.set_num_threads(previous_threads)


def _schedule(step: int, total: int, lr: float) -> float:
    warm = max(1, total // 20)
    if step < warm:
        return lr * (step + 1) / warm
    return lr * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))


def _steps(total_frames: int, epochs: float, batch: int, crop: int) -> int:
    if epochs <= 0:
        return 0
    return max(1, math.ceil(epochs * total_frames / (batch * crop)))


def _crops(rng: np.random.Generator, lengths: list[int], batch: int, crop: int):
    """One batch of (item, start, length): items drawn uniformly, a common crop length."""
    items = rng.integers(0, len(lengths), size=batch)
    size = int(min(crop, min(lengths[i] for i in items)))
    starts = [int(rng.integers(0, lengths[i] - size + 1)) for i in items]
    return [int(i) for i in items], starts, size


def _train_loop(model, steps: int, cfg: dict, batch_fn, loss_fn, desc: str, progress: bool, seed: int):
    """AdamW with warm-up and cosine decay; returns the loss curve (mean per ~5% of steps)."""
    torch = _torch()
    from tqdm import tqdm

    rng = np.random.default_rng(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    curve, window = [], []
    every = max(1, steps // 20)
    model.train()
    with tqdm(range(steps), desc=desc, unit="step", disable=not progress) as bar:
        for step in bar:
            for group in opt.param_groups:
                group["lr"] = _schedule(step, steps, cfg["lr"])
            loss = loss_fn(model, *batch_fn(rng))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            window.append(loss.item())
            if len(window) == every or step == steps - 1:
                curve.append(round(float(np.mean(window)), 5))
                bar.set_postfix_str(f"loss {curve[-1]:.4f}")
                window = []
    model.eval()
    return curve


# --------------------------------------------------------------------------- training


def train_offline_codec(
    train_cuts: str | os.PathLike,
    alignments: str | os.PathLike | None,
    out_dir: str | os.PathLike,
    *,
    seed: int = 1234,
    root: str | os.PathLike | None = None,
    progress: bool = True,
    threads: int | None = 2,
    tokens_out: str | os.PathLike | None = None,
    tokens_split: str = "train",
    **sizes: Any,
) -> dict:
    """Train the offline codec on ``train_cuts`` (lhotse cuts JSONL; relative audio paths are
    resolved against ``root``, default the current directory) and write ``out_dir/config.json``,
    ``weights.pt`` and ``report.json``. ``alignments``: the aligner's phone JSONL
    (``{"utt_id", "phones": [[p, start, end], ...]}``; utterances missing from it are used for
    every stage but the phone encoder) or None to use the phone timings in the cuts'
    supervisions. ``sizes`` override :data:`DEFAULTS` (network widths, ``n_tokens``,
    ``rvq_codebooks``, ``rvq_size``, epochs per stage, ``batch_size``, ``crop_seconds``, ...).
    Returns the training report (losses, held-out phone accuracy, token purity, timings).
    ``tokens_out``: also write the semantic tokens of every utterance of ``train_cuts`` as the
    token set ``tokens_out/tokens_split/`` (:func:`write_train_tokens`), the same set
    ``arnar tokenize --codec offline`` makes of those cuts, without running the front end again.

    The stages run in this order, in one seeded torch random state (the networks' initial
    weights are drawn from it as each stage builds them), each stage's numpy generators seeded
    from ``seed``: :func:`_prepare` (features, labels, held-out split), :func:`_train_encoder`,
    :func:`_fit_tokens`, :func:`_train_decoder`, :func:`_fit_rvq`, :func:`_evaluate_held_out`."""
    torch = _torch()
    dropped = sorted(set(sizes) & RETIRED_OPTIONS)
    if dropped:
        log.warning("offline codec: ignoring retired option(s) %s (the refinement network was removed)", dropped)
        sizes = {k: v for k, v in sizes.items() if k not in RETIRED_OPTIONS}
    unknown = set(sizes) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"unknown option(s) {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    cfg = {**DEFAULTS, **sizes}
    if cfg["enc_frontend"] not in ("moonshine", "mel"):
        raise ValueError(f"enc_frontend must be moonshine or mel, got {cfg['enc_frontend']!r}")
    analysis = mel_analysis(cfg["mel_analysis"])  # an unknown name fails here, before any work
    if cfg["token_layer"] not in ("bottleneck", "hidden", "posteriors"):
        raise ValueError(f"token_layer must be bottleneck, hidden or posteriors, got {cfg['token_layer']!r}")
    out_dir = Path(out_dir)
    root = Path(root) if root is not None else Path.cwd()
    t_start = time.perf_counter()
    timings: dict[str, float] = {}

    def lap(name: str, since: float) -> float:
        now = time.perf_counter()
        timings[name] = round(now - since, 2)
        return now

    with _deterministic(threads), torch.random.fork_rng():
        torch.manual_seed(seed)
        data = _prepare(train_cuts, alignments, root, cfg, seed=seed, threads=threads, progress=progress)
        t = lap("features", t_start)
        encoder, enc_steps, enc_curve = _train_encoder(data, cfg, seed=seed, progress=progress)
        t = lap("encoder", t)
        centroids = _fit_tokens(data, encoder, cfg, seed=seed)
        t = lap("kmeans", t)
        decoder, all_stats, dec_steps, dec_curve = _train_decoder(data, cfg, seed=seed, progress=progress)
        t = lap("decoder", t)
        rvq = _fit_rvq(data, cfg, seed=seed)
        t = lap("rvq", t)
        held_out = _evaluate_held_out(data, cfg, encoder, decoder, rvq)

        state = {}
        state.update({f"encoder.{k}": v for k, v in encoder.state_dict().items()})
        state["semantic_centroids"] = centroids
        state.update({f"decoder.{k}": v for k, v in decoder.state_dict().items()})
        state["default_speaker"] = all_stats.mean(0)
        state["rvq.codebooks"] = rvq.codebooks
        state["rvq.mean"] = rvq.mean
        state["rvq.std"] = rvq.std
        state = {k: v.detach().clone().contiguous() for k, v in state.items()}

    config = {
        "format": FORMAT,
        "sample_rate": SAMPLE_RATE,
        "n_fft": analysis.n_fft, "win_length": analysis.win, "hop_length": HOP, "n_mels": N_MELS,
        "semantic_frame_rate": SAMPLE_RATE / (HOP * SEMANTIC_STACK),
        "rvq_frame_rate": SAMPLE_RATE / (HOP * RVQ_STACK),
        "seed": seed,
        "threads": threads,
        "alignments": "supervisions" if alignments is None else "file",
        **cfg,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    _save_state(state, out_dir / WEIGHTS)
    atomic.write_text(out_dir / CONFIG, json.dumps(config, indent=1, sort_keys=True) + "\n")
    if tokens_out is not None:
        t = time.perf_counter()
        write_train_tokens(data.utts, out_dir, tokens_out, tokens_split)
        timings["train_tokens"] = round(time.perf_counter() - t, 2)
    n_params = {name: sum(int(p.numel()) for p in m.parameters())
                for name, m in (("encoder", encoder), ("decoder", decoder))}
    timings["total"] = round(time.perf_counter() - t_start, 2)
    utts, train, labelled, held = data.utts, data.train, data.labelled, data.held
    report = {
        "utterances": {"train": len(train), "labelled": len(labelled), "held_out": len(held)},
        "audio_seconds": round(sum(u["audio"].size for u in utts) / SAMPLE_RATE, 1),
        "phones": len(cfg["phones"]),
        "parameters": n_params,
        "steps": {"encoder": enc_steps, "decoder": dec_steps},
        "loss_curves": {"encoder_ce": enc_curve, "decoder_l1": dec_curve},
        "held_out": held_out,
        "rvq_residual_mse": rvq.residual_mse,
        "threads": threads,
    }
    # report.json is compared across builds (DVC hashes the model folder): the timings go beside it
    atomic.write_text(out_dir / REPORT, json.dumps(report, indent=1, sort_keys=True) + "\n")
    atomic.write_text(out_dir / BUILD_LOG, json.dumps({"seconds": timings}, indent=1, sort_keys=True) + "\n")
    report["seconds"] = timings
    log.info("trained offline codec in %.1f s -> %s", timings["total"], out_dir)
    return report


def write_train_tokens(utts: list[dict], model_dir: str | os.PathLike, tokens_out: str | os.PathLike,
                       split: str) -> None:
    """The semantic token set of the codec's own training utterances, from the encoder inputs
    :func:`_prepare` computed. The front end (Moonshine's encoder) is most of what tokenizing
    costs, and training has run it on every one of these clips already: on the speak profile
    this saves 7 of the DAG's thread-minutes. The tokens come from the saved codec
    (:meth:`OfflineCodec.semantic_tokens`, the code path of :meth:`OfflineCodec.encode`) and
    the set names its hash, so it is the set ``arnar tokenize`` writes of the same cuts
    (tests/test_offline_codec.py compares the two byte for byte).

    The encoder runs on one thread, as in the tokenize rule's one-thread job, whatever the
    training's thread count: its latents on 2 threads differ by ~2e-6, and on the speak train
    split that flipped one near-tie frame of ~447k (``spk13_0133``, timed run of 2026-12-05).
    The front end's states are the same floats on 1 and 2 threads."""
    from arnar.codec.offline.codec import OfflineCodec
    from arnar.codec.shards import write_token_shards

    codec = OfflineCodec(model_dir, stream="semantic", threads=1)
    tokens = {u["id"]: codec.semantic_tokens(u["enc_in"]) for u in utts}
    write_token_shards(Path(tokens_out), split, tokens, codec)
    log.info("%s: %d utterances tokenized with offline (the codec's training features)", split, len(tokens))


@dataclass
class _Data:
    """What :func:`_prepare` gives the stages: every utterance (dicts with ``id``, ``speaker``,
    ``audio``, ``phones``, ``mel``, ``norm``, ``stats``, ``enc_in``, ``labels``; the token stage
    adds ``tokens`` and ``tokens2``), the training and held-out utterances, the labelled training
    utterances, and the batch shape (``batch`` crops of ``crop_tok`` 25 Hz frames)."""

    utts: list[dict]
    train: list[dict]
    held: list[dict]
    labelled: list[dict]
    batch: int
    crop_tok: int


def _prepare(train_cuts, alignments, root: Path, cfg: dict, *, seed: int, threads: int | None,
             progress: bool) -> _Data:
    """Features: read the cuts and alignments, compute each utterance's log-mel, normalised mel,
    speaker statistics and encoder inputs (filling in ``cfg["frontend_*"]``), the phone set
    (``cfg["phones"]``) and frame labels, and split off the held-out utterances."""
    from tqdm import tqdm

    torch = _torch()
    utts = _read_cuts(Path(train_cuts), root)
    if not utts:
        raise CodecError(f"{train_cuts}: no cuts")
    align = _read_alignments(Path(alignments)) if alignments is not None else None
    encoder_inputs = _frontend(cfg, threads)
    for u in tqdm(utts, desc="offline codec: features", unit="utt", disable=not progress):
        if align is not None:
            u["phones"] = align.get(u["id"])
        u["mel"] = log_mel(u["audio"], SEMANTIC_STACK, cfg["mel_analysis"])  # [4T, 80]
        u["norm"], _, _ = _utterance_norm(u["mel"])
        u["stats"] = _speaker_stats(u["mel"])
        u["enc_in"] = torch.from_numpy(encoder_inputs(u["audio"], u["mel"]))
    phones = sorted({_phone_key(s) for u in utts if u["phones"] for s, _, _ in u["phones"]} - {SILENCE})
    if not phones:
        raise CodecError("no phone alignments for any training utterance")
    cfg["phones"] = [SILENCE, *phones]
    index = {p: i for i, p in enumerate(cfg["phones"])}
    for u in utts:
        n_tok = u["mel"].shape[0] // SEMANTIC_STACK
        u["labels"] = (_frame_labels(u["phones"], n_tok, index, SAMPLE_RATE / (HOP * SEMANTIC_STACK))
                       if u["phones"] else None)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(utts))
    n_hold = int(round(cfg["holdout"] * len(utts))) if len(utts) >= 4 else 0
    if cfg["holdout"] > 0 and len(utts) >= 4:
        n_hold = max(1, n_hold)
    held = [utts[i] for i in sorted(order[:n_hold])]
    train = [utts[i] for i in sorted(order[n_hold:])]
    labelled = [u for u in train if u["labels"] is not None]
    if not labelled:
        raise CodecError("no training utterance has a phone alignment")
    crop_tok = max(1, int(round(cfg["crop_seconds"] * SAMPLE_RATE / (HOP * SEMANTIC_STACK))))
    batch = int(cfg["batch_size"])
    return _Data(utts=utts, train=train, held=held, labelled=labelled, batch=batch, crop_tok=crop_tok)


def _train_encoder(data: _Data, cfg: dict, *, seed: int, progress: bool):
    """1. Phone encoder: frame-level phone cross-entropy on random crops of the labelled training
    utterances. Returns (encoder, steps, loss curve)."""
    torch = _torch()
    labelled, batch, crop_tok = data.labelled, data.batch, data.crop_tok
    encoder = _make_encoder(cfg)

    enc_x = [u["enc_in"] for u in labelled]
    enc_y = [torch.from_numpy(u["labels"]) for u in labelled]
    enc_len = [x.shape[0] for x in enc_x]

    def enc_batch(r):
        items, starts, size = _crops(r, enc_len, batch, crop_tok)
        x = torch.stack([enc_x[i][s:s + size] for i, s in zip(items, starts)])
        y = torch.stack([enc_y[i][s:s + size] for i, s in zip(items, starts)])
        if cfg["enc_frontend"] == "mel":  # the warp and masks act on mel bands
            x = _augment(x, r, cfg["enc_warp"], cfg["enc_masks"])
        return x, y

    def enc_loss(model, x, y):
        logits = model(x)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                                 label_smoothing=cfg["label_smoothing"])

    enc_steps = min(_steps(sum(enc_len), cfg["enc_epochs"], batch, crop_tok), int(cfg["enc_max_steps"]))
    enc_curve = _train_loop(encoder, enc_steps, cfg, enc_batch, enc_loss, "offline codec: phone encoder",
                            progress, seed + 1)
    return encoder, enc_steps, enc_curve


def _fit_tokens(data: _Data, encoder, cfg: dict, *, seed: int):
    """2. Semantic tokens: k-means on the encoder's ``token_layer`` features of the training
    utterances; sets every utterance's ``tokens`` and ``tokens2`` (nearest and second-nearest
    centroid). Returns the centroids."""
    torch = _torch()
    utts, train = data.utts, data.train
    with torch.inference_mode():
        feats = {u["id"]: encoder.features(u["enc_in"][None], cfg["token_layer"])[0] for u in utts}
        train_feats = torch.cat([feats[u["id"]] for u in train])
    pick = np.random.default_rng(seed + 2).permutation(train_feats.shape[0])[: cfg["kmeans_points"]]
    centroids = _kmeans(train_feats[torch.from_numpy(np.sort(pick))].contiguous(), cfg["n_tokens"],
                        cfg["kmeans_iters"], seed + 2)
    for u in utts:
        u["tokens"], u["tokens2"] = _assign2(feats[u["id"]], centroids)
    return centroids


def _train_decoder(data: _Data, cfg: dict, *, seed: int, progress: bool):
    """3. Token decoder: L1 on the normalised mel from (noised) tokens and the statistics of another
    utterance of the same speaker. Returns (decoder, the training utterances' speaker statistics
    ``[N, 160]``, steps, loss curve)."""
    torch = _torch()
    train, batch, crop_tok = data.train, data.batch, data.crop_tok
    decoder = _make_decoder(cfg)
    all_stats = torch.from_numpy(np.stack([u["stats"] for u in train]))
    decoder.cond_mean.copy_(all_stats.mean(0))
    decoder.cond_std.copy_(all_stats.std(0).clamp_min(1e-3) if len(train) > 1 else torch.ones(2 * N_MELS))
    by_speaker: dict[str, list[int]] = {}
    for i, u in enumerate(train):
        by_speaker.setdefault(u["speaker"], []).append(i)
    dec_len = [len(u["tokens"]) for u in train]
    dec_y = [torch.from_numpy(u["norm"]) for u in train]

    def dec_batch(r):
        items, starts, size = _crops(r, dec_len, batch, crop_tok)
        prompts = []
        for i in items:  # the prompt: another utterance of the same speaker where there is one
            mates = [j for j in by_speaker[train[i]["speaker"]] if j != i] or [i]
            prompts.append(mates[int(r.integers(0, len(mates)))])
        tok = torch.stack([train[i]["tokens"][s:s + size] for i, s in zip(items, starts)])
        if cfg["dec_token_noise"] > 0:  # unseen speech lands in neighbouring clusters more often
            second = torch.stack([train[i]["tokens2"][s:s + size] for i, s in zip(items, starts)])
            flip = torch.from_numpy(r.random(tok.shape) < cfg["dec_token_noise"])
            tok = torch.where(flip, second, tok)
        if cfg["dec_warp"] > 0:  # the same warp on the target and its prompt: one new voice per item
            st, y = [], []
            for i, j, s in zip(items, prompts, starts):
                factor = float(np.exp(r.uniform(-cfg["dec_warp"], cfg["dec_warp"])))
                st.append(_speaker_stats(_warp_mel(train[j]["mel"], factor)))
                norm = _utterance_norm(_warp_mel(train[i]["mel"], factor))[0]
                y.append(torch.from_numpy(norm[SEMANTIC_STACK * s:SEMANTIC_STACK * (s + size)]))
            return tok, torch.from_numpy(np.stack(st)), torch.stack(y)
        st = torch.from_numpy(np.stack([train[j]["stats"] for j in prompts]))
        y = torch.stack([dec_y[i][SEMANTIC_STACK * s:SEMANTIC_STACK * (s + size)] for i, s in zip(items, starts)])
        return tok, st, y

    def dec_loss(model, tok, st, y):
        return (model(tok, st) - y).abs().mean()

    dec_steps = min(_steps(sum(dec_len), cfg["dec_epochs"], batch, crop_tok), int(cfg["dec_max_steps"]))
    dec_curve = _train_loop(decoder, dec_steps, cfg, dec_batch, dec_loss, "offline codec: token decoder",
                            progress, seed + 3)
    return decoder, all_stats, dec_steps, dec_curve


@dataclass
class _RVQ:
    """What :func:`_fit_rvq` gives: the codebooks ``[n_q, K, 160]``, the global per-band mean and
    deviation ``[80]``, every utterance's normalised 50 Hz frames ``[T50, 160]`` by id, and the
    residual mean squared error after each codebook."""

    codebooks: Any
    mean: Any
    std: Any
    vecs: dict
    residual_mse: list[float]


def _fit_rvq(data: _Data, cfg: dict, *, seed: int) -> _RVQ:
    """4. RVQ stack: residual k-means on globally normalised 50 Hz frames."""
    torch = _torch()
    utts, train = data.utts, data.train
    rvq_frames = {}
    for u in utts:
        m = log_mel(u["audio"], RVQ_STACK, cfg["mel_analysis"])
        rvq_frames[u["id"]] = torch.from_numpy(m)
    train_mel = torch.cat([rvq_frames[u["id"]] for u in train])
    g_mean = train_mel.mean(0)
    g_std = train_mel.std(0).clamp_min(1e-3)
    vecs = {k: ((v - g_mean) / g_std).reshape(-1, RVQ_STACK * N_MELS) for k, v in rvq_frames.items()}
    train_vecs = torch.cat([vecs[u["id"]] for u in train])
    pick = np.random.default_rng(seed + 4).permutation(train_vecs.shape[0])[: cfg["rvq_points"]]
    pick = torch.from_numpy(np.sort(pick))
    residual = train_vecs[pick].clone()
    codebooks = []
    rvq_err = []
    for q in range(cfg["rvq_codebooks"]):
        cb = _kmeans(residual.contiguous(), cfg["rvq_size"], cfg["rvq_iters"], seed + 100 + q)
        residual = residual - cb[_assign(residual, cb)]
        codebooks.append(cb)
        rvq_err.append(round(float((residual ** 2).mean()), 5))
    codebooks_t = torch.stack(codebooks)  # [n_q, K, 160]
    return _RVQ(codebooks=codebooks_t, mean=g_mean, std=g_std, vecs=vecs, residual_mse=rvq_err)


def _evaluate_held_out(data: _Data, cfg: dict, encoder, decoder, rvq: _RVQ) -> dict:
    """The held-out utterances: phone frame accuracy, token phone purity, decoder L1 and the RVQ
    stack's L1 by number of codebooks (the report's ``held_out``)."""
    torch = _torch()
    held = data.held
    codebooks_t, vecs = rvq.codebooks, rvq.vecs

    def dequantize(codes, n):
        """Sum of the first n codebooks' vectors as normalised mel frames [2 T50, 80]."""
        vec = torch.zeros((codes.shape[1], RVQ_STACK * N_MELS))
        for q in range(n):
            vec += codebooks_t[q][codes[q]]
        return vec.reshape(-1, N_MELS)

    with torch.inference_mode():
        hold_lab = [u for u in held if u["labels"] is not None]
        acc = purity = None
        if hold_lab:
            pred = torch.cat([encoder(u["enc_in"][None])[0].argmax(-1) for u in hold_lab])
            gold = torch.cat([torch.from_numpy(u["labels"]) for u in hold_lab])
            acc = round(float((pred == gold).float().mean()), 4)
            toks = torch.cat([u["tokens"] for u in hold_lab]).numpy()
            joint = np.zeros((cfg["n_tokens"], len(cfg["phones"])))
            np.add.at(joint, (toks, gold.numpy()), 1)
            purity = round(float(joint.max(1).sum() / joint.sum()), 4)
        dec_l1 = None
        rvq_l1: dict[str, float] = {}
        if held:
            dec_l1 = round(float(np.mean([
                float((decoder(u["tokens"][None], torch.from_numpy(u["stats"])[None])[0]
                       - torch.from_numpy(u["norm"])).abs().mean()) for u in held])), 4)
            n_q = int(cfg["rvq_codebooks"])
            for n in sorted({1, 2, max(1, n_q // 2), n_q}):
                errors = []
                for u in held:
                    vec = vecs[u["id"]]
                    res = vec.clone()
                    codes = []
                    for cb in codebooks_t[:n]:
                        idx = _assign(res, cb)
                        res -= cb[idx]
                        codes.append(idx)
                    errors.append(float((dequantize(torch.stack(codes), n) - vec.reshape(-1, N_MELS)).abs().mean()))
                rvq_l1[str(n)] = round(float(np.mean(errors)), 4)
    return {
        "phone_accuracy": acc,
        "token_phone_purity": purity,
        "decoder_l1": dec_l1,
        "rvq_l1_by_codebooks": rvq_l1,  # first n codebooks -> L1 on the normalised mel
    }


def _save_state(state: dict, path: Path) -> None:
    torch = _torch()
    with atomic.atomic_path(path) as tmp:
        torch.save(state, str(tmp))
