"""The training engine (arnar.train) and its data (arnar.train.data) on tiny models and data.

The DDP check runs 2 CPU processes with gloo under torchrun (tests/ddp_worker.py); everything
else runs in this process.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ddp_worker import ADAM_EPS, toy_batch_examples, toy_paradigm  # noqa: E402  (registers toy_next)

from arnar.codec.shards import write_token_shards  # noqa: E402
from arnar.train.data import (  # noqa: E402
    BucketBatchSampler,
    TrainDataError,
    join_utterances,
    load_utterances,
    prompt_pairs,
    read_durations,
    vocab_for,
)
from arnar.paradigms.base import Utterance  # noqa: E402
from arnar.paradigms.base import collate  # noqa: E402
from arnar.train import (  # noqa: E402
    TrainError,
    build_optimizer,
    checkpoint_path,
    compose_config,
    learning_rate,
    load_model,
    main,
    optimizer_step,
    train,
)

CODEC = {"name": "toy", "config_hash": "toy-hash", "frame_rate": 25.0, "n_codebooks": 2, "codebook_size": 16,
         "sample_rate": 16000}
TINY = ["model=tiny", "model.dim=32", "model.n_layers=2", "model.n_heads=2", "train.progress=false"]


def write_spm(path: Path, vocab_size: int = 24) -> Path:
    import sentencepiece as spm

    words = "the cat sat on a mat and dog ran far away from home".split()
    sentences = [" ".join(words[i:] + words[:i]) for i in range(len(words))]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=buf, vocab_size=vocab_size,
                                   model_type="bpe", character_coverage=1.0, hard_vocab_limit=False,
                                   num_threads=1, minloglevel=2)
    path.write_bytes(buf.getvalue())
    return path


def toy_dataset(root: Path, n: int = 24, seed: int = 0, text_size: int = 24) -> dict[str, Path]:
    """Token shards (2 codebooks of 16 codes) + matching durations rows for ``n`` utterances."""
    rng = np.random.default_rng(seed)
    tokens, rows = {}, []
    for i in range(n):
        utt = f"spk{i % 3}_{i:04d}"
        T, L = int(rng.integers(8, 30)), int(rng.integers(2, 7))
        tokens[utt] = rng.integers(0, 16, size=(2, T))
        ends = np.sort(rng.integers(0, T + 1, size=L))
        ends[-1] = T
        rows.append({"utt_id": utt, "frame_rate": 25.0, "num_frames": T,
                     "bpe_ids": rng.integers(0, text_size, size=L).tolist(), "ends": ends.tolist()})
    split = write_token_shards(root / "tokens", "train", tokens, CODEC, shard_size=10)
    durations = root / "durations.jsonl"
    durations.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"tokens": split, "durations": durations}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("train_data")
    paths = toy_dataset(root)
    paths["bpe"] = write_spm(root / "bpe.model")
    dev = toy_dataset(root / "dev", n=6, seed=1)
    paths["dev_tokens"], paths["dev_durations"] = dev["tokens"], dev["durations"]
    return paths


def run_train(data, run_dir, overrides, **kwargs):
    cfg = compose_config([*TINY, *overrides])
    return train(cfg, run_dir=run_dir, train_tokens=data["tokens"], train_durations=data["durations"],
                 bpe_model=data["bpe"], **kwargs)


def logged(run_dir: Path, key: str) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    return [(r["step"], r[key]) for r in rows if key in r]


# ----------------------------------------------------------------------------- schedule

def test_learning_rate_warmup_then_cosine():
    lr = lambda s: learning_rate(s, lr=1.0, warmup_steps=10, max_steps=110, min_lr_ratio=0.1)  # noqa: E731
    assert lr(0) == pytest.approx(0.1)  # first update: 1/10 of the peak, not 0
    assert lr(4) == pytest.approx(0.5)
    assert lr(9) == pytest.approx(1.0)
    assert lr(10) == pytest.approx(1.0)  # cosine starts at the peak
    assert lr(60) == pytest.approx(0.55)  # half way: (1 + 0.1) / 2
    assert lr(35) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi / 4)))
    assert lr(110) == pytest.approx(0.1)
    assert lr(500) == pytest.approx(0.1)  # held at the floor after max_steps


def test_departures_from_papers_name_every_setting_no_paper_uses():
    from arnar.train.config import compose_config, departures_from_papers

    assert departures_from_papers(compose_config(["paradigm=ar"]), "bpe") == {}
    assert departures_from_papers(compose_config(["paradigm=cod"]), "phonemes") == {}  # CoD's paper reads phonemes
    assert departures_from_papers(compose_config(["paradigm=cod"]), "bpe") == {"text_units": "bpe"}
    ar = compose_config(["paradigm=ar", "data.prompt_pairs=0.5", "paradigm.options.input_noise=0.15"])
    assert departures_from_papers(ar, "phonemes") == {"data.prompt_pairs": 0.5, "paradigm.options.input_noise": 0.15,
                                                      "text_units": "phonemes"}
    sync = compose_config(["paradigm=syncspeech", "paradigm.options.finetune_spans=all"])
    assert departures_from_papers(sync, "bpe") == {"paradigm.options.finetune_spans": "all"}
    # a paradigm without the option (NAR has no input_noise) is not reported for it
    assert departures_from_papers(compose_config(["paradigm=nar"]), "bpe") == {}
    nar = compose_config(["paradigm=nar", "paradigm.options.text_positions=proportional"])
    assert departures_from_papers(nar, "bpe") == {"paradigm.options.text_positions": "proportional"}
    assert departures_from_papers(compose_config(["paradigm=palle_stage1"]), "bpe") == {}
    palle = compose_config(["paradigm=palle_stage1", "paradigm.options.span_scoring=suffix"])
    assert departures_from_papers(palle, "bpe") == {"paradigm.options.span_scoring": "suffix"}


# ----------------------------------------------------------------------------- bucket sampler

def test_bucket_sampler_budget_coverage_determinism():
    lengths = torch.randint(5, 60, (101,), generator=torch.Generator().manual_seed(0)).tolist()
    sampler = BucketBatchSampler(lengths, max_tokens=150, seed=3)
    batches = list(sampler)
    assert all(len(b) * max(lengths[i] for i in b) <= 150 for b in batches)
    assert sorted(i for b in batches for i in b) == list(range(101))  # every item exactly once
    # similar lengths together: spread inside a batch far below the data's spread
    assert np.mean([max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches]) < 10
    again = BucketBatchSampler(lengths, max_tokens=150, seed=3)
    assert list(again) == batches
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    assert epoch1 != batches and sorted(i for b in epoch1 for i in b) == list(range(101))
    assert BucketBatchSampler(lengths, max_tokens=150, seed=4).global_batches(0) != batches
    unshuffled = list(BucketBatchSampler(lengths, max_tokens=150, shuffle=False))
    assert [i for b in unshuffled for i in b] == sorted(range(101), key=lambda i: (lengths[i], i))


def test_bucket_sampler_ranks_resume_and_batch_size():
    lengths = [10 + (i * 7) % 40 for i in range(60)]
    full = BucketBatchSampler(lengths, max_tokens=100, seed=1).global_batches(2)
    ranks = [BucketBatchSampler(lengths, max_tokens=100, seed=1, rank=r, world_size=3) for r in range(3)]
    for s in ranks:
        s.set_epoch(2)
    per_rank = [list(s.indexed()) for s in ranks]
    assert len({len(p) for p in per_rank}) == 1 and len(per_rank[0]) == len(full) // 3
    items = [i for p in per_rank for _, b in p for i in b]
    assert len(items) == len(set(items))  # disjoint
    for p in per_rank:
        assert all(full[g] == b for g, b in p)  # each batch named by its index in the global list
    # resume: starting from local batch 2 gives the tail of the same sequence
    ranks[1].set_start(2)
    assert list(ranks[1]) == [b for _, b in per_rank[1][2:]]
    ranks[1].set_epoch(2)  # set_epoch starts the epoch from its first batch again
    assert len(list(ranks[1])) == len(per_rank[1])
    # uneven sharding for evaluation keeps every batch
    uneven = [list(BucketBatchSampler(lengths, max_tokens=100, shuffle=False, rank=r, world_size=4, even=False))
              for r in range(4)]
    assert sorted(i for p in uneven for b in p for i in b) == list(range(60))
    # fixed batch size; an item over the token budget is a batch of its own
    assert [len(b) for b in BucketBatchSampler(lengths, batch_size=7, shuffle=False)] == [7] * 8 + [4]
    over = list(BucketBatchSampler([5, 5, 500, 5], max_tokens=100, shuffle=False))
    assert [2] in over and sorted(i for b in over for i in b) == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        BucketBatchSampler(lengths)


# ----------------------------------------------------------------------------- data loading

def test_load_utterances_joins_skips_and_clips(tmp_path, caplog):
    rng = np.random.default_rng(0)
    tokens = {f"spk{i}_000{i}": rng.integers(0, 16, size=(2, 20)) for i in range(5)}
    tokens["spk9_only_tokens"] = rng.integers(0, 16, size=(2, 20))
    rows = [{"utt_id": u, "frame_rate": 25.0, "num_frames": 20, "bpe_ids": [1, 2, 3], "ends": [5, 12, 20]}
            for u in tokens if "only" not in u]
    rows[1].update(num_frames=21, ends=[5, 12, 21])  # one frame more than the tokens: clipped
    rows[2].update(num_frames=19, ends=[5, 12, 19])  # one frame less: the last end stretched to T
    rows[3].update(num_frames=23, ends=[5, 12, 23])  # 3 frames off: not the same audio, skipped
    rows.append({"utt_id": "spk8_only_durations", "frame_rate": 25.0, "num_frames": 4, "bpe_ids": [1], "ends": [4]})
    split = write_token_shards(tmp_path / "tok", "train", tokens, CODEC)
    durations = tmp_path / "d.jsonl"
    durations.write_text("".join(json.dumps(r) + "\n" for r in rows))

    utts, counts = join_utterances(dict(sorted(tokens.items())), read_durations(durations), codebook=1)
    assert [u.utt_id for u in utts] == ["spk0_0000", "spk1_0001", "spk2_0002", "spk4_0004"]
    assert (counts["no_durations"], counts["no_tokens"], counts["length_mismatch"], counts["clipped"]) == (1, 1, 1, 2)
    assert utts[0].speaker == "spk0" and utts[0].text.tolist() == [1, 2, 3]
    assert torch.equal(utts[0].speech, torch.from_numpy(tokens["spk0_0000"][1]).long())  # codebook 1
    assert all(int(u.ends[-1]) == u.num_frames == 20 for u in utts)
    assert utts[1].ends.tolist() == [5, 12, 20] and utts[2].ends.tolist() == [5, 12, 20]

    with caplog.at_level(logging.INFO, logger="arnar.train.data"):
        loaded = load_utterances(split, durations)
    assert [u.utt_id for u in loaded] == [u.utt_id for u in utts]
    line = next(r.getMessage() for r in caplog.records if "skipped" in r.getMessage())
    assert "length mismatch: 1" in line and "no durations: 1" in line and "no tokens: 1" in line
    assert len(join_utterances(tokens, read_durations(durations), max_frames=19)[0]) == 0
    with pytest.raises(TrainDataError, match="no utterance"):
        load_utterances(split, durations, max_frames=19)


def test_prompt_pairs_join_same_speaker_utterances_as_the_test_layout():
    def utt(utt_id, text, frames, ends):
        return Utterance(utt_id, utt_id.split("_")[0], torch.tensor(text), torch.arange(frames) + 100 * len(text),
                         torch.tensor(ends))

    utts = [utt("a_1", [1, 2], 5, [2, 5]), utt("a_2", [3], 4, [4]), utt("a_3", [4, 5, 6], 6, [1, 3, 6]),
            utt("b_1", [7], 3, [3])]  # speaker b has one utterance: it stays single
    assert prompt_pairs(utts, 0.0, seed=0) == utts
    joined = prompt_pairs(utts, 1.0, seed=0)
    assert len(joined) == len(utts) and joined[3] is utts[3]
    by_id = {u.utt_id: u for u in utts}
    for target, pair in zip(utts[:3], joined[:3]):
        prompt_id, target_id = pair.utt_id.split("+")
        prompt = by_id[prompt_id]
        # the target stays the second utterance; the prompt is another one of its speaker
        assert target_id == target.utt_id and prompt_id != target_id and prompt.speaker == pair.speaker == "a"
        assert pair.text.tolist() == prompt.text.tolist() + target.text.tolist()
        assert pair.speech.tolist() == prompt.speech.tolist() + target.speech.tolist()
        # a_n of the target's tokens counted from the joined speech's first frame (SyncSpeech Eq. 1)
        assert pair.ends.tolist() == prompt.ends.tolist() + [e + prompt.num_frames for e in target.ends.tolist()]
        assert int(pair.ends[-1]) == pair.num_frames
    # hand-worked: a_2's prompt among {a_1, a_3} from the seed, the same on every call
    assert [u.utt_id for u in prompt_pairs(utts, 1.0, seed=0)] == [u.utt_id for u in joined]
    half = prompt_pairs(utts, 0.5, seed=3)
    assert sum("+" in u.utt_id for u in half) == 2
    with pytest.raises(TrainDataError, match="prompt_pairs must lie in"):
        prompt_pairs(utts, 1.5, seed=0)
    featured = [Utterance("a_1", "a", torch.tensor([1]), torch.tensor([2]), None, {"phones": torch.tensor([1])})]
    with pytest.raises(TrainDataError, match="per-utterance features"):
        prompt_pairs(featured, 0.5, seed=0)


def test_load_utterances_errors_name_the_file(tmp_path, data):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(TrainDataError, match="nope.jsonl"):
        load_utterances(data["tokens"], missing)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"utt_id": "a", "frame_rate": 25, "num_frames": 3, "bpe_ids": [1], "ends": [3]}\n{oops\n')
    with pytest.raises(TrainDataError, match=r"bad\.jsonl:2"):
        load_utterances(data["tokens"], bad)
    bad.write_text('{"utt_id": "a", "frame_rate": 25, "num_frames": 3, "bpe_ids": [1, 2], "ends": [3]}\n')
    with pytest.raises(TrainDataError, match=r"bad\.jsonl:1: bpe_ids and ends"):
        load_utterances(data["tokens"], bad)
    with pytest.raises(TrainDataError, match="manifest"):
        load_utterances(tmp_path, data["durations"])
    rate = tmp_path / "rate.jsonl"
    rate.write_text(data["durations"].read_text().replace('"frame_rate": 25.0', '"frame_rate": 50.0'))
    with pytest.raises(TrainDataError, match="50.0"):
        load_utterances(data["tokens"], rate)
    copy_dir = tmp_path / "corrupt"
    copy_dir.mkdir()
    for f in data["tokens"].iterdir():
        (copy_dir / f.name).write_bytes(f.read_bytes())
    shard = sorted(copy_dir.glob("shard-*.npz"))[0]
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(TrainDataError, match=shard.name):
        load_utterances(copy_dir, data["durations"])
    with pytest.raises(TrainDataError, match="missing.model"):
        vocab_for(data["tokens"], tmp_path / "missing.model")
    vocab = vocab_for(data["tokens"], data["bpe"])
    assert (vocab.text_size, vocab.speech_size) == (24, 16)


# ----------------------------------------------------------------------------- one update

def _grads(model):
    return {k: p.grad.clone() for k, p in model.named_parameters()}


def test_grad_accumulation_equals_full_batch():
    reference = toy_paradigm()
    examples = toy_batch_examples(reference)
    merged, halves = collate(examples), [collate(examples[:2]), collate(examples[2:])]
    # what "the mean loss over the batch's targets" means, computed directly
    out = reference(merged)
    (out.loss_sum / out.n_targets).backward()
    expected = _grads(reference)

    one, two = toy_paradigm(), toy_paradigm()
    # ADAM_EPS: Adam's first update is ~lr * sign(grad), so a gradient of ~1e-9 would turn float
    # rounding between batch shapes into lr-sized differences; a larger eps also keeps the update
    # proportional to the gradient, so a wrong normalisation shows in the parameters
    opt_one = build_optimizer(one, lr=1e-3, weight_decay=0.1, eps=ADAM_EPS)
    opt_two = build_optimizer(two, lr=1e-3, weight_decay=0.1, eps=ADAM_EPS)
    r1 = optimizer_step(one, opt_one, [merged], lr=1e-3, grad_clip=0.0)
    r2 = optimizer_step(two, opt_two, halves, lr=1e-3, grad_clip=0.0)
    for name, p in one.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(dict(two.named_parameters())[name].grad, p.grad, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(dict(two.named_parameters())[name], p, atol=1e-6, rtol=0)
    assert r1.loss == pytest.approx(r2.loss, rel=1e-6) and r1.n_targets == r2.n_targets == int(out.n_targets)
    assert r1.grad_norm == pytest.approx(r2.grad_norm, rel=1e-5)
    assert set(r1.metrics) == {"correct"} and 0 <= r1.metrics["correct"] <= 1


def test_bf16_instructions_are_read_from_the_cpu_flags_line():
    from arnar.train.config import cpu_computes_bf16_natively

    zen4 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\nbugs\t\t: sysret_ss_attrs\n"
    sapphire_rapids = "flags\t\t: fpu avx2 avx512f amx_tile amx_bf16 amx_int8\n"
    avx2_only = "flags\t\t: fpu sse2 avx2 fma\nmodel name\t: AMD EPYC avx512_bf16 in a name is not a flag\n"
    assert cpu_computes_bf16_natively(zen4) and cpu_computes_bf16_natively(sapphire_rapids)
    assert not cpu_computes_bf16_natively(avx2_only)
    assert not cpu_computes_bf16_natively("")  # no flags line (not x86 Linux): float32


def test_host_record_reads_the_first_cpu_of_cpuinfo():
    from arnar.train.config import host_record

    two_cpus = ("processor\t: 0\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC 9R14\nstepping\t: 1\n"
                "flags\t\t: fpu avx2 avx512f avx512_bf16\n\nprocessor\t: 1\ncpu family\t: 6\nmodel\t\t: 143\n"
                "model name\t: another\nstepping\t: 8\nflags\t\t: fpu avx2\n")
    record = host_record(two_cpus)
    assert record["cpu"] == "AMD EPYC 9R14" and record["cpu_family_model_stepping"] == "25/17/1"
    assert record["bf16_instructions"] is True and record["torch"] == torch.__version__
    assert host_record("") == {**record, "cpu": None, "cpu_family_model_stepping": None, "bf16_instructions": None}


def test_precision_bf16_autocasts_on_a_cpu_and_auto_stays_float32():
    from arnar.train.config import TrainError, _autocast_dtype

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert _autocast_dtype("auto", cpu) is None and _autocast_dtype("fp32", cpu) is None
    assert _autocast_dtype("bf16", cpu) is torch.bfloat16
    assert _autocast_dtype("auto", cuda) is torch.bfloat16 and _autocast_dtype("fp32", cuda) is None
    with pytest.raises(TrainError, match="precision"):
        _autocast_dtype("fp16", cpu)
    # bf16_if_native: bf16 only where the hardware computes it, float32 on an emulating CPU
    assert _autocast_dtype("bf16_if_native", cpu, native_bf16=True) is torch.bfloat16
    assert _autocast_dtype("bf16_if_native", cpu, native_bf16=False) is None
    assert _autocast_dtype("bf16_if_native", cuda, native_bf16=False) is torch.bfloat16
    # the update under CPU autocast is a real bf16 update: close to float32's, not equal to it
    examples = toy_batch_examples(toy_paradigm())
    runs = {}
    for dtype in (None, torch.bfloat16):
        model = toy_paradigm()
        opt = build_optimizer(model, lr=1e-3, weight_decay=0.1, eps=ADAM_EPS)
        runs[dtype] = optimizer_step(model, opt, [collate(examples)], lr=1e-3, grad_clip=0.0, autocast_dtype=dtype)
    assert math.isfinite(runs[torch.bfloat16].loss)
    assert runs[torch.bfloat16].loss == pytest.approx(runs[None].loss, rel=0.02)
    assert runs[torch.bfloat16].loss != runs[None].loss


# ----------------------------------------------------------------------------- DDP

@pytest.fixture(scope="module")
def ddp_run(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    overrides = [*TINY, "paradigm=nar", "train.max_steps=2", "train.max_tokens=120", "train.grad_accum=1",
                 "train.ckpt_every=0", "train.log_every=1", "train.eval_every=0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[1] / "src"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(Path(__file__).with_name("ddp_worker.py")), str(out), str(data["tokens"]), str(data["durations"]),
           str(data["bpe"]), *overrides]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, overrides


def test_ddp_two_ranks_make_the_update_of_one_on_the_merged_batch(ddp_run):
    out, _ = ddp_run
    ddp = torch.load(out / "step.pt")
    single = toy_paradigm()
    optimizer = build_optimizer(single, lr=1e-3, weight_decay=0.1, eps=ADAM_EPS)
    result = optimizer_step(single, optimizer, [collate(toy_batch_examples(single))], lr=1e-3, grad_clip=1.0)
    for name, p in single.named_parameters():
        torch.testing.assert_close(ddp["grads"][name], p.grad, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(ddp["params"][name], p.detach(), atol=1e-6, rtol=0)
    assert ddp["loss"] == pytest.approx(result.loss, rel=1e-6)
    assert ddp["grad_norm"] == pytest.approx(result.grad_norm, rel=1e-5)


def test_ddp_training_run_equals_gradient_accumulation(ddp_run, data, tmp_path):
    out, overrides = ddp_run
    # 2 ranks x 1 micro-batch == 1 rank x 2 micro-batches: same data order, same example seeds
    single = tmp_path / "single"
    cfg = compose_config([*overrides, "train.grad_accum=2"])
    summary = train(cfg, run_dir=single, train_tokens=data["tokens"], train_durations=data["durations"],
                    bpe_model=data["bpe"])
    assert summary["steps"] == 2 and summary["world_size"] == 1
    ddp_summary = json.loads((out / "run" / "train_summary.json").read_text())
    assert ddp_summary["world_size"] == 2 and ddp_summary["tokens_seen"] == summary["tokens_seen"]
    for key in ("train/loss", "train/grad_norm", "train/correct"):
        a, b = logged(out / "run", key), logged(single, key)
        assert [s for s, _ in a] == [1, 2] and [s for s, _ in b] == [1, 2]
        assert [v for _, v in a] == pytest.approx([v for _, v in b], rel=1e-5), key
    ddp_weights = torch.load(out / "run" / "final.pt")["model"]
    for name, value in torch.load(single / "final.pt")["model"].items():
        torch.testing.assert_close(ddp_weights[name], value, atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------- resume

@pytest.mark.parametrize("paradigm", ["nar", "toy_next"])
def test_resume_is_exact(data, tmp_path, paradigm):
    overrides = [f"paradigm={'nar' if paradigm == 'nar' else 'ar'}", f"paradigm.name={paradigm}",
                 "model.dropout=0.2", "train.max_steps=6", "train.warmup_steps=2", "train.max_tokens=200",
                 "train.log_every=1", "train.ckpt_every=2", "train.keep_checkpoints=1", "train.eval_every=3"]
    dev = {"dev_tokens": data["dev_tokens"], "dev_durations": data["dev_durations"]}
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    full = run_train(data, straight, overrides, **dev)
    assert full["finished"] and full["steps"] == 6 and full["epochs"] > 1  # resume crosses an epoch
    part = run_train(data, resumed, overrides, stop_after_steps=3, **dev)
    assert not part["finished"] and not (resumed / "final.pt").exists()
    assert torch.load(resumed / "checkpoints" / "last.pt", weights_only=False)["step"] == 3
    with (resumed / "log.jsonl").open("a") as f:  # as if the run had logged step 4 and died before its checkpoint
        f.write(json.dumps({"step": 4, "train/loss": 0.0}) + "\n")
    rest = run_train(data, resumed, overrides, **dev)
    assert rest["steps"] == 6 and rest["finished"]

    losses = logged(straight, "train/loss")
    assert [s for s, _ in losses] == list(range(1, 7))
    assert logged(resumed, "train/loss") == losses  # exactly equal, row for row
    assert logged(resumed, "dev/loss") == logged(straight, "dev/loss") and len(logged(straight, "dev/loss")) == 2
    a, b = torch.load(straight / "final.pt")["model"], torch.load(resumed / "final.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)

    # run folder layout
    assert sorted(p.name for p in (resumed / "checkpoints").iterdir()) == ["last.pt", "step_6.pt"]
    assert (resumed / "config.yaml").is_file() and any((resumed / "tb").iterdir())
    summary = json.loads((resumed / "train_summary.json").read_text())
    assert summary["steps"] == 6 and summary["final_dev_loss"] is not None
    # The count by hand for the tiny config (dim 32, 2 layers, 2 heads of 16, ffn 64, no biases): per block
    # q, k, v, o 4 x 32 x 32 = 4096, SwiGLU 3 x 32 x 64 = 6144, two RMSNorms 2 x 32 = 64, so 10304; two
    # blocks and the final norm 20_640. Embedding and head are V x 32 each, V = 8 specials + the BPE's pieces
    # + 16 speech codes (the toy codec's codebook), the BPE size read from sentencepiece itself. Both
    # paradigms (nar, toy_next) are that backbone, embedding and head and nothing else, all trainable.
    import sentencepiece as spm

    text_size = spm.SentencePieceProcessor(model_file=str(data["bpe"])).get_piece_size()
    expected = 2 * (4 * 32 * 32 + 3 * 32 * 64 + 2 * 32) + 32 + 2 * (8 + text_size + 16) * 32
    assert summary["parameters"] == summary["trainable_parameters"] == expected
    model, cfg = load_model(resumed, "final")
    assert cfg.paradigm.name == paradigm and not model.training
    assert sum(p.numel() for p in model.parameters()) == expected  # the reloaded model is the one counted
    assert all(torch.equal(model.state_dict()[k], a[k]) for k in a)


def test_dropout_changes_without_rng_restore(data, tmp_path):
    """The resume test can fail: with dropout, a run whose RNG is not restored diverges."""
    overrides = ["paradigm=nar", "model.dropout=0.2", "train.max_steps=2", "train.max_tokens=200",
                 "train.log_every=1", "train.ckpt_every=1"]
    run_train(data, tmp_path / "a", overrides)
    run_train(data, tmp_path / "b", overrides, stop_after_steps=1)
    state = torch.load(tmp_path / "b" / "checkpoints" / "last.pt", weights_only=False)
    state["rng"][0]["torch"] = torch.manual_seed(99).get_state()
    torch.save(state, tmp_path / "b" / "checkpoints" / "last.pt")
    run_train(data, tmp_path / "b", overrides)
    assert logged(tmp_path / "a", "train/loss")[1] != logged(tmp_path / "b", "train/loss")[1]


# ----------------------------------------------------------------------------- command line

def test_main_parses_paths_and_overrides(data, tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["--run-dir", str(run), "--tokens", str(data["tokens"]), "--durations", str(data["durations"]),
            "--text-units", str(data["bpe"]), "--", "paradigm=ar", *TINY, "train.max_steps=1", "train.log_every=1"]
    assert main([*argv[:8], "--print-config", *argv[8:]]) == 0
    assert "max_steps: 1" in capsys.readouterr().out
    threads = torch.get_num_threads()
    try:
        assert main([*argv[:8], "--threads", "1", "--summary", str(tmp_path / "s" / "summary.json"), *argv[8:]]) == 0
    finally:
        torch.set_num_threads(threads)
    assert (run / "final.pt").is_file()
    written = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert written["steps"] == 1 and written["not_in_the_papers"] == {}  # AR on BPE, single utterances
    assert main([*argv, "train.no_such_key=1"]) == 2
    assert "no_such_key" in capsys.readouterr().err
    assert main(["--run-dir", str(run), "--tokens", str(tmp_path), "--durations", str(data["durations"]),
                 "--text-units", str(data["bpe"])]) == 2
    assert "manifest.json" in capsys.readouterr().err


def test_checkpoint_of_another_model_is_refused_and_a_fresh_start_clears(data, tmp_path):
    run_train(data, tmp_path, ["paradigm=ar", "train.max_steps=4", "train.ckpt_every=1", "train.log_every=1"])
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["last.pt", "step_3.pt", "step_4.pt"]
    with pytest.raises(TrainError, match="different model config"):
        run_train(data, tmp_path, ["paradigm=ar", "train.max_steps=2", "model.n_layers=1"])
    small = ["paradigm=ar", "train.max_steps=2", "model.n_layers=1", "train.ckpt_every=1", "train.log_every=1"]
    run_train(data, tmp_path, small, resume=False)  # the old run's step_3/4 must not outlive it
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["last.pt", "step_1.pt", "step_2.pt"]
    assert [s for s, _ in logged(tmp_path, "train/loss")] == [1, 2]
    model, cfg = load_model(tmp_path)  # "last"
    assert cfg.model.n_layers == 1 and len(model.backbone.layers) == 1
    with pytest.raises(TrainError, match="step_9.pt"):
        load_model(tmp_path, 9)


def test_a_run_trained_before_an_option_existed_still_resumes(data, tmp_path):
    run_train(data, tmp_path, ["paradigm=ar", "train.max_steps=2", "train.ckpt_every=1"])
    last = tmp_path / "checkpoints" / "last.pt"
    saved = torch.load(last, weights_only=False)
    # as a checkpoint written before data.prompt_pairs and AR's input_noise were options
    del saved["config"]["data"]["prompt_pairs"], saved["config"]["paradigm"]["options"]["input_noise"]
    torch.save(saved, last)
    run_train(data, tmp_path, ["paradigm=ar", "train.max_steps=3", "train.ckpt_every=1", "train.log_every=1"])
    # the first run logged its last step only (log_every 5); a fresh start would log 1, 2 and 3
    assert [s for s, _ in logged(tmp_path, "train/loss")] == [2, 3]
    # a value other than the one the old run trained with is another run
    with pytest.raises(TrainError, match="different data config"):
        run_train(data, tmp_path, ["paradigm=ar", "train.max_steps=4", "data.prompt_pairs=0.5"])


def test_best_dev_weights_are_kept_and_used(data, tmp_path):
    """Small corpora overfit: best.pt holds the weights of the lowest dev loss, and checkpoint
    "best" (synthesis, later stages) loads them; without dev data "best" falls back to final.pt."""
    overrides = ["paradigm=ar", "train.max_steps=8", "train.warmup_steps=1", "train.lr=0.05", "train.max_tokens=200",
                 "train.eval_every=2", "train.ckpt_every=0", "train.log_every=1"]
    run_dir = tmp_path / "best"
    summary = run_train(data, run_dir, overrides, dev_tokens=data["dev_tokens"], dev_durations=data["dev_durations"])
    dev = dict(logged(run_dir, "dev/loss"))
    assert sorted(dev) == [2, 4, 6, 8]
    best_step = min(dev, key=dev.get)
    assert summary["best_step"] == best_step and summary["best_dev_loss"] == dev[best_step]
    best = torch.load(run_dir / "best.pt", weights_only=False)
    assert best["step"] == best_step
    model, _ = load_model(run_dir, "best")
    assert all(torch.equal(model.state_dict()[k], best["model"][k]) for k in best["model"])
    plain = run_train(data, tmp_path / "no_dev", overrides)
    assert plain["best_step"] is None and not (tmp_path / "no_dev" / "best.pt").exists()
    assert checkpoint_path(tmp_path / "no_dev", "best") == tmp_path / "no_dev" / "final.pt"


def test_second_stage_restarts_when_its_first_stage_changed(data, tmp_path, caplog):
    """A run started from another (train.init_from) resumes only while that run is unchanged:
    retraining the first stage makes the second start afresh from the new weights."""
    first, second = tmp_path / "first", tmp_path / "second"
    paths = ["--tokens", str(data["tokens"]), "--durations", str(data["durations"]), "--text-units", str(data["bpe"])]
    common = ["paradigm=ar", *TINY, "train.max_steps=4", "train.log_every=1", "train.ckpt_every=1"]
    assert main(["--run-dir", str(first), *paths, "--", *common]) == 0
    stage_two = ["--run-dir", str(second), *paths, "--resume-if-compatible",
                 "--fresh-if-older-than", str(first / "final.pt"), "--", *common, f"train.init_from={first}"]
    assert main([*stage_two[:-len(common) - 2], "--stop-after", "2", *stage_two[-len(common) - 2:]]) == 0
    assert torch.load(second / "checkpoints" / "last.pt", weights_only=False)["step"] == 2
    # unchanged first stage: the second resumes at step 2
    with caplog.at_level("INFO", logger="arnar.train"):
        assert main(stage_two) == 0
    assert "resumed" in caplog.text and "initialised from" not in caplog.text
    # the first stage is retrained: the second starts afresh from it
    assert main(["--run-dir", str(first), *paths, "--no-resume", "--", *common, "train.seed=7"]) == 0
    os.utime(first / "final.pt")  # newer than the second run's checkpoint even on coarse clocks
    caplog.clear()
    with caplog.at_level("INFO", logger="arnar.train"):
        assert main(stage_two) == 0
    assert "starting this run afresh" in caplog.text and f"initialised from {first}" in caplog.text


def test_matching_init_starts_another_paradigm_from_the_trained_ar(tmp_path):
    """training.start_from_ar (train.init_matching): a run of another paradigm loads every tensor
    of the AR checkpoint whose name and shape it has, nested networks included (PALLE's
    stage_one.backbone... reads AR's backbone...), and keeps its own fresh tensors (SyncSpeech's
    duration head, PALLE's text encoder); a model sharing nothing with the source is refused, and
    so is another vocabulary. Strict init_from still refuses a model of another paradigm."""
    from arnar.paradigms import build_paradigm
    from arnar.paradigms.base import Vocab
    from arnar.train import Distributed, _init_from
    from arnar.train.checkpoints import matching_tensors

    vocab, tiny = Vocab(text_size=10, speech_size=20), {"dim": 32, "n_layers": 2, "n_heads": 4, "dropout": 0.0}
    torch.manual_seed(0)
    ar = build_paradigm("ar", vocab, tiny)
    with torch.no_grad():
        for weight in ar.parameters():
            weight.normal_(std=0.5)
    source = ar.state_dict()
    torch.save({"model": source, "vocab": vocab.to_dict(), "step": 9, "paradigm": "ar"}, tmp_path / "best.pt")

    # hand-worked matching: exact names first, then a nested name ending in "." + the source's
    shaped = {"embed.weight": torch.zeros(3, 2), "head.weight": torch.zeros(2, 2)}
    nested = {"stage_one.embed.weight": torch.ones(3, 2), "stage_one.head.weight": torch.ones(5, 2),
              "embed.weight": torch.ones(3, 2), "flag": torch.ones(())}
    assert set(matching_tensors(shaped, nested)) == {"stage_one.embed.weight", "embed.weight"}

    torch.manual_seed(1)
    sync = build_paradigm("syncspeech", vocab, tiny, stage="pretrain")
    fresh_head = sync.duration_head.weight.detach().clone()
    _init_from(sync, tmp_path, vocab, Distributed(), matching=True)
    loaded = sync.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in source.items())  # AR's every tensor, the head included
    assert torch.equal(sync.duration_head.weight, fresh_head)

    torch.manual_seed(2)
    palle = build_paradigm("palle", vocab, tiny, stage=1)
    fresh_encoder = {k: v.clone() for k, v in palle.stage_one.text_encoder.state_dict().items()}
    with pytest.raises(TrainError, match="does not fit"):
        _init_from(palle, tmp_path, vocab, Distributed())
    _init_from(palle, tmp_path, vocab, Distributed(), matching=True)
    backbone = {k: v for k, v in source.items() if k.startswith("backbone.")}
    assert backbone and all(torch.equal(palle.stage_one.state_dict()[k], v) for k, v in backbone.items())
    assert torch.equal(palle.stage_one.embed.weight, source["embed.weight"])
    assert all(torch.equal(palle.stage_one.text_encoder.state_dict()[k], v) for k, v in fresh_encoder.items())
    assert not bool(palle.stage_two_initialised)

    wider = build_paradigm("nar", vocab, {**tiny, "dim": 48})
    with pytest.raises(TrainError, match="shares no tensor"):
        _init_from(wider, tmp_path, vocab, Distributed(), matching=True)
    with pytest.raises(TrainError, match="vocabulary"):
        _init_from(build_paradigm("nar", Vocab(text_size=11, speech_size=20), tiny), tmp_path,
                   Vocab(text_size=11, speech_size=20), Distributed(), matching=True)
