"""minigate.measure: the held-out prose windows, measuring a model or a shipped checkpoint, measurements.json and the
check of every number it stores, the ratios the course states, a recipe's seeds; analysis.published_measures'
one-pass record. (The bar every shipped trio meets is the release's: tests/test_release.py.)"""

import json
import math
import shutil

import pytest
import torch

import minigate
from minigate import analysis, data, measure
from minigate.rows import read_rows
from minigate.course.release import SEEDS_DIR, SHIPPED_DIR
from minigate.presets import NAMES, model_config
from minigate.course import release


def test_prose_windows_are_held_out_bos_first_windows_of_512(prose):
    assert prose.shape[1] == measure.PROSE_LEN and (prose[:, 0] == 0).all() and prose.shape[0] >= 50
    assert torch.equal(measure.prose_windows(data.DEFAULT_TOKENIZER, limit=5), prose[:5])


@pytest.mark.slow
def test_one_pass_gives_what_separate_passes_give(prose):
    """published_measures reads T=512, Gu's T=64 and M-Act off one forward pass per batch: the T=64 shares equal a
    pass over 64-token windows (attention is causal) and M-Act equals massive_activations' (which runs the fused
    attention kernel) to float rounding."""
    torch.manual_seed(0)
    model = minigate.Transformer(model_config("code", "none")).eval()
    x = prose[:6]
    m = analysis.published_measures(model, x, batch_size=4)
    short = analysis.attention_sink(model, x[:, :analysis.GU_LEN], batch_size=4)
    assert torch.allclose(m.sink_64.share, short.share, atol=1e-6) and m.sink_rate_64 == short.sink_rate
    assert m.max_head_64 == pytest.approx(short.share.max().item(), abs=1e-6)
    assert torch.equal(m.sink.share, analysis.attention_sink(model, x, batch_size=4).share)
    assert m.m_act == pytest.approx(analysis.massive_activations(model, x, batch_size=4).m_act, rel=1e-6)
    short_only = analysis.published_measures(model, x[:, :analysis.GU_LEN])  # no second protocol at T <= 64
    assert short_only.sink_rate_64 is None and short_only.seq_len == analysis.GU_LEN


def test_measures_are_the_papers_metrics_and_where_the_largest_head_is(prose):
    torch.manual_seed(0)
    model = minigate.Transformer(model_config("code", "headwise"))  # the shipped size, untrained
    row = measure.measure_model(model, prose[:4], "x", val_loss_code=3.0)
    assert 0 < row.uniform < row.f_attn < 1 and row.f_attn_excess == row.f_attn - row.uniform
    assert len(row.m_act_per_layer) == 4 and row.m_act == pytest.approx(sum(row.m_act_per_layer) / 4)
    layer, head = row.max_head_at
    assert 0 <= layer < 4 and 0 <= head < 4 and row.val_loss_code == 3.0 and row.windows == 4
    assert row.max_head >= max(row.f_attn_per_layer) and row.max_act == max(row.m_act_per_layer)


@pytest.mark.slow
def test_write_measurements_stores_the_record_under_its_field_names(tmp_path, prose):
    folder = shutil.copytree(SHIPPED_DIR / "code-elementwise", tmp_path / "code-elementwise")
    (folder / measure.MEASUREMENTS).unlink()
    row = measure.measure_folder(folder, prose[:4])
    measure.write_measurements(folder, row, prose[:4])
    stored = json.loads((folder / measure.MEASUREMENTS).read_text())
    protocol = stored["protocol"]
    assert protocol["windows"] == 4 and protocol["windows_sha256"] == measure.windows_digest(prose[:4])
    assert {k: v for k, v in stored.items() if k != "protocol"} == json.loads(json.dumps(row.record()))
    assert set(row.numbers()) <= set(stored) and 0 <= stored["sink_rate_64"] <= 1 and 0 < stored["max_head_64"] <= 1
    again = read_rows(folder / measure.MEASUREMENTS)  # the one reader: every field checked
    assert again.rows[0].record() == json.loads(json.dumps(row.record())) and again.rows[0].sink is None
    assert again.protocol == protocol and again.header == {}


@pytest.mark.slow
def test_a_run_folder_is_measured_from_its_model_and_history(tmp_path, prose):
    """A finished `minigate train` folder (model/ and history.json): what lesson 04 measures of a learner's runs."""
    run_dir = tmp_path / "code-baseline"
    shutil.copytree(SHIPPED_DIR / "code-baseline", run_dir / "model")
    shutil.copyfile(SHIPPED_DIR / "code-baseline" / "history.json", run_dir / "history.json")
    (run_dir / "model" / "history.json").unlink()
    row = measure.measure_folder(run_dir, prose[:2])
    assert row.name == "code-baseline" and row.val_loss_code == release.shipped_run("code-baseline")["history"][
        "val_loss"][-1]
    assert row.f_attn == pytest.approx(measure.measure_folder(SHIPPED_DIR / "code-baseline", prose[:2]).f_attn)


def test_ratios_are_baseline_over_gated_for_each_gated_variant(measurement):
    rows = {"none": measurement(0.06, 60, 2.0), "headwise": measurement(0.02, 30, 2.0),
            "elementwise": measurement(0.015, 20, 2.0)}
    got = measure.ratios(rows)
    assert set(got) == {"headwise", "elementwise"}
    assert got["headwise"] == pytest.approx({"f_attn_excess": 3.0, "m_act": 2.0})
    assert got["elementwise"] == pytest.approx({"f_attn_excess": 4.0, "m_act": 3.0})


def test_a_ratio_with_nothing_to_remove_is_nan_and_one_with_nothing_left_is_inf(measurement):
    """A gated model with no sink head left under a baseline with some: inf; a baseline with none: nan (no symptom,
    so no ratio), not inf (the gate removed nothing)."""
    got = measure.ratios({"none": measurement(0.06, 60, 2.0, sink_heads=3),
                          "elementwise": measurement(0.02, 30, 2.0, sink_heads=0)}, keys=("sink_heads_64",))
    assert got["elementwise"]["sink_heads_64"] == math.inf
    got = measure.ratios({"none": measurement(0.06, 60, 2.0, sink_heads=0),
                          "elementwise": measurement(0.02, 30, 2.0, sink_heads=0)}, keys=("sink_heads_64", "m_act"))
    assert math.isnan(got["elementwise"]["sink_heads_64"]) and got["elementwise"]["m_act"] == 2.0


@pytest.mark.slow
def test_a_measurement_that_disagrees_with_measurements_json_names_the_number(tmp_path, prose):
    """measure_shipped fails, naming the number and the fix, when a stored number is not what the weights give."""
    shutil.copytree(SHIPPED_DIR / "code-headwise", tmp_path / "code-headwise")
    stored = json.loads((tmp_path / "code-headwise" / measure.MEASUREMENTS).read_text())
    m_act, heads = stored["m_act"], stored["sink_heads_64"]  # what the weights give
    stored["m_act"] += 1.0
    (tmp_path / "code-headwise" / measure.MEASUREMENTS).write_text(json.dumps(stored))
    with pytest.raises(ValueError, match=rf"code-headwise: m_act is {int(m_act)}\.\d+ measured here but "
                                         rf"{int(m_act + 1)}\.\d+ in its measurements\.json: .* reinstall minigate"):
        release.measure_shipped("code-headwise", prose=prose, shipped=tmp_path)
    stored["m_act"] -= 1.0
    stored["sink_heads_64"] += 1  # a count: compared exactly
    (tmp_path / "code-headwise" / measure.MEASUREMENTS).write_text(json.dumps(stored))
    with pytest.raises(ValueError, match=rf"code-headwise: sink_heads_64 is {heads} measured here but {heads + 1}"):
        release.measure_shipped("code-headwise", prose=prose, shipped=tmp_path)


def test_every_stored_number_is_checked(prose):
    """CHECKED is every number a measurements.json stores (all of PublishedMeasures but its stats, and the validation
    loss): each, changed in the record, is named; the same record passes."""
    record = json.loads((SHIPPED_DIR / "code-baseline" / measure.MEASUREMENTS).read_text())
    assert set(release.CHECKED) == set(record) - {"protocol", "name"}
    got = measure.Measurement.from_record(record)
    release.check_measurement("x", got, record, 1e-4)
    for key in release.CHECKED:
        value = record[key]
        changed = [v + 1 for v in value] if isinstance(value, list) else value + 1
        with pytest.raises(ValueError, match=f"x: {key} is "):
            release.check_measurement("x", got, dict(record, **{key: changed}), 1e-4)


@pytest.mark.slow
def test_the_shipped_measurements_are_what_the_shipped_weights_give():
    """measurements.json is current: each shipped code model measured again on the same windows agrees with it
    (measure_shipped asserts it; a re-shipped model without `--measure` fails here), with the stats for plots."""
    rows = release.measure_preset("code")
    assert list(rows) == list(NAMES) and all(r.same_windows for r in rows.values())
    assert rows["none"].sink.f_attn == pytest.approx(rows["none"].f_attn)
    assert rows["none"].act.m_act == pytest.approx(rows["none"].m_act)
    m_act = rows["none"].m_act / rows["elementwise"].m_act
    assert measure.ratios(rows)["elementwise"]["m_act"] == pytest.approx(m_act)
    assert release.shipped_variants("code") == list(NAMES)
    assert release.shipped_variants("code-moe") == ["none", "elementwise"]


def test_spread_gives_seed_0_the_range_and_how_often_the_gate_helped(tmp_path):
    stored = json.loads((SEEDS_DIR / "code.json").read_text())["rows"][0]  # every field of a row
    rec = lambda seed, v, excess, m_act, sinks, head: {  # noqa: E731
        **stored, "seed": seed, "variant": v, "f_attn_excess": excess, "m_act": m_act, "heads": 16,
        "sink_heads_64": sinks, "max_head_64": head}
    rows = [rec(0, "none", 0.06, 80, 6, 0.6), rec(0, "headwise", 0.02, 40, 2, 0.7),
            rec(0, "elementwise", 0.01, 20, 2, 0.5),
            rec(1, "none", 0.05, 60, 6, 0.5), rec(1, "headwise", 0.025, 60, 7, 0.4),
            rec(1, "elementwise", 0.01, 30, 1, 0.3),
            rec(2, "none", 0.05, 60, 6, 0.5)]  # a seed still training: left out
    (tmp_path / "code.json").write_text(json.dumps({"rows": rows}))
    seeds = release.seed_rows(path=tmp_path / "code.json")
    assert sorted(seeds) == [0, 1, 2] and set(seeds[2]) == {"none"}
    s = release.spread(seeds)
    h, e = s["headwise"], s["elementwise"]
    assert (h["f_attn_excess"].seed0, h["f_attn_excess"].low, h["f_attn_excess"].high) == (3.0, 2.0, 3.0)
    assert (h["m_act"].helped, h["m_act"].seeds, h["m_act"].low) == (1, 2, 1.0)  # seed 1: no smaller M-Act
    assert (h["sink_heads_64"].helped, e["sink_heads_64"].helped) == (1, 2)  # seed 1's headwise has more sink heads
    assert (e["sink_heads_64"].seed0, e["sink_heads_64"].low, e["sink_heads_64"].high, e["sink_heads_64"].of) == (
        2, 1, 2, 16)
    assert (h["max_head_64"].helped, e["max_head_64"].high) == (1, 0.5)  # seed 0's headwise head is the stronger
    assert s["none"]["sink_heads_64"].seeds == 2 and s["none"]["max_head_64"].low == 0.5
    with pytest.raises(ValueError, match="needs seed 0"):
        release.spread({1: seeds[1]})


def test_the_recorded_seeds_are_measured_as_the_shipped_models():
    """data/seeds/code.json: seed 0 is the shipped trio's measurements.json, every row names its corpus, precision
    and speed, and each seed holds the three variants once."""
    data_ = json.loads((SEEDS_DIR / "code.json").read_text())
    assert data_["protocol"]["windows_sha256"] == release.stored("code-baseline")["protocol"]["windows_sha256"]
    seeds = release.seed_rows()
    assert set(seeds[0]) == set(NAMES) and len(seeds) >= 2
    for v, r in seeds[0].items():
        assert r.m_act == release.stored(f"code-{NAMES[v]}")["m_act"]
    for r in data_["rows"]:
        assert r["precision"] in ("fp32", "bf16") and len(r["corpus_sha256"]) == 64 and r["tokens_per_s"] > 0
    assert len(data_["rows"]) == len({(r["seed"], r["variant"]) for r in data_["rows"]})


def test_the_lessons_and_readmes_state_each_number_with_its_range():
    s = release.spread(release.seed_rows())
    n = s["none"]["sink_heads_64"].seeds
    lines = release.spread_lines(s)
    assert lines[0] == f"over {n} seeds, seed 0's value (the shipped models) and the range over the seeds:"
    x = s["elementwise"]["m_act"]
    assert f"M-Act {x.seed0:.1f}x ({x.low:.1f}-{x.high:.1f}x, smaller in {x.helped} of {n} seeds)" in lines[3]
    assert x.low <= x.seed0 <= x.high
    b = s["none"]["sink_heads_64"]
    assert f"sink heads at T=64 {b.seed0} ({b.low}-{b.high}) of 16" in lines[1]
