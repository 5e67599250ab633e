"""minigate.ship: measuring, thinning and shipping the natural-data checkpoints, and the bar it checks."""

import json
from pathlib import Path

import pytest
import torch

import minigate
from minigate import data, ship
from minigate.cli import main
from minigate.presets import model_config
from minigate.resources import DATA_DIR


@pytest.fixture(scope="module")
def prose():
    return ship.prose_windows(data.DEFAULT_TOKENIZER)


def test_prose_windows_are_held_out_bos_first_windows_of_512(prose):
    assert prose.shape[1] == ship.PROSE_LEN and (prose[:, 0] == 0).all() and prose.shape[0] >= 50
    assert torch.equal(ship.prose_windows(data.DEFAULT_TOKENIZER, limit=5), prose[:5])


def test_shipped_numbers_are_the_papers_metrics_and_where_the_largest_head_is(prose):
    torch.manual_seed(0)
    model = minigate.Transformer(model_config("code", "headwise"))  # the shipped size, untrained
    row = ship.shipped_numbers(model, prose[:4], {"val_loss": [3.0]})
    assert 0 < row["uniform"] < row["f_attn"] < 1 and row["f_attn_excess"] == row["f_attn"] - row["uniform"]
    assert len(row["m_act_per_layer"]) == 4 and row["m_act"] == pytest.approx(sum(row["m_act_per_layer"]) / 4, abs=0.1)
    layer, head = row["max_head_at"]
    assert 0 <= layer < 4 and 0 <= head < 4 and row["val_loss_code"] == 3.0
    assert row["max_head"] >= max(row["f_attn_per_layer"]) - 1e-4


def test_thin_keeps_every_tenth_step_and_all_evaluations():
    history = minigate.shipped_run("text-baseline")["history"]
    thin = ship.thin(dict(history, info={"tokenizer": "/home/someone/course/data/tokenizer.json"}), every=10)
    assert thin["step"][:-1] == [s for s in history["step"] if s % 10 == 0][:len(thin["step"]) - 1]
    assert thin["step"][-1] == history["step"][-1] and thin["val_loss"] == history["val_loss"]
    assert thin["metrics"] == history["metrics"] and thin["info"]["tokenizer"] == "data/tokenizer.json"


def row(excess, m_act, loss, head=0.3):
    return {"f_attn_excess": excess, "m_act": m_act, "val_loss_code": loss, "max_head": head}


def test_the_bar_passes_a_threefold_separation_and_names_each_failure():
    base = row(0.06, 60, 2.00)
    ok = ship.check_bar({"none": base, "headwise": row(0.02, 20, 2.02), "elementwise": row(0.01, 10, 1.9)}, "code")
    assert all(holds for _, holds in ok) and len(ok) == 9
    bad = dict(ship.check_bar({"none": row(0.02, 15, 2.0, head=0.2), "headwise": row(0.01, 20, 2.05)}, "code"))
    assert not any(bad.values())  # each line fails on its own number
    assert "headwise: val loss <= baseline + 0.02" in bad and "baseline M-Act >= 20" in bad
    gpu = dict(ship.check_bar({"none": base, "elementwise": row(0.01, 10, 2.01)}, "code-gpu"))
    assert not gpu["baseline M-Act >= 100"] and not gpu["elementwise: val loss <= baseline + 0.001"]


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
    rows = ship.shipped_rows(preset)
    for row in rows.values():
        assert row["protocol"]["function"] == "analysis.published_measures" and row["protocol"]["windows"] == 75
    readme = (DATA_DIR / "checkpoints" / "README.md").read_text()
    assert ship.table(rows, preset) in readme
    if preset == "code-moe":  # a pair: a table, no sentence
        return
    summary = ship.effect_summary(rows)
    assert summary in readme.replace("\n", " ")
    assert summary in (DATA_DIR.parent / "README.md").read_text().replace("\n", " ")


def test_measure_folder_writes_the_numbers_and_their_protocol(tmp_path, prose):
    import shutil

    folder = Path(shutil.copytree(DATA_DIR / "checkpoints" / "code-elementwise", tmp_path / "code-elementwise"))
    (folder / ship.MEASUREMENTS).unlink()
    row = ship.measure_folder(folder, prose[:4])
    stored = json.loads((folder / ship.MEASUREMENTS).read_text())
    assert stored["protocol"]["windows"] == 4 and stored["protocol"]["windows_sha256"] == ship.windows_digest(prose[:4])
    assert {k: stored[k] for k in row} == json.loads(json.dumps(row))
    assert 0 <= stored["sink_rate_64"] <= 1 and 0 < stored["max_head_64"] <= 1


def test_ratios_are_baseline_over_gated_for_each_gated_variant():
    rows = {"none": row(0.06, 60, 2.0), "headwise": row(0.02, 30, 2.0), "elementwise": row(0.015, 20, 2.0)}
    got = ship.ratios(rows)
    assert set(got) == {"headwise", "elementwise"}
    assert got["headwise"] == pytest.approx({"f_attn_excess": 3.0, "m_act": 2.0})
    assert got["elementwise"] == pytest.approx({"f_attn_excess": 4.0, "m_act": 3.0})


def test_a_measurement_that_disagrees_with_measurements_json_names_the_number(tmp_path, monkeypatch, prose):
    """measure_shipped fails, naming the number and the fix, when a stored number is not what the weights give."""
    import shutil

    shutil.copytree(DATA_DIR / "checkpoints" / "code-headwise", tmp_path / "checkpoints" / "code-headwise")
    stored = json.loads((tmp_path / "checkpoints" / "code-headwise" / ship.MEASUREMENTS).read_text())
    stored["m_act"] += 1.0
    (tmp_path / "checkpoints" / "code-headwise" / ship.MEASUREMENTS).write_text(json.dumps(stored))
    monkeypatch.setattr(ship, "DATA_DIR", tmp_path)
    with pytest.raises(AssertionError, match=r"code-headwise: m_act .* --measure"):
        ship.measure_shipped("code-headwise", prose=prose)


def test_the_shipped_measurements_are_what_the_shipped_weights_give():
    """measurements.json is current: each shipped code model measured again on the same windows agrees with it
    (measure_shipped asserts it; a re-shipped model without `--measure` fails here), with the stats for plots."""
    rows = ship.measure_preset("code")
    assert list(rows) == list(ship.NAMES) and all(r["same_windows"] for r in rows.values())
    assert rows["none"]["sink"].f_attn == pytest.approx(rows["none"]["f_attn"])
    assert rows["none"]["act"].m_act == pytest.approx(rows["none"]["m_act"])
    m_act = rows["none"]["m_act"] / rows["elementwise"]["m_act"]
    assert ship.ratios(rows)["elementwise"]["m_act"] == pytest.approx(m_act)


def test_the_docs_and_lessons_that_state_the_shipped_numbers_are_found():
    docs, lessons = ship.shown_in()
    assert [p.name for p in docs] == ["README.md", "README.md"]
    assert [p.name[:2] for p in lessons] == ["03", "04", "07", "08"]  # call ship.measure_*, name "code"
    docs, lessons = ship.shown_in(preset="code-moe")  # the MoE pair: its table, and lesson 08 (not 03, 04, 07)
    assert [p.parent.name for p in docs] == ["checkpoints"] and [p.name[:2] for p in lessons] == ["08"]
    assert ship.shipped_variants("code") == list(ship.NAMES) and ship.shipped_variants("code-moe") == ["none",
                                                                                                       "elementwise"]


def test_shown_in_tells_the_presets_apart(tmp_path):
    """A lesson shows preset P when it calls ship.measure_* and names P ("P", "P-baseline", f"P-{name}"): "code-moe-..."
    is not a code model, and a lesson that names a model without measuring it shows nothing."""
    (tmp_path / "solutions").mkdir()
    cells = {"01": 'ship.measure_preset("code")', "02": 'ship.measure_shipped("code-moe-baseline")',
             "03": 'ship.measure_shipped(f"code-{name}")', "04": 'minigate.shipped("code-baseline")'}
    for n, src in cells.items():
        (tmp_path / "solutions" / f"{n}_x.ipynb").write_text(json.dumps({"cells": [{"source": src}]}))
    assert [p.name[:2] for p in ship.shown_in(tmp_path, "code")[1]] == ["01", "03"]
    assert [p.name[:2] for p in ship.shown_in(tmp_path, "code-moe")[1]] == ["02"]


def test_update_docs_puts_the_new_table_and_sentence_where_the_old_ones_stood(tmp_path):
    old = ship.shipped_rows("code")
    new = {v: dict(r, f_attn_excess=r["f_attn_excess"] / 2, m_act=r["m_act"] + 1) for v, r in old.items()}
    doc = tmp_path / "README.md"
    doc.write_text(f"Intro.\n\n{ship.table(old, 'code')}\n\n{ship.effect_summary(old)} More.\n")
    assert ship.update_docs(old, new, "code", [doc]) == [doc]
    text = doc.read_text()
    assert ship.table(new, "code") in text and ship.effect_summary(new) + " More." in text
    assert ship.table(old, "code") not in text and text.startswith("Intro.")
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

    for name in ship.NAMES.values():
        shutil.copytree(DATA_DIR / "checkpoints" / f"code-{name}", tmp_path / f"code-{name}")
    readme = (DATA_DIR.parent / "README.md").read_text()
    assert ship.main(["--preset", "code", "--measure", "--ship", str(tmp_path), "--variants", "none"]) == 0
    assert "rewrote" not in capsys.readouterr().out and (DATA_DIR.parent / "README.md").read_text() == readme
    assert json.loads((tmp_path / "code-baseline" / ship.MEASUREMENTS).read_text())["windows"] == 75
