"""The study of what makes the gate's effect larger (research/train_study.py -> data/study/<axis>.json, read by
minigate.course.scaling): every row well-formed and measured by the shipped protocol, each seed's models alike, and
the table and the figure drawn from them."""

import json
import math
import shutil
import statistics

import pytest

from minigate.presets import NAMES
from minigate.course import scaling
from minigate.rows import parse, write_rows
from minigate.course.published import TABLE_4
from minigate.course import release

pytestmark = pytest.mark.usefixtures("close_figures")
STUDY = sorted((scaling.DATA / "study").glob("*.json"))
ROW_KEYS = {"point", "seed", "variant", "name", "seq_len", "windows", "uniform", "f_attn", "f_attn_excess", "max_head",
            "sink_rate_64", "max_head_64", "m_act", "val_loss_code", "corpus_sha256", "corpus_files", "precision",
            "tokens_per_s", "params", "tokens", "steps", "cpus", "wall_s", "train_s", "tracker"}


@pytest.mark.parametrize("path", STUDY, ids=[p.stem for p in STUDY])
def test_every_study_row_is_well_formed_and_measured_as_the_shipped_models(path):
    doc = json.loads(path.read_text())
    shipped = release.stored("code-baseline")["protocol"]
    assert {k: doc["protocol"][k] for k in ("prose", "seq_len", "gu_seq_len", "sink_threshold", "function",
                                            "windows", "windows_sha256")} == {
        k: shipped[k] for k in ("prose", "seq_len", "gu_seq_len", "sink_threshold", "function", "windows",
                                "windows_sha256")}
    assert doc["rows"] and {r["point"] for r in doc["rows"]} <= set(doc["points"])
    trios = {}
    for r in doc["rows"]:
        assert ROW_KEYS <= set(r), sorted(ROW_KEYS - set(r))
        assert r["variant"] in NAMES and r["windows"] == 75 and r["seq_len"] == 512
        assert 0 <= r["sink_rate_64"] <= 1 and r["m_act"] > 0 and math.isfinite(r["val_loss_code"])
        assert r["tracker"] and all({"step", "sink_rate_64", "m_act"} <= set(m) for m in r["tracker"])
        trios.setdefault((r["point"], r["seed"]), []).append(r)
    for (point, seed), rows in trios.items():  # like with like: one machine's corpus, one precision per seed
        for key in ("corpus_sha256", "precision", "steps"):
            assert len({json.dumps(r[key]) for r in rows}) == 1, f"{point} seed {seed}: its models differ in {key}"


# a stored study row, every field of a rows.Row; the crafted rows below change its numbers (raw F-Attn: the same)
TEMPLATE = json.loads((scaling.DATA / "study" / "length.json").read_text())["rows"][0]


def _row(point, seed, variant, sink, excess, m_act, loss=2.0):
    return {**TEMPLATE, "point": point, "seed": seed, "variant": variant, "sink_rate_64": sink, "f_attn_excess": excess,
            "m_act": m_act, "val_loss_code": loss, "params": 1377664, "tokens": 32768000, "steps": 8000,
            "wall_s": 700, "train_s": 600,
            "tracker": [{"step": s, "sink_rate_64": sink, "f_attn_excess": excess, "m_act": m_act * s / 2000}
                        for s in (500, 1000, 2000)]}


@pytest.fixture
def crafted(tmp_path):
    """A data/ folder with one study point of two seeds (seed 1's elementwise model has no sink head left)."""
    (tmp_path / "study").mkdir()
    rows = [_row("2x", s, v, *vals) for s, (b, e) in enumerate([((0.5, 0.1, 100), (0.25, 0.02, 25)),
                                                                  ((0.375, 0.08, 80), (0.0, 0.02, 40))])
            for v, vals in (("none", b), ("elementwise", e))]
    (tmp_path / "study" / "length.json").write_text(json.dumps(
        {"points": {"2x": {"about": "twice the tokens"}}, "rows": rows}))
    shutil.copytree(scaling.DATA / "seeds", tmp_path / "seeds")
    return tmp_path


def test_points_ratios_and_the_table(crafted):
    pts = scaling.points(crafted)
    assert [p.name for p in pts] == ["code", "2x", "code-gpu"]  # by size, then tokens; the GPU recipe last
    two = pts[1]
    assert two.ratios("elementwise", "m_act") == [4.0, 2.0] and two.ratios("headwise", "m_act") == []
    assert two.ratios("elementwise", "sink_rate_64") == [2.0, math.inf]  # none left: no finite ratio
    lines = scaling.table(pts)
    row = next(line for line in lines if line.startswith("2x") and "elementwise" in line)
    assert "2.0x (2.0-inf)" not in row and "inf" in row and "3.0x (2.0-4.0)" in row and " 10" in row  # 600 s
    assert lines[0].split()[-2:] == ["M-Act", "b"] and row.split()[-1] == "90"  # the baselines' median M-Act: 100, 80
    assert lines[0].split()[7:10] == ["F-Attn", "excess", "raw"] and "1.0x (1.0-1.0)" in row  # crafted: same raw
    code = next(line for line in lines if line.startswith("code ") and "elementwise" in line)
    raw = [r.f_attn / pts[0].seeds[r.seed]["elementwise"].f_attn for r in pts[0].rows() if r.variant == "none"]
    assert f"{statistics.median(raw):.1f}x ({min(raw):.1f}-{max(raw):.1f})" in code  # the seeds: raw, as the paper
    assert not any(line.startswith("2x") and "headwise" in line for line in lines)
    assert scaling.tracked(list(pts[1].seeds[0].values()), "m_act") == [(s * 4096, 4.0) for s in (500, 1000, 2000)]


def test_the_figure_has_a_panel_per_measure_and_the_papers_ratios(crafted):
    fig = scaling.figure(scaling.points(crafted))
    assert [ax.get_title() for ax in fig.axes] == [*scaling.MEASURES.values(), "along training (tracker, 8 windows)"]
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["code", "2x", "code-gpu"]
    dashed = {round(line.get_ydata()[0], 2) for ax in fig.axes[1:3] for line in ax.lines
              if line.get_linestyle() == "--"}
    table_4 = {round(TABLE_4[k]["none"] / TABLE_4[k][g], 2) for k in ("f_attn", "m_act") for g in scaling.GATED}
    assert dashed == table_4  # the paper's own ratios, from course/published.py
    assert not any(line.get_linestyle() == "--" for line in fig.axes[0].lines)  # the paper reports no sink heads
    assert any(t.get_text() == "none left" for t in fig.axes[0].texts)


def test_a_setting_whose_gated_model_is_still_training_is_in_neither_the_table_nor_the_figure(crafted):
    """4x has its baseline only (the queue trains it first): no ratio yet, so no tick and no line."""
    (crafted / "study" / "long.json").write_text(json.dumps(
        {"points": {"4x": {"about": "four times the tokens"}}, "rows": [_row("4x", 0, "none", 0.375, 0.09, 139)]}))
    pts = scaling.points(crafted)
    assert "4x" in [p.name for p in pts] and not any(line.startswith("4x") for line in scaling.table(pts))
    fig = scaling.figure(pts)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["code", "2x", "code-gpu"]
    assert not any(line.get_gid().startswith("4x") for line in fig.axes[3].lines if line.get_gid())


def test_the_along_training_panel_draws_each_seeds_tracker_ratios_against_tokens(crafted):
    """Two seeds of the crafted 2x point: a line per seed and measure, x in millions of tokens seen, y the tracker's
    baseline / elementwise (seed 0's M-Act: 100 / 25 at every step)."""
    ax = scaling.figure(scaling.points(crafted)).axes[3]
    drawn = {line.get_gid(): line for line in ax.lines if line.get_gid()}
    assert set(drawn) == {f"2x seed {s}, {m}" for s in (0, 1) for m in ("F-Attn above uniform", "M-Act")}
    # the legend: one entry per setting (its colour), one per measure (its line style), not one per line
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["2x (2 seeds)", "F-Attn above uniform", "M-Act"]
    m_act = drawn["2x seed 0, M-Act"]
    assert list(m_act.get_xdata()) == [s * 4096 / 1e6 for s in (500, 1000, 2000)]
    assert list(m_act.get_ydata()) == [4.0, 4.0, 4.0] and m_act.get_linestyle() == ":"
    assert list(drawn["2x seed 1, F-Attn above uniform"].get_ydata()) == [4.0] * 3  # 0.08 / 0.02
    assert ax.get_legend().legend_handles[0].get_color() == m_act.get_color()  # the setting's entry: its lines' colour


def _add(data, doc, point, about, trios):
    """Write data/study/<doc>.json with `point`'s seeds: trios [(baseline values, elementwise values)]."""
    rows = [_row(point, s, v, *vals) for s, (b, e) in enumerate(trios) for v, vals in (("none", b), ("elementwise", e))]
    (data / "study" / f"{doc}.json").write_text(json.dumps({"points": {point: {"about": about}}, "rows": rows}))


def test_a_setting_trained_on_a_gpu_comes_after_the_cpu_ones_by_size(crafted):
    """A study point whose rows name their GPU (research/train_study.py's m-gpu) sits with code-gpu, after every CPU
    setting, and among the GPU settings by size: a larger CPU point stays before code-gpu."""
    _add(crafted, "size", "big", "larger", [((0.5, 0.1, 100), (0.25, 0.02, 25))])
    _add(crafted, "gpu", "m-gpu", "on a GPU", [((0.5, 0.1, 100), (0.25, 0.02, 25))])
    for doc, params, gpu in (("size", 9_000_000, None), ("gpu", 15_000_000, "NVIDIA H200")):
        path = crafted / "study" / f"{doc}.json"
        got = json.loads(path.read_text())
        got["rows"] = [dict(r, params=params, gpu=gpu) for r in got["rows"]]
        path.write_text(json.dumps(got))
    assert [p.name for p in scaling.points(crafted)] == ["code", "2x", "big", "code-gpu", "m-gpu"]


def test_a_seed_whose_baseline_has_no_sink_head_gives_no_ratio_and_the_table_says_so(crafted):
    """Seed 1: neither model has a sink head (no ratio, not inf); seed 2: only the gated one has (a ratio of 0)."""
    _add(crafted, "size", "xs", "smaller", [((0.25, 0.02, 10), (0.125, 0.01, 5)), ((0.0, 0.02, 10), (0.0, 0.01, 5)),
                                            ((0.0, 0.02, 10), (0.0625, 0.01, 5))])
    pts = scaling.points(crafted)
    xs = next(p for p in pts if p.name == "xs")
    assert xs.paired("elementwise") == 3 and xs.ratios("elementwise", "sink_rate_64") == [2.0, 0.0]  # no inf
    lines = scaling.table(pts)
    row = next(line for line in lines if line.startswith("xs"))
    assert "1.0x (0.0-2.0) 2/3" in row and "2.0x (2.0-2.0)" in row  # sink heads: two seeds of three; excess: all
    assert lines[-1] == scaling.FEWER
    sinks = scaling.figure(pts).axes[0]
    assert [t.get_text() for t in sinks.texts].count("baseline none") == 1  # xs elementwise, off the log axis


def test_the_largest_effect_is_the_study_setting_with_the_greatest_mean_log_ratio(crafted):
    """The crafted 2x (sink heads 2x and all gone, excess 5x and 4x, M-Act 4x and 2x) against a 0.5M point at 2x on
    every measure: 2x is the larger; the recipes on the scorecard (code, code-gpu) are never chosen."""
    _add(crafted, "size", "xs", "smaller", [((0.25, 0.02, 10), (0.125, 0.01, 5))] * 2)
    pts = scaling.points(crafted)
    assert scaling.largest(pts).name == "2x"
    assert scaling.largest([p for p in pts if p.name != "2x"]).name == "xs"
    assert scaling.largest([p for p in pts if p.name in scaling.ON_THE_CARD]) is None
    assert scaling.largest(scaling.points()).name in {p.name for p in scaling.points()} - set(scaling.ON_THE_CARD)


def test_the_bar_needs_five_times_on_every_measure_in_three_seeds_at_no_worse_loss(crafted):
    """The crafted 2x has two seeds: short of three whatever its ratios; three seeds of 6x pass, unless one measure
    falls short in one seed or a gated loss is worse than its baseline's."""
    def point(trios, worse=False):
        _add(crafted, "longer", "4x", "longer", trios)
        if worse:
            doc = json.loads((crafted / "study" / "longer.json").read_text())
            doc["rows"][1]["val_loss_code"] = 2.1  # seed 0's elementwise model ends above its baseline's 2.0
            (crafted / "study" / "longer.json").write_text(json.dumps(doc))
        return next(p for p in scaling.points(crafted) if p.name == "4x")

    assert not scaling.meets_bar(next(p for p in scaling.points(crafted) if p.name == "2x"))
    six = ((0.6, 0.06, 60), (0.1, 0.01, 10))
    assert scaling.meets_bar(point([six] * 3)) and not scaling.meets_bar(point([six] * 2))
    assert not scaling.meets_bar(point([six, six, ((0.6, 0.06, 60), (0.1, 0.01, 15))]))  # M-Act 4x in one seed
    assert not scaling.meets_bar(point([six] * 3, worse=True))


def _queue_script(tmp_path, monkeypatch, seconds):
    """research/train_study.py with a point `t` of two seeds (baseline and elementwise), whose trainings only wait
    `seconds` and leave a finished folder, whose measuring gives a stub row and whose writing is recorded: the
    queue's plumbing alone."""
    import time

    from research import train_study as S  # its module attributes below are monkeypatched back afterwards
    monkeypatch.setattr(S, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(S, "OUT", tmp_path / "study")
    monkeypatch.setattr(S, "POINTS", {"t": ("size", {}, "a test point")})
    monkeypatch.setattr(S, "QUEUE", [("t", s, ("none", "elementwise")) for s in (0, 1)])
    digest = release.stored("code-baseline")["protocol"]["windows_sha256"]
    monkeypatch.setattr(S.measure, "prose_windows", lambda *a, **k: None)
    monkeypatch.setattr(S.measure, "windows_digest", lambda prose: digest)
    started, written = {}, []

    def train(point, seed, variant, threads):
        started[seed, variant] = time.time()
        time.sleep(seconds)
        S.folder(point, seed, variant).joinpath("model").mkdir(parents=True)
        S.folder(point, seed, variant).joinpath("model", "config.json").write_text("{}")  # finished (runs.finished)
        return 0

    monkeypatch.setattr(S, "train", train)
    monkeypatch.setattr(S, "measured_row", lambda p, s, v, prose, device: parse(dict(
        TEMPLATE, point=p, seed=s, variant=v, sink_rate_64=0.0, f_attn_excess=0.0, m_act=1.0, val_loss_code=2.0,
        wall_s=1), "a stub row"))

    def write(rows, prose):  # what stored_rows reads back
        written.append(sorted((r.seed, r.variant) for r in rows))
        S.OUT.mkdir(exist_ok=True)
        write_rows(S.OUT / "size.json", rows)

    monkeypatch.setattr(S, "write", write)
    return S, started, written


def test_the_queue_trains_jobs_at_once_and_measures_each_as_it_ends(tmp_path, monkeypatch):
    S, started, written = _queue_script(tmp_path, monkeypatch, seconds=0.5)
    assert S.main(["run", "--jobs", "2"]) == 0
    assert abs(started[0, "none"] - started[0, "elementwise"]) < 0.4  # a seed's two side by side
    assert min(started[1, v] for v in ("none", "elementwise")) > started[0, "none"] + 0.5  # then the next seed's
    assert written[-1] == [(0, "elementwise"), (0, "none"), (1, "elementwise"), (1, "none")]
    assert S.main(["run", "--jobs", "2"]) == 0 and len(written) == 4  # all finished and measured: nothing to do


def test_the_queue_starts_no_training_the_deadline_leaves_no_room_for(tmp_path, monkeypatch, capsys):
    S, started, written = _queue_script(tmp_path, monkeypatch, seconds=0.5)
    assert S.main(["run", "--jobs", "2", "--deadline", "1"]) == 0  # the first pair took 0.5 s or more, from t0
    assert sorted(started) == [(0, "elementwise"), (0, "none")] and "stopping before 2 runs" in capsys.readouterr().out
    assert S.main(["run", "--jobs", "2", "--deadline", "60"]) == 0 and sorted(started) == [
        (0, "elementwise"), (0, "none"), (1, "elementwise"), (1, "none")]  # the rest, next time


def test_measuring_again_keeps_the_rows_whose_runs_are_elsewhere(tmp_path, monkeypatch):
    """A GPU point's runs stay on the GPU machine: `measure` measures the runs here and keeps the others' rows."""
    S, _, written = _queue_script(tmp_path, monkeypatch, seconds=0.1)
    assert S.main(["run", "--jobs", "2"]) == 0
    shutil.rmtree(S.folder("t", 1, "none"))  # trained and measured on another machine
    measured = len(written)
    assert S.main(["measure"]) == 0 and len(written) == measured + 3  # the three runs here, each written as measured
    assert written[-1] == [(0, "elementwise"), (0, "none"), (1, "elementwise"), (1, "none")]


def test_the_queue_runs_in_the_layout_of_every_preset_run_and_names_the_move_from_the_old_one(tmp_path, monkeypatch):
    """runs/study/<point>-seed<S>/<name> (runs.RunFolder), its log and the queue's record beside it; a seed folder of
    minigate 0.1's runs/study/<point>/seed<S> stops the queue before anything runs, naming the move."""
    S, started, _ = _queue_script(tmp_path, monkeypatch, seconds=0)
    assert S.folder("t", 1, "none") == tmp_path / "runs" / "t-seed1" / "baseline"
    assert S.sidecar("t", 1, "none") == tmp_path / "runs" / "t-seed1" / "baseline.study.json"
    (tmp_path / "runs" / "t" / "seed1" / "baseline").mkdir(parents=True)
    for what in ("plan", "run"):
        with pytest.raises(ValueError) as refused:
            S.main([what, "--threads", "1"])
        assert str(refused.value) == (f"{tmp_path / 'runs' / 't' / 'seed1'} is in minigate 0.1's layout: move it to "
                                      f"{tmp_path / 'runs' / 't-seed1'}")
    assert not started
