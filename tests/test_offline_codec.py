"""The offline codec (``arnar.codec.offline``): training, rates, shapes, decoding, determinism.

A tiny codec is trained on a few sentences synthesized here with Debian's flite (two voices, so
two speakers), labelled with flite's own phone timings (``-psdur``), so the tests need nothing
from ``data/``. Quality is measured on the corpus by the pipeline, not here.
"""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import soundfile as sf

from arnar.codec import (
    Codec,
    CodecError,
    codec_info,
    levels,
    load_codec,
    read_token_shards,
    write_token_shards,
)
from arnar.codec.offline import (
    OfflineCodec,
    log_mel,
    mel_to_audio,
    train_offline_codec,
)
from flite_audio import flite_utterance  # tests/flite_audio.py

SENTENCES = [
    "Please call the doctor before noon tomorrow.",
    "The children walked to school in the morning.",
    "A quiet river runs under the old stone bridge.",
    "She packed her bags and left before sunrise.",
]
VOICES = ["rms", "slt"]

# small enough to train in about a second; every stage runs
TINY = dict(
    enc_channels=32, enc_dilations=[1, 2], bottleneck=8, enc_epochs=2,
    n_tokens=16, kmeans_iters=4,
    dec_channels=32, dec_dilations=[1], dec_fine_channels=16, dec_fine_dilations=[1], dec_epochs=1,
    enc_front_channels=8, enc_front_dilations=[1],
    rvq_codebooks=3, rvq_size=8, rvq_iters=4,
    batch_size=4, crop_seconds=1.0,
)



@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Cuts JSONL (alignments in the supervisions), an aligner-format JSONL, the wav paths."""
    if shutil.which("flite") is None:
        pytest.skip("needs the Debian package flite (apt-get install flite)")
    out = tmp_path_factory.mktemp("offline_corpus")
    cuts, aligned, wavs = [], [], []
    for voice in VOICES:
        for i, text in enumerate(SENTENCES):
            utt = f"{voice}_{i}"
            wav = out / f"{utt}.wav"
            phones = flite_utterance(text, voice, wav)
            info = sf.info(str(wav))
            duration = info.frames / info.samplerate
            cuts.append({
                "id": utt, "start": 0.0, "duration": duration, "channel": 0, "type": "MonoCut",
                "supervisions": [{
                    "id": utt, "recording_id": utt, "start": 0.0, "duration": duration, "channel": 0,
                    "text": text, "speaker": voice,
                    "alignment": {"phone": [[p, b, round(e - b, 4), None] for p, b, e in phones]},
                }],
                "recording": {"id": utt, "sources": [{"type": "file", "channels": [0], "source": str(wav)}],
                              "sampling_rate": info.samplerate, "num_samples": info.frames,
                              "duration": duration, "channel_ids": [0]},
            })
            # the aligners' format: upper-case ARPAbet, silences left out
            aligned.append({"utt_id": utt, "duration": duration, "words": [],
                            "phones": [[p.upper(), b, e] for p, b, e in phones if p != "pau"]})
            wavs.append(wav)
    cuts_path = out / "cuts.jsonl"
    cuts_path.write_text("".join(json.dumps(c) + "\n" for c in cuts))
    align_path = out / "align.jsonl"
    align_path.write_text("".join(json.dumps(a) + "\n" for a in aligned[:-1]))  # one utterance unaligned
    return cuts_path, align_path, wavs


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    cuts, align, _ = corpus
    out = tmp_path_factory.mktemp("offline_model") / "codec"
    # the DAG's call: the codec also writes its training clips' token set (tokens/offline/train)
    report = train_offline_codec(cuts, align, out, seed=7, progress=False,
                                 tokens_out=out.parent / "tokens", tokens_split="train", **TINY)
    return out, report


def _clips(wavs, n=3):
    return [sf.read(str(w), dtype="float32")[0] for w in wavs[:n]]


# --------------------------------------------------------------------------- training


def test_training_writes_model_and_report(trained):
    out, report = trained
    assert {p.name for p in out.iterdir()} >= {"config.json", "weights.pt", "report.json", "build_log.json"}
    # the timings go to build_log.json, so that two builds give the same report.json
    assert json.loads((out / "report.json").read_text()) == {k: v for k, v in report.items() if k != "seconds"}
    assert json.loads((out / "build_log.json").read_text()) == {"seconds": report["seconds"]}
    assert report["utterances"]["train"] + report["utterances"]["held_out"] == 8
    # one utterance is missing from the alignment file: trained on, but not by the phone encoder
    assert report["utterances"]["labelled"] in (report["utterances"]["train"] - 1, report["utterances"]["train"])
    for stage in ("encoder_ce", "decoder_l1"):
        curve = report["loss_curves"][stage]
        assert curve and all(math.isfinite(x) for x in curve)
    accuracy = report["held_out"]["phone_accuracy"]
    assert accuracy is None or 0.0 <= accuracy <= 1.0
    assert set(report["seconds"]) >= {"features", "encoder", "kmeans", "decoder", "rvq", "total"}
    l1 = report["held_out"]["rvq_l1_by_codebooks"]  # more codebooks, less quantization error
    assert l1[str(TINY["rvq_codebooks"])] < l1["1"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["phones"][0] == "<sil>" and "k" in cfg["phones"] and "pau" not in cfg["phones"]
    assert cfg["semantic_frame_rate"] == 25.0 and cfg["rvq_frame_rate"] == 50.0


def test_training_is_deterministic(corpus, trained, tmp_path):
    cuts, align, _ = corpus
    out, _ = trained
    again = tmp_path / "again"
    train_offline_codec(cuts, align, again, seed=7, progress=False, **TINY)
    assert (again / "weights.pt").read_bytes() == (out / "weights.pt").read_bytes()
    for stream in ("semantic", "rvq"):
        a = load_codec("offline", model=out, stream=stream)
        b = load_codec("offline", model=again, stream=stream)
        assert a.config_hash() == b.config_hash()
    other = tmp_path / "other_seed"
    train_offline_codec(cuts, align, other, seed=8, progress=False, **TINY)
    assert load_codec("offline", model=other).config_hash() != load_codec("offline", model=out).config_hash()


def test_moonshine_front_end_is_recorded_and_checked(trained, corpus, tmp_path):
    """The default front end is Moonshine's encoder: the config names its weights, and a codec
    folder trained on other weights is refused rather than encoding with the wrong features."""
    import shutil

    from arnar.codec.moonshine_frontend import MoonshineFrontend

    out, _ = trained
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["enc_frontend"] == "moonshine" and cfg["frontend_dim"] == 416
    assert cfg["frontend_sha256"] == MoonshineFrontend().model_sha256
    other = tmp_path / "other"
    shutil.copytree(out, other)
    cfg["frontend_sha256"] = "0" * 64
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CodecError, match="retrain it"):
        load_codec("offline", model=str(other))
    load_codec("offline", model=str(other), stream="rvq")  # the RVQ stream does not use the front end


def test_mel_front_end_still_trains(corpus, tmp_path):
    cuts, align, wavs = corpus
    report = train_offline_codec(cuts, align, tmp_path / "mel", seed=3, progress=False,
                                 **{**TINY, "enc_frontend": "mel"})
    assert report["parameters"]["encoder"] > 0
    codec = load_codec("offline", model=str(tmp_path / "mel"))
    clip = _clips(wavs, 1)[0]
    assert codec.encode([clip], 16_000)[0].shape == (1, codec.n_frames(clip.size))
    with pytest.raises(ValueError, match="enc_frontend"):
        train_offline_codec(cuts, align, tmp_path / "x", seed=3, progress=False, enc_frontend="hubert")


def test_codec_on_the_vocoders_mel_analysis(corpus, trained, tmp_path):
    """mel_analysis=hifigan: the codec's config says the window, its decoder's mel is HiFi-GAN's
    analysis (the RVQ stack's decoded mel of a clip is near that clip's hifigan-analysis mel, not
    its stft25ms mel), the semantic tokens (Moonshine front end) do not depend on it, and an
    unknown analysis fails before any work."""
    cuts, align, wavs = corpus
    out = tmp_path / "wide"
    train_offline_codec(cuts, align, out, seed=7, progress=False, **{**TINY, "mel_analysis": "hifigan"})
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["mel_analysis"], cfg["n_fft"], cfg["win_length"], cfg["hop_length"]) == ("hifigan", 1024, 743, 160)
    old, _ = trained
    assert json.loads((old / "config.json").read_text())["win_length"] == 400
    clip = _clips(wavs, 1)[0]
    wide = load_codec("offline", model=out)
    np.testing.assert_array_equal(wide.encode([clip], 16000)[0], load_codec("offline", model=old).encode([clip], 16000)[0])
    rvq = load_codec("offline", model=out, stream="rvq")
    mel = rvq.decode_mel(rvq.encode([clip], 16000))[0]
    own, other = log_mel(clip, 2, "hifigan"), log_mel(clip, 2, "stft25ms")
    assert np.abs(mel - own).mean() < 0.6 * np.abs(mel - other).mean()
    with pytest.raises(ValueError, match="unknown mel analysis"):
        train_offline_codec(cuts, align, tmp_path / "x", seed=7, progress=False, mel_analysis="wide")
    assert not (tmp_path / "x").exists()


def test_training_steps_are_capped(corpus, tmp_path):
    """enc_max_steps / dec_max_steps cap the updates, so cost stops growing with corpus hours."""
    cuts, align, _ = corpus
    report = train_offline_codec(cuts, align, tmp_path / "cap", seed=3, progress=False,
                                 **{**TINY, "enc_epochs": 50.0, "dec_epochs": 50.0, "enc_max_steps": 3,
                                    "dec_max_steps": 2})
    assert report["steps"] == {"encoder": 3, "decoder": 2}


def test_training_from_supervision_timings(corpus, tmp_path):
    cuts, _, _ = corpus
    report = train_offline_codec(cuts, None, tmp_path / "sup", seed=1, progress=False, **TINY)
    assert report["utterances"]["labelled"] == report["utterances"]["train"]
    cfg = json.loads((tmp_path / "sup" / "config.json").read_text())
    assert cfg["alignments"] == "supervisions"


def test_training_rejects_unknown_options(corpus, tmp_path, caplog):
    cuts, align, _ = corpus
    with pytest.raises(TypeError, match="unknown option"):
        train_offline_codec(cuts, align, tmp_path / "x", seed=1, progress=False, n_tokenz=4)
    with pytest.raises(ValueError, match="token_layer"):
        train_offline_codec(cuts, align, tmp_path / "x", seed=1, progress=False, token_layer="top")
    # options of the retired refinement network are ignored with a warning
    with caplog.at_level("WARNING", logger="arnar.codec"):
        train_offline_codec(cuts, align, tmp_path / "r", seed=7, progress=False, ref_epochs=1, **TINY)
    assert "retired" in caplog.text
    assert (tmp_path / "r" / "weights.pt").is_file()


# --------------------------------------------------------------------------- semantic stream


def test_semantic_tokens_rate_shape_range(trained, corpus):
    out, _ = trained
    codec = load_codec("offline", model=out)
    assert isinstance(codec, Codec) and isinstance(codec, OfflineCodec)
    assert (codec.name, codec.sample_rate, codec.frame_rate, codec.n_codebooks) == ("offline", 16000, 25.0, 1)
    assert codec.codebook_size == TINY["n_tokens"] and codec.can_decode
    clips = _clips(corpus[2])
    codes = codec.encode(clips, 16000)
    for clip, c in zip(clips, codes):
        assert c.dtype == np.int64 and c.shape == (1, math.ceil(clip.size / 640))
        assert c.min() >= 0 and c.max() < codec.codebook_size
    # a clip's tokens do not depend on its batch
    alone = [codec.encode([clip], 16000)[0] for clip in clips]
    assert all(np.array_equal(a, b) for a, b in zip(alone, codes))
    # other input rates are resampled: 8 kHz input, same duration -> same token count
    import soxr

    low = soxr.resample(clips[0], 16000, 8000).astype(np.float32)
    assert codec.encode([low], 8000)[0].shape[1] == math.ceil(low.size * 2 / 640)
    assert codec.n_frames(clips[0].size) == codes[0].shape[1]


def test_semantic_decode_lengths_and_prompts(trained, corpus):
    out, _ = trained
    codec = load_codec("offline", model=out, gl_iters=4)
    clips = _clips(corpus[2])
    codes = codec.encode(clips, 16000)
    plain = codec.decode(codes)
    with_audio = codec.decode(codes, prompt_audio=[clips[1], None, clips[0]])
    with_tokens = codec.decode(codes[1:], prompt=[codes[0], None])
    for c, y in zip(codes, plain):
        assert y.dtype == np.float32 and y.shape == (c.shape[1] * 640,) and np.all(np.isfinite(y))
    assert [y.shape for y in with_audio] == [y.shape for y in plain]
    assert not np.allclose(with_audio[0], plain[0])  # the prompt's voice changes the output
    np.testing.assert_array_equal(with_audio[1], plain[1])  # None -> the default voice
    import soxr

    low = soxr.resample(clips[1], 16000, 8000).astype(np.float32)  # prompts at other rates are resampled
    assert codec.decode(codes[:1], prompt_audio=[low], prompt_sample_rate=8000)[0].shape == plain[0].shape
    assert [y.shape for y in with_tokens] == [y.shape for y in plain[1:]]  # prompt frames are cut
    np.testing.assert_array_equal(with_tokens[1], plain[2])
    # decoding is deterministic
    np.testing.assert_array_equal(codec.decode(codes[:1])[0], plain[0])
    # 1-D token arrays are accepted for the single stream
    assert codec.decode([codes[0][0]])[0].shape == plain[0].shape
    with pytest.raises(CodecError, match="outside"):
        codec.decode([np.full((1, 5), codec.codebook_size)])
    with pytest.raises(CodecError, match="expected codes"):
        codec.decode([np.zeros((2, 5), dtype=np.int64)])
    with pytest.raises(CodecError):
        codec.decode(codes, prompt=[None])


def test_decoding_through_either_vocoder(trained, corpus):
    """The same tokens give Griffin-Lim or HiFi-GAN audio (arnar.codec.offline.vocoder) of one
    length and rate; the vocoder changes neither the tokens nor the codec's hash (token shards
    written with one stay valid for the other)."""
    out, _ = trained
    clips = _clips(corpus[2], 1)
    for stream, samples_per_frame in (("semantic", 640), ("rvq", 320)):
        gl = load_codec("offline", model=out, stream=stream, gl_iters=4)
        hg = load_codec("offline", model=out, stream=stream, vocoder="hifigan")
        codes = gl.encode(clips, 16000)
        np.testing.assert_array_equal(hg.encode(clips, 16000)[0], codes[0])
        assert hg.config_hash() == gl.config_hash()
        a, b = gl.decode(codes)[0], hg.decode(codes)[0]
        assert a.shape == b.shape == (codes[0].shape[1] * samples_per_frame,)
        assert b.dtype == np.float32 and np.all(np.isfinite(b)) and not np.allclose(a, b)
    with pytest.raises(CodecError, match="unknown vocoder"):
        load_codec("offline", model=out, vocoder="wavenet")


# --------------------------------------------------------------------------- RVQ stream


def test_rvq_stack_rate_shape_range_and_decode(trained, corpus):
    out, _ = trained
    codec = load_codec("offline", model=out, stream="rvq", gl_iters=4)
    assert (codec.name, codec.frame_rate, codec.n_codebooks, codec.codebook_size) == (
        "offline_rvq", 50.0, TINY["rvq_codebooks"], TINY["rvq_size"])
    clips = _clips(corpus[2], 2)
    codes = codec.encode(clips, 16000)
    for clip, c in zip(clips, codes):
        assert c.dtype == np.int64 and c.shape == (TINY["rvq_codebooks"], math.ceil(clip.size / 320))
        assert c.min() >= 0 and c.max() < codec.codebook_size
    audio = codec.decode(codes)
    assert [y.shape for y in audio] == [(c.shape[1] * 320,) for c in codes]
    assert all(y.dtype == np.float32 and np.all(np.isfinite(y)) for y in audio)
    # prompt tokens give context and are cut; prompt audio is accepted and unused by the stack
    assert codec.decode(codes[1:], prompt=[codes[0]])[0].shape == audio[1].shape
    np.testing.assert_array_equal(codec.decode(codes[:1], prompt_audio=[clips[1]])[0], audio[0])
    # the first quantizer decimates into CoD levels (12.5 / 25 / 50 Hz)
    coarse, mid, fine = levels(codes[0][0], 3)
    assert np.array_equal(fine, codes[0][0]) and coarse.size == math.ceil(codes[0].shape[1] / 4)
    # fewer codebooks: a prefix of the full stack, another hash
    one = load_codec("offline", model=out, stream="rvq", n_codebooks=1)
    assert one.n_codebooks == 1 and np.array_equal(one.encode(clips[:1], 16000)[0], codes[0][:1])
    assert one.config_hash() != codec.config_hash()
    with pytest.raises(CodecError, match="n_codebooks"):
        load_codec("offline", model=out, stream="rvq", n_codebooks=TINY["rvq_codebooks"] + 1)
    # the stream's own codec name
    assert load_codec("offline_rvq", model=out).config_hash() == codec.config_hash()


def test_streams_and_hashes_differ(trained):
    out, _ = trained
    semantic = load_codec("offline", model=out)
    rvq = load_codec("offline", model=out, stream="rvq")
    assert semantic.config_hash() != rvq.config_hash()
    assert codec_info(semantic)["frame_rate"] == 25.0 and codec_info(rvq)["n_codebooks"] == TINY["rvq_codebooks"]


def test_token_shards_round_trip(trained, corpus, tmp_path):
    out, _ = trained
    codec = load_codec("offline", model=out)
    clips = _clips(corpus[2])
    tokens = {f"u{i}": c for i, c in enumerate(codec.encode(clips, 16000))}
    write_token_shards(tmp_path, "test", tokens, codec)
    back = read_token_shards(tmp_path / "test", expect_codec_hash=load_codec("offline", model=out).config_hash())
    assert all(np.array_equal(back[k], v) for k, v in tokens.items())


def test_training_writes_the_token_set_tokenize_writes(trained, corpus, tmp_path):
    """The train split's tokens written by the codec's training, from its own front-end features,
    are byte for byte the set `arnar tokenize --codec offline` writes of the same clips (one
    clip at a time from the wav files, front end run again, one thread), and name the saved codec."""
    out, report = trained
    written = out.parent / "tokens" / "train"
    codec = load_codec("offline", model=out, threads=1)  # the tokenize rule's one-thread job
    wavs = corpus[2]
    tokens = {w.stem: c for w, c in zip(wavs, codec.encode([sf.read(str(w), dtype="float32")[0] for w in wavs], 16000))}
    write_token_shards(tmp_path, "train", tokens, codec)
    assert sorted(p.name for p in written.iterdir()) == sorted(p.name for p in (tmp_path / "train").iterdir())
    for f in (tmp_path / "train").iterdir():
        assert (written / f.name).read_bytes() == f.read_bytes(), f.name
    assert len(read_token_shards(written, expect_codec_hash=codec.config_hash())) == len(wavs)
    assert "train_tokens" in report["seconds"]


def test_semantic_tokens_from_inputs_refuses_the_rvq_stream(trained):
    out, _ = trained
    with pytest.raises(CodecError, match="RVQ stream"):
        load_codec("offline_rvq", model=out).semantic_tokens(None)


# --------------------------------------------------------------------------- loading errors, features


def test_loading_errors(tmp_path, trained):
    with pytest.raises(CodecError, match="not an offline codec folder"):
        load_codec("offline", model=tmp_path)
    with pytest.raises(CodecError, match="model="):
        load_codec("offline")
    out, _ = trained
    with pytest.raises(CodecError, match="stream"):
        load_codec("offline", model=out, stream="acoustic")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((out / "config.json").read_text())
    (broken / "weights.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CodecError, match="weights"):
        load_codec("offline", model=broken)


@pytest.mark.parametrize("analysis", ["stft25ms", "hifigan"])
def test_features_and_griffin_lim(analysis):
    rng = np.random.default_rng(0)
    t = np.arange(16000 + 123) / 16000
    clip = (0.3 * np.sin(2 * np.pi * 220 * t) + 0.01 * rng.standard_normal(t.size)).astype(np.float32)
    mel = log_mel(clip, analysis=analysis)
    assert mel.shape == (4 * math.ceil(clip.size / 640), 80) and mel.dtype == np.float32
    assert log_mel(clip, 2, analysis).shape == (2 * math.ceil(clip.size / 320), 80)
    y = mel_to_audio(mel, n_iter=8, analysis=analysis)
    assert y.shape == (mel.shape[0] * 160,)
    np.testing.assert_array_equal(y, mel_to_audio(mel, n_iter=8, analysis=analysis))
    # the resynthesis keeps the spectrum: its mel is close to the original's where there is energy
    again = log_mel(y[: clip.size], analysis=analysis)
    loud = mel > mel.max() - 4
    assert np.median(np.abs(again - mel)[loud]) < 0.5


def test_mel_analyses_differ_where_the_window_resolves_harmonics():
    """A 46.4 ms window (hifigan) resolves the harmonics of a 110 Hz voice in the low bands; a 25 ms
    one (stft25ms) smears neighbours together, so its low bands vary less from band to band. The
    two share the hop, the frame count and the bands' level on a sustained tone."""
    from arnar.codec.offline.features import MEL_ANALYSES, mel_analysis

    t = np.arange(16000) / 16000
    voice = sum(np.sin(2 * np.pi * 110 * k * t) / k for k in range(1, 30)).astype(np.float32) * 0.1
    narrow, wide = log_mel(voice, analysis="stft25ms"), log_mel(voice, analysis="hifigan")
    assert narrow.shape == wide.shape
    middle = slice(20, -20)
    ripple = [np.abs(np.diff(m[middle, :20], axis=1)).mean() for m in (narrow, wide)]
    assert ripple[1] > 1.5 * ripple[0]
    assert MEL_ANALYSES["hifigan"].n_fft == 1024 and MEL_ANALYSES["hifigan"].win == round(1024 * 16000 / 22050)
    with pytest.raises(ValueError, match="unknown mel analysis"):
        mel_analysis("stft10ms")


def test_mel_filters_from_the_cache_are_librosas(tmp_path, monkeypatch):
    """The codec's mel filterbank, kept in the cache folder after the first use, is
    librosa.filters.mel's (Slaney, 0-8 kHz) bit for bit, made once and read back the same."""
    import librosa

    from arnar.codec.offline import features

    monkeypatch.setenv("ARNAR_CACHE_DIR", str(tmp_path))
    want = librosa.filters.mel(sr=16000, n_fft=512, n_mels=80, fmin=0.0, fmax=8000).astype(np.float32)
    first = features._librosa_mel_filters(512)
    assert len(list((tmp_path / "mel").iterdir())) == 1
    np.testing.assert_array_equal(first, want)
    np.testing.assert_array_equal(features._librosa_mel_filters(512), want)
    wide = librosa.filters.mel(sr=16000, n_fft=1024, n_mels=80, fmin=0.0, fmax=8000).astype(np.float32)
    np.testing.assert_array_equal(features._librosa_mel_filters(1024), wide)  # one file per FFT size
    assert len(list((tmp_path / "mel").iterdir())) == 2
