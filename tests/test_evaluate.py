"""Evaluation runner: test lists, one system on one task (real offline backends), speed summary."""

import json
import shutil
import subprocess

import numpy as np
import pytest
import soundfile as sf

from arnar.evaluate.run import evaluate_system, per_item_errors_from_utterances, speed_summary
from arnar.evaluate.testlists import (
    TestItem,
    TestListError,
    build_testlists,
    read_testlist,
    to_tsv,
    verify_testlist,
)


def _item(n, task="cross_sentence", text="The birch canoe slid on the smooth planks.", prompt="p"):
    return TestItem(item_id=f"i{n}", task=task, speaker="s", target_id=f"t{n}", target_text=text,
                    target_duration=4.5, prompt_id=prompt, prompt_start=0.0, prompt_end=3.0, prompt_text="")


@pytest.fixture(scope="module")
def test_cuts(tmp_path_factory):
    """A held-out split of two speakers with word alignments, through the real ingest."""
    from arnar.corpus.manifests import ingest_corpus
    from arnar.corpus.validate import ValidationLimits

    root = tmp_path_factory.mktemp("corpus")
    (root / "speakers.tsv").write_text("speaker\tsplit\na\ttest\nb\ttest\n")
    rng = np.random.default_rng(0)
    durations = {"a": [2.0, 4.5, 5.0, 6.0], "b": [4.2, 11.0]}
    for speaker, lengths in durations.items():
        (root / speaker).mkdir()
        for k, seconds in enumerate(lengths):
            utt = f"{speaker}{k}"
            sf.write(root / speaker / f"{utt}.wav", 0.1 * rng.standard_normal(int(seconds * 16000)), 16000)
            (root / speaker / f"{utt}.txt").write_text(f"word one two three {utt}")
            words = [["word", 0.0, 1.0], ["one", 1.0, 2.9], ["two", 2.9, 3.5], ["three", 3.5, 4.0]]
            (root / speaker / f"{utt}.align.json").write_text(json.dumps({"phones": [], "words": words}))
    out = tmp_path_factory.mktemp("manifests")
    limits = ValidationLimits(sample_rate=16000, min_duration=0.5, max_duration=30.0)
    ingest_corpus(root, out, limits=limits, dev_fraction=0.0, seed=0, progress=False)
    return out / "test_cuts.jsonl"


def test_testlists_follow_the_protocol(test_cuts):
    lists = build_testlists(test_cuts, min_duration=4.0, max_duration=10.0, prompt_seconds=3.0,
                            max_items=100, seed=7)
    cont = {i.target_id: i for i in lists["continuation"]}
    # 4-10 s and at least 1 s after the 3 s prompt: a2 (2.0 s) and b1 (11.0 s) are out
    assert sorted(cont) == ["a1", "a2", "a3", "b0"]
    assert all(i.prompt_id == i.target_id and i.prompt_end == 3.0 for i in cont.values())
    # prompt text: the words that end by 3.0 s ("word" 0-1, "one" 1-2.9)
    assert cont["a1"].prompt_text == "word one"
    cross = {i.target_id: i for i in lists["cross_sentence"]}
    assert sorted(cross) == ["a1", "a2", "a3", "b0"]
    for item in cross.values():
        assert item.prompt_id != item.target_id and item.prompt_id[0] == item.target_id[0]  # same speaker
    assert cross["b0"].prompt_id == "b1"  # b's only other utterance, even though it is over 10 s
    again = build_testlists(test_cuts, min_duration=4.0, max_duration=10.0, prompt_seconds=3.0,
                            max_items=100, seed=7)
    assert again == lists
    capped = build_testlists(test_cuts, min_duration=4.0, max_duration=10.0, prompt_seconds=3.0,
                             max_items=2, seed=7)
    assert len(capped["continuation"]) == 2


def test_balanced_sample_takes_as_many_from_every_voice():
    import random
    from collections import Counter

    from arnar.evaluate.testlists import balanced_sample

    items = [(s, k) for s, n in (("a", 10), ("b", 10), ("c", 10), ("d", 2)) for k in range(n)]
    chosen = balanced_sample(items, 10, lambda item: item[0], random.Random(0))
    # 10 over 4 voices: 3, 3, 2, 2 (the remainder to a and b); d has 2 of its 2; no item twice
    assert Counter(s for s, _ in chosen) == {"a": 3, "b": 3, "c": 2, "d": 2} and len(set(chosen)) == 10
    # 14: quotas 4, 4, 3, 3, but d has only 2, so one more comes from the others' remaining items
    chosen = balanced_sample(items, 14, lambda item: item[0], random.Random(0))
    counts = Counter(s for s, _ in chosen)
    assert len(chosen) == len(set(chosen)) == 14 and counts["d"] == 2 and counts["c"] >= 3
    assert sorted(counts.values()) in ([2, 3, 4, 5], [2, 4, 4, 4])
    # the same seed, the same items
    assert balanced_sample(items, 14, lambda item: item[0], random.Random(0)) == chosen


def test_testlists_per_task_counts_and_balanced_voices(test_cuts):
    kw = dict(min_duration=4.0, max_duration=10.0, prompt_seconds=3.0, seed=7)
    # qualifying: a1, a2, a3 and b0 for both tasks
    lists = build_testlists(test_cuts, max_items={"continuation": 1, "cross_sentence": 3}, **kw)
    assert len(lists["continuation"]) == 1 and len(lists["cross_sentence"]) == 3
    balanced = build_testlists(test_cuts, max_items=2, per_voice="balanced", **kw)
    for task in ("continuation", "cross_sentence"):  # one of a's three, and b's only one
        assert sorted(i.speaker for i in balanced[task]) == ["a", "b"]
    # a single count draws as the lists frozen before per-task counts did
    assert build_testlists(test_cuts, max_items={"continuation": 2, "cross_sentence": 2}, **kw) == \
        build_testlists(test_cuts, max_items=2, **kw)
    with pytest.raises(TestListError, match="a count for each of continuation, cross_sentence"):
        build_testlists(test_cuts, max_items={"cross_sentence": 3}, **kw)
    with pytest.raises(TestListError, match="per_voice"):
        build_testlists(test_cuts, max_items=2, per_voice="stratified", **kw)


def test_testlists_without_items_say_why(test_cuts):
    with pytest.raises(TestListError, match="no continuation items"):
        build_testlists(test_cuts, min_duration=20.0, max_duration=30.0, prompt_seconds=3.0, max_items=10, seed=0)


def test_frozen_list_round_trip_and_mismatch(tmp_path):
    items = [_item(1), _item(2)]
    frozen = tmp_path / "cross_sentence.tsv"
    frozen.write_text(to_tsv(items))
    assert read_testlist(frozen) == items
    verify_testlist(frozen, items)
    changed = [_item(1), _item(2, text="Another sentence."), _item(3)]
    with pytest.raises(TestListError, match=r"1 new items .*1 items with other text.*arnar testlists --write"):
        verify_testlist(frozen, changed)
    (tmp_path / "bad.tsv").write_text("item_id\tnope\n")
    with pytest.raises(TestListError, match="columns"):
        read_testlist(tmp_path / "bad.tsv")


def test_speed_summary_worked_example():
    """Two timing records as `arnar synthesize` writes them, a SyncSpeech one and an AR one, their
    figures worked out by hand (d_LLM = 25 ms)."""
    timing = {
        # SyncSpeech, q = 1, 12 text tokens: it starts after q + 1 = 2 of them; its first packet
        # took c = 4 passes (FPL-A 0.2 s, so d_TTS = 0.05 s) and was complete once 5 text tokens had
        # been read; the codec decoded that packet in 0.03 s
        "x": {"item_id": "x", "token_seconds": 1.0, "fpl_a": 0.2, "first_packet_decode_seconds": 0.03,
              "text_tokens_to_start": 2, "text_tokens_waited": 5, "first_packet_passes": 4, "forward_passes": 13},
        # AR, 8 text tokens: it reads the whole text before its first pass (to start = waited = 8)
        "y": {"item_id": "y", "token_seconds": 2.0, "fpl_a": 0.4, "first_packet_decode_seconds": 0.05,
              "text_tokens_to_start": 8, "text_tokens_waited": 8, "first_packet_passes": 15, "forward_passes": 20},
    }
    summary = speed_summary(timing, {"x": 4.0, "y": 6.0}, d_llm=0.025)
    # token stage 1 s + 2 s over 4 s + 6 s of audio
    assert summary["rtf_token_stage"] == pytest.approx(0.3)
    assert "rtf_end_to_end" not in summary  # no item reported total_seconds
    assert summary["fpl_a"] == pytest.approx(0.3)  # (0.2 + 0.4) / 2: the token stage only
    assert summary["first_packet_decode"] == pytest.approx(0.04)  # (0.03 + 0.05) / 2, a column of its own
    # FPL-L, Eq. 7: x (q + 1) d_LLM + c d_TTS = 2 x 0.025 + 4 x 0.05 = 0.25;
    # y, all its text first: 8 x 0.025 + 0.4 = 0.6; mean 0.425
    assert summary["fpl_l"] == pytest.approx(0.425)
    # waited: x 5 x 0.025 + 0.2 = 0.325; y 0.6 as above; mean 0.4625
    assert summary["fpl_l_waited"] == pytest.approx(0.4625)
    assert summary["forward_passes"] == 16.5
    assert speed_summary({}, {}, 0.025) is None
    # a record written before text_tokens_to_start existed (its fpl_a included the codec): FPL-A
    # only, no FPL-L figure of either kind from it
    old = {"x": {"item_id": "x", "token_seconds": 1.0, "fpl_a": 0.2, "text_tokens_waited": 2}}
    summary = speed_summary(old, {"x": 4.0}, d_llm=0.025)
    assert summary["fpl_a"] == pytest.approx(0.2)
    assert not {"fpl_l", "fpl_l_waited", "first_packet_decode"} & set(summary)


def test_evaluate_system_with_offline_backends(tmp_path):
    """Real pocketsphinx and resemblyzer on flite speech; a missing item counts as all deleted."""
    if shutil.which("flite") is None:
        pytest.skip("Debian's flite is not installed (scripts/setup.sh installs it)")
    from arnar.evaluate.asr import load_asr
    from arnar.evaluate.mos import load_mos_predictor
    from arnar.evaluate.similarity import load_speaker_encoder

    texts = ["The birch canoe slid on the smooth planks.", "Glue the sheet to the dark blue background."]
    system, prompts = tmp_path / "system", tmp_path / "prompts"
    system.mkdir(), prompts.mkdir()
    items = []
    for n, text in enumerate(texts + ["This one was never generated."]):
        items.append(_item(n, text=text))
        subprocess.run(["flite", "-voice", "rms", "-t", "It is easy to tell the depth of a well.",
                        "-o", str(prompts / f"i{n}.wav")], check=True)
        if n < len(texts):
            subprocess.run(["flite", "-voice", "rms", "-t", text, "-o", str(system / f"i{n}.wav")], check=True)
    (system / "timing.jsonl").write_text(json.dumps({"item_id": "i0", "token_seconds": 0.5}) + "\n")
    result = evaluate_system(
        system="flite", task="cross_sentence", system_dir=system, items=items, prompts_dir=prompts,
        asr_backends={"pocketsphinx": load_asr("pocketsphinx")},
        speaker_encoder=load_speaker_encoder("resemblyzer"),
        out_json=tmp_path / "r.json", out_tsv=tmp_path / "r.tsv", d_llm=0.025,
        mos_predictor=load_mos_predictor("dnsmos"),
    )
    assert result["missing"] == ["i2"]
    # DNSMOS over the two present clips: P.808 headline, P.835 beside it, all on the 1-5 scale
    mos = result["mos"]
    assert mos["backend"] == "dnsmos" and mos["headline"] == "p808" and mos["mean"] == mos["p808"]
    assert all(1.0 <= mos[c] <= 5.0 for c in ("p808", "sig", "bak", "ovrl"))
    wer = result["asr"]["pocketsphinx"]
    # the missing item's 5 words are all deletions, so corpus WER >= 5 / 21 words
    assert wer["deletions"] >= 5 and wer["ref_words"] == 8 + 8 + 5
    assert wer["wer_corpus"] < 60.0  # flite rms reads well: the two present items are mostly right
    assert result["sim"]["mean"] > 0.8  # same voice as the prompt
    assert result["speed"]["items_timed"] == 1
    rows = (tmp_path / "r.tsv").read_text().splitlines()
    assert len(rows) == 4 and rows[0].startswith("item_id\tspeaker\tduration\tsim\tmos")
    assert rows[3].split("\t")[4] == ""  # the missing item has no MOS (and does not lower the mean)
    assert json.loads((tmp_path / "r.json").read_text()) == result
    # per item, in test-list order: what the report's paired bootstrap resamples; they add up to the totals
    per_item = wer["per_item"]
    assert per_item["item_ids"] == ["i0", "i1", "i2"] and per_item["ref_words"] == [8, 8, 5]
    assert per_item["errors"][2] == 5
    assert sum(per_item["errors"]) == wer["substitutions"] + wer["deletions"] + wer["insertions"]
    # an evaluation written before per_item existed gets the same numbers back from its TSV
    assert per_item_errors_from_utterances(tmp_path / "r.tsv", items, "pocketsphinx") == per_item
    with pytest.raises(ValueError, match="no column 'hyp_whisper'"):
        per_item_errors_from_utterances(tmp_path / "r.tsv", items, "whisper")
    with pytest.raises(ValueError, match="do not match the test list"):
        per_item_errors_from_utterances(tmp_path / "r.tsv", items[:2], "pocketsphinx")


def test_audit_per_speaker_keeps_the_first_utterances_of_each_speaker(test_cuts, tmp_path):
    """Speaker a has 4 utterances and b has 2: a cap of 3 audits a0-a2 and b0-b1 (5), a cap of 1
    audits a0 and b0; the cap is recorded. The TSV's ids show which files were read."""
    from arnar.evaluate.run import ground_truth_audit
    from arnar.evaluate.similarity import load_speaker_encoder

    class FixedTextAsr:  # the cap is under test, not the recognizer
        name, model_id = "echo", "echo"

        def transcribe(self, audio, sample_rate):
            return ["word one two three" for _ in audio]

    encoder = load_speaker_encoder("resemblyzer")
    for cap, expected in [(3, ["a0", "a1", "a2", "b0", "b1"]), (1, ["a0", "b0"])]:
        result = ground_truth_audit(cuts_paths=[test_cuts], voices={}, asr_backends={"echo": FixedTextAsr()},
                                    speaker_encoder=encoder, out_json=tmp_path / f"{cap}.json",
                                    out_tsv=tmp_path / f"{cap}.tsv", per_speaker=cap)
        ids = [row.split("\t")[0] for row in (tmp_path / f"{cap}.tsv").read_text().splitlines()[1:]]
        assert ids == expected
        assert result["utterances"] == len(expected) and result["per_speaker"] == cap
    # naturalness per voice: a predictor that scores each clip by its length (seconds) makes the
    # means checkable by hand. Cap 3: a0-a2 are 2.0, 4.5, 5.0 s (voice A), b0-b1 4.2, 11.0 s (voice B)
    class LengthMos:
        name, model_id, sample_rate = "length", "seconds", 16000

        def score(self, audio, sample_rate):
            seconds = np.array([len(a) / sample_rate for a in audio], dtype=np.float32)
            return {"p808": seconds, "sig": 2 * seconds}

    result = ground_truth_audit(cuts_paths=[test_cuts], voices={"a": "A", "b": "B"},
                                asr_backends={"echo": FixedTextAsr()}, speaker_encoder=encoder,
                                out_json=tmp_path / "m.json", out_tsv=tmp_path / "m.tsv", per_speaker=3,
                                mos_predictor=LengthMos())
    mos = result["mos"]
    assert mos["headline"] == "p808"
    assert mos["per_voice"]["A"]["p808"] == pytest.approx((2.0 + 4.5 + 5.0) / 3, abs=1e-3)
    assert mos["per_voice"]["B"]["sig"] == pytest.approx(2 * (4.2 + 11.0) / 2, abs=1e-3)
    assert mos["overall"]["p808"] == pytest.approx((2.0 + 4.5 + 5.0 + 4.2 + 11.0) / 5, abs=1e-3)
    rows = [r.split("\t") for r in (tmp_path / "m.tsv").read_text().splitlines()]
    assert rows[0][-1] == "mos" and float(rows[1][-1]) == pytest.approx(2.0, abs=1e-3)
    with pytest.raises(ValueError, match="per_speaker"):
        ground_truth_audit(cuts_paths=[test_cuts], voices={}, asr_backends={}, speaker_encoder=encoder,
                           out_json=tmp_path / "x.json", out_tsv=tmp_path / "x.tsv", per_speaker=0)


def planned_judges(extra_asr_seeds, tmp_path):
    """system -> task -> the `--asr` judges of its planned evaluation (the smoke DAG, dry run,
    with both offline judges)."""
    import re

    from smoke_dag import BIN, copy_workflow, run

    workflow = copy_workflow(tmp_path / extra_asr_seeds)
    profiles = {"smoke": {"evaluation": {"asr": ["moonshine", "pocketsphinx"], "extra_asr_seeds": extra_asr_seeds}}}
    plan = run([str(BIN / "snakemake"), "-n", "-p", "--cores", "1", "evaluate", "--config", "profile=smoke",
                f"profiles={json.dumps(profiles)}"], workflow).stdout
    judges = {}
    for m in re.finditer(r"arnar evaluate --system (\S+) --task (\S+) (.*?) 2>", plan):
        judges.setdefault(m.group(1), {})[m.group(2)] = re.findall(r"--asr (\w+)", m.group(3))
    return judges


@pytest.mark.parametrize("extra_asr_seeds", ["first", "all"])
def test_the_cross_checking_judge_hears_the_first_seed_or_all(extra_asr_seeds, tmp_path):
    judges = planned_judges(extra_asr_seeds, tmp_path)
    both = ["moonshine", "pocketsphinx"]
    # reference rows and every paradigm's first seed: both judges, headline first
    assert judges["ground_truth"]["cross_sentence"] == both
    assert judges["ar"]["cross_sentence"] == both and judges["nar"]["continuation"] == both
    # a later seed: the headline judge alone, unless every seed is to be cross-checked
    later = ["moonshine"] if extra_asr_seeds == "first" else both
    assert judges["ar_seed2"]["cross_sentence"] == later and judges["nar_seed2"]["continuation"] == later
