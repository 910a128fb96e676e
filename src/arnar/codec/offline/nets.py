"""Networks of the offline codec, built lazily so that importing the package does not import
torch: the phone encoder (an optional 100 Hz front end on single mel frames, residual convolution
blocks at 25 Hz, a bottleneck and a phone classifier), the token decoder (token embedding, FiLM-
conditioned residual blocks at 25 Hz and, after a transposed convolution, at 100 Hz), their
builders from a recipe configuration, and the encoder's input maker (Moonshine encoder states or
the per-utterance normalised log-mel)."""

from __future__ import annotations

from arnar.codec.base import CodecError
from arnar.codec.offline.features import HOP, N_MELS, SEMANTIC_STACK, _MEL_CACHE, _torch, _utterance_norm


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
