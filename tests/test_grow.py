"""Lesson 03's GROW switch (minigate.course.grow): the three models trained in one background process, progress read
from the run folders and the JSON lines of `minigate train --progress json`, a killed run resumed, the processes of a
stopped one found ended (psutil), and lesson 04's measurement of the learner's own models."""

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch

from minigate import Transformer, measure
from minigate.course.grow import CPU_RECIPE, GPU_RECIPE, Grow, _any_running, _tree, find_grown, recipe_for
from minigate.presets import NAMES, PRESETS, VARIANTS, model_config
from minigate.course import release
from minigate.course.release import SEEDS_DIR, SHIPPED_DIR
from minigate.runfolder import lock_holder
from minigate.train import train

FAST = {"eval_every": 2, "ckpt_every": 2, "eval_batches": 1, "batch_size": 4, "seq_len": 32}


# a guard against a hang, not a timing: on 2 busy cores (the other pytest worker running torchrun's two ranks or a
# training notebook) three ci runs of 250 steps took over 90 s
def wait(grow: Grow, until, timeout: float = 300.0):
    t0 = time.monotonic()
    while not until():
        assert time.monotonic() - t0 < timeout, {v: p for v, p in grow.status().items()}
        time.sleep(0.2)


def test_the_recipe_is_code_on_a_cpu_and_code_gpu_on_cuda():
    assert recipe_for("cpu") == CPU_RECIPE == "code" and recipe_for("cuda") == recipe_for("cuda:0") == GPU_RECIPE
    assert Grow(seed=2, preset="code", root="runs").command("headwise")[3:] == [
        "train", "--preset", "code", "--variant", "headwise", "--out", "runs/code-seed2/headwise", "--set", "seed=2",
        "--progress", "json"]
    with pytest.raises(ValueError, match="unknown preset 'cod'"):
        Grow(preset="cod")


@pytest.mark.slow
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
        lines = [json.loads(line) for line in grow.log(variant).read_text().splitlines() if line.startswith("{")]
        assert lines[0]["step"] == 1 and lines[-1] == {"step": 4, "steps": 4, "loss": lines[-1]["loss"],
                                                       "val_loss": lines[-1]["val_loss"],
                                                       "tokens_per_s": lines[-1]["tokens_per_s"]}
        assert all(isinstance(lines[-1][k], (int, float)) for k in ("loss", "val_loss", "tokens_per_s"))
    assert "done: validation loss" in grow.log("elementwise").read_text()


@pytest.mark.slow
def test_progress_is_read_from_a_running_folder(tmp_path):
    grow = Grow(seed=0, preset="code", root=tmp_path)
    assert {p.state for p in grow.status().values()} == {"waiting"} and not grow.running()
    (grow.folder("none")).mkdir(parents=True)
    (grow.folder("none") / "history.json").write_text(json.dumps({"step": [1, 2, 500], "metrics": [
        {"step": 250, "sink_rate_64": 0.125, "f_attn_excess": 0.01, "m_act": 20.0}]}))
    grow.log("none").write_text("x" * 5000 + "\n"  # beyond the tail that is read
                                'resuming runs/x at step 500/4000\n{"step": 510, "steps": 4000, "loss": 3.2}\n'
                                "train:  13%|#3  | 530/4000 [01:05<07:10, 8.1it/s, loss=3.1]\n"  # a bar: not read
                                '{"step": 520, "steps": 4000, "loss": 3.1, "val_loss": null, "tokens_per_s": 900}\n'
                                "a message after it\n")
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
    assert [ax.get_title() for ax in fig.axes] == ["sink rate at T=64", "F-Attn above uniform", "M-Act"]


@pytest.mark.slow
def test_lesson_04_measures_the_learners_models_as_the_shipped_ones(tmp_path):
    """Three finished run folders (here: the shipped weights and histories, laid out as `minigate train` writes them)
    are measured with measure.measure_folder on the same windows; before all three exist there is nothing to show."""
    grow = Grow(seed=7, preset="code", root=tmp_path)
    prose = measure.prose_windows(limit=2)
    for variant, name in NAMES.items():
        assert grow.measure(prose) is None
        shutil.copytree(SHIPPED_DIR / f"code-{name}", grow.folder(variant) / "model")
        shutil.move(grow.folder(variant) / "model" / "history.json", grow.folder(variant) / "history.json")
    rows = grow.measure(prose)
    shipped = {v: measure.measure_folder(SHIPPED_DIR / f"code-{n}", prose) for v, n in NAMES.items()}
    for v, r in rows.items():
        assert r.name == f"yours-{NAMES[v]}" and r.windows == 2
        assert (r.f_attn, r.m_act, r.val_loss_code) == (shipped[v].f_attn, shipped[v].m_act, shipped[v].val_loss_code)


@pytest.mark.slow
def test_the_estimate_times_a_few_steps_of_each_model():
    torch.manual_seed(0)
    minutes = Grow(preset="ci", steps=600).estimate(steps=1, warmup=1)
    assert list(minutes) == ["baseline", "headwise", "elementwise"] and all(0 < m < 60 for m in minutes.values())
    with pytest.raises(ValueError, match="--set nope=...: no such ModelConfig or TrainConfig field"):
        Grow(preset="ci", sets={"nope": 1}).estimate(steps=1, warmup=1)  # the runs' own configs, --set included


@pytest.mark.slow
def test_progress_lines_are_json_from_train_itself(capsys):
    """train(progress="json"): a line of JSON on stdout every JSON_EVERY_S seconds (the first step's at once) and at
    the last step, and nothing else there; a progress it does not know is refused before it trains."""
    cfg = dataclasses.replace(PRESETS["ci"].train, steps=3, warmup_steps=1, eval_every=2, eval_batches=1,
                              batch_size=2, seq_len=32, ckpt_every=0, ckpt_minutes=0, compile=False, device="cpu")
    torch.manual_seed(0)
    model = Transformer(model_config("ci", "none"))
    ids = torch.randint(1, model.cfg.vocab_size, (2000,))
    history = train(model, ids, ids[:200], cfg, progress="json")
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    steps = [r["step"] for r in lines]  # [1, 3] unless a step took 2 s
    assert steps[0] == 1 and steps[-1] == 3 and steps == sorted(set(steps)) and {r["steps"] for r in lines} == {3}
    assert lines[-1]["loss"] == round(history.loss[-1], 4) and lines[-1]["val_loss"] == round(history.val_loss[-1], 4)
    assert lines[0]["val_loss"] is None  # no evaluation before step 2
    with pytest.raises(ValueError, match="progress='jsonl': True or 'bar' .*, 'json' .* or False"):
        train(model, ids, ids[:200], cfg, progress="jsonl")


@pytest.mark.skipif(os.name == "nt", reason="POSIX zombies")
def test_a_process_tree_has_ended_when_each_has_ended_or_is_a_zombie():
    """stop() waits on the background process and what it started (psutil): an ended process its parent has not yet
    waited for (a zombie) has ended; a pid with no process has no tree."""
    p = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                          "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                          "print(child.pid, flush=True)\nchild.wait()"], stdout=subprocess.PIPE, text=True)
    try:
        child = int(p.stdout.readline())
        tree = _tree(p.pid)
        assert [q.pid for q in tree] == [p.pid, child] and _any_running(tree)
        os.kill(child, signal.SIGKILL)  # p waits for it and ends; nobody waits for p yet: a zombie
        t0 = time.monotonic()
        while psutil.Process(p.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() - t0 < 10
            time.sleep(0.02)
        assert not _any_running(tree)
    finally:
        p.kill()
        p.wait()
        p.stdout.close()
    assert _tree(p.pid) == [] and not _any_running(tree)


@pytest.mark.slow
@pytest.mark.skipif(os.name == "nt", reason="POSIX process groups (on Windows stop() sends CTRL_BREAK to the group)")
def test_a_stopped_and_then_killed_run_resumes_each_time_where_its_checkpoint_stands(tmp_path):
    """stop() ends the background process *and* its `minigate train` (no orphan keeps training), after the model in
    training wrote a checkpoint; start() resumes it. Killed mid-run (as a crash would), the run resumes from that
    checkpoint again, and ends once. Meanwhile status checks, polled as fast as they go while the process starts,
    read who holds the lock and never take it: the process never fails to take it."""
    grow = Grow(seed=1, preset="ci", root=tmp_path, steps=250, sets=dict(FAST, ckpt_every=1000))
    assert grow.stop() == f"nothing is training {grow.base}"
    grow.start()
    t0 = time.monotonic()
    while grow.progress("none").step < 3:
        grow.status()
        assert time.monotonic() - t0 < 300, grow.status()
    pid = lock_holder(grow.base)["pid"]
    group = [int(p) for p in subprocess.run(["pgrep", "-g", str(os.getpgid(pid))], capture_output=True,
                                            text=True).stdout.split()]
    assert len(group) >= 2  # the background process and its `minigate train`
    said = grow.stop()
    assert not grow.running() and not any(psutil.pid_exists(p) for p in group), said
    assert said.startswith("stopped: baseline stopped at step") and "headwise waiting" in said
    checkpoint = grow.folder("none") / "checkpoint.pt"
    assert checkpoint.is_file()  # written on SIGTERM (ckpt_every is never reached)
    stopped_at = torch.load(checkpoint, weights_only=True)["step"]
    assert "SIGTERM: finishing this step" in grow.log("none").read_text()
    log = (grow.base / "grow.log").read_text()
    assert "baseline: stopped; see" in log and "in use" not in log and not grow.folder("headwise").exists()
    assert "--resume" in grow.command("none")
    grow.start()  # resumes from stopped_at; killed, with the process that started it, before its next checkpoint
    wait(grow, lambda: grow.progress("none").step > stopped_at)
    os.killpg(lock_holder(grow.base)["pid"], signal.SIGKILL)
    wait(grow, lambda: not grow.running(), timeout=10)
    assert not grow.done("none") and grow.progress("none").state == "stopped"
    assert torch.load(checkpoint, weights_only=True)["step"] == stopped_at and "--resume" in grow.command("none")
    grow.start()
    wait(grow, lambda: grow.finished() and not grow.running())
    log = grow.log("none").read_text()
    assert log.count("resuming") == log.count(f"at step {stopped_at}/250") == 2, log[-2000:]
    assert log.count("done: validation loss") == 1
    assert json.loads((grow.folder("none") / "history.json").read_text())["step"][-1] == 250


def _tiny_run(folder, preset: str, variant: str):
    """A finished run folder of `preset`'s model shape after 2 training steps on random tokens (train() writes model/
    and history.json as `minigate train` does)."""
    torch.manual_seed(0)
    model = Transformer(model_config(preset, variant))
    cfg = PRESETS[preset].train
    ids = torch.randint(1, model.cfg.vocab_size, (4000,))
    small = dict(steps=2, warmup_steps=1, batch_size=2, seq_len=32, eval_every=2, eval_batches=1, ckpt_every=0,
                 ckpt_minutes=0, compile=False, device="cpu", precision="fp32")
    train(model, ids, ids[:200], dataclasses.replace(cfg, **small), out_dir=folder, progress=False)


@pytest.mark.slow
def test_lesson_04_finds_a_code_gpu_trio_and_counts_its_own_heads(tmp_path):
    """A trio grown on a GPU (code-gpu: 6 layers x 8 heads), copied to a kept folder (Drive in Colab): find_grown finds
    it there, and compare() counts 48 heads and sets it beside code-gpu's own seeds, with no shipped trio to show."""
    kept = tmp_path / "drive"
    seeds_corpus = json.loads((SEEDS_DIR / "code-gpu.json").read_text())["rows"][0]
    for v in VARIANTS:
        folder = Grow(seed=4, preset="code-gpu", root=kept).folder(v)
        _tiny_run(folder, "code-gpu", v)
        path = folder / "run.json"
        run_json = json.loads(path.read_text()) if path.is_file() else {}  # as if it read the seeds' corpus
        run_json["python_code"] = {"sha256": seeds_corpus["corpus_sha256"], "files": seeds_corpus["corpus_files"]}
        (folder / "run.json").write_text(json.dumps(run_json))
    assert find_grown(4, [tmp_path / "runs"]) is None
    grown = find_grown(4, [tmp_path / "runs", kept])
    assert grown.preset == "code-gpu"
    text = grown.compare(measure.prose_windows(limit=2))
    assert json.loads((grown.folder("none") / "measurements.json").read_text())["heads"] == 48  # its own record
    rows = [line for line in text.splitlines() if line.startswith("yours")]
    assert len(rows) == 4 and all(" / 48 " in line for line in rows[:3]) and not text.startswith("shipped")
    assert "the course's seeds of the code-gpu recipe (data/seeds/code-gpu.json)" in text
    assert "seed 0's value (one of the course's runs)" in text and " of 48;" in text and "not set beside" not in text


@pytest.mark.slow
def test_a_trio_on_another_corpus_is_not_set_beside_the_courses(tmp_path):
    """Like with like: the shipped trio and the seeds read other python-code corpora than a trio grown on the pinned
    one; compare() names each corpus and sets neither beside yours."""
    grow = Grow(seed=7, preset="code", root=tmp_path)
    for variant, name in NAMES.items():
        shutil.copytree(SHIPPED_DIR / f"code-{name}", grow.folder(variant) / "model")
        shutil.move(grow.folder(variant) / "model" / "history.json", grow.folder(variant) / "history.json")
        run_json = json.loads((grow.folder(variant) / "model" / "run.json").read_text())
        run_json["python_code"] = {"sha256": "ab" * 32, "files": 10641}
        (grow.folder(variant) / "run.json").write_text(json.dumps(run_json))
    text = grow.compare(measure.prose_windows(limit=2))
    assert not any(line.startswith("shipped") for line in text.splitlines()) and "seed 0's value" not in text
    shipped = json.loads((SHIPPED_DIR / "code-baseline" / "run.json").read_text())["python_code"]
    assert f"yours read python-code {'ab' * 6} (10,641 files)" in text
    assert f"the shipped trio read python-code {shipped['sha256'][:12]} ({shipped['files']:,} files)" in text
    assert "the course's seeds (data/seeds/code.json) read" in text


@pytest.mark.slow
def test_lesson_03_compares_the_finished_trio_with_the_shipped_one(tmp_path):
    """The in-runtime comparison: the learner's three models measured on the windows given, each beside the shipped
    model of the same variant as its measurements.json stores it (heads of 16), both trios' ratios, and each new
    measurement stored beside its run. Here the learner's are the shipped weights on 2 windows; that those weights
    give their stored numbers on the 75 windows of the protocol is test_measure's."""
    grow = Grow(seed=7, preset="code", root=tmp_path)
    prose = measure.prose_windows(limit=2)
    assert grow.compare(prose) == ""
    for variant, name in NAMES.items():
        shutil.copytree(SHIPPED_DIR / f"code-{name}", grow.folder(variant) / "model")
        shutil.move(grow.folder(variant) / "model" / "history.json", grow.folder(variant) / "history.json")
    lines = grow.compare(prose).splitlines()
    stored = release.shipped_rows("code")
    mine = {v: measure.measure_folder(SHIPPED_DIR / f"code-{n}", prose, name=f"yours-{n}") for v, n in NAMES.items()}

    def numbers(row):
        return [str(row.sink_heads_64), "/", str(row.heads), f"{row.max_head_64:.2f}", f"{row.f_attn_excess:.3f}",
                f"{row.m_act:.1f}", f"{row.val_loss_code:.3f}"]

    for variant, name in NAMES.items():
        shipped = next(line for line in lines if line.startswith(f"shipped  code-{name} "))
        yours = next(line for line in lines if line.startswith(f"yours    yours-{name} "))
        assert shipped.split()[2:] == numbers(stored[variant]) and yours.split()[2:] == numbers(mine[variant])
        assert " / 16 " in yours
        record = json.loads((grow.folder(variant) / "measurements.json").read_text())  # measured once, kept beside it
        assert record["name"] == f"yours-{name}" and record["protocol"]["windows"] == 2
    for who, rows in (("shipped", stored), ("yours", mine)):
        x = measure.ratios(rows)
        line = next(line for line in lines if line.startswith(f"{who}:"))
        assert all(f"{x[g]['f_attn_excess']:.1f}x ({g})" in line and f"{x[g]['m_act']:.1f}x ({g})" in line
                   for g in x), line
    text = "\n".join(lines)
    rows = json.loads((SEEDS_DIR / "code.json").read_text())["rows"]
    shipped = json.loads((SHIPPED_DIR / "code-baseline" / "run.json").read_text())["python_code"]["sha256"]
    if {r["corpus_sha256"] for r in rows} == {shipped}:  # every seed on the shipped trio's corpus: set beside
        assert "(data/seeds/code.json)" in text and "seed 0's value (the shipped models)" in text
    else:  # seeds on other corpora are named, not set beside
        assert "the course's seeds (data/seeds/code.json) read" in text and "seed 0's value" not in text


def test_keep_copies_the_finished_trio_once_and_never_half(tmp_path):
    grow = Grow(seed=7, preset="code", root=tmp_path / "runs", keep=tmp_path / "drive")
    assert grow.copy_kept() is None  # nothing finished
    for variant, name in NAMES.items():
        shutil.copytree(SHIPPED_DIR / f"code-{name}", grow.folder(variant) / "model")
        shutil.copy(SHIPPED_DIR / f"code-{name}" / "run.json", grow.folder(variant))
        shutil.move(grow.folder(variant) / "model" / "history.json", grow.folder(variant) / "history.json")
        (grow.folder(variant) / "checkpoint.pt").write_bytes(b"large")
    (grow.keep / "baseline.part").mkdir(parents=True)  # a copy cut short earlier
    assert grow.copy_kept() == tmp_path / "drive" / "code-seed7"
    assert sorted(p.name for p in (grow.keep / "baseline").iterdir()) == ["history.json", "model", "run.json"]
    assert not (grow.keep / "baseline.part").exists()
    assert find_grown(7, [tmp_path / "elsewhere", tmp_path / "drive"]).base == grow.keep


def test_drive_is_for_colab_only():
    from minigate.course.grow import drive_folder

    with pytest.raises(ValueError, match="DRIVE = True is for Colab; on your own machine the models stay in runs/"):
        drive_folder()
