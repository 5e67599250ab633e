"""scripts/ship.py, the release pipeline outside the package: training, thinning, shipping, measuring again, and
bringing the READMEs and lessons along."""

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest
import torch

import minigate
from minigate import data, measure
from minigate.cli import main
from minigate.pretrained import SHIPPED_DIR

_spec = importlib.util.spec_from_file_location("ship", Path(__file__).parents[1] / "scripts" / "ship.py")
ship = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ship)


@pytest.fixture(scope="module")
def prose():
    return measure.prose_windows(data.DEFAULT_TOKENIZER)


def test_thin_keeps_every_tenth_step_and_all_evaluations():
    history = minigate.shipped_run("text-baseline")["history"]
    thin = ship.thin(dict(history, info={"tokenizer": "/home/someone/course/data/tokenizer.json"}), every=10)
    assert thin["step"][:-1] == [s for s in history["step"] if s % 10 == 0][:len(thin["step"]) - 1]
    assert thin["step"][-1] == history["step"][-1] and thin["val_loss"] == history["val_loss"]
    assert thin["metrics"] == history["metrics"] and thin["info"]["tokenizer"] == "data/tokenizer.json"


def test_a_finished_run_ships_as_bf16_with_portable_run_json(tmp_path, monkeypatch, prose):
    monkeypatch.setenv("MINIGATE_CODE_MAX_BYTES", "2000000")
    run = tmp_path / "runs" / "code-elementwise"
    shrink = ["--set", "batch_size=2", "--set", "seq_len=64", "--set", "eval_batches=1", "--set", "eval_every=1"]
    assert main(["train", "--preset", "code", "--variant", "elementwise", "--out", str(run), "--steps", "2",
                 "--quiet", "--threads", "1", *shrink]) == 0
    got = ship.ship_one(run, tmp_path / "ship" / "code-elementwise", prose[:2])
    shipped = tmp_path / "ship" / "code-elementwise"
    assert {"config.json", "model.safetensors", "run.json", "history.json", "tokenizer.json"} <= \
        {p.name for p in shipped.iterdir()}
    assert minigate.from_pretrained(shipped).cfg.gate_granularity == "elementwise"
    assert got["steps"] == 2 and got["minutes"] > 0 and got["windows"] == 2
    text = (shipped / "run.json").read_text() + (shipped / "history.json").read_text()
    assert str(tmp_path) not in text and "/site-packages" not in text and str(data.DEFAULT_TOKENIZER) not in text
    assert json.loads((shipped / "run.json").read_text())["python_code"]["roots"][0] == "stdlib"
    bf16 = minigate.from_pretrained(shipped)
    assert got["f_attn"] == pytest.approx(got["f_attn_fp32"], abs=0.01)  # bf16 weights measure like fp32 ones
    assert bf16.cfg.max_seq_len == 512


def test_the_gpu_recipe_refuses_a_machine_without_cuda(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert ship.main(["--preset", "code-gpu", "--runs", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out


@pytest.mark.parametrize("preset", ["code", "code-moe"])
def test_the_readmes_state_the_shipped_measurements(preset):
    """One source: the checkpoints' README table and both READMEs' sentence come from the measurements.json files."""
    rows = measure.shipped_rows(preset)
    for r in rows.values():
        stored = measure.stored(r.name)
        assert stored["protocol"]["function"] == "analysis.published_measures" and stored["protocol"]["windows"] == 75
    readme = (SHIPPED_DIR / "README.md").read_text()
    assert measure.table(rows, preset) in readme
    if preset == "code-moe":  # a pair: a table, no sentence
        return
    summary = measure.effect_summary(rows)
    assert summary in readme.replace("\n", " ")
    assert summary in (ship.ROOT / "README.md").read_text().replace("\n", " ")


def test_the_docs_and_lessons_that_state_the_shipped_numbers_are_found():
    docs, lessons = ship.shown_in()
    assert [p.name for p in docs] == ["README.md", "README.md"]
    assert [p.name[:2] for p in lessons] == ["04", "07", "08"]  # call measure_*, name "code" (03 shows the histories)
    docs, lessons = ship.shown_in(preset="code-moe")  # the MoE pair: its table, and lesson 08 (not 03, 04, 07)
    assert [p.parent.name for p in docs] == ["checkpoints"] and [p.name[:2] for p in lessons] == ["08"]
    assert measure.shipped_variants("code") == list(measure.NAMES) and measure.shipped_variants("code-moe") == ["none",
                                                                                                       "elementwise"]


def test_shown_in_tells_the_presets_apart(tmp_path):
    """A lesson shows preset P when it calls measure_preset / measure_shipped and names P ("P", "P-baseline",
    f"P-{name}"): "code-moe-..."
    is not a code model, and a lesson that names a model without measuring it shows nothing."""
    (tmp_path / "solutions").mkdir()
    cells = {"01": 'measure.measure_preset("code")', "02": 'measure_shipped("code-moe-baseline")',
             "03": 'measure.measure_shipped(f"code-{name}")', "04": 'minigate.shipped("code-baseline")'}
    for n, src in cells.items():
        (tmp_path / "solutions" / f"{n}_x.ipynb").write_text(json.dumps({"cells": [{"source": src}]}))
    assert [p.name[:2] for p in ship.shown_in(tmp_path, "code")[1]] == ["01", "03"]
    assert [p.name[:2] for p in ship.shown_in(tmp_path, "code-moe")[1]] == ["02"]


def test_update_docs_puts_the_new_table_and_sentence_where_the_old_ones_stood(tmp_path):
    old = measure.shipped_rows("code")
    new = {v: dataclasses.replace(r, f_attn_excess=r.f_attn_excess / 2, m_act=r.m_act + 1) for v, r in old.items()}
    doc = tmp_path / "README.md"
    doc.write_text(f"Intro.\n\n{measure.table(old, 'code')}\n\n{measure.effect_summary(old)} More.\n")
    assert ship.update_docs(old, new, "code", [doc]) == [doc]
    text = doc.read_text()
    assert measure.table(new, "code") in text and measure.effect_summary(new) + " More." in text
    assert measure.table(old, "code") not in text and text.startswith("Intro.")
    assert ship.update_docs(new, new, "code", [doc]) == []  # nothing to change
    (tmp_path / "edited.md").write_text("a table edited by hand\n")
    with pytest.raises(ValueError, match="edited.md states neither the table nor the sentence"):
        ship.update_docs(old, new, "code", [tmp_path / "edited.md"])


def test_rerun_lessons_executes_a_notebook_in_place(tmp_path):
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    path = tmp_path / "01_demo.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("print(6 * 7)")]), path)
    ship.rerun_lessons([path], rebuild=False)
    cell = nbformat.read(path, as_version=4).cells[0]
    assert cell.outputs[0]["text"] == "42\n" and "execution" not in cell.metadata  # no timings stored


def test_measure_elsewhere_leaves_the_course_docs_and_lessons_alone(tmp_path, capsys):
    """--measure on a copy of the shipped folders rewrites the copy's measurements.json only."""
    import shutil

    for name in measure.NAMES.values():
        shutil.copytree(SHIPPED_DIR / f"code-{name}", tmp_path / f"code-{name}")
    readme = (ship.ROOT / "README.md").read_text()
    assert ship.main(["--preset", "code", "--measure", "--ship", str(tmp_path), "--variants", "none"]) == 0
    assert "rewrote" not in capsys.readouterr().out and (ship.ROOT / "README.md").read_text() == readme
    assert json.loads((tmp_path / "code-baseline" / measure.MEASUREMENTS).read_text())["windows"] == 75


_seeds_spec = importlib.util.spec_from_file_location("seeds", Path(__file__).parents[1] / "scripts" / "seeds.py")
seeds = importlib.util.module_from_spec(_seeds_spec)
_seeds_spec.loader.exec_module(seeds)


def test_the_readmes_state_the_seeds_and_scripts_seeds_rewrites_them(tmp_path):
    """Both READMEs state measure.seed_sentence of data/seeds/code.json; scripts/seeds.py puts a new one in place of
    the old, and refuses a README that states neither sentence."""
    sentence = measure.seed_sentence(measure.spread(measure.seed_rows()))
    for doc in (ship.ROOT / "README.md", SHIPPED_DIR / "README.md"):
        assert sentence in doc.read_text(), doc
    (tmp_path / "data" / "checkpoints").mkdir(parents=True)
    old = sentence.replace("Over ", "Over 9", 1).replace("elementwise (in ", "elementwise (in 9", 1)
    summary = measure.effect_summary(measure.shipped_rows("code"))
    (tmp_path / "README.md").write_text(f"Intro. {summary} {old} End.\n")
    (tmp_path / "data" / "checkpoints" / "README.md").write_text(f"{summary}\n")  # the first time: after it
    assert len(seeds.update_readmes("code", tmp_path)) == 2
    assert (tmp_path / "README.md").read_text() == f"Intro. {summary} {sentence} End.\n"
    assert (tmp_path / "data" / "checkpoints" / "README.md").read_text() == f"{summary} {sentence}\n"
    (tmp_path / "README.md").write_text("edited by hand\n")
    with pytest.raises(ValueError, match="states neither the seeds' sentence"):
        seeds.update_readmes("code", tmp_path)
