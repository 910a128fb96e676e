"""Tests of the speaker-similarity backends (arnar.evaluate.similarity) and the optional MOS
predictor (arnar.evaluate.mos)."""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
import time
import types

import numpy as np
import pytest
import soundfile as sf

from arnar.evaluate import mos, similarity
from arnar.evaluate.audio import AudioError, load_mono, resample
from arnar.evaluate.similarity import SimUnavailableError, cosine, embed_files

VOICES = ("rms", "slt", "awb")
SENTENCES = (
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "She sells sea shells by the sea shore on a bright summer morning.",
)
needs_flite = pytest.mark.skipif(shutil.which("flite") is None,
                                 reason="needs the Debian package flite")


# ----------------------------------------------------------------------------- cosine


def test_cosine_rowwise_and_pairs():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 7)), rng.standard_normal((5, 7))
    want = [x @ y / np.linalg.norm(x) / np.linalg.norm(y) for x, y in zip(a, b)]
    np.testing.assert_allclose(cosine(a, b), want, rtol=1e-12)
    assert cosine(a, b).shape == (5,)
    assert cosine(a[0], b[0]).shape == ()
    assert float(cosine(a[0], b[0])) == pytest.approx(want[0])
    assert float(cosine(a[0], 3 * a[0])) == pytest.approx(1.0)
    assert float(cosine(a[0], -a[0])) == pytest.approx(-1.0)
    np.testing.assert_allclose(cosine(a, b[0]), [cosine(x, b[0]) for x in a])  # broadcast
    with pytest.raises(ValueError):
        cosine(a, b[:4])
    with pytest.raises(ValueError):
        cosine(a, b[:, :6])
    with pytest.raises(ValueError):
        cosine(np.zeros(7), b[0])


def test_unknown_encoder_name():
    with pytest.raises(ValueError, match="resemblyzer, wavlm"):
        similarity.load_speaker_encoder("ecapa")


# ----------------------------------------------------------------------------- resemblyzer


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[tuple[str, int], object]:
    if shutil.which("flite") is None:
        pytest.skip("needs the Debian package flite")
    out = tmp_path_factory.mktemp("flite")
    paths = {}
    for voice, (i, text) in itertools.product(VOICES, enumerate(SENTENCES)):
        path = out / f"{voice}_{i}.wav"
        subprocess.run(["flite", "-voice", voice, "-t", text, "-o", str(path)], check=True,
                       capture_output=True)
        paths[voice, i] = path
    return paths


@pytest.fixture(scope="module")
def resemblyzer_encoder():
    return similarity.load_speaker_encoder("resemblyzer")


@needs_flite
def test_resemblyzer_separates_voices(clips, resemblyzer_encoder):
    enc = resemblyzer_encoder
    assert enc.name == "resemblyzer" and "resemblyzer" in enc.model_id
    assert isinstance(enc, similarity.SpeakerEncoder)
    keys = list(clips)
    emb = embed_files(enc, [clips[k] for k in keys], batch_size=4, progress=False)
    assert emb.shape == (len(keys), 256) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    same, diff = [], []
    for (i, ka), (j, kb) in itertools.combinations(enumerate(keys), 2):
        (same if ka[0] == kb[0] else diff).append(float(cosine(emb[i], emb[j])))
    # Measured: same voice 0.93-0.95, different voices 0.53-0.76 (flite rms/slt/awb, ~4 s).
    assert min(same) > max(diff) + 0.08, (same, diff)
    assert np.mean(same) - np.mean(diff) > 0.2


@needs_flite
def test_resemblyzer_deterministic_and_rate_independent(clips, resemblyzer_encoder):
    enc = resemblyzer_encoder
    wav, rate = load_mono(clips["rms", 0])
    assert rate == 16000
    first = enc.embed([wav], rate)
    np.testing.assert_array_equal(first, enc.embed([wav], rate))
    # The same audio delivered at 24 kHz is resampled back to 16 kHz inside embed.
    at24 = enc.embed([resample(wav, rate, 24000)], 24000)
    assert float(cosine(first[0], at24[0])) > 0.98
    # embed_files reads the file the same way as load_mono + embed.
    np.testing.assert_allclose(embed_files(enc, [clips["rms", 0]], progress=False), first,
                               atol=1e-6)


def test_resemblyzer_edge_cases(resemblyzer_encoder, tmp_path):
    enc = resemblyzer_encoder
    assert enc.embed([], 16000).shape == (0, 256)
    with pytest.raises(AudioError, match="silence"):
        enc.embed([np.zeros(16000, np.float32)], 16000)
    with pytest.raises(AudioError, match=r"audio\[1\]"):
        enc.embed([np.ones(100, np.float32), np.zeros(0, np.float32)], 16000)
    with pytest.raises(TypeError):
        enc.embed(np.ones(1600, np.float32), 16000)  # one utterance, not wrapped in a list
    # Noise that VAD removes entirely still gets a finite embedding (untrimmed fallback).
    noise = np.random.default_rng(0).standard_normal(8000).astype(np.float32) * 1e-3
    assert np.all(np.isfinite(enc.embed([noise], 16000)))
    # embed_files names the file that cannot be embedded.
    silent = tmp_path / "silent.wav"
    sf.write(silent, np.zeros(16000, np.float32), 16000)
    with pytest.raises(AudioError, match="silent.wav"):
        embed_files(enc, [silent], progress=False)


# ----------------------------------------------------------------------------- WavLM


def _tiny_wavlm(path, feat_extract_norm: str):
    """A tiny random WavLM x-vector model + feature extractor saved in Hugging Face format."""
    import torch
    from transformers import Wav2Vec2FeatureExtractor, WavLMConfig, WavLMForXVector

    torch.manual_seed(0)
    config = WavLMConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        conv_dim=(16,) * 7, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
        num_buckets=32, max_bucket_distance=100, tdnn_dim=(16, 16, 16, 16, 32),
        xvector_output_dim=8, feat_extract_norm=feat_extract_norm,
        do_stable_layer_norm=feat_extract_norm == "layer",
    )
    model = WavLMForXVector(config)
    with torch.no_grad():  # the default init is so small that embeddings are ~1e-8
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    model.save_pretrained(path)
    Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0,
                             do_normalize=True, return_attention_mask=True).save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=["layer", "group"])
def wavlm_encoder(request, tmp_path_factory):
    path = _tiny_wavlm(tmp_path_factory.mktemp(f"wavlm_{request.param}"), request.param)
    return similarity.load_speaker_encoder("wavlm", model=str(path))


def _signals():
    rng = np.random.default_rng(1)
    t = np.arange(16000) / 16000
    voiced = (0.3 * np.sin(2 * np.pi * 140 * t) * np.sin(2 * np.pi * 3 * t)).astype(np.float32)
    # lengths differ (padding inside a batch), two are equal (group-norm models batch those)
    return [
        voiced,
        rng.standard_normal(11000).astype(np.float32) * 0.1,
        rng.standard_normal(7300).astype(np.float32) * 0.1,
        voiced[::-1].copy(),
        rng.standard_normal(6000).astype(np.float32) * 0.1,
    ]


def test_wavlm_batch_equals_single(wavlm_encoder):
    enc = wavlm_encoder
    assert enc.name == "wavlm" and isinstance(enc, similarity.SpeakerEncoder)
    xs = _signals()
    batch = enc.embed(xs, 16000)
    assert batch.shape == (len(xs), 8) and batch.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    single = np.concatenate([enc.embed([x], 16000) for x in xs])
    np.testing.assert_allclose(batch, single, atol=1e-4)
    assert float(np.min(cosine(batch, single))) > 0.99999
    np.testing.assert_array_equal(batch, enc.embed(xs, 16000))  # deterministic
    # order of the batch does not matter
    np.testing.assert_allclose(enc.embed(xs[::-1], 16000)[::-1], batch, atol=1e-4)


def test_wavlm_resamples_and_rejects_too_short(wavlm_encoder):
    enc = wavlm_encoder
    x = _signals()[0]
    at8k = resample(x, 16000, 8000)
    np.testing.assert_allclose(enc.embed([at8k], 8000), enc.embed([resample(at8k, 8000, 16000)],
                                                                   16000), atol=1e-6)
    with pytest.raises(AudioError, match="too short"):
        enc.embed([x, x[:3000]], 16000)
    assert enc.embed([], 16000).shape == (0, 8)


def test_wavlm_unavailable_fast(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(SimUnavailableError, match="not in the local Hugging Face cache"):
        similarity.load_speaker_encoder("wavlm", model="arnar-test/no-such-wavlm-sv")
    assert time.perf_counter() - start < 10
    with pytest.raises(SimUnavailableError, match="not found"):
        similarity.load_speaker_encoder("wavlm", model=str(tmp_path / "missing"))
    with pytest.raises(SimUnavailableError):  # a directory that is not a model
        similarity.load_speaker_encoder("wavlm", model=str(tmp_path))


def test_wavlm_rejects_model_without_speaker_head(tmp_path):
    """A plain WavLM (no x-vector head) must not load as a speaker model with a random head."""
    import torch
    from transformers import Wav2Vec2FeatureExtractor, WavLMConfig, WavLMModel

    torch.manual_seed(0)
    config = WavLMConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, conv_dim=(16,) * 7, num_conv_pos_embeddings=16,
                         num_conv_pos_embedding_groups=2, num_buckets=32, max_bucket_distance=100)
    WavLMModel(config).save_pretrained(tmp_path)
    Wav2Vec2FeatureExtractor().save_pretrained(tmp_path)
    with pytest.raises(SimUnavailableError, match="speaker"):
        similarity.load_speaker_encoder("wavlm", model=str(tmp_path))


# ----------------------------------------------------------------------------- MOS


def test_mos_unavailable_gives_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "utmosv2", None)  # import fails, as where not installed
    ok, reason = mos.mos_available()
    assert not ok
    assert "utmosv2" in reason and "pip install git+https://github.com/sarulab-speech/UTMOSv2" \
        in reason
    with pytest.raises(mos.MosUnavailableError) as err:
        mos.load_mos_predictor()
    assert str(err.value) == reason
    with pytest.raises(ValueError, match="known: dnsmos, utmosv2"):
        mos.load_mos_predictor("pesq")


def test_mos_here_matches_environment():
    ok, reason = mos.mos_available()
    try:
        import utmosv2  # noqa: F401
    except Exception:
        assert not ok and "install" in reason
    else:
        assert ok


def test_mos_adapter_calls_documented_api(monkeypatch):
    """The adapter with a stand-in for utmosv2 (the real one cannot be installed here): one
    16 kHz 1-D array per predict(data=...) call, keyword arguments of UTMOSv2Model.predict,
    a reproducible score despite random frame selection, and global RNG state left alone."""
    calls = []

    class FakeModel:
        def predict(self, *, data, device, num_workers, batch_size, num_repetitions, verbose):
            calls.append((data, device, num_workers, batch_size, num_repetitions, verbose))
            return np.float64(1.0 + 4.0 * np.random.rand())  # frame choice is random upstream

    fake = types.ModuleType("utmosv2")
    fake.__version__ = "0.test"
    fake.create_model = lambda pretrained=True, config="fusion_stage3", fold=0: FakeModel()
    monkeypatch.setitem(sys.modules, "utmosv2", fake)

    assert mos.mos_available() == (True, "utmosv2 0.test imports")
    predictor = mos.load_mos_predictor("utmosv2", device="cpu")
    assert predictor.name == "utmosv2" and predictor.model_id.startswith("utmosv2==0.test")
    x24 = np.sin(np.arange(24000) / 24000 * 2 * np.pi * 200).astype(np.float32)
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    scores = predictor.predict([x24, x24[:12000]], 24000)
    assert np.array_equal(np.random.get_state()[1], before)
    assert scores.shape == (2,) and scores.dtype == np.float32
    assert np.all((scores >= 1) & (scores <= 5))
    np.testing.assert_array_equal(scores, predictor.predict([x24, x24[:12000]], 24000))
    data, device, workers, _, _, verbose = calls[0]
    assert data.ndim == 1 and data.dtype == np.float32 and len(data) == 16000
    assert len(calls[1][0]) == 8000 and device == "cpu" and workers == 0 and verbose is False

    fake.create_model = lambda **kw: (_ for _ in ()).throw(OSError("offline"))
    with pytest.raises(mos.MosUnavailableError, match="offline"):
        mos.load_mos_predictor()


def test_dnsmos_scores_clean_speech_above_the_same_speech_with_noise(tmp_path):
    """DNSMOS from the speechmos wheel on real speech (flite): white noise at 10 dB SNR lowers the
    P.808 MOS and P.835 BAK (background) by a clear margin; scores are the same on a second call
    and the first-window reading stays near the reference script's every-window reading (a short
    clip's windows are cyclic shifts of one repeated clip)."""
    import shutil
    import subprocess

    import soundfile as sf

    if shutil.which("flite") is None:
        pytest.skip("Debian's flite is not installed (scripts/setup.sh installs it)")
    wav = tmp_path / "clean.wav"
    subprocess.run(["flite", "-voice", "slt", "-t", "The birch canoe slid on the smooth planks of the old dock.",
                    "-o", str(wav)], check=True)
    clean, rate = sf.read(str(wav), dtype="float32")
    noise = np.random.default_rng(0).standard_normal(clean.size).astype(np.float32)
    noise *= np.sqrt(np.mean(clean ** 2) / np.mean(noise ** 2) / 10.0)  # 10 dB SNR
    noisy = (clean + noise) / max(1.0, float(np.abs(clean + noise).max()))

    predictor = mos.load_mos_predictor("dnsmos")
    assert predictor.model_id.startswith("speechmos==0.0.1.1:dnsmos")
    scores = predictor.score([clean, noisy], rate)
    assert set(scores) == {"p808", "sig", "bak", "ovrl"}
    assert scores["p808"][0] > scores["p808"][1] + 0.5
    assert scores["bak"][0] > scores["bak"][1] + 1.0
    np.testing.assert_array_equal(predictor.predict([clean], rate), scores["p808"][:1])
    every = mos.DnsmosPredictor(windows="all").score([clean], rate)
    assert abs(float(every["p808"][0]) - float(scores["p808"][0])) < 0.3
    with pytest.raises(ValueError, match="silent"):
        predictor.score([np.zeros(16000, np.float32)], 16000)
    with pytest.raises(ValueError, match="windows"):
        mos.DnsmosPredictor(windows="middle")
