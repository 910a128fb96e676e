"""Coarse token kinds for CoD Table V (``arnar.codec.coarse``): pooling by hand, every kind built on
a tiny offline codec trained here (flite speech, as tests/test_offline_codec.py), lengths and codes
checked against the codec, the prompt path of CoD.prepare_request, and the errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import soundfile as sf
import torch

from arnar.codec.base import CodecError
from arnar.codec.coarse import CoarseTokenizer, build_coarse_tokens, main, pool
from arnar.codec.offline import OfflineCodec
from arnar.paradigms import build_paradigm
from arnar.paradigms.base import SynthesisRequest, Vocab
from test_offline_codec import TINY, corpus, trained  # noqa: F401  (module fixtures: a tiny codec)


def test_pool_averages_groups_and_a_partial_last_group():
    latents = torch.tensor([[1.0, 10.0], [3.0, 20.0], [5.0, 30.0]])
    assert pool(latents, 2).tolist() == [[2.0, 15.0], [5.0, 30.0]]
    assert pool(latents, 4).tolist() == [[3.0, 20.0]]
    assert pool(latents, 1).tolist() == latents.tolist()


@pytest.fixture(scope="module")
def splits(corpus, tmp_path_factory):  # noqa: F811
    """Cut manifests and CoD features tables (phonemes and speaker stand-ins) of two splits."""
    cuts_path, _, _ = corpus
    cuts = [json.loads(line) for line in cuts_path.read_text().splitlines()]
    out = tmp_path_factory.mktemp("coarse_splits")
    result = []
    for name, part in (("train", cuts[:6]), ("dev", cuts[6:])):
        manifest = out / f"{name}_cuts.jsonl"
        manifest.write_text("".join(json.dumps(c) + "\n" for c in part))
        table = {c["id"]: {"phonemes": torch.tensor([1, 2, 3]), "speaker": torch.zeros(8)} for c in part}
        features = out / f"cod_{name}.pt"
        torch.save(table, features)
        result.append((manifest, features, out / f"cod_coarse_{name}.pt"))
    return result, {c["id"]: c["recording"]["sources"][0]["source"] for c in cuts}


@pytest.mark.parametrize("kind,levels", [("independent", 3), ("shared", 3), ("units", 2)])
def test_each_kind_has_the_lengths_and_codes_cod_expects(kind, levels, trained, splits, tmp_path):  # noqa: F811
    model, _ = trained
    split_files, wav_of = splits
    folder = tmp_path / f"coarse_{kind}"
    tokenizer = build_coarse_tokens(kind, levels, model, split_files, folder, seed=3, iters=3, progress=False)
    rvq = OfflineCodec(model, stream="rvq")
    size = TINY["rvq_size"]
    loaded = CoarseTokenizer.load(folder)
    assert (loaded.kind, loaded.n_levels, len(loaded.codebooks)) == (kind, levels, levels - 1)
    for _, _, out in split_files:
        table = torch.load(out, weights_only=True)
        for utt, row in table.items():
            audio, rate = sf.read(wav_of[utt], dtype="float32")
            T = rvq.encode([audio], rate)[0].shape[1]
            assert set(row) == {"phonemes", "speaker", "coarse"} and len(row["coarse"]) == levels - 1
            for codes, factor in zip(row["coarse"], [2 ** (levels - level) for level in range(1, levels)]):
                assert len(codes) == math.ceil(T / factor)
                assert codes.dtype == torch.long and 0 <= int(codes.min()) and int(codes.max()) < size
            # the saved tokenizer encodes an utterance as the build did
            assert [c.tolist() for c in loaded.levels(audio, rate)] == [c.tolist() for c in row["coarse"]]
    if kind == "shared":  # the codec's own first codebook on pooled latents, by hand
        assert all(torch.equal(cb, rvq.codebooks[0]) for cb in loaded.codebooks)
        audio, rate = sf.read(wav_of["rms_0"], dtype="float32")
        pooled = pool(rvq.latents(audio, rate), 4).numpy()
        distances = ((pooled[:, None, :] - rvq.codebooks[0].numpy()[None]) ** 2).sum(-1)
        assert loaded.levels(audio, rate)[0].tolist() == distances.argmin(1).tolist()
    else:  # codebooks of their own, fitted on the latents of the first split only
        dims = TINY["bottleneck"] if kind == "units" else 160
        assert all(tuple(cb.shape) == (size, dims) for cb in loaded.codebooks)
        again = build_coarse_tokens(kind, levels, model, split_files[:1], tmp_path / "again", seed=3, iters=3,
                                    progress=False)
        assert all(torch.equal(a, b) for a, b in zip(again.codebooks, tokenizer.codebooks))
    assert json.loads((folder / "config.json").read_text())["fitted_on"] == str(split_files[0][0])


def test_skip_frames_drops_whole_finest_frames(trained, corpus):  # noqa: F811
    model, _ = trained
    _, _, wavs = corpus
    audio, rate = sf.read(str(wavs[0]), dtype="float32")
    tokenizer = CoarseTokenizer("shared", 2, str(model), [OfflineCodec(model, stream="rvq").codebooks[0]])
    # 3 frames of 20 ms at 16 kHz: 960 samples
    assert [c.tolist() for c in tokenizer.levels(audio, rate, skip_frames=3)] == \
        [c.tolist() for c in tokenizer.levels(audio[960:], rate)]


def test_cod_prepare_request_encodes_the_trimmed_prompt(trained, corpus, splits, tmp_path):  # noqa: F811
    model, _ = trained
    _, _, wavs = corpus
    split_files, _ = splits
    folder = tmp_path / "coarse_independent"
    tokenizer = build_coarse_tokens("independent", 3, model, split_files[:1], folder, iters=2, progress=False)
    vocab = Vocab(text_size=10, speech_size=TINY["rvq_size"])
    torch.manual_seed(0)
    cod = build_paradigm("cod", vocab, {"dim": 32, "n_layers": 1, "n_heads": 2, "dropout": 0.0}, speaker_dim=8,
                         n_phonemes=64, duration_dim=16, duration_layers=1, coarse_tokenizer=str(folder)).eval()

    class FixedEncoder:  # stands in for resemblyzer: the test is about the coarse prompt
        def embed(self, audio, sample_rate):
            return np.zeros((1, 8), dtype=np.float32)

    cod._speaker_encoder_cache = FixedEncoder()
    audio, rate = sf.read(str(wavs[1]), dtype="float32")
    prompt_codes = torch.from_numpy(OfflineCodec(model, stream="rvq").encode([audio], rate)[0][0])
    request = SynthesisRequest(torch.tensor([1]), torch.tensor([2]), prompt_codes, target_frames=9)
    out = cod.prepare_request(request, text="A plan.", prompt_text="The river.", prompt_audio=audio,
                              sample_rate=rate)
    skip = len(prompt_codes) % 4
    kept = len(prompt_codes) - skip
    expected = tokenizer.levels(audio, rate, skip_frames=skip)
    assert [c.tolist() for c in out.features["prompt_coarse"]] == [c.tolist() for c in expected]
    assert [len(c) for c in out.features["prompt_coarse"]] == [kept // 4, kept // 2]
    gen = cod.generate(out, torch.Generator().manual_seed(0), steps=1)
    assert gen.speech.shape == (9,)
    assert gen.info["level_lengths"] == [kept // 4 + 3, kept // 2 + 5, kept + 9]


def test_errors_name_the_problem(trained, tmp_path, capsys):  # noqa: F811
    model, _ = trained
    with pytest.raises(ValueError, match="expected one of"):
        CoarseTokenizer("hubert", 2, str(model), [torch.zeros(1)])
    with pytest.raises(ValueError, match="levels must be 2"):
        CoarseTokenizer("units", 3, str(model), [torch.zeros(1)] * 2)
    with pytest.raises(ValueError, match="at least 2 levels"):
        CoarseTokenizer("shared", 1, str(model), [])
    with pytest.raises(CodecError, match="not a coarse token folder"):
        CoarseTokenizer.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(CodecError, match="format 'other'"):
        CoarseTokenizer.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"format": "arnar-cod-coarse/1"}))
    (tmp_path / "codebooks.pt").write_bytes(b"")
    with pytest.raises(CodecError, match="codebooks.pt: unreadable"):
        CoarseTokenizer.load(tmp_path)
    missing = tmp_path / "nope.jsonl"
    assert main(["--kind", "shared", "--levels", "3", "--codec-model", str(model), "--split", str(missing),
                 str(tmp_path / "f.pt"), str(tmp_path / "o.pt"), "--out", str(tmp_path / "t"), "--no-progress"]) == 2
    assert "nope.jsonl" in capsys.readouterr().err
