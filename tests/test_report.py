"""The report's arithmetic: spread over seeds, claim verdicts, grid naming and tables (hand-worked)."""

import math

import pytest

from arnar.ablations import GRIDS, check_grid_values, grid_rows, grid_system
from arnar.report import (
    Layout,
    Stat,
    ablation_tables,
    budget_note,
    claims_section,
    comparison_table,
    judge,
    judge_with_items,
    paired_interval,
    plot_grid,
)


def even_errors(wer, items=10, words=10):
    """Per-item errors of ``items`` items of ``words`` words each whose corpus WER is ``wer``,
    spread as evenly as whole errors allow (10 x 10 words: ``wer`` errors in all)."""
    total = round(wer * items * words / 100)
    return [total // items + (1 if k < total % items else 0) for k in range(items)]


def result(wer, sim=0.9, rtf=None, fpl_l=None, passes=None, utt_mean=None, errors=None, words=10):
    """An evaluation as `arnar evaluate` writes it. Its per-item errors (``errors``, one entry per
    item of ``words`` words; by default :func:`even_errors`) are what the claims' bootstrap reads."""
    speed = None if rtf is None else {"rtf_token_stage": rtf, "rtf_end_to_end": rtf + 0.01, "fpl_a": 0.1,
                                      "fpl_l": fpl_l, "forward_passes": passes}
    errors = even_errors(wer) if errors is None else errors
    per_item = {"item_ids": [f"i{k}" for k in range(len(errors))], "errors": errors,
                "ref_words": [words] * len(errors)}
    return {"asr": {"pocketsphinx": {"wer_corpus": wer, "wer_utterance_mean": wer if utt_mean is None else utt_mean,
                                     "model": "ps", "per_item": per_item}},
            "sim": {"mean": sim, "backend": "resemblyzer", "model": "r", "reference": "prompt audio"},
            "speed": speed, "missing": [], "items": 6}


def both(**kw):
    return {"continuation": result(**kw), "cross_sentence": result(**kw)}


def test_stat_mean_and_sample_sd():
    s = Stat.of([10.0, 12.0, 14.0])  # mean 12; sample sd sqrt(((-2)^2 + 0 + 2^2) / 2) = 2
    assert s.mean == 12.0 and s.sd == 2.0 and s.n == 3
    assert s.format() == "12.00 ± 2.00"
    one = Stat.of([7.5, None])
    assert one.sd is None and one.format(1) == "7.5"
    assert Stat.of([None]) is None


def test_judge_uses_the_pooled_spread():
    # spread sqrt(3^2 + 4^2) = 5: a gain of 6 wins, of 4 ties, of -6 is reversed
    assert judge(Stat(10, 3, 3), Stat(16, 4, 3), None, lower_is_better=True) == "reproduced"
    assert judge(Stat(10, 3, 3), Stat(14, 4, 3), None, lower_is_better=True) == "tie"
    assert judge(Stat(16, 3, 3), Stat(10, 4, 3), None, lower_is_better=True) == "reversed"
    # a one-seed row borrows the noise 3 of its paradigm: spread sqrt(9 + 9) = 4.24
    assert judge(Stat(10, None, 1), Stat(14, None, 1), 3.0, lower_is_better=True) == "tie"
    assert judge(Stat(10, None, 1), Stat(14.5, None, 1), 3.0, lower_is_better=True) == "reproduced"
    # higher is better (SIM)
    assert judge(Stat(0.9, None, 1), Stat(0.8, None, 1), None, lower_is_better=False) == "reproduced"


def test_comparison_rows_show_mean_and_spread_over_seeds():
    results = {"ground_truth": both(wer=5.0), "ar": both(wer=10.0, rtf=0.1, passes=90),
               "ar_seed2": both(wer=12.0, rtf=0.3, passes=92), "ar_seed3": both(wer=14.0, rtf=0.2, passes=94)}
    layout = Layout(references=["ground_truth"], comparison={"ar": ["ar", "ar_seed2", "ar_seed3"]},
                    runs={"ar": "ar"})
    table = comparison_table(results, layout, {"ar": 2_350_000})
    assert "| ground_truth | – | 5.00 | 5.00 | 0.900 ±" not in table  # one seed: no spread
    assert "| ar | 2.35M | 12.00 ± 2.00 | 12.00 ± 2.00 | 0.900 ± 0.000 | – | 0.200 | 0.210 | 0.100 | – | – | 92.0 | 0 |" \
        in table
    assert "mean ± standard deviation over 3 synthesis seeds" in table
    assert "ar_seed2" not in table


def with_second_judge(r, wer):
    """``r`` judged by moonshine (headline, ``r``'s WER) and pocketsphinx at ``wer``."""
    asr = {"moonshine": {**r["asr"]["pocketsphinx"], "model": "m"},
           "pocketsphinx": {**r["asr"]["pocketsphinx"], "wer_corpus": wer, "wer_utterance_mean": wer}}
    return {**r, "asr": asr}


def test_a_second_judge_of_the_first_seed_only_gets_one_figure_and_a_caption():
    # evaluation.extra_asr_seeds: first: ar's later seeds were judged by the headline judge alone
    results = {"ground_truth": {t: with_second_judge(result(wer=5.0), 20.0) for t in ("continuation", "cross_sentence")},
               "ar": {t: with_second_judge(result(wer=10.0), 30.0) for t in ("continuation", "cross_sentence")},
               "ar_seed2": both(wer=12.0), "ar_seed3": both(wer=14.0)}
    for seed in ("ar_seed2", "ar_seed3"):
        for r in results[seed].values():
            r["asr"] = {"moonshine": r["asr"]["pocketsphinx"]}
    layout = Layout(references=["ground_truth"], comparison={"ar": ["ar", "ar_seed2", "ar_seed3"]})
    table = comparison_table(results, layout)
    # moonshine over the three seeds (12 ± 2), pocketsphinx the first seed's 30 with no spread
    assert "| ar | – | 12.00 ± 2.00 | 12.00 ± 2.00 | 30.00 | 30.00 | 0.900 ± 0.000 |" in table
    assert "pocketsphinx: each paradigm row's first synthesis seed only" in table
    # every seed judged by both: no such caption
    for seed, wer in (("ar_seed2", 12.0), ("ar_seed3", 14.0)):
        results[seed] = {t: with_second_judge(r, 30.0) for t, r in both(wer=wer).items()}
    assert "first synthesis seed only" not in comparison_table(results, layout)


def test_budget_note_sums_each_systems_lineage_and_flags_unequal_budgets():
    """DELTA's weights come from AR's 300 updates and its own 200: 500, against AR's 300, 1.67x;
    tokens seen add up the same way; rows without a run (references) or a summary are left out."""
    summaries = {"ar": {"steps": 300, "tokens_seen": 600_000}, "delta": {"steps": 200, "tokens_seen": 400_000},
                 "nar": {"steps": 300}}
    layout = Layout(references=["ground_truth"], comparison={}, runs={"ar": "ar", "delta": "delta", "nar": "nar",
                                                                       "cod": "cod"},
                    lineages={"ar": ["ar"], "delta": ["ar", "delta"], "nar": ["nar"], "cod": ["cod"]})
    note = budget_note(["ground_truth", "ar", "delta", "nar", "cod"], layout, summaries)
    assert "`ar` 300, 0.60M tokens; `delta` 500 (`ar` 300 + `delta` 200), 1.00M tokens; `nar` 300." in note
    assert "ground_truth" not in note and "`cod`" not in note
    assert "Budgets are not equal: 300 to 500 updates (1.67x)" in note
    assert budget_note(["ar", "nar"], layout, summaries).endswith("Every row trained for 300 updates.")
    assert budget_note(["ground_truth"], layout, summaries) == ""
    results = {"ar": both(wer=10.0), "delta": both(wer=9.0)}
    table = comparison_table(results, Layout(references=[], comparison={"ar": ["ar"], "delta": ["delta"]},
                                             runs=layout.runs, lineages=layout.lineages), None, summaries)
    assert table.count("Budgets are not equal: 300 to 500 updates (1.67x)") == 2  # under both task tables


def test_claims_are_judged_per_task_against_the_seed_spread():
    results = {
        "ar": both(wer=50.0, rtf=0.03), "ar_seed2": both(wer=52.0, rtf=0.03),
        "palle_stage1": both(wer=40.0, rtf=0.3), "palle_stage1_seed2": both(wer=42.0, rtf=0.3),
        "nar": both(wer=41.0), "nar_seed2": both(wer=43.0),
    }
    layout = Layout(references=[], comparison={"ar": ["ar", "ar_seed2"], "nar": ["nar", "nar_seed2"],
                                               "palle_stage1": ["palle_stage1", "palle_stage1_seed2"]})
    text = claims_section(results, layout)
    # PAR 41 ± 1.41 vs AR 51 ± 1.41: spread 2 < 10 -> reproduced by the seeds; its errors spread evenly,
    # 8 or 9 of 20 words fewer on every item, so every resample of items agrees; vs NAR 42 ± 1.41: 1 < 2 -> tie
    row = ("| PAR beats AR on WER | PALLE (arXiv:2504.10352) Table 3 (Sys. C1 vs A) | Continuation | wer "
           "| palle_stage1 41.00 ± 1.41 | ar 51.00 ± 1.41 | -10.00 [")
    assert row in text and text[text.index(row):].split("\n")[0].endswith("] | **reproduced** |")
    assert "| PAR beats NAR on WER | PALLE (arXiv:2504.10352) Table 3 (Sys. C1 vs B) | Cross-sentence | wer |" in text
    assert text.count("**tie**") == 2 and text.count("**reversed**") == 2  # RTF: PAR slower than AR on both tasks
    assert "| palle_stage1 0.300 | ar 0.030 | – | **reversed** |" in text  # speed claims have no interval
    assert "| Paired bootstrap 95 % (better − worse, WER points) | This run |" in text
    assert "SyncSpeech" not in text  # claims whose systems did not run are left out


def test_a_verdict_needs_the_seeds_and_the_items_to_agree():
    """The combined rule on its own: the seed verdict stands only where the item interval of
    better minus worse lies wholly on its side of 0; anything else is a tie."""
    assert judge_with_items("reproduced", (-5.0, -8.0, -2.0), lower_is_better=True) == "reproduced"
    assert judge_with_items("reproduced", (-5.0, -8.0, 1.0), lower_is_better=True) == "tie"  # holds 0
    assert judge_with_items("reproduced", (-5.0, -8.0, 0.0), lower_is_better=True) == "tie"  # touches 0
    assert judge_with_items("tie", (-5.0, -8.0, -2.0), lower_is_better=True) == "tie"  # the seeds do not agree
    assert judge_with_items("reversed", (5.0, 2.0, 8.0), lower_is_better=True) == "reversed"
    assert judge_with_items("reversed", (-5.0, -8.0, -2.0), lower_is_better=True) == "tie"  # they contradict
    assert judge_with_items("reproduced", None, lower_is_better=True) == "tie"  # no per-item numbers
    assert judge_with_items("reproduced", (0.1, 0.05, 0.2), lower_is_better=False) == "reproduced"  # (SIM)


def test_seeds_say_reproduced_but_the_items_do_not():
    """PAR 20 and 22 % over two seeds against AR 30 and 32 %: a gain of 10 points against a seed
    spread of 2, so the seeds alone say reproduced. But all of PAR's errors sit in one sentence of
    five (10 words each): item 1 holds 10 + 11 = 21 of its errors summed over both seeds, AR's
    0 + 7 + 8 + 8 + 8 sit in the other four. A resample that draws item 1 twice or more (26 % of
    them: 1 - 0.8^5 - 5 x 0.2 x 0.8^4) puts PAR behind, e.g. items (1, 1, 2, 3, 4): PAR 42 / 100,
    AR 23 / 100; the interval holds 0 and the claim is a tie. The same means with errors spread over
    every item are reproduced."""
    def par_ar(par_errors, ar_errors):
        results = {"palle_stage1": both(wer=20.0, errors=par_errors[0]),
                   "palle_stage1_seed2": both(wer=22.0, errors=par_errors[1]),
                   "ar": both(wer=30.0, errors=ar_errors[0]), "ar_seed2": both(wer=32.0, errors=ar_errors[1])}
        layout = Layout(references=[], comparison={"palle_stage1": ["palle_stage1", "palle_stage1_seed2"],
                                                   "ar": ["ar", "ar_seed2"]})
        return results, layout

    results, layout = par_ar(([10, 0, 0, 0, 0], [11, 0, 0, 0, 0]), ([0, 3, 4, 4, 4], [0, 4, 4, 4, 4]))
    assert judge(Stat(21.0, 1.41, 2), Stat(31.0, 1.41, 2), None, lower_is_better=True) == "reproduced"
    difference, low, high = paired_interval(results, layout.comparison["palle_stage1"], layout.comparison["ar"],
                                            "continuation")
    assert difference == pytest.approx(21 / 100 * 100 - 31 / 100 * 100)  # 21 and 31 errors over 2 x 50 words
    assert low < 0 < high
    text = claims_section(results, layout)
    assert f"| -10.00 [{low:.2f}, {high:.2f}] | **tie** |" in text
    assert "**reproduced**" not in text and "tie 2." in text
    results, layout = par_ar(([2, 2, 2, 2, 2], [3, 2, 2, 2, 2]), ([3, 3, 3, 3, 3], [4, 3, 3, 3, 3]))
    assert claims_section(results, layout).count("**reproduced**") == 2


def test_the_interval_pairs_items_by_id_and_skips_evaluations_without_them():
    """Items matched by id: B's list in another order gives the same interval; an item only one
    side has is left out; a replica without per-item numbers (an old JSON without its TSV) gives
    no interval, so the claim cannot be reproduced."""
    a = {"continuation": result(wer=20.0, errors=[1, 0, 3])}
    b = {"continuation": result(wer=30.0, errors=[2, 2, 4])}
    results = {"a": a, "b": b}
    reference = paired_interval(results, ["a"], ["b"], "continuation")
    assert reference[0] == pytest.approx(100 * (4 - 8) / 30)
    shuffled = b["continuation"]["asr"]["pocketsphinx"]["per_item"]
    for key in shuffled:
        shuffled[key] = shuffled[key][::-1]  # the same items, listed backwards
    assert paired_interval(results, ["a"], ["b"], "continuation") == pytest.approx(reference)
    extra = {"continuation": result(wer=20.0, errors=[1, 0, 3, 9])}  # i3 only here
    assert paired_interval({"a": extra, "b": b}, ["a"], ["b"], "continuation") == pytest.approx(reference)
    del a["continuation"]["asr"]["pocketsphinx"]["per_item"]
    assert paired_interval(results, ["a"], ["b"], "continuation") is None


def test_old_evaluations_get_their_per_item_errors_from_the_utterance_tsv(tmp_path):
    """An evaluation JSON written before ``per_item`` existed: load_results recomputes each item's
    errors from the TSV's hypotheses and the test list's texts (word_errors, as the evaluation did);
    a missing item (empty hypothesis) is every word deleted."""
    import json

    from arnar.evaluate.testlists import TestItem, to_tsv
    from arnar.report import item_errors, load_results

    def item(n, text):
        return TestItem(item_id=f"i{n}", task="continuation", speaker="s", target_id=f"t{n}", target_text=text,
                        target_duration=4.5, prompt_id=f"t{n}", prompt_start=0.0, prompt_end=3.0, prompt_text="")

    lists = tmp_path / "testlists"
    lists.mkdir()
    (lists / "continuation.tsv").write_text(to_tsv([item(0, "The birch canoe slid."), item(1, "It has 42 words.")]))
    evaluation = result(wer=50.0)
    del evaluation["asr"]["pocketsphinx"]["per_item"]
    (tmp_path / "eval" / "x").mkdir(parents=True)
    (tmp_path / "eval" / "x" / "continuation.json").write_text(json.dumps(evaluation))
    # i0: "canoe" -> "canoes" (1 substitution of 4 words); i1 had no audio: 5 words deleted
    (tmp_path / "eval" / "x" / "continuation_utterances.tsv").write_text(
        "item_id\tspeaker\tduration\tsim\thyp_pocketsphinx\twer_pocketsphinx\n"
        "i1\ts\t0.0\t\t\t1.0\ni0\ts\t2.1\t0.9\tthe birch canoes slid\t0.25\n")
    layout = Layout(references=[], comparison={"x": ["x"]}, tasks={"x": ["continuation"]})
    loaded = load_results(tmp_path / "eval", ["x"], layout, lists)
    assert item_errors(loaded["x"]["continuation"]) == {"i0": (1, 4), "i1": (5, 5)}
    assert "per_item" not in load_results(tmp_path / "eval", ["x"], layout)["x"]["continuation"]["asr"]["pocketsphinx"]


def test_a_wer_claim_between_two_systems_that_do_not_speak_is_not_judged():
    """The bar: WER <= 2x the ceiling row of the system's own decoding path. Single-stream ceiling
    30 % (bar 60 %), CoD's first-quantizer ceiling 60 % (bar 120 %)."""
    results = {"resynth_offline": both(wer=30.0), "resynth_offline_rvq_q1": both(wer=60.0),
               "ar": both(wer=99.0, rtf=0.03), "palle_stage1": both(wer=170.0, rtf=0.3),
               "nar": both(wer=55.0), "cod": both(wer=110.0), "cod_l1": both(wer=130.0)}
    ceilings = {"ar": "resynth_offline", "palle_stage1": "resynth_offline", "nar": "resynth_offline",
                "cod": "resynth_offline_rvq_q1", "cod_l1": "resynth_offline_rvq_q1"}
    layout = Layout(references=["resynth_offline", "resynth_offline_rvq_q1"],
                    comparison={s: [s] for s in ("ar", "palle_stage1", "nar", "cod")}, ceilings=ceilings)
    text = claims_section(results, layout)
    rows = [line.split(" | ") for line in text.splitlines() if line.count(" | ") >= 6]
    lines = {f"{cells[0]} | {cells[2]}": " | ".join(cells) for cells in rows}
    # AR 99 > 60 and PALLE 170 > 60: babble against babble
    assert lines["| PAR beats AR on WER | Continuation"].endswith("| **neither speaks** |")
    # NAR 55 <= 60 speaks: PALLE's loss to it is a real one
    assert lines["| PAR beats NAR on WER | Cross-sentence"].endswith("| **reversed** |")
    # CoD 110 <= 120 speaks on its own ceiling, its one-level variant 130 does not: judged
    assert lines["| Three temporal levels beat one | Cross-sentence"].endswith("| **reproduced** |")
    # speed claims are judged whatever the WER
    assert lines["| PAR is faster than AR (token-stage RTF) | Continuation"].endswith("| **reversed** |")
    assert "neither speaks 2" in text
    # without ceilings (a plain layout) every claim is judged as before
    assert "**neither speaks**" not in claims_section(results, Layout(references=[], comparison=layout.comparison))


def test_grid_names_follow_the_axis_and_default():
    assert grid_rows("delta_steps", [4, 8, 16]) == [(4, "delta_steps4"), (8, "delta_steps8"), (16, "delta")]
    assert grid_rows("cod_levels", [1, 2, 3]) == [(1, "cod_l1"), (2, "cod_l2"), (3, "cod")]
    assert grid_system(GRIDS["delta_mu"], 1.0) == "delta_mu1.0"
    assert grid_system(GRIDS["syncspeech_q"], 2) == "syncspeech_q2"
    # the duration multiplier scales the ground-truth duration: even 1.0 is its own system
    assert grid_system(GRIDS["palle_duration"], 1.0) == "palle_dur1.0"
    # PALLE's refinement rule: the paper's (palle.py's default) is the palle row, the earlier rule its own system
    assert grid_rows("palle_refine_rule", ["rescore", "stage_one_confidence"]) == [
        ("rescore", "palle"), ("stage_one_confidence", "palle_refine_stage_one_confidence")]
    assert GRIDS["palle_refine_rule"].decoding == "refine_rule" and not GRIDS["palle_refine_rule"].training
    assert GRIDS["syncspeech_q"].training and not GRIDS["delta_mu"].training
    with pytest.raises(ValueError, match="training.grids.cod_levels: values must be among"):
        check_grid_values("cod_levels", [4])
    with pytest.raises(ValueError, match="training.grids.nope: unknown axis"):
        check_grid_values("nope", [1])


def test_grid_tables_and_curves(tmp_path):
    cross = {"cross_sentence": None}
    results = {"palle": both(wer=30.0), "palle_seed2": both(wer=34.0)}
    for value, wer in ((0.7, 60.0), (1.0, 30.0), (1.3, 45.0)):
        results[f"palle_dur{value}"] = {**cross, "cross_sentence": result(wer=wer, rtf=0.2, fpl_l=1.0, passes=107)}
    layout = Layout(references=[], comparison={"palle": ["palle", "palle_seed2"]},
                    grids={"palle_duration": [0.7, 1.0, 1.3]}, tasks={f"palle_dur{v}": ["cross_sentence"]
                                                                     for v in (0.7, 1.0, 1.3)})
    tables = ablation_tables(results, layout)
    assert "### PALLE: total duration multiplier (x ground-truth duration) (PALLE (arXiv:2504.10352) Fig. 5)" in tables
    assert "| 0.7 | palle_dur0.7 | 60.00 | 0.900 | 0.200 | 1.000 | 107.0 |" in tables
    assert "Conti WER" not in tables  # the grid spoke cross-sentence only
    # the seeds of the base system say how large a tie is: sd of (30, 34) = 2.83
    assert "`palle` varies by continuation WER ± 2.83, cross-sentence WER ± 2.83" in tables
    assert plot_grid(results, "palle_duration", [0.7, 1.0, 1.3], tmp_path / "g.png")
    assert (tmp_path / "g.png").stat().st_size > 5000
    assert not plot_grid(results, "delta_mu", [0.3, 1.0], tmp_path / "h.png")  # not run (and a table axis)
    assert math.isclose(Stat.of([30.0, 34.0]).sd, 2.828, abs_tol=1e-3)


def test_wer_rtf_lines_follow_each_grid_axis_in_value_order(tmp_path):
    from arnar.report import grid_lines, plot_wer_vs_rtf

    grids = {"delta_steps": [16, 4, 8], "palle_duration": [0.7, 1.0, 1.3], "syncspeech_q": [1, 2]}
    present = {"delta_steps4", "delta_steps8", "delta", "palle_dur0.7", "palle_dur1.0", "palle_dur1.3", "ar"}
    # syncspeech_q's systems are absent: no line; DELTA in its values' order, the default (16) last
    assert grid_lines(grids, present) == [("delta_steps", ["delta_steps4", "delta_steps8", "delta"]),
                                          ("palle_duration", ["palle_dur0.7", "palle_dur1.0", "palle_dur1.3"])]
    results = {s: {"cross_sentence": {"asr": {"moonshine": {"wer_corpus": 10.0 + i}},
                                      "speed": {"rtf_token_stage": 0.01 * (i + 1), "forward_passes": 4 * (i + 1)}}}
               for i, s in enumerate(sorted(present))}
    assert plot_wer_vs_rtf(results, tmp_path / "p.png", grids=grids) and (tmp_path / "p.png").stat().st_size > 0
    assert not plot_wer_vs_rtf({"x": {"cross_sentence": {"asr": {"m": {"wer_corpus": 1.0}}}}}, tmp_path / "q.png")


def test_string_valued_grid_and_the_papers_cod_row():
    """CoD's guidance-form axis (string values) is drawn as a table, not a curve; the comparison names
    `cod` (this project's speech-prompt prefix) and `cod_paper` (the paper's adaLN speaker only)."""
    from arnar.ablations import value_name
    from arnar.paradigms.cod import DECODING

    default = DECODING["guidance_form"]
    other = "interpolate" if default == "extrapolate" else "extrapolate"
    assert value_name("interpolate") == "interpolate"
    results = {"cod": both(wer=30.0, rtf=0.5, fpl_l=2.0, passes=120), "cod_seed2": both(wer=34.0),
               "cod_paper": both(wer=40.0), "cod_paper_seed2": both(wer=44.0),
               f"cod_guidance_{other}": {"cross_sentence": result(wer=25.0, rtf=0.4, fpl_l=1.5, passes=120)}}
    layout = Layout(references=[], comparison={"cod": ["cod", "cod_seed2"],
                                               "cod_paper": ["cod_paper", "cod_paper_seed2"]},
                    grids={"cod_guidance_form": ["extrapolate", "interpolate"]},
                    tasks={f"cod_guidance_{other}": ["cross_sentence"]})
    tables = ablation_tables(results, layout)
    assert f"| {default} | cod | 30.00 | 0.900 | 0.500 | 2.000 | 120.0 |" in tables
    assert f"| {other} | cod_guidance_{other} | 25.00 | 0.900 | 0.400 | 1.500 | 120.0 |" in tables
    assert "(Chain-of-Details (arXiv:2604.19330) Sec. IV-B)" in tables and "| CFG form (w: 3 -> 0.75) | System |" in tables
    assert not plot_grid(results, "cod_guidance_form", ["extrapolate", "interpolate"], None)  # a table axis
    table = comparison_table(results, layout)
    assert table.count("`cod`: this project's CoD") == 2  # under each task's table
    assert "`cod_paper`: the paper's CoD (voice from the adaLN speaker embedding only" in table
    # a profile without the paper's row has no note; no claim is made on either axis (the paper makes none)
    alone = Layout(references=[], comparison={"cod": ["cod", "cod_seed2"]})
    assert "this project's CoD" not in comparison_table(results, alone)
    assert claims_section(results, layout) == ""


def test_training_table_gives_trainable_parameters_and_the_papers_count(tmp_path):
    import json

    from arnar.report import training_table

    def summary(paradigm, parameters, trainable=None):
        run = {"paradigm": paradigm, "parameters": parameters, "model": {"n_layers": 4, "dim": 192}, "steps": 3000,
               "epochs": 12.5, "wall_time_s": 1800.0, "tokens_per_s": 4000.0, "final_train_loss": 1.5,
               "final_dev_loss": 1.7}
        if trainable is not None:
            run["trainable_parameters"] = trainable
        return run

    (tmp_path / "delta.json").write_text(json.dumps(summary("delta", 3_000_000, 450_000)))
    (tmp_path / "palle.json").write_text(json.dumps(summary("palle", 5_224_324, 5_224_324)))
    (tmp_path / "ar.json").write_text(json.dumps(summary("ar", 1_987_392)))  # a summary from before the column
    sync = {**summary("syncspeech", 2_000_000, 2_000_000), "not_in_the_papers": {
        "data.prompt_pairs": 0.5, "paradigm.options.finetune_spans": "all", "text_units": "phonemes"}}
    (tmp_path / "syncspeech.json").write_text(json.dumps(sync))
    (tmp_path / "nar.json").write_text(json.dumps({**summary("nar", 2_000_000, 2_000_000), "not_in_the_papers": {}}))
    rows = {line.split(" | ")[0].lstrip("| "): line for line in training_table(tmp_path, ["ar"]).splitlines()}
    assert rows["delta"].startswith("| delta | delta | 3.00M | 0.45M | 494.0M | 4 x 192 | 3000 | 12.5 | 30.0 |")
    assert rows["palle"].startswith("| palle | palle | 5.22M | 5.22M | 177.0M |")
    assert rows["ar"].startswith("| ar | ar | 1.99M | – | – |")
    assert rows["ar"].endswith("| 1.500 | 1.700 | not recorded |")
    assert rows["nar"].endswith("| 1.500 | 1.700 | – |")
    assert rows["syncspeech"].endswith("| prompt_pairs=0.5, finetune_spans=all, text units phonemes |")


# --- plots: what a reader sees is what the table says -------------------------------------------


def _boxes_overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_systems_plot_draws_the_tables_means_spreads_and_ceilings():
    """AR's three seeds 10, 12, 14: a bar at 12 with an error bar from 10 to 14, the numbers its
    table row prints; DELTA spoke once: no error bar; every paradigm's bar carries its ceiling row's
    value; names read level and the legend sits off the axes."""
    import matplotlib.pyplot as plt
    from matplotlib.container import BarContainer, ErrorbarContainer

    from arnar.report import systems_figure

    results = {"ground_truth": both(wer=5.0, sim=0.95), "resynth_offline": both(wer=20.0, sim=0.8),
               "ar": both(wer=10.0, sim=0.70), "ar_seed2": both(wer=12.0, sim=0.72),
               "ar_seed3": both(wer=14.0, sim=0.74), "delta": both(wer=30.0, sim=0.6)}
    layout = Layout(references=["ground_truth", "resynth_offline"],
                    comparison={"ar": ["ar", "ar_seed2", "ar_seed3"], "delta": ["delta"]},
                    ceilings={"ar": "resynth_offline", "delta": "resynth_offline"})
    fig = systems_figure(results, layout)
    wer_ax, sim_ax = fig.axes[:2]
    names = [t.get_text() for t in wer_ax.get_yticklabels()]
    assert names == ["ground_truth", "resynth_offline", "ar", "delta"]
    table = comparison_table(results, layout)
    cross = table[table.index("### Cross-sentence"):]
    for ax, column in ((wer_ax, 3), (sim_ax, 4)):  # WER-P corpus, SIM
        bars = {c.get_label(): [p.get_width() for p in c] for c in ax.containers if isinstance(c, BarContainer)}
        for name, width in zip(names, bars["Cross-sentence"]):
            cell = next(line for line in cross.splitlines() if line.startswith(f"| {name} |")).split(" | ")[column]
            assert float(cell.split(" ± ")[0]) == pytest.approx(width, abs=5e-3), (name, cell, width)
    assert "| ar | – | 12.00 ± 2.00 | 12.00 ± 2.00 | 0.720 ± 0.020 |" in cross
    segments = [segment for c in wer_ax.containers if isinstance(c, ErrorbarContainer)
                for segment in c.lines[2][0].get_segments()]
    assert len(segments) == 2  # AR's only, one per task
    assert all(seg[0][0] == pytest.approx(10.0) and seg[1][0] == pytest.approx(14.0) for seg in segments)
    ceilings = sorted(line.get_xdata()[0] for line in wer_ax.lines if line.get_marker() == "d")
    assert ceilings == [20.0] * 4  # AR and DELTA, both tasks
    assert all(t.get_rotation() == 0 for t in wer_ax.get_yticklabels())
    fig.canvas.draw()
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels[:2] == ["Continuation", "Cross-sentence"] and any("sd over synthesis seeds" in t for t in labels)
    assert not any(_boxes_overlap(legend.get_window_extent(), ax.get_window_extent()) for ax in (wer_ax, sim_ax))
    plt.close(fig)


def test_wer_rtf_plot_names_every_point_and_keeps_labels_apart():
    """Comparison systems at their means ± sd, named in a legend beside the axes; grid and ablation
    points numbered, two on one spot sharing a label; distinct tick labels on the log axis even
    inside one decade; no label on another."""
    import matplotlib.pyplot as plt

    from arnar.report import wer_rtf_figure

    def timed(wer, rtf, passes):
        return {"cross_sentence": result(wer=wer, rtf=rtf, passes=passes)}

    results = {"ar": timed(30.0, 0.060, 100), "ar_seed2": timed(34.0, 0.062, 100),
               "delta": timed(40.0, 0.080, 16), "delta_steps4": timed(60.0, 0.050, 4),
               "delta_steps8": timed(50.0, 0.065, 8), "delta_noconv": timed(45.0, 0.070, 16),
               "delta_noprompt": timed(45.0, 0.070, 16), "cod": {"cross_sentence": result(wer=90.0)}}
    layout = Layout(references=[], comparison={"ar": ["ar", "ar_seed2"], "delta": ["delta"], "cod": ["cod"]},
                    grids={"delta_steps": [4, 8, 16]})
    fig = wer_rtf_figure(results, grids=layout.grids, layout=layout)
    ax = fig.axes[0]
    fig.canvas.draw()
    low, high = ax.get_xlim()
    ticks = [t for t in ax.get_xticklabels() if t.get_text() and low <= t.get_position()[0] <= high]
    assert len(ticks) >= 2 and len({t.get_text() for t in ticks}) == len(ticks)
    boxes = sorted((t.get_window_extent() for t in ticks), key=lambda box: box.x0)
    assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:]))
    (legend,) = [child for a in fig.axes for child in a.get_children() if child.__class__.__name__ == "Legend"]
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == ["ar (100 passes)", "delta (16 passes)", "grid delta_steps"]  # cod is not timed
    assert not any("other" in label for label in labels)
    assert not _boxes_overlap(legend.get_window_extent(), ax.get_window_extent())
    (ar,) = [c for c in ax.containers if c.get_label() == "ar (100 passes)"]
    assert ar.lines[0].get_xdata()[0] == pytest.approx(0.061) and ar.lines[0].get_ydata()[0] == pytest.approx(32.0)
    assert ar.has_yerr
    notes = [child for child in ax.get_children() if child.__class__.__name__ == "Annotation"]
    # numbered by RTF: delta_steps4 1, delta_steps8 2, delta_noconv 3 and delta_noprompt 4 on one spot
    assert sorted(n.get_text() for n in notes) == ["1", "2", "3,4"]
    note_boxes = [n.get_window_extent() for n in notes]
    assert not any(_boxes_overlap(a, b) for i, a in enumerate(note_boxes) for b in note_boxes[i + 1:])
    plt.close(fig)


def test_plots_redraw_from_the_committed_metrics(tmp_path):
    """metrics.json keeps what the comparison plots read: rebuilt results give the table's numbers."""
    import json

    from arnar.report import METRICS, metrics_summary, plots_from_metrics, results_from_metrics, stat

    results = {"resynth_offline": both(wer=20.0), "ar": both(wer=10.0, rtf=0.05, fpl_l=0.5, passes=90),
               "ar_seed2": both(wer=12.0, rtf=0.06, fpl_l=0.6, passes=92)}
    audit = {"asr": {"pocketsphinx": {"overall": {"wer_corpus": 3.0}}}, "sim": {}}
    metrics = metrics_summary(results, audit)
    rebuilt = results_from_metrics(metrics, ["pocketsphinx"])
    layout = {"references": ["resynth_offline"], "comparison": {"ar": ["ar", "ar_seed2"]},
              "ceilings": {"ar": "resynth_offline"}}
    for metric in ("wer", "sim", "rtf", "passes"):
        for task in ("continuation", "cross_sentence"):
            for replicas in (["resynth_offline"], ["ar", "ar_seed2"]):
                assert stat(rebuilt, replicas, task, METRICS[metric]) == stat(results, replicas, task, METRICS[metric])
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    drawn = plots_from_metrics(tmp_path / "metrics.json", layout, ["pocketsphinx"], tmp_path / "plots")
    assert drawn == ["systems.png", "wer_vs_rtf.png"]
    assert all((tmp_path / "plots" / name).stat().st_size > 5000 for name in drawn)


def test_naturalness_and_timed_items_reach_the_tables():
    """DNSMOS in an evaluation: the MOS column (P.808, mean ± sd over seeds), the caption naming
    the predictor, a MOS column per voice group, metrics.json's mos_* keys; the audit's table per
    voice; and a caption saying how many items timed the speed columns when not all were."""
    from arnar.report import audit_table, metrics_summary, voice_group_table

    def with_mos(p808, rtf=None, timed=None):
        r = result(wer=10.0, rtf=rtf, fpl_l=None if rtf is None else 0.2, passes=None if rtf is None else 9)
        r["mos"] = {"backend": "dnsmos", "model": "speechmos==0.0.1.1:dnsmos (x)", "headline": "p808",
                    "mean": p808, "p808": p808, "sig": 3.0, "bak": 4.0, "ovrl": 2.5,
                    "per_voice_group": {"unseen voice": p808 - 0.5}}
        r["asr"]["pocketsphinx"]["per_voice_group"] = {"unseen voice": {"wer_corpus": 12.0}}
        r["sim"]["per_voice_group"] = {"unseen voice": 0.8}
        if timed is not None:
            r["speed"]["items_timed"] = timed
        return {"continuation": r, "cross_sentence": r}

    results = {"ground_truth": with_mos(3.8), "ar": with_mos(3.0, rtf=0.1, timed=2),
               "ar_seed2": with_mos(3.4, rtf=0.1, timed=2)}
    layout = Layout(references=["ground_truth"], comparison={"ar": ["ar", "ar_seed2"]}, runs={"ar": "ar"})
    table = comparison_table(results, layout)
    assert "| ar | – | 10.00 ± 0.00 | 10.00 ± 0.00 | 0.900 ± 0.000 | 3.20 ± 0.28 | 0.100 |" in table  # sd of 3.0, 3.4
    assert "MOS: dnsmos P.808 (speechmos==0.0.1.1:dnsmos (x))." in table
    assert "the 2 of 6 items of each list decoded alone (batch 1)" in table
    groups = voice_group_table(results, layout)
    assert "| System | unseen voice WER | unseen voice SIM | unseen voice MOS |" in groups
    assert "| ar | 12.00 ± 0.00 | 0.800 ± 0.000 | 2.70 ± 0.28 |" in groups
    audit = {"utterances": 2, "speakers": 2, "asr": {}, "sim": {"backend": "r", "model": "r"},
             "mos": {"backend": "dnsmos", "model": "m", "headline": "p808",
                     "overall": {"p808": 3.75, "ovrl": 3.0}, "per_voice": {"slt": {"p808": 3.5, "ovrl": 2.9},
                                                                          "rms": {"p808": 4.0, "ovrl": 3.1}}}}
    text = audit_table(audit)
    assert "| Voice | P.808 ↑ | P.835 OVRL ↑ |" in text and "| rms | 4.00 | 3.10 |" in text
    assert "| **overall** | 3.75 | 3.00 |" in text
    audit["sim"]["same_vs_different_speaker"] = None
    summary = metrics_summary(results, audit)
    assert summary["ar"]["cross_sentence"]["mos_p808"] == 3.0 and summary["ar"]["cross_sentence"]["mos_ovrl"] == 2.5
    assert summary["ground_truth_audit"]["mos_p808"] == 3.75
    # every item timed (batch 1): no caption about it
    plain = {"ar": {"continuation": result(wer=10.0, rtf=0.1), "cross_sentence": result(wer=10.0, rtf=0.1)}}
    for r in plain["ar"].values():
        r["speed"]["items_timed"] = 6
    assert "decoded alone" not in comparison_table(plain, Layout(references=[], comparison={"ar": ["ar"]}))


def test_comparison_rows_follow_the_layouts_order_not_the_alphabet():
    """The DAG's layout JSON has sorted keys; its ``order`` (training.paradigms') puts the rows back."""
    results = {s: both(wer=10.0) for s in ("ar", "nar", "syncspeech", "cod")}
    layout = Layout(references=[], comparison={s: [s] for s in sorted(results)}, order=["ar", "nar", "syncspeech"])
    assert list(layout.comparison) == ["ar", "nar", "syncspeech", "cod"]  # cod, not in the order, after them
    table = comparison_table(results, layout)
    assert table.index("| nar |") < table.index("| syncspeech |") < table.index("| cod |")
