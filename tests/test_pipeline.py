"""End to end: the whole DAG on the smoke profile, as a user runs it.

The workflow files are copied into a temporary folder and Snakemake runs there for real
(synthesizers, ingest, alignment, codec, training, synthesis, evaluation, report). One run per
test session (the `smoke` fixture, tests/conftest.py) feeds the checks here and elsewhere.
"""

import json
import re
import shutil

import pytest

from smoke_dag import BIN, copy_workflow, run, snakemake, tree_digest

pytestmark = pytest.mark.slow
def test_smoke_data_phase_outputs(smoke):
    data = smoke / "data" / "smoke"
    stats = json.loads((smoke / "results/smoke/data/corpus.json").read_text())
    assert stats["speakers"] == 6
    assert stats["quarantined"]["total"] == 0
    assert stats["splits"]["test"]["speakers"] == 2  # held-out speakers
    assert stats["splits"]["train"]["utterances"] > 0 and stats["splits"]["dev"]["utterances"] > 0
    for split in ("train", "dev", "test"):
        assert (data / "manifests" / f"{split}_cuts.jsonl").exists()
    assert (data / "tokenizers" / "bpe.model").stat().st_size > 0
    tok = json.loads((smoke / "results/smoke/data/tokenizers.json").read_text())
    assert tok["bpe"]["vocab_size"] > 0


def test_rebuild_is_byte_identical(smoke, tmp_path):
    other = copy_workflow(tmp_path / "again")
    snakemake(other, "data")
    for phase in ("corpus", "manifests", "tokenizers"):
        a = tree_digest(smoke / "data/smoke" / phase)
        b = tree_digest(other / "data/smoke" / phase)
        assert a and a == b, phase


def test_lint_is_clean(smoke):
    result = snakemake(smoke, "--lint", check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Lints for" not in result.stdout + result.stderr


def test_bad_params_stop_with_the_key_named(tmp_path):
    work = copy_workflow(tmp_path / "bad")
    params = work / "params.yaml"
    params.write_text(params.read_text().replace("seed: 1234", "seed: many"))
    result = snakemake(work, "-n", check=False)
    assert result.returncode != 0
    assert "seed: 'many' is not of type 'integer'" in result.stdout + result.stderr


def test_evaluation_and_report(smoke):
    results = smoke / "results/smoke"
    for task in ("continuation", "cross_sentence"):
        r = json.loads((results / f"eval/ground_truth/{task}.json").read_text())
        assert r["items"] == 6 and r["missing"] == []
        wer = r["asr"]["moonshine"]  # the smoke profile's judge
        assert 0 <= wer["wer_corpus"] < 60 and 0 <= wer["wer_utterance_mean"] < 60
        assert r["sim"]["mean"] > 0.7  # ground truth against a prompt of the same speaker
    audit = json.loads((results / "eval/ground_truth_audit.json").read_text())
    separation = audit["sim"]["same_vs_different_speaker"]
    assert separation["same_mean"] > separation["different_mean"] and separation["auc"] > 0.9
    metrics = json.loads((results / "metrics.json").read_text())
    # smoke trains a tiny offline codec (two resynthesis rows), every paradigm (two seeds each), the
    # ablations and the grids
    assert set(metrics) == {"ground_truth", "resynth_offline", "resynth_offline_rvq", *SYSTEMS, *SEED2, *CROSS_ONLY,
                            "ground_truth_audit"}
    assert set(metrics["delta_mu1.0"]) == {"cross_sentence"}  # grids speak training.grid_tasks only
    table = (results / "report/comparison.md").read_text()
    assert "| ground_truth |" in table and "WER-M corpus" in table
    assert re.search(r"\| ar \| 0\.\d\dM \| \d+\.\d\d ± \d+\.\d\d \|", table)  # mean ± sd over the 2 seeds
    for ablation in ("Chain-of-Details: temporal levels", "DELTA-TTS: unmasking steps", "PALLE: stages",
                     "SyncSpeech: pre-training and attention mask", "DELTA-TTS: time-shifted schedule", "SyncSpeech: look-ahead text tokens",
                     "PALLE: total duration multiplier (x ground-truth duration)", "Claims of the papers, tested on this run",
                     "Chain-of-Details: coarse token types", "Chain-of-Details: guidance form"):
        assert f"### {ablation}" in table
    assert re.search(r"\| The hybrid mask beats a causal mask \| SyncSpeech \(arXiv:2502\.11094\) Table 2 \| Cross-sentence \| wer \|"
                     r" syncspeech \d+\.\d\d ± \d+\.\d\d \| syncspeech_causal \d+\.\d\d \|"
                     r" -?\d+\.\d\d \[-?\d+\.\d\d, -?\d+\.\d\d\] \| \*\*(reproduced|tie|reversed|neither speaks)\*\* \|",
                     table)
    assert "### Training" in table and re.search(r"\| nar \| nar \| (0\.\d\dM) \| \1 \| – \| 2 x 32 \| 30 \|", table)
    assert re.search(r"\| palle \| palle \| [\d.]+M \| [\d.]+M \| 177\.0M \|", table)
    delta = re.search(r"\| delta \| delta \| ([\d.]+)M \| ([\d.]+)M \| 494\.0M \|", table)
    assert delta and float(delta[2]) < float(delta[1])  # the conversion trains adapters and conv modules only
    for plot in ("systems.png", "ground_truth_wer_per_voice.png", "sim_pairs.png", "wer_vs_rtf.png",
                 "grid_delta_steps.png", "grid_palle_duration.png"):
        assert (results / "report/plots" / plot).stat().st_size > 10_000


SYSTEMS = ["ar", "nar", "syncspeech", "palle_stage1", "palle", "palle_concat_stage1", "palle_concat", "delta", "cod",
           "cod_paper"]  # the comparison: both tasks
SEED2 = [f"{s}_seed2" for s in SYSTEMS]  # evaluation.synthesis_seeds: 2
CROSS_ONLY = ["syncspeech_nopretrain", "syncspeech_causal", "cod_l1", "cod_l2", "syncspeech_q2", "delta_steps4",
              "delta_mu1.0", "palle_dur0.7", "palle_dur1.0", "cod_ind", "cod_shared", "cod_units",
              "cod_guidance_interpolate"]  # ablations, grids (the guidance form: cod.py's default is extrapolate)
RUNS = ["ar", "nar", "syncspeech_pretrain", "syncspeech", "palle_stage1", "palle", "palle_concat_stage1", "palle_concat",
        "delta", "cod", "cod_l2", "cod_l1",
        "syncspeech_nopretrain", "syncspeech_causal_pretrain", "syncspeech_causal", "syncspeech_q2",
        "cod_ind", "cod_shared", "cod_units", "cod_paper"]


def test_paradigms_train_and_speak_every_item(smoke):
    """The training phase: every run finished (multi-stage runs chained), and every system spoke
    every test item with its forward passes counted and its first-packet latency measured."""
    for run in RUNS:
        summary = json.loads((smoke / f"results/smoke/train/{run}.json").read_text())
        assert summary["finished"] and summary["steps"] == 30, run
        assert (smoke / f"data/smoke/runs/{run}/final.pt").exists()
    assert "initialised from data/smoke/runs/palle_stage1/best.pt" in (smoke / "logs/smoke/train_palle.log").read_text()
    # PALLE on the concatenation layout: stage one starts from ar's tensors, stage two from stage one
    concat_log = (smoke / "logs/smoke/train_palle_concat_stage1.log").read_text()
    assert re.search(r"initialised \d+ of \d+ tensors from data/smoke/runs/ar/best.pt", concat_log)
    assert "layout: concat" in (smoke / "data/smoke/runs/palle_concat/config.yaml").read_text()
    # CoD generates the whole stack (smoke's offline_rvq has 2 codebooks), its audio decoded from both
    assert "codebooks: 2" in (smoke / "data/smoke/runs/cod/config.yaml").read_text()
    cod_timing = (smoke / "data/smoke/systems/cod/cross_sentence/timing.jsonl").read_text().splitlines()
    assert all(json.loads(line)["codebooks"] == 2 for line in cod_timing)
    causal = (smoke / "data/smoke/runs/syncspeech_causal/config.yaml").read_text()
    assert "attention: causal" in causal and "syncspeech_causal_pretrain" in causal
    for run, kind in (("cod_ind", "independent"), ("cod_shared", "shared"), ("cod_units", "units")):  # CoD Table V
        config = (smoke / f"data/smoke/runs/{run}/config.yaml").read_text()
        assert f"coarse_tokenizer: data/smoke/codec/coarse_{kind}" in config and f"cod_{kind}_train.pt" in config
        assert json.loads((smoke / f"data/smoke/codec/coarse_{kind}/config.json").read_text())["kind"] == kind
    # the paper's CoD (voice from the speaker embedding only), otherwise trained as cod
    assert "speech_prompt: false" in (smoke / "data/smoke/runs/cod_paper/config.yaml").read_text()
    assert "speech_prompt: true" in (smoke / "data/smoke/runs/cod/config.yaml").read_text()
    q2 = (smoke / "data/smoke/runs/syncspeech_q2/config.yaml").read_text()
    assert "q: 2" in q2 and "syncspeech_pretrain" in q2  # a training-time grid value: its own fine-tuning run
    for system in SYSTEMS + SEED2 + CROSS_ONLY:
        for task in ("continuation", "cross_sentence") if system not in CROSS_ONLY else ("cross_sentence",):
            folder = smoke / f"data/smoke/systems/{system}/{task}"
            timing = [json.loads(line) for line in (folder / "timing.jsonl").read_text().splitlines()]
            batched = [json.loads(line) for line in (folder / "batched.jsonl").read_text().splitlines()]
            # smoke decodes in batches of 4 and times 3 of its 6 items alone (timing_items)
            assert len(timing) == 3 and len(batched) == 3 and len(list(folder.glob("*.wav"))) == 6
            assert all(r["batch_size"] == 3 for r in batched) and not any("batch_size" in r for r in timing)
            for record in timing:
                assert record["fpl_a"] > 0 and record["forward_passes"] >= 1
                # the first packet's tokens exist no later than the whole utterance's
                assert record["fpl_a"] <= record["token_seconds"] + 1e-6, (system, record)
                if system.startswith("syncspeech"):  # SyncSpeech Eq. 7: it starts after q + 1 text tokens
                    q = 2 if system == "syncspeech_q2" else 1
                    assert record["text_tokens_to_start"] == q + 1, (system, record)
                elif "text_tokens_to_start" in record:  # a model that reads the whole text first
                    assert record["text_tokens_to_start"] == record["text_tokens_waited"], (system, record)
                if system == "nar":
                    assert record["forward_passes"] == 16  # its MaskGIT steps
                if system == "ar":  # one pass per generated token (+1 when it stopped at <eos>)
                    assert record["forward_passes"] in (record["generated_frames"], record["generated_frames"] + 1)
                if system == "palle_stage1":
                    assert record["refine_passes"] == 0
                if system.startswith("delta_steps"):  # at most its steps (a step with nothing to commit is skipped)
                    assert record["forward_passes"] <= int(system.removeprefix("delta_steps"))
        if system.startswith("syncspeech"):  # streaming: a first packet that needed fewer passes than the
            # whole utterance came sooner than the whole token stage
            streamed = [r for r in timing if r.get("first_packet_passes", r["forward_passes"]) < r["forward_passes"]]
            assert streamed and all(r["fpl_a"] < r["token_seconds"] for r in streamed), (system, timing)
        evaluation = json.loads((smoke / f"results/smoke/eval/{system}/cross_sentence.json").read_text())
        assert evaluation["speed"]["fpl_l"] > evaluation["speed"]["fpl_a"]
    # a second synthesis seed is a second sample of the same checkpoint: the audio differs
    first, second = (smoke / "data/smoke/systems/ar/cross_sentence", smoke / "data/smoke/systems/ar_seed2/cross_sentence")
    assert any((first / w.name).read_bytes() != w.read_bytes() for w in second.glob("*.wav"))
    # the duration multiplier scales the ground-truth length: 0.7x speaks fewer frames than 1.0x
    frames = {m: sum(json.loads(line)["generated_frames"] for line in
                     (smoke / f"data/smoke/systems/palle_dur{m}/cross_sentence/timing.jsonl").read_text().splitlines())
              for m in ("0.7", "1.0")}
    assert frames["0.7"] < frames["1.0"]


CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--virtual-time-budget=5000",
]


def test_html_report_renders_with_working_audio(smoke, tmp_path):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (scripts/setup.sh installs it)")
    page = smoke / "results/smoke/report/index.html"
    result = run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                  page.as_uri()], tmp_path, timeout=120)
    players = re.findall(r"<audio[^>]*>", result.stdout)
    # 2 tasks x 2 samples x (prompt + ground truth + 2 resynthesis rows + the 10 systems of the comparison)
    assert len(players) == 2 * 2 * (1 + 1 + 2 + len(SYSTEMS)) == 56
    assert all('data-state="loaded"' in p for p in players), players
    assert "<h1>arnar report" in result.stdout


def test_frozen_testlist_mismatch_stops_the_run(smoke, tmp_path):
    work = tmp_path / "changed"
    shutil.copytree(smoke, work, symlinks=True)
    frozen = work / "src/arnar/evaluate/testlists/smoke/continuation.tsv"
    lines = frozen.read_text().splitlines(keepends=True)
    frozen.write_text("".join(lines[:-1]))  # drop one item from the committed list
    result = run([str(BIN / "snakemake"), "--cores", "2", "testlists", "--forcerun", "testlists",
                  "--config", "profile=smoke"], work, check=False)
    log = (work / "logs/smoke/testlists.log").read_text()
    assert result.returncode != 0
    assert "does not match the corpus (1 new items" in log and "arnar testlists --write" in log


def test_alignment_phase(smoke):
    accuracy = json.loads((smoke / "results/smoke/alignment/accuracy_pocketsphinx.json").read_text())
    overall = accuracy["groups"]["overall"]
    assert overall["aligned"] > 0 and overall["word"]["median_ms"] < 40  # pocketsphinx vs the synthesizer
    assert "| **overall** |" in (smoke / "results/smoke/alignment.md").read_text()
    for split in ("train", "dev", "test"):
        rows = [json.loads(line) for line in (smoke / f"data/smoke/align/durations_25hz/{split}.jsonl").read_text().splitlines()]
        assert rows, split
        for row in rows:
            assert row["ends"][-1] == row["num_frames"] and len(row["ends"]) == len(row["bpe_ids"])
            assert all(b >= a for a, b in zip(row["ends"], row["ends"][1:]))
