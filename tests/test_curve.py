"""Learning curves (arnar.evaluate.curve): which checkpoints are read, in what order, with which
dev loss, and how an interrupted curve resumes."""

import json

import pytest
import torch

from arnar.evaluate.curve import CurveError, checkpoint_facts, curve_table, kept_checkpoints, learning_curve


def make_run(tmp_path, steps, final=True):
    """A run folder with training checkpoints at ``steps`` (dev loss 5 - step / 1000) and final.pt."""
    run = tmp_path / "ar"
    (run / "checkpoints").mkdir(parents=True)
    for step in steps:
        torch.save({"step": step, "dev_loss": 5.0 - step / 1000}, run / "checkpoints" / f"step_{step}.pt")
    torch.save({"step": 99, "dev_loss": 4.0}, run / "checkpoints" / "last.pt")  # not a kept step
    if final:
        torch.save({"step": max(steps, default=0), "model": {}}, run / "final.pt")
    return run


def test_kept_checkpoints_are_in_update_order_then_final(tmp_path):
    # numeric order, not the file names' (step_1000 sorts before step_500 as text)
    run = make_run(tmp_path, [1000, 500, 1500])
    assert kept_checkpoints(run) == ["step_500", "step_1000", "step_1500", "final"]


def test_a_run_with_nothing_kept_is_refused_by_name(tmp_path):
    run = make_run(tmp_path, [], final=False)
    with pytest.raises(CurveError, match="no kept checkpoints"):
        kept_checkpoints(run)


def test_checkpoint_facts_read_step_and_dev_loss_and_refuse_a_foreign_file(tmp_path):
    run = make_run(tmp_path, [500])
    assert checkpoint_facts(run, "step_500") == {"step": 500, "dev_loss": 4.5}
    assert checkpoint_facts(run, "final") == {"step": 500, "dev_loss": None}
    torch.save([1, 2], run / "checkpoints" / "step_7.pt")
    with pytest.raises(CurveError, match="step_7.pt: not a checkpoint"):
        checkpoint_facts(run, "step_7")
    with pytest.raises(CurveError, match="no such checkpoint"):
        checkpoint_facts(run, "step_8")


def test_every_checkpoint_speaks_and_is_judged_once_and_a_rerun_resumes(tmp_path):
    run = make_run(tmp_path, [500, 1000])
    spoken = []

    def speak(name, wav_dir):
        wav_dir.mkdir(parents=True)
        spoken.append(name)

    def judge(name, wav_dir, out_json):
        # WER (percent, as evaluate_system gives it) falls with updates: 90 at 500, 60 at 1000, 30 at final
        wer = {"step_500": 90.0, "step_1000": 60.0, "final": 30.0}[name]
        result = {"asr": {"moonshine": {"wer_corpus": wer}}, "sim": {"mean": 0.7}}
        out_json.write_text(json.dumps(result))
        return result

    rows = learning_curve(run, None, speak=speak, judge=judge, out_dir=tmp_path / "curve", final_dev_loss=3.2)
    assert spoken == ["step_500", "step_1000", "final"]
    assert [(r["step"], r["dev_loss"], r["wer"]["moonshine"]) for r in rows] == [
        (500, 4.5, 90.0), (1000, 4.0, 60.0), (1000, 3.2, 30.0)]  # final: the summary's dev loss
    table = (tmp_path / "curve" / "curve.md").read_text().splitlines()
    assert table[0] == "| checkpoint | updates | dev loss | WER moonshine | SIM |"
    assert table[2] == "| step_500 | 500 | 4.500 | 90.0 % | 0.700 |"
    # a second call reads the judged checkpoints back: nothing speaks again
    spoken.clear()
    again = learning_curve(run, None, speak=speak, judge=judge, out_dir=tmp_path / "curve", final_dev_loss=3.2)
    assert spoken == [] and again == rows


def test_the_table_marks_a_missing_dev_loss_and_sim():
    rows = [{"checkpoint": "final", "step": 10, "dev_loss": None, "wer": {"a": 50.0, "b": 25.0}, "sim": None}]
    assert curve_table(rows, ["a", "b"]).splitlines()[-1] == "| final | 10 | — | 50.0 % | 25.0 % | — |"


def test_best_and_final_take_the_summary_dev_losses(tmp_path):
    run = make_run(tmp_path, [500])
    torch.save({"step": 200, "model": {}}, run / "best.pt")  # weights only, as the engine writes it

    def judge(name, wav_dir, out_json):
        return {"asr": {"moonshine": {"wer_corpus": 50.0}}, "sim": {"mean": 0.5}}

    rows = learning_curve(run, ["best", "final"], speak=lambda name, wav_dir: None, judge=judge,
                          out_dir=tmp_path / "curve", final_dev_loss=3.0, best_dev_loss=2.5)
    assert [(r["checkpoint"], r["step"], r["dev_loss"]) for r in rows] == [("best", 200, 2.5), ("final", 500, 3.0)]
