"""Codec interface, S3 and DAC codecs on small random-initialised real model classes, token shards.

The pretrained weights of both codecs come from hubs these machines cannot reach, so the tests
build small instances of the packages' own model classes (as tests/test_codec_packages.py does),
save them in the packages' own checkpoint formats and load them through ``load_codec``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import warnings
import zipfile

import numpy as np
import pytest
import soundfile as sf
import torch

from arnar.codec import (
    Codec,
    CodecError,
    CodecUnavailableError,
    StaleTokensError,
    TokenShardError,
    codec_info,
    encode_files,
    level_lengths,
    level_rates,
    levels,
    load_codec,
    read_token_manifest,
    read_token_shards,
    write_token_shards,
)
from arnar.hub import unreachable

# --------------------------------------------------------------------------- fixtures

DAC_HOP = 2 * 4 * 5 * 8  # encoder_rates of the small model


def _noise(seconds: float, rate: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(round(seconds * rate))) / rate
    tone = 0.3 * np.sin(2 * np.pi * (150 + 50 * seed) * t)
    return (tone + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


def _small_dac(seed: int):
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.script / weight_norm deprecations inside dac
        from dac.model.dac import DAC

        return DAC(
            encoder_dim=16, encoder_rates=[2, 4, 5, 8], decoder_dim=64, decoder_rates=[8, 5, 4, 2],
            n_codebooks=4, codebook_size=256, codebook_dim=8, sample_rate=16000,
        )


@pytest.fixture(scope="module")
def dac_paths(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dac")
    paths = []
    for seed in (0, 1):
        path = folder / f"dac_small_{seed}.pth"
        _small_dac(seed).save(str(path), package=False)  # the package's own weights format
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def dac(dac_paths):
    # batches of several clips (the CPU default is one clip at a time), to test masked padding
    return load_codec("dac", model=dac_paths[0], batch_size=8, max_batch_seconds=100)


@pytest.fixture(scope="module")
def s3_path(tmp_path_factory):
    from s3tokenizer.model_v2 import ModelConfig, S3TokenizerV2

    torch.manual_seed(0)
    # head dim is fixed at 64 by the model's rotary table, so state = 64 x heads
    model = S3TokenizerV2("speech_tokenizer_v2_25hz", ModelConfig(n_audio_state=128, n_audio_head=2,
                                                                    n_audio_layer=2))
    path = tmp_path_factory.mktemp("s3") / "s3_small.pt"
    torch.save(model.state_dict(), path)  # what S3TokenizerV2.init_from_pt reads
    return path


@pytest.fixture(scope="module")
def s3(s3_path):
    return load_codec("s3", model=s3_path)


# --------------------------------------------------------------------------- interface


def test_load_codec_unknown_name():
    with pytest.raises(CodecError, match="unknown codec"):
        load_codec("no_such_codec")


def test_codecs_satisfy_the_protocol(s3, dac):
    for codec in (s3, dac):
        assert isinstance(codec, Codec)
        info = codec_info(codec)
        assert info["config_hash"] == codec.config_hash() and len(info["config_hash"]) == 64
        assert info["package_version"]  # recorded in token manifests


# --------------------------------------------------------------------------- S3


def test_s3_encodes_batches_at_25hz(s3):
    assert (s3.name, s3.sample_rate, s3.frame_rate, s3.n_codebooks, s3.codebook_size) == \
        ("s3", 16000, 25.0, 1, 6561)
    assert s3.can_decode is False
    assert s3.config["n_audio_state"] == 128 and s3.config["n_audio_layer"] == 2
    clips = [_noise(2.0, 16000, 0), _noise(1.0, 16000, 1), _noise(3.3, 16000, 2)]
    codes = s3.encode(clips, 16000)
    assert [c.shape for c in codes] == [(1, 50), (1, 25), (1, 83)]  # 25 tokens per second
    for c in codes:
        assert c.dtype == np.int64 and c.min() >= 0 and c.max() < 6561
    alone = [s3.encode([clip], 16000)[0] for clip in clips]
    for a, b in zip(codes, alone):
        np.testing.assert_array_equal(a, b)  # padding in a batch does not change tokens
    again = s3.encode(clips[::-1], 16000)[::-1]
    for a, b in zip(codes, again):
        np.testing.assert_array_equal(a, b)  # deterministic, independent of order
    # token count by hand, ceil(ceil(n_mel / 2) / 2) with n_mel = n_samples // 160 (two stride-2 stages):
    # 0.37 s = 5920 samples -> 37 mel frames -> 19 -> 10 tokens (not 25 x 0.37 = 9.25);
    # 1.01 s = 16160 -> 101 -> 51 -> 26
    odd = s3.encode([_noise(0.37, 16000, 4), _noise(1.01, 16000, 5)], 16000)
    assert [c.shape for c in odd] == [(1, 10), (1, 26)]


def test_s3_tokens_are_the_packages_reference_pipeline(s3, s3_path):
    """The package's own pipeline run here, one clip at a time: log-mel, padding, quantize."""
    import s3tokenizer
    from s3tokenizer.model_v2 import S3TokenizerV2

    from arnar.codec.s3 import _config_from_state

    state = torch.load(s3_path, weights_only=True)
    model = S3TokenizerV2("speech_tokenizer_v2_25hz", _config_from_state(state))
    model.load_state_dict(state)
    model.eval()
    clips = [_noise(2.0, 16000, 0), _noise(1.0, 16000, 1), _noise(3.3, 16000, 2)]
    ours = s3.encode(clips, 16000)  # one batch, padded
    for clip, codes in zip(clips, ours):
        with torch.inference_mode():
            feats, lens = s3tokenizer.padding([s3tokenizer.log_mel_spectrogram(torch.from_numpy(clip), n_mels=128)])
            ref, ref_lens = model.quantize(feats, lens)
        np.testing.assert_array_equal(codes[0], ref[0, : int(ref_lens[0])].numpy())


def test_s3_resamples_input(s3):
    import soxr

    clip = _noise(2.0, 16000, 3)
    at_44k = soxr.resample(clip, 16000, 44100).astype(np.float32)
    (codes,) = s3.encode([at_44k], 44100)
    assert codes.shape == (1, 50)
    # the 44.1 kHz clip is tokenized as soxr's 16 kHz version of it, token for token
    back = soxr.resample(at_44k, 44100, 16000).astype(np.float32)
    np.testing.assert_array_equal(codes, s3.encode([back], 16000)[0])


def test_s3_cannot_decode_and_rejects_bad_input(s3):
    with pytest.raises(CodecError, match="no decoder"):
        s3.decode([np.zeros((1, 10), np.int64)])
    with pytest.raises(CodecError, match="mono"):
        s3.encode([np.zeros((2, 16000), np.float32)], 16000)
    with pytest.raises(CodecError, match="too short|shorter"):
        s3.encode([np.zeros(100, np.float32)], 16000)


def test_s3_checkpoint_errors(tmp_path):
    with pytest.raises(CodecError, match="neither"):
        load_codec("s3", model=str(tmp_path / "missing.pt"))
    bad = tmp_path / "bad.pt"
    torch.save({"x": torch.zeros(1)}, bad)
    with pytest.raises(CodecError, match="not an S3TokenizerV2 state dict"):
        load_codec("s3", model=bad)


def test_s3_config_hash_follows_weights(s3, s3_path, tmp_path):
    assert load_codec("s3", model=s3_path).config_hash() == s3.config_hash()
    state = torch.load(s3_path, weights_only=True)
    state["quantizer._codebook.project_down.bias"] += 1e-3
    other = tmp_path / "other.pt"
    torch.save(state, other)
    assert load_codec("s3", model=other).config_hash() != s3.config_hash()


def test_s3_onnx_and_cached_name_load_paths(s3, s3_path, tmp_path, monkeypatch):
    import s3tokenizer
    import s3tokenizer.utils
    from s3tokenizer.model_v2 import S3TokenizerV2

    from arnar.codec.s3 import _config_from_state

    state = torch.load(s3_path, weights_only=True)
    # an .onnx file goes through the package's converter (building a real ONNX graph with the
    # package's node names is out of reach here, so the converter is stood in for)
    onnx = tmp_path / "speech_tokenizer_v2.onnx"
    onnx.write_bytes(b"onnx")
    monkeypatch.setattr(s3tokenizer.utils, "onnx2torch", lambda path, torch_path, verbose: dict(state))
    assert load_codec("s3", model=onnx).config_hash() == s3.config_hash()

    # the package's name: a cached file is used with no network, through s3tokenizer.load_model
    (tmp_path / "speech_tokenizer_v2_25hz.onnx").write_bytes(b"cached")
    calls = []

    def fake_load_model(name, download_root=None):
        calls.append((name, download_root))
        net = S3TokenizerV2(name, _config_from_state(state))
        net.load_state_dict(state)
        return net

    monkeypatch.setattr(s3tokenizer, "load_model", fake_load_model)
    codec = load_codec("s3", download_root=tmp_path, offline=True)
    assert calls == [("speech_tokenizer_v2_25hz", str(tmp_path))]
    assert codec.config_hash() == s3.config_hash()


def test_s3_named_model_offline_fails_fast(tmp_path):
    start = time.perf_counter()
    with pytest.raises(CodecUnavailableError, match="model=<path>"):
        load_codec("s3", model="speech_tokenizer_v2_25hz", download_root=tmp_path, offline=True)
    assert time.perf_counter() - start < 1
    import s3tokenizer

    if unreachable(s3tokenizer._MODELS["speech_tokenizer_v2_25hz"], 3) is None:
        pytest.skip("modelscope is reachable: loading would download the real weights")
    start = time.perf_counter()
    with pytest.raises(CodecUnavailableError, match="cannot be reached"):
        load_codec("s3", download_root=tmp_path, connect_timeout=3)
    assert time.perf_counter() - start < 15


# --------------------------------------------------------------------------- DAC


def test_dac_rates_shapes_and_round_trip(dac):
    assert (dac.name, dac.sample_rate, dac.n_codebooks, dac.codebook_size) == ("dac", 16000, 4, 256)
    assert dac.hop_length == DAC_HOP and dac.frame_rate == 16000 / DAC_HOP == 50.0
    assert dac.can_decode
    clips = [_noise(0.6, 16000, 0), _noise(0.37, 16000, 1), _noise(1.05, 16000, 2)]
    codes = dac.encode(clips, 16000)
    assert [c.shape for c in codes] == [(4, int(np.ceil(len(x) / DAC_HOP))) for x in clips]
    for c in codes:
        assert c.dtype == np.int64 and c.min() >= 0 and c.max() < 256
    audio = dac.decode(codes)
    for x, c, y in zip(clips, codes, audio):
        assert y.dtype == np.float32 and y.ndim == 1
        assert len(y) == c.shape[1] * DAC_HOP and abs(len(y) - len(x)) < DAC_HOP


def test_dac_round_trip_is_the_packages_reconstruction(dac, dac_paths):
    """decode(encode(x)) against DAC.forward's "audio" (the package's encode -> quantize -> decode, cut
    to the input's length). The weights are random, so the reconstruction is not the input; what is
    deterministic and checkable is that our two halves (batched, masked) give the package's result."""
    from dac.model.dac import DAC

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = DAC.load(str(dac_paths[0])).eval()
    clips = [_noise(0.6, 16000, 0), _noise(0.37, 16000, 1), _noise(1.05, 16000, 2)]
    audio = dac.decode(dac.encode(clips, 16000))  # one batch of three, padded and masked
    for x, y in zip(clips, audio):
        with torch.no_grad():
            ref = model(torch.from_numpy(x)[None, None], 16000)["audio"][0, 0].numpy()
        # the reference is cut to the input's length, or shorter where this decoder returns a few samples
        # under T x hop (0.6 s = 30 frames: 9592 of 9600; ours pads those 8 with zeros)
        n = len(ref)
        assert len(x) - 16 <= n <= len(x)
        snr = 10 * np.log10(np.mean(ref**2) / np.mean((y[:n] - ref) ** 2))
        assert snr > 60, f"{snr:.1f} dB"  # float rounding only (measured ~130 dB); a wrong frame is ~0 dB


def test_dac_batch_equals_one_by_one(dac):
    clips = [_noise(s, 16000, i) for i, s in enumerate((1.0, 0.3, 0.65, 0.02))]
    codes = dac.encode(clips, 16000)
    alone = [dac.encode([clip], 16000)[0] for clip in clips]
    for a, b in zip(codes, alone):
        np.testing.assert_array_equal(a, b)  # masked padding: exactly the same tokens
    audio = dac.decode(codes)
    for a, c in zip(audio, codes):
        np.testing.assert_allclose(a, dac.decode([c])[0], atol=1e-5)


def test_dac_encode_reference_and_options(dac, dac_paths):
    from dac.model.dac import DAC

    clip = _noise(0.9, 16000, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = DAC.load(str(dac_paths[0])).eval()  # the package's own loader and forward pass
    with torch.no_grad():
        ref = model(torch.from_numpy(clip)[None, None], 16000)["codes"][0].numpy()
    np.testing.assert_array_equal(dac.encode([clip], 16000)[0], ref)

    first = load_codec("dac", model=dac_paths[0], n_codebooks=1)
    assert first.n_codebooks == 1
    np.testing.assert_array_equal(first.encode([clip], 16000)[0], ref[:1])
    assert first.config_hash() != dac.config_hash()
    assert len(first.decode([ref[:1]])[0]) == ref.shape[1] * DAC_HOP
    with pytest.raises(CodecError, match="codebooks"):
        load_codec("dac", model=dac_paths[0], n_codebooks=5)

    import soxr

    at_22k = soxr.resample(clip, 16000, 22050).astype(np.float32)
    assert dac.encode([at_22k], 22050)[0].shape == ref.shape

    # tiny batches by duration give the same tokens
    small = load_codec("dac", model=dac_paths[0], batch_size=2, max_batch_seconds=0.6)
    clips = [clip, _noise(0.5, 16000, 6), _noise(0.3, 16000, 7)]
    for a, b in zip(small.encode(clips, 16000), dac.encode(clips, 16000)):
        np.testing.assert_array_equal(a, b)


def test_dac_decode_with_prompt_and_bad_codes(dac):
    codes = dac.encode([_noise(1.0, 16000, 8)], 16000)[0]
    whole = dac.decode([codes])[0]
    tail = dac.decode([codes[:, 20:]], prompt=[codes[:, :20]])[0]
    assert len(tail) == (codes.shape[1] - 20) * DAC_HOP
    np.testing.assert_allclose(tail, whole[20 * DAC_HOP :], atol=1e-5)
    with pytest.raises(CodecError, match="shape"):
        dac.decode([codes[:2]])
    with pytest.raises(CodecError, match="outside"):
        dac.decode([codes + 256])


def test_dac_config_hash(dac, dac_paths):
    default = load_codec("dac", model=dac_paths[0])
    assert default.batch_size == 1  # CPU: batching is slower than one clip at a time
    assert default.config_hash() == dac.config_hash()  # batching is not part of the hash
    assert load_codec("dac", model=dac_paths[1]).config_hash() != dac.config_hash()


def test_dac_bad_weights_file(tmp_path):
    bad = tmp_path / "bad.pth"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(CodecError, match="not a DAC weights file"):
        load_codec("dac", model=bad)
    with pytest.raises(CodecError, match="neither"):
        load_codec("dac", model="48khz")


def test_dac_tag_loads_from_the_package_cache(dac, dac_paths, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    cached = tmp_path / ".cache" / "descript" / "dac" / "weights_44khz_8kbps_0.0.1.pth"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(dac_paths[0].read_bytes())
    # found where dac.utils.download keeps it: no network needed
    assert load_codec("dac", model="44khz", offline=True).config_hash() == dac.config_hash()


def test_dac_tag_offline_fails_fast(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no cached weights
    start = time.perf_counter()
    with pytest.raises(CodecUnavailableError, match="model=<path>"):
        load_codec("dac", model="44khz", offline=True)
    assert time.perf_counter() - start < 1
    monkeypatch.setenv("ARNAR_OFFLINE", "1")
    with pytest.raises(CodecUnavailableError, match="offline mode"):
        load_codec("dac")
    monkeypatch.delenv("ARNAR_OFFLINE")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    import dac.utils

    if unreachable(dac.utils.__MODEL_URLS__[("44khz", "0.0.1", "8kbps")], 3) is None:
        pytest.skip("github is reachable: loading would download the real weights")
    start = time.perf_counter()
    with pytest.raises(CodecUnavailableError, match="cannot be reached"):
        load_codec("dac", model="44khz", connect_timeout=3)
    assert time.perf_counter() - start < 15


def test_dac_first_quantizer_levels(dac):
    codes = dac.encode([_noise(1.0, 16000, 9)], 16000)[0]  # 50 frames
    lv = levels(codes, 3)
    assert [len(x) for x in lv] == level_lengths(50, 3) == [13, 25, 50]
    np.testing.assert_array_equal(lv[-1], codes[0])
    # level 1 keeps the first token of each group of 4 frames of quantizer 0: frames 0, 4, ..., 48 (the
    # last group, frames 48-49, is partial); level 2 of each pair: frames 0, 2, ..., 48
    first = [0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48]
    assert lv[0].tolist() == [int(codes[0, j]) for j in first]
    assert lv[1].tolist() == [int(codes[0, j]) for j in range(0, 50, 2)]
    assert lv[0].tolist() == lv[1][::2].tolist()  # level 1 is level 2 decimated by 2
    # a hand-worked code block [n_q = 4, T = 6]: only row 0 (the first quantizer) makes levels
    block = np.array([[7, 3, 9, 1, 4, 4], [0, 0, 0, 0, 0, 0], [5, 5, 5, 5, 5, 5], [2, 2, 2, 2, 2, 2]])
    assert [x.tolist() for x in levels(block, 3)] == [[7, 4], [7, 9, 4], [7, 3, 9, 1, 4, 4]]
    assert level_rates(dac.frame_rate, 3) == [12.5, 25.0, 50.0]


# --------------------------------------------------------------------------- files


def test_encode_files(dac, tmp_path, caplog):
    paths = []
    for i, seconds in enumerate((0.8, 1.5, 0.4)):
        path = tmp_path / f"utt{i}.wav"
        sf.write(path, _noise(seconds, 22050, i), 22050)
        paths.append(path)
    with caplog.at_level(logging.INFO, logger="arnar.codec"):
        got = list(encode_files(dac, paths, batch_size=2, progress=False))
    assert [p for p, _ in got] == paths
    from arnar.evaluate.audio import load_mono

    expected = dac.encode([load_mono(p, 16000)[0] for p in paths], 16000)
    for (_, codes), ref in zip(got, expected):
        np.testing.assert_array_equal(codes, ref)
    assert any("x real time" in r.getMessage() and "3 files" in r.getMessage() for r in caplog.records)


# --------------------------------------------------------------------------- shards


def _tokens(n: int, n_q: int, size: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"spk1_utt{i:03d}": rng.integers(0, size, (n_q, int(rng.integers(0, 40)))) for i in range(n)}


def test_token_shards_round_trip_and_manifest(dac, tmp_path):
    tokens = _tokens(7, 4, 256)
    folder = write_token_shards(tmp_path, "train", tokens, dac, shard_size=3)
    assert folder == tmp_path / "train"
    assert sorted(p.name for p in folder.iterdir()) == [
        "manifest.json", "shard-00000.npz", "shard-00001.npz", "shard-00002.npz"]
    back = read_token_shards(folder, expect_codec_hash=dac.config_hash())
    assert list(back) == sorted(tokens)
    for utt, codes in tokens.items():
        assert back[utt].dtype == np.int16
        np.testing.assert_array_equal(back[utt], codes)
    assert read_token_shards(folder, dtype=np.int64)["spk1_utt000"].dtype == np.int64
    manifest = read_token_manifest(folder)
    assert manifest["codec"] == codec_info(dac)
    assert manifest["n_utterances"] == 7
    assert manifest["n_frames"] == sum(c.shape[1] for c in tokens.values())
    assert manifest["codec"]["package"] == "descript-audio-codec"
    # np.load reads a shard directly
    with np.load(folder / "shard-00000.npz") as npz:
        assert sorted(npz.files) == sorted(tokens)[:3]
    # the manifest's figures, recomputed: 7 utterances in shards of 3 -> 3, 3, 1 in sorted id order;
    # each shard's sha256 that of its bytes; seconds = frames / 50 Hz (the small DAC's frame rate)
    ids = sorted(tokens)
    for shard, chunk in zip(manifest["shards"], (ids[0:3], ids[3:6], ids[6:7])):
        assert shard["n_utterances"] == len(chunk)
        assert shard["n_frames"] == sum(tokens[u].shape[1] for u in chunk)
        assert shard["sha256"] == hashlib.sha256((folder / shard["file"]).read_bytes()).hexdigest()
    assert manifest["seconds"] == round(manifest["n_frames"] / 50.0, 3)


def test_token_shards_are_deterministic_bytes(tmp_path):
    info = {"name": "s3", "config_hash": "a" * 64, "frame_rate": 25.0, "n_codebooks": 1,
            "codebook_size": 6561, "sample_rate": 16000}
    tokens = _tokens(5, 1, 6561)
    a = write_token_shards(tmp_path / "a", "dev", tokens, info, shard_size=2)
    b = write_token_shards(tmp_path / "b", "dev", dict(reversed(list(tokens.items()))), info, shard_size=2)
    for name in ("manifest.json", "shard-00000.npz", "shard-00002.npz"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    with zipfile.ZipFile(a / "shard-00000.npz") as zf:
        assert {zi.date_time for zi in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}


def test_token_shards_stale_and_corrupt(dac, tmp_path):
    folder = write_token_shards(tmp_path, "test", _tokens(5, 4, 256), dac, shard_size=2)
    with pytest.raises(StaleTokensError) as err:
        read_token_shards(folder, expect_codec_hash="b" * 64)
    msg = str(err.value)
    assert "stale token set" in msg and "manifest.json" in msg and "rerun the tokenize rule" in msg
    assert dac.config_hash() in msg and "b" * 64 in msg and "codec dac" in msg

    # a readable shard of the same set in the wrong place: refused by its hash, not read as tokens
    shard = folder / "shard-00001.npz"
    original = shard.read_bytes()
    shard.write_bytes((folder / "shard-00000.npz").read_bytes())
    with pytest.raises(TokenShardError, match="shard-00001.npz: token shard corrupt"):
        read_token_shards(folder, expect_codec_hash=dac.config_hash())
    shard.write_bytes(original)
    assert len(read_token_shards(folder, expect_codec_hash=dac.config_hash())) == 5  # restored: read again

    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(TokenShardError, match="shard-00001.npz: token shard corrupt"):
        read_token_shards(folder)
    shard.unlink()
    with pytest.raises(TokenShardError, match="shard-00001.npz: token shard missing"):
        read_token_shards(folder)
    (folder / "manifest.json").unlink()
    with pytest.raises(TokenShardError, match="no token manifest"):
        read_token_shards(folder)


def test_token_shards_rewrite_and_validation(dac, tmp_path):
    write_token_shards(tmp_path, "train", _tokens(6, 4, 256), dac, shard_size=2)
    folder = write_token_shards(tmp_path, "train", _tokens(3, 4, 256, seed=1), dac, shard_size=2)
    assert sorted(p.name for p in folder.glob("shard-*.npz")) == ["shard-00000.npz", "shard-00001.npz"]
    assert len(read_token_shards(folder)) == 3
    assert json.loads((folder / "manifest.json").read_text())["n_utterances"] == 3
    with pytest.raises(ValueError, match="expected codes"):
        write_token_shards(tmp_path, "x", {"u": np.zeros((2, 5), np.int64)}, dac)
    with pytest.raises(ValueError, match="outside"):
        write_token_shards(tmp_path, "x", {"u": np.full((4, 5), 256)}, dac)
