"""s3tokenizer and descript-audio-codec coexist in one environment (README developer notes).

Both packages' real model classes are built small with random weights (their pretrained
weights come from a hub, which these machines cannot reach) and run a forward pass.
"""

import warnings

import pytest
import torch


def test_torchaudio_runs_in_pure_python_mode():
    import torchaudio

    # The CUDA extension libraries were removed by scripts/setup.sh; the package must say so
    # instead of failing to import.
    assert torchaudio._extension._IS_TORCHAUDIO_EXT_AVAILABLE is False
    x = torch.randn(1, 1600)
    y = torchaudio.functional.resample(x, 16000, 8000)
    assert y.shape == (1, 800)


def test_dac_model_class_forward_and_round_trip():
    from dac.model.dac import DAC

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's weight_norm deprecation, inside DAC
        model = DAC(
            encoder_dim=16, encoder_rates=[2, 4, 5, 8], decoder_dim=64, decoder_rates=[8, 5, 4, 2],
            n_codebooks=4, codebook_size=256, codebook_dim=8, sample_rate=16000,
        ).eval()
    hop = 2 * 4 * 5 * 8
    audio = torch.randn(1, 1, 16000) * 0.1
    with torch.no_grad():
        out = model(audio, 16000)
        frames = out["codes"].shape[-1]
        assert out["codes"].shape == (1, 4, frames)
        assert frames == pytest.approx(16000 / hop, abs=1)
        assert int(out["codes"].min()) >= 0 and int(out["codes"].max()) < 256
        z = model.quantizer.from_codes(out["codes"])[0]
        decoded = model.decode(z)
    # DAC's transposed convolutions trim a few samples; the length matches to within one hop
    assert abs(decoded.shape[-1] - frames * hop) < hop


def test_s3tokenizer_v2_model_class_quantizes_at_25hz():
    import s3tokenizer
    from s3tokenizer.model_v2 import ModelConfig, S3TokenizerV2

    torch.manual_seed(0)
    # head dim is fixed at 64 by the model's rotary table, so state = 64 x heads
    config = ModelConfig(n_audio_state=128, n_audio_head=2, n_audio_layer=2)
    model = S3TokenizerV2("speech_tokenizer_v2_25hz", config).eval()
    audio = torch.randn(16000 * 2) * 0.1  # 2 s at 16 kHz
    mel = s3tokenizer.log_mel_spectrogram(audio)
    mels, mel_lens = s3tokenizer.padding([mel])
    with torch.no_grad():
        codes, code_lens = model.quantize(mels, mel_lens)
    assert codes.shape == (1, 50) and int(code_lens[0]) == 50  # 25 tokens per second
    assert int(codes.min()) >= 0 and int(codes.max()) < config.n_codebook_size == 6561
