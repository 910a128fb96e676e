"""The offline codec's recipe options and its model folder: the options of
:func:`~arnar.codec.offline.train.train_offline_codec` (:data:`DEFAULTS`, and the retired ones it
still accepts), the format tag and the names of the files a trained model folder holds
(``config.json``, ``weights.pt``, ``report.json``, ``build_log.json``)."""

from __future__ import annotations

from typing import Any

FORMAT = "arnar-offline-codec/1"
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
    # the STFT of every mel (features.MEL_ANALYSES): stft25ms (a 25 ms window) | hifigan (HiFi-GAN's
    # 46.4 ms window and 1024-point FFT: the decoder then predicts the vocoder's own mel)
    "mel_analysis": "stft25ms",
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
