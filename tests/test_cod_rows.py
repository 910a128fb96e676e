"""Chain-of-Details' extra rows (issue 22 items 6-7): the guidance-form grid and the paper's model.

* ``cod_guidance_form``: a decoding axis (no retraining) whose values are both CFG forms of
  ``arnar.paradigms.cod``; the value that is cod.py's default is the ``cod`` row itself.
* ``cod_paper``: the paper's CoD (``speech_prompt: false``, voice from the adaLN speaker
  embedding only) as a comparison row, trained exactly as ``cod`` is otherwise.

The registry is read where it acts: the train and synthesize commands a Snakemake dry run
plans (workflow/rules/runs.smk), and the Hydra config those overrides compose.
"""

import json
import re

import pytest

from arnar.ablations import GRIDS, check_grid_values, grid_rows
from arnar.config import ConfigError, load_params
from arnar.paradigms.cod import DECODING, GUIDANCE_FORMS

# a profile-level override of cod: every run trained as cod must take it too (RUN_BASE)
COD_STEPS = "train.max_steps=7"


def test_guidance_form_axis_decodes_both_forms_of_the_trained_cod():
    grid = GRIDS["cod_guidance_form"]
    assert grid.paradigm == "cod" and grid.base == "cod"
    assert not grid.training and grid.decoding == "guidance_form"  # decoding only: the cod run, decoded again
    assert set(GUIDANCE_FORMS) == {"extrapolate", "interpolate"}
    assert grid.default == DECODING["guidance_form"]  # the cod row is cod.py's default form
    rows = dict(grid_rows("cod_guidance_form", ["extrapolate", "interpolate"]))
    other = "interpolate" if DECODING["guidance_form"] == "extrapolate" else "extrapolate"
    assert rows == {DECODING["guidance_form"]: "cod", other: f"cod_guidance_{other}"}
    with pytest.raises(ValueError, match="repeated value"):
        check_grid_values("cod_guidance_form", ["interpolate", "interpolate"])
    assert grid.source == "Chain-of-Details (arXiv:2604.19330) Sec. IV-B"  # "we decrease the guidance level linearly from 3 to 0.75"


@pytest.mark.parametrize("profile", ["smoke", "mini"])
def test_smoke_and_mini_list_both_guidance_forms(profile):
    P = load_params(overrides={"profile": profile})
    assert P["training"]["grids"]["cod_guidance_form"] == ["extrapolate", "interpolate"]
    assert "cod" in P["training"]["paradigms"]


def test_the_schema_refuses_an_unknown_guidance_form():
    with pytest.raises(ConfigError, match="cod_guidance_form"):
        load_params(overrides={"profile": "smoke", "profiles": {"smoke": {"training": {"grids": {
            "cod_guidance_form": ["extrapolate", "average"]}}}}})


@pytest.fixture(scope="module")
def smoke_plan(tmp_path_factory):
    """The smoke DAG's shell commands (dry run), with a profile override of cod's updates."""
    from smoke_dag import BIN, copy_workflow, run

    workflow = copy_workflow(tmp_path_factory.mktemp("wf"))
    # a config file, not --config, which would turn the boolean into a string
    profiles = {"profiles": {"smoke": {"training": {"overrides": {"cod": [COD_STEPS]}, "cod_q1": True, "cod_single": True},
                                       "codec": {"resynthesis": ["offline", "offline_rvq", "offline_rvq_q1"]}}}}
    (workflow / "plan.json").write_text(json.dumps(profiles))
    return run([str(BIN / "snakemake"), "-n", "-p", "--cores", "1", "--configfile", "params.yaml", "plan.json",
                "--config", "profile=smoke"], workflow).stdout


def train_overrides(plan):
    jobs = re.finditer(r"arnar train --run-dir \S+/runs/(\w+) .*? -- (.*?) 2>", plan)
    return {m.group(1): m.group(2).split() for m in jobs}


def synthesized(plan):
    """system -> task -> decoding options of every planned synthesis."""
    out = {}
    for m in re.finditer(r"arnar synthesize --run-dir \S+/runs/(\w+) .*? --out \S+/systems/(\w+)/(\w+) "
                         r"--decoding '(.*?)'", plan):
        out.setdefault(m.group(2), {})[m.group(3)] = (m.group(1), json.loads(m.group(4)))
    return out


def test_cod_paper_trains_as_cod_without_the_speech_prompt(smoke_plan):
    runs = train_overrides(smoke_plan)
    cod, paper = runs["cod"], runs["cod_paper"]
    assert "paradigm.options.speech_prompt=false" in paper and not any("speech_prompt" in o for o in cod)
    # the same config, model, recipe, features and updates (cod's profile override included): nothing else differs
    assert [o for o in paper if o != "paradigm.options.speech_prompt=false"] == cod
    assert cod[:3] == ["paradigm=cod", "model=tiny", "train=smoke"] and cod[-1] == COD_STEPS
    assert "data.features=data/smoke/features/cod_train.pt" in paper


def test_cod_paper_config_differs_from_cod_in_the_speech_prompt_only(smoke_plan):
    from arnar.train import compose_config

    runs = train_overrides(smoke_plan)
    cod = compose_config(runs["cod"])
    paper = compose_config(runs["cod_paper"])
    assert cod.paradigm.options.speech_prompt is True and paper.paradigm.options.speech_prompt is False
    paper.paradigm.options.speech_prompt = True
    assert paper == cod


def test_cod_paper_is_a_comparison_row_and_the_guidance_grid_decodes_the_cod_run(smoke_plan):
    systems = synthesized(smoke_plan)
    # a row of the comparison: both tasks, every synthesis seed (smoke: 2)
    for system in ("cod_paper", "cod_paper_seed2"):
        assert set(systems[system]) == {"continuation", "cross_sentence"}
        assert all(run == "cod_paper" and options == {} for run, options in systems[system].values())
    # the grid: one more decoding of the trained cod run, on the grid tasks only
    other = "interpolate" if DECODING["guidance_form"] == "extrapolate" else "extrapolate"
    assert systems[f"cod_guidance_{other}"] == {"cross_sentence": ("cod", {"guidance_form": other})}
    assert systems["cod"]["cross_sentence"] == ("cod", {})
    layout = json.loads(re.search(r"arnar report .*? --layout '(.*?)'", smoke_plan).group(1))
    assert layout["comparison"]["cod_paper"] == ["cod_paper", "cod_paper_seed2"]
    assert layout["grids"]["cod_guidance_form"] == ["extrapolate", "interpolate"]


def test_cod_generates_the_whole_stack_and_cod_q1_its_first_quantizer(smoke_plan):
    """Issue 53: `cod` generates every codebook (option codebooks: all) and its reference row is the
    stack's resynthesis; `cod_q1` is the same run with codebooks=1, a comparison row whose reference
    is the first quantizer's resynthesis; both decode through the stack's codec."""
    from arnar.train import compose_config

    runs = train_overrides(smoke_plan)
    assert "paradigm.options.codebooks=1" in runs["cod_q1"] and not any("codebooks" in o for o in runs["cod"])
    assert [o for o in runs["cod_q1"] if o != "paradigm.options.codebooks=1"] == runs["cod"]  # cod's updates too
    assert compose_config(runs["cod"]).paradigm.options.codebooks == "all"
    assert compose_config(runs["cod_q1"]).paradigm.options.codebooks == 1
    codecs = dict(re.findall(r"arnar synthesize --run-dir \S+/runs/(cod\w*) .*?--codec (\w+)", smoke_plan))
    assert codecs["cod"] == codecs["cod_q1"] == "offline_rvq"
    systems = synthesized(smoke_plan)
    assert set(systems["cod_q1_seed2"]) == {"continuation", "cross_sentence"}
    layout = json.loads(re.search(r"arnar report .*? --layout '(.*?)'", smoke_plan).group(1))
    assert layout["ceilings"]["cod"] == layout["ceilings"]["cod_paper"] == "resynth_offline_rvq"
    assert layout["ceilings"]["cod_q1"] == "resynth_offline_rvq_q1"
    assert layout["ceilings"]["ar"] == "resynth_offline"


def test_a_decoding_grid_decodes_as_its_base_row_and_may_not_move_its_default(tmp_path):
    """training.decoding of cod reaches the guidance grid's system too (the axis' option aside), and
    setting the axis' own option there (which would relabel the cod row) stops the DAG, key named."""
    from smoke_dag import BIN, copy_workflow, run

    workflow = copy_workflow(tmp_path / "wf")
    other = "interpolate" if DECODING["guidance_form"] == "extrapolate" else "extrapolate"

    def plan(decoding):
        profiles = {"smoke": {"training": {"decoding": {"cod": decoding}}}}
        target = f"data/smoke/systems/cod_guidance_{other}/cross_sentence"
        return run([str(BIN / "snakemake"), "-n", "-p", "--cores", "1", target,
                    "--config", "profile=smoke", f"profiles={json.dumps(profiles)}"], workflow, check=False)

    ok = plan({"length": "prompt_rate"})  # (a string: --config turns the numbers of a JSON value into strings)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert synthesized(ok.stdout)[f"cod_guidance_{other}"]["cross_sentence"] == \
        ("cod", {"guidance_form": other, "length": "prompt_rate"})
    refused = plan({"guidance_form": other})
    assert refused.returncode != 0
    assert "training.decoding.cod sets 'guidance_form', the option the grid cod_guidance_form varies" in \
        refused.stdout + refused.stderr


def test_cod_single_trains_as_cod_on_the_single_stream_and_decodes_through_it(smoke_plan):
    """`cod_single`: the same config, features and updates as `cod`, but the single stream's tokens
    and 25 Hz durations (`codebooks: all` resolves to that manifest's one codebook), decoded through
    the single stream's codec, with that stream's resynthesis as its reference row."""
    runs = train_overrides(smoke_plan)
    assert runs["cod_single"] == runs["cod"]
    data = dict(re.findall(r"arnar train --run-dir \S+/runs/(cod\w*) --tokens (\S+) ", smoke_plan))
    assert data["cod"].endswith("/tokens/offline_rvq/train") and data["cod_single"].endswith("/tokens/offline/train")
    durations = dict(re.findall(r"arnar train --run-dir \S+/runs/(cod\w*) .*?--durations (\S+) ", smoke_plan))
    assert durations["cod_single"].endswith("durations_25hz/train.jsonl") and "50hz" in durations["cod"]
    codecs = dict(re.findall(r"arnar synthesize --run-dir \S+/runs/(cod\w*) .*?--codec (\w+)", smoke_plan))
    assert codecs["cod_single"] == "offline" and codecs["cod"] == "offline_rvq"
    assert set(synthesized(smoke_plan)["cod_single_seed2"]) == {"continuation", "cross_sentence"}
    layout = json.loads(re.search(r"arnar report .*? --layout '(.*?)'", smoke_plan).group(1))
    assert layout["ceilings"]["cod_single"] == "resynth_offline"
