"""Lesson 03's GROW switch (minigate.course.grow): the three models trained in one background process, progress read
from the run folders, a killed run resumed, and lesson 04's measurement of the learner's own models."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from minigate import measure
from minigate.course.grow import CPU_RECIPE, GPU_RECIPE, Grow, recipe_for
from minigate.pretrained import SHIPPED_DIR

FAST = {"eval_every": 2, "ckpt_every": 2, "eval_batches": 1, "batch_size": 4, "seq_len": 32}


def wait(grow: Grow, until, timeout: float = 90.0):
    t0 = time.monotonic()
    while not until():
        assert time.monotonic() - t0 < timeout, {v: p for v, p in grow.status().items()}
        time.sleep(0.2)


def test_the_recipe_is_code_on_a_cpu_and_code_gpu_on_cuda():
    assert recipe_for("cpu") == CPU_RECIPE == "code" and recipe_for("cuda") == recipe_for("cuda:0") == GPU_RECIPE
    assert Grow(seed=2, preset="code", root="runs").command("headwise")[3:] == [
        "train", "--preset", "code", "--variant", "headwise", "--out", "runs/code-seed2/headwise", "--set", "seed=2"]
    with pytest.raises(ValueError, match="unknown preset 'cod'"):
        Grow(preset="cod")


def test_start_trains_the_three_in_the_background_once(tmp_path):
    grow = Grow(seed=3, preset="ci", root=tmp_path, steps=4, sets=FAST)
    said = grow.start()
    assert said.startswith("training baseline, headwise, elementwise in the background")
    assert grow.start().startswith("already training")  # the first holds the lock: nothing more started
    wait(grow, lambda: grow.finished() and not grow.running())
    assert grow.start().startswith("all three models of seed 3 are trained")
    for variant, p in grow.status().items():
        assert (p.step, p.steps, p.state) == (4, 4, "done")
        record = json.loads((grow.folder(variant) / "run.json").read_text())
        assert record["train"]["seed"] == 3 and record["train"]["steps"] == 4
    assert "done: validation loss" in grow.log("elementwise").read_text()


def test_progress_is_read_from_a_running_folder(tmp_path):
    grow = Grow(seed=0, preset="code", root=tmp_path)
    assert {p.state for p in grow.status().values()} == {"waiting"} and not grow.running()
    (grow.folder("none")).mkdir(parents=True)
    (grow.folder("none") / "history.json").write_text(json.dumps({"step": [1, 2, 500], "metrics": [
        {"step": 250, "sink_rate_64": 0.125, "f_attn_excess": 0.01, "m_act": 20.0}]}))
    grow.log("none").write_text("train:  13%|#3  | 520/4000 [01:05<07:10, 8.1it/s, loss=3.1]\n")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from minigate.runfolder import RunLock\n"
                               f"with RunLock({str(grow.base)!r}):\n    print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)  # what the background process holds while it works
    try:
        assert holder.stdout.readline() == "held\n"
        p = grow.progress("none")
        assert (p.step, p.steps, p.state) == (520, 4000, "training") and grow.running()
        assert grow.progress("headwise").state == "waiting"
    finally:
        holder.kill()
        holder.wait()
    assert grow.progress("none").state == "stopped"  # unfinished, and nothing trains it: start() resumes it
    assert list(grow.histories()) == ["baseline"]
    fig = grow.curves()
    assert [ax.get_title() for ax in fig.axes] == ["sink heads at T=64 (share)", "F-Attn above uniform", "M-Act"]


def test_a_killed_run_resumes_where_its_checkpoint_stands(tmp_path):
    grow = Grow(seed=0, preset="ci", root=tmp_path, steps=16, sets=dict(FAST, ckpt_every=4))
    grow.start()
    wait(grow, lambda: grow.progress("none").step >= 8 and (grow.folder("none") / "checkpoint.pt").is_file())
    pid = int(dict(line.split("=", 1) for line in (grow.base / ".lock").read_text().splitlines())["pid"])
    os.killpg(pid, signal.SIGKILL)  # the background process and its `minigate train`, mid-run, as a crash would
    wait(grow, lambda: not grow.running(), timeout=10)
    assert not grow.done("none") and grow.progress("none").state == "stopped"
    assert "--resume" in grow.command("none")
    grow.start()
    wait(grow, lambda: grow.finished() and not grow.running())
    log = grow.log("none").read_text()
    assert "resuming" in log and log.count("done: validation loss") == 1
    assert json.loads((grow.folder("none") / "history.json").read_text())["step"][-1] == 16


def test_lesson_04_measures_the_learners_models_as_the_shipped_ones(tmp_path):
    """Three finished run folders (here: the shipped weights and histories, laid out as `minigate train` writes them)
    are measured with measure.measure_folder on the same windows; before all three exist there is nothing to show."""
    grow = Grow(seed=7, preset="code", root=tmp_path)
    prose = measure.prose_windows(limit=2)
    for variant, name in measure.NAMES.items():
        assert grow.measure(prose) is None
        shutil.copytree(SHIPPED_DIR / f"code-{name}", grow.folder(variant) / "model")
        shutil.move(grow.folder(variant) / "model" / "history.json", grow.folder(variant) / "history.json")
    rows = grow.measure(prose)
    shipped = {v: measure.measure_folder(SHIPPED_DIR / f"code-{n}", prose) for v, n in measure.NAMES.items()}
    for v, r in rows.items():
        assert r.name == f"yours-{measure.NAMES[v]}" and r.windows == 2
        assert (r.f_attn, r.m_act, r.val_loss_code) == (shipped[v].f_attn, shipped[v].m_act, shipped[v].val_loss_code)


def test_the_estimate_times_a_few_steps_of_each_model():
    torch.manual_seed(0)
    minutes = Grow(preset="ci", steps=600).estimate(steps=1, warmup=1)
    assert list(minutes) == ["baseline", "headwise", "elementwise"] and all(0 < m < 60 for m in minutes.values())
