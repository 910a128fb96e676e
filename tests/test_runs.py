"""The run registry (arnar.runs) and `arnar runs`, checked by hand on the smoke profile."""

import pytest

from arnar.cli import main
from arnar.config import REPO_ROOT, load_params
from arnar.runs import ABLATIONS, COARSE_KINDS, SYSTEMS_OF, RunsError, run_registry


def smoke_registry():
    return run_registry(load_params(REPO_ROOT / "params.yaml", {"profile": "smoke"}))


def test_smoke_registry_chains_and_systems():
    registry = smoke_registry()
    # multi-stage recipes: fine-tuning after pre-training, PALLE stage two after stage one; DELTA reads ar
    assert registry.runs_needed("syncspeech") == ["syncspeech_pretrain"]
    assert registry.runs_needed("palle") == ["palle_stage1"]
    assert registry.runs_needed("delta") == ["ar"]
    assert registry.delta_source == "ar"  # tiny models: DELTA converts the comparison's ar run
    # every run appears once, after the run that needs it
    runs = registry.all_runs()
    assert runs[:8] == ["ar", "nar", "syncspeech", "syncspeech_pretrain", "palle", "palle_stage1", "palle_concat",
                        "palle_concat_stage1"]
    assert len(runs) == len(set(runs)) == 20
    # PALLE on both layouts: the concatenation layout's stage one starts from ar (start_from_ar), its
    # stage two from its stage one; with the fused pair's budget where a profile gives it none of its own
    assert registry.runs_needed("palle_concat") == ["palle_concat_stage1"]
    assert registry.runs_needed("palle_concat_stage1") == ["ar"]
    assert registry.lineage("palle_concat") == ["ar", "palle_concat_stage1", "palle_concat"]
    assert registry.runs["palle_concat_stage1"]["overrides"] == ["paradigm.options.layout=concat"]
    assert registry.run_base["palle_concat_stage1"] == "palle_stage1" and registry.run_base["palle_concat"] == "palle"
    assert registry.paradigm_systems["palle_concat_stage1"] == ("palle_concat", {"refine_steps": 0})
    # evaluated systems: the comparison with two synthesis seeds, plus grids and ablations
    assert registry.paradigm_systems["palle_stage1"] == ("palle", {"refine_steps": 0})
    assert registry.paradigm_systems["ar_seed2"] == ("ar", {})
    assert registry.system_seed["ar_seed2"] == 1235
    # a training-time grid value is one more run of its base run, with the axis' override
    assert registry.runs["syncspeech_q2"] == {"config": "syncspeech", "init_from": "syncspeech_pretrain",
                                              "overrides": ["paradigm.options.q=2"]}
    assert registry.run_base["cod_paper"] == "cod" and registry.run_base["cod_ind"] == "cod"
    assert set(COARSE_KINDS) <= set(registry.runs) and "cod_table5" in ABLATIONS and "cod" in SYSTEMS_OF
    # a system's weights come from its run and every run that one starts from or loads
    assert registry.lineage("ar") == ["ar"]
    assert registry.lineage("syncspeech") == ["syncspeech_pretrain", "syncspeech"]
    assert registry.lineage("delta") == ["ar", "delta"]
    assert registry.lineage("palle") == ["palle_stage1", "palle"]


def test_a_grid_of_an_unlisted_paradigm_is_refused():
    params = load_params(REPO_ROOT / "params.yaml", {"profile": "smoke"})
    params["training"]["paradigms"] = [p for p in params["training"]["paradigms"] if p != "cod"]
    with pytest.raises(RunsError, match="add it to training.paradigms"):
        run_registry(params)


def test_arnar_runs_lists_runs_chains_and_systems(capsys):
    assert main(["runs", "--params", str(REPO_ROOT / "params.yaml"), "--profile", "smoke"]) in (0, None)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "profile smoke: 20 runs, 33 evaluated systems"
    rows = {line.split()[0]: line.split(None, 2)[2] for line in out[2:]}
    assert rows["ar"].split() == ["-", "ar", "ar_seed2"]
    assert rows["syncspeech"].startswith("init_from syncspeech_pretrain ")
    assert rows["syncspeech"].split()[-2:] == ["syncspeech", "syncspeech_seed2"]
    assert rows["syncspeech_pretrain"].split() == ["-", "-"]
    assert rows["palle"].split()[2:] == ["palle_stage1", "palle", "palle_stage1_seed2", "palle_seed2",
                                         "palle_dur0.7", "palle_dur1.0"]
    assert rows["delta"].startswith("reads ar ")
    assert rows["cod_paper"].split() == ["base", "cod", "cod_paper", "cod_paper_seed2"]
    assert rows["syncspeech_q2"].startswith("init_from syncspeech_pretrain, base syncspeech ")


def test_the_default_profile_trains_the_six_and_one_cod_row():
    """speak (two hours on 2 cores) drops the paper's CoD row and the first-quantizer CoD (no system,
    so no run of them among the runs its systems need), and has PALLE on the concatenation layout
    only, its stage one from ar; mini keeps all of them."""
    speak = run_registry(load_params(REPO_ROOT / "params.yaml", {"profile": "speak"}))
    systems = {run for run, _ in speak.paradigm_systems.values()}
    assert "cod" in systems and "cod_paper" not in systems and "cod_q1" not in systems
    assert not any(s.startswith(("cod_paper", "cod_q1")) for s in speak.paradigm_systems)
    assert set(systems) == {"ar", "nar", "syncspeech", "palle_concat", "delta", "cod"}
    assert speak.lineage("palle_concat") == ["ar", "palle_concat_stage1", "palle_concat"]
    assert set(speak.all_runs()) == {"ar", "nar", "syncspeech", "syncspeech_pretrain", "palle_concat",
                                     "palle_concat_stage1", "delta", "cod"}
    mini = run_registry(load_params(REPO_ROOT / "params.yaml", {"profile": "mini"}))
    assert mini.paradigm_systems["cod_paper_seed3"] == ("cod_paper", {})
    assert mini.paradigm_systems["cod_q1_seed3"] == ("cod_q1", {})
    # the single-stream CoD is a row only where a profile turns it on (tests/test_cod_rows.py plans it)
    assert not any(s.startswith("cod_single") for s in (*speak.paradigm_systems, *mini.paradigm_systems))
    assert {"palle_stage1", "palle", "palle_concat_stage1", "palle_concat"} <= set(mini.paradigm_systems)


def test_a_decoding_that_draws_nothing_from_the_seed_speaks_once():
    """speak decodes DELTA at temperature 0 (argmax commits): its seeds would give the same audio,
    so it is synthesized once; every sampling system keeps its replicas and their seeds. mini
    samples DELTA (the paper's temperature 1) and keeps three."""
    speak = run_registry(load_params(REPO_ROOT / "params.yaml", {"profile": "speak"}))
    assert speak.seeds_of["delta"] == ["delta"]
    assert not any(s.startswith("delta_seed") for s in speak.paradigm_systems)
    assert speak.seeds_of["ar"] == ["ar", "ar_seed2", "ar_seed3"]
    assert (speak.system_seed["ar_seed2"], speak.system_seed["ar_seed3"]) == (1235, 1236)
    assert "delta_seed2" not in speak.system_seed
    mini = run_registry(load_params(REPO_ROOT / "params.yaml", {"profile": "mini"}))
    assert mini.seeds_of["delta"] == ["delta", "delta_seed2", "delta_seed3"]
    assert mini.system_seed["delta_seed3"] == 1236


def test_start_from_ar_chains_runs_to_ar_and_refuses_what_cannot():
    """training.start_from_ar: the listed runs start from ar (init_from, tensors matched by name and
    shape), so their lineage and budget include ar's; ar itself, a run already chained to another,
    an unknown run and CoD's acoustic-stack runs (another vocabulary) are refused by name."""
    params = load_params(REPO_ROOT / "params.yaml", {"profile": "smoke"})
    params["training"]["start_from_ar"] = ["nar", "syncspeech_pretrain", "palle_stage1"]
    registry = run_registry(params)
    assert registry.runs["nar"] == {"config": "nar", "init_from": "ar", "init_matching": True}
    assert registry.lineage("nar") == ["ar", "nar"]
    assert registry.lineage("syncspeech") == ["ar", "syncspeech_pretrain", "syncspeech"]
    assert registry.lineage("palle") == ["ar", "palle_stage1", "palle"]
    assert "init_matching" not in registry.runs["palle"]  # stage two still loads stage one strictly
    for run, reason in [("ar", "not a run"), ("nope", "not a run"), ("palle", "already starts from"),
                        ("delta", "already starts from"), ("cod", "acoustic stack")]:
        params["training"]["start_from_ar"] = [run]
        with pytest.raises(RunsError, match=reason):
            run_registry(params)


def test_the_longest_chain_of_runs_starts_first():
    """speak: ar -> syncspeech_pretrain -> syncspeech and ar -> palle_concat_stage1 -> palle_concat
    are the longest chains (NAR and DELTA also wait for ar); cod stands alone. train.smk's priority
    is this depth."""
    speak = run_registry(load_params(REPO_ROOT / "params.yaml", {"profile": "speak"}))
    runs = speak.all_runs()
    depth = {run: speak.chain_depth(run, runs) for run in runs}
    assert depth == {"ar": 3, "syncspeech_pretrain": 2, "palle_concat_stage1": 2, "syncspeech": 1, "nar": 1,
                     "delta": 1, "palle_concat": 1, "cod": 1}
