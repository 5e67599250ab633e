"""Figures build from real results and carry their labels (no display needed)."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import LogNorm  # noqa: E402

from minigate import ModelConfig, Transformer, plots  # noqa: E402
from minigate.analysis import SinkStats, attention_sink, massive_activations  # noqa: E402
from minigate.checkpoint import History  # noqa: E402
from minigate.plots._style import _plain  # noqa: E402
from minigate.presets import NAMES  # noqa: E402

pytestmark = pytest.mark.usefixtures("close_figures")


@pytest.fixture
def inputs(tokens):
    return tokens(3, 16)


@pytest.fixture
def models(tiny):
    torch.manual_seed(0)
    return {"baseline": Transformer(ModelConfig(**tiny)),
            "headwise": Transformer(ModelConfig(**tiny, gate="G1", gate_granularity="headwise"))}


def test_first_token_share_and_massive_activation_figures(inputs, models):

    sinks = {k: attention_sink(m, inputs) for k, m in models.items()}
    fig = plots.first_token_share(sinks, uniform=0.2, threshold=0.25)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "layer" and "first token" in ax.get_title()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[0].startswith("baseline: F-Attn") and labels[1].startswith("headwise: F-Attn")
    line = ax.get_lines()[0]  # the baseline's per-layer points are the measured ones, not joined by a line
    assert list(line.get_ydata()) == pytest.approx(sinks["baseline"].per_layer.tolist())
    assert line.get_linestyle() == "None"
    assert any(t.startswith("uniform attention 0.200") for t in labels)
    shares = SinkStats(share=torch.tensor([[0.9, 0.1, 0.2], [0.05, 0.4, 0.31]]))  # 3 heads above 0.3
    ax = plots.first_token_share({"made up": shares}).axes[0]
    ringed = [c for c in ax.collections if len(c.get_facecolors()) == 0]  # the sink heads' rings
    assert sorted(y for c in ringed for _, y in c.get_offsets()) == pytest.approx([0.31, 0.4, 0.9])
    fig = plots.m_act_per_layer({k: massive_activations(m, inputs) for k, m in models.items()})
    assert fig.axes[0].get_yscale() == "log"


def test_residual_map_shows_each_value_as_a_multiple_of_its_panels_median():
    """Lesson 04's position x dimension map: |value| / median per panel on one shared log scale from 1, the peak ringed
    and its multiple and place in the title."""
    base = torch.ones(6, 10)
    base[::2] = -1.0
    base[0, 7] = -40.0
    gated = torch.full((6, 10), 2.0)
    gated[4, 3] = 20.0
    fig = plots.residual_map({"baseline": base, "gated": gated})
    panels = [ax for ax in fig.axes if ax.get_images()]
    assert [ax.get_title() for ax in panels] == [
        "baseline: peak 40x the median |value|, at position 0, dimension 7",
        "gated: peak 10x the median |value|, at position 4, dimension 3"]
    images = [ax.get_images()[0] for ax in panels]
    assert images[0].get_array()[0, 7] == pytest.approx(40.0) and images[1].get_array()[0, 0] == pytest.approx(1.0)
    assert all(isinstance(im.norm, LogNorm) and (im.norm.vmin, im.norm.vmax) == (1, pytest.approx(40.0))
               for im in images)
    assert [tuple(c.get_offsets()[0]) for ax in panels for c in ax.collections] == [(7, 0), (3, 4)]  # the rings
    assert panels[-1].get_xlabel() == "dimension of the residual stream"


def test_first_token_excess_map_one_panel_per_model_on_one_scale_centred_on_zero():
    """Lesson 07's (layer x head) excess: each panel shows its model's values, the heads above the threshold boxed and
    counted; small models print every value, large ones (1B: 28 x 16) none."""
    small = {"baseline": torch.tensor([[0.25, 0.01], [-0.02, 0.06]]),
             "headwise": torch.tensor([[0.0, 0.1], [0.0, 0.0]])}
    fig = plots.first_token_excess_map(small, threshold=0.05)
    panels = [ax for ax in fig.axes if ax.get_images()]
    assert len(panels) == 2
    assert [ax.get_title() for ax in panels] == ["baseline\n2 heads above 0.05", "headwise\n1 head above 0.05"]
    image = panels[0].get_images()[0]
    assert torch.allclose(torch.tensor(image.get_array().data), small["baseline"])
    assert (image.norm.vmin, image.norm.vmax) == (pytest.approx(-0.25), pytest.approx(0.25))  # shared, centred
    assert panels[1].get_images()[0].norm.vmax == pytest.approx(0.25)
    assert sorted(t.get_text() for t in panels[0].texts) == ["-0.02", "0.01", "0.06", "0.25"]
    assert len(panels[0].patches) == 2 and len(panels[1].patches) == 1  # the boxed heads
    assert _whole_ticks(panels[0], "x") and _whole_ticks(panels[0], "y")
    big = plots.first_token_excess_map({"1B": torch.rand(28, 16, generator=torch.Generator().manual_seed(0))})
    assert not big.axes[0].texts and big.axes[0].get_title() == "1B"  # no threshold: nothing boxed or counted


def test_attention_maps_one_panel_per_pattern(inputs, models):
    _, cache = models["baseline"].run_with_cache(inputs[:1], names_filter=lambda n: n.endswith("hook_pattern"))
    patterns = {f"layer {L}": cache[f"blocks.{L}.attn.hook_pattern"][0] for L in range(2)}
    fig = plots.attention_maps(patterns, tokens=[str(t) for t in inputs[0].tolist()])
    panels = [ax for ax in fig.axes if ax.get_images()]
    assert len(panels) == 2 and panels[0].get_title().startswith("layer 0")
    img = panels[1].get_images()[0].get_array()
    assert img.shape == (16, 16)
    assert torch.allclose(torch.tensor(img.data), patterns["layer 1"].mean(0), atol=1e-6)
    late = plots.attention_maps({"late queries": patterns["layer 0"][0, 10:, :4]}, first_query=10)
    assert late.axes[0].get_ylim() == (15.5, 9.5) and late.axes[0].get_xlim() == (-0.5, 3.5)  # rows 10-15 named so


def test_attention_maps_titles_apart_and_log_floor():
    """Long labels wrap so neighbouring titles never overlap; floor= colours on a log scale that says what it clips."""
    p = torch.softmax(torch.randn(24, 24, generator=torch.Generator().manual_seed(0)), -1).tril()
    p[:, 0] = 0.5  # a bright first column next to values far below 1e-3 (and the zeros of future keys)
    labels = [f"code-{name}, layer 3, head 0" for name in ("baseline", "headwise", "elementwise", "extra")]
    for n in (2, 3, 4, 6):
        fig = plots.attention_maps({f"{labels[i % 4]} ({i})": p for i in range(n)}, first_query=488)
        fig.canvas.draw()
        panels = [ax for ax in fig.axes if ax.get_images()]
        titles = [ax.title.get_window_extent() for ax in panels]
        assert all(len(line) <= 28 for ax in panels for line in ax.get_title().splitlines())
        assert not any(a.overlaps(b) for i, a in enumerate(titles) for b in titles[i + 1:])
        ticks = [t.get_window_extent() for ax in panels for t in ax.get_xticklabels() if t.get_text()]
        assert not any(t.overlaps(b) for t in titles for b in ticks)  # nor the tick labels of the row above
        assert panels[0].get_images()[0].norm.vmin == 0 and panels[0].get_images()[0].norm.vmax == 1  # default: linear
    fig = plots.attention_maps({"late queries": p}, first_query=488, floor=1e-3)
    image = fig.axes[0].get_images()[0]
    assert isinstance(image.norm, LogNorm) and (image.norm.vmin, image.norm.vmax) == (1e-3, 1)
    assert image.get_array().min() == pytest.approx(1e-3)  # below the floor: shown at the floor
    assert fig.axes[0].get_title() == "late queries\nfirst-token share 0.50"  # the share of the values, not clipped
    bar = fig.axes[-1]
    assert "log scale" in bar.get_ylabel() and "below 0.001" in bar.get_ylabel()


def test_loss_curves_and_training_metric():
    h = History(step=list(range(1, 41)), loss=[5 - 0.05 * i for i in range(40)], eval_step=[20, 40],
                val_loss=[4.5, 3.5], spikes=[10], metrics=[{"step": 20, "f_attn": 0.1}, {"step": 40, "f_attn": 0.3}])
    fig = plots.loss_curves({"baseline": h}, smooth=5)
    ax = fig.axes[0]
    assert ax.get_ylabel().startswith("loss") and len(ax.get_lines()) == 3  # train, validation, one spike line
    fig = plots.training_metric({"baseline": h}, "f_attn")
    assert list(fig.axes[0].get_lines()[0].get_ydata()) == [0.1, 0.3]
    h2 = History(metrics=[{"step": 20, "f_attn": 0.2, "m_act": 9.0}])
    fig = plots.training_metrics({"baseline": h, "elementwise": h2}, {"f_attn": "F-Attn", "m_act": "M-Act"}, "both")
    assert [ax.get_title() for ax in fig.axes] == ["F-Attn", "M-Act"] and fig.get_suptitle() == "both"
    lines = fig.axes[0].get_lines()  # one line per run, in each run's colour
    assert [list(line.get_ydata()) for line in lines] == [[0.1, 0.3], [0.2]]
    assert lines[1].get_color() == plots.COLORS["elementwise"] and len(fig.axes[1].get_lines()[0].get_ydata()) == 0


def test_each_variant_has_one_colour_under_its_name():
    assert list(plots.COLORS) == list(NAMES.values())


def _whole_ticks(ax, axis="x"):
    """Layer and head ticks are whole numbers (no 0.5)."""
    fig = ax.get_figure()
    fig.canvas.draw()
    ticks = ax.get_xticks() if axis == "x" else ax.get_yticks()
    lo, hi = ax.get_xlim() if axis == "x" else sorted(ax.get_ylim())
    shown = [t for t in ticks if lo <= t <= hi]
    return len(shown) > 0 and all(float(t).is_integer() for t in shown)


@pytest.fixture
def gated_pair(tiny):
    torch.manual_seed(0)
    return {"headwise": Transformer(ModelConfig(**tiny, gate="G1", gate_granularity="headwise")),
            "elementwise": Transformer(ModelConfig(**tiny, gate="G1", gate_granularity="elementwise"))}


def test_gate_anatomy_figures(inputs, gated_pair):
    from minigate.gate_analysis import compare_gates, gate_scores

    scores = {k: gate_scores(m, inputs) for k, m in gated_pair.items()}
    fig = plots.gate_distribution(scores)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend[0].startswith(f"headwise: mean {scores['headwise'].distribution().mean:.3f}")
    fig = plots.gate_head_means(scores)
    img = fig.axes[0].get_images()[0].get_array()
    assert torch.allclose(torch.tensor(img.data), scores["headwise"].head_means(), atol=1e-6)
    assert _whole_ticks(fig.axes[0], "x") and _whole_ticks(fig.axes[0], "y")
    fig = plots.gate_first_vs_rest(scores)
    assert _whole_ticks(fig.axes[0])
    assert list(fig.axes[0].get_lines()[0].get_ydata()) == pytest.approx(
        scores["headwise"].first_vs_rest(by_layer=True).first.tolist())
    m = scores["elementwise"].token_matrix(0)
    fig = plots.gate_token_matrix(m, tokens=[str(t) for t in inputs[0].tolist()], layers=[0, 1])
    assert fig.axes[0].get_images()[0].get_array().shape == (16, 2)
    table = compare_gates(scores, ci=True, n_boot=50)
    fig = plots.gate_by_type(table)
    assert [round(p.get_height(), 6) for p in fig.axes[0].patches] == [round(table[k]["mean"], 6) for k in table]
    assert "CI" in fig.axes[0].get_title()
    assert _whole_ticks(plots.gate_layer_quantiles(scores).axes[0])
    fig = plots.gate_dimension_classes(scores["elementwise"].dimension_classes())
    heights = torch.tensor([p.get_height() for p in fig.axes[0].patches]).view(3, 2)
    assert torch.allclose(heights.sum(0).float(), torch.ones(2))  # the three classes fill each layer's bar


def test_ablation_figures(gated_pair, tokens):
    from minigate import ablation as ab

    model = gated_pair["headwise"]
    c = ab.chunks(tokens(400, None, seed=1), 4, 12, model=model)
    conds = {"learned": [], **ab.constant_conditions(model, (0.0, 0.5, 1.0)), **ab.layer_conditions(model)}
    res = ab.sweep(model, c, conds, n_boot=50, progress=False)
    fig = plots.sweep_curve(res)
    line = fig.axes[0].get_lines()[0]
    assert list(line.get_xdata()) == [0.0, 0.5, 1.0]
    assert list(line.get_ydata()) == pytest.approx([res[f"gates={v:g}"].ppl for v in (0.0, 0.5, 1.0)])
    assert fig.axes[0].get_yscale() == "log"
    fig = plots.layer_ablation(res)
    assert len(fig.axes[0].patches) == 4  # 2 layers x (open, closed)
    assert _whole_ticks(fig.axes[0])


def test_cost_bars_one_panel_per_setting_with_intervals():
    """The forbid-<bos> costs of lesson 06: a panel per setting, a bar per model and condition at its estimate, the
    error bar spanning its interval, coloured by the gate the model's name contains."""
    from minigate.stats import bootstrap_ci

    diffs = torch.randn(16, generator=torch.Generator().manual_seed(0)) * 0.1 + 0.5
    costs = {"copy models": {"copy-baseline": {"all layers": (10.8, 10.7, 11.0), "L0": (10.9, 10.8, 11.0)},
                             "copy-headwise": {"all layers": (7.3, 6.9, 7.8), "L0": (9.6, 9.4, 9.8)}},
             "code models": {"code-elementwise": {"all layers": bootstrap_ci(diffs), "L3": (0.05, 0.03, 0.07)}}}
    fig = plots.cost_bars(costs)
    copy, code = fig.axes
    assert [copy.get_title(), code.get_title()] == ["copy models", "code models"]
    assert [t.get_text() for t in copy.get_xticklabels()] == ["all layers", "L0"]
    bars = copy.patches
    assert [round(b.get_height(), 3) for b in bars] == [10.8, 10.9, 7.3, 9.6]
    assert bars[0].get_facecolor() == matplotlib.colors.to_rgba(plots.COLORS["baseline"])
    assert bars[2].get_facecolor() == matplotlib.colors.to_rgba(plots.COLORS["headwise"])
    caps = [seg for coll in copy.collections for seg in coll.get_segments()]  # the error bars, one segment each
    assert sorted(round(float(seg[0][1]), 3) for seg in caps) == [6.9, 9.4, 10.7, 10.8]
    assert sorted(round(float(seg[1][1]), 3) for seg in caps) == [7.8, 9.8, 11.0, 11.0]
    ci = bootstrap_ci(diffs)
    assert code.patches[0].get_height() == pytest.approx(ci.estimate.item())
    assert code.patches[0].get_facecolor() == matplotlib.colors.to_rgba(plots.COLORS["elementwise"])
    assert "nats" in copy.get_ylabel()
    fig = plots.cost_bars(costs, predicted={"copy-baseline": 4.0, "copy-headwise": 0.5})
    marks = [line for line in fig.axes[0].get_lines() if line.get_marker() == "D"]  # one per predicted model
    assert [(round(float(m.get_xdata()[0]), 3), float(m.get_ydata()[0])) for m in marks] == [(-0.2, 4.0), (0.2, 0.5)]
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()].count("predicted") == 1
    assert not [line for line in fig.axes[1].get_lines() if line.get_marker() == "D"]

def test_log_axes_have_plain_readable_ticks():
    """Perplexity and M-Act axes: plain numbers (150, not 1.5x10^2), several labels even within one decade."""
    from types import SimpleNamespace

    res = {"learned": SimpleNamespace(ppl=99.5, ci=None), "L0 open": SimpleNamespace(ppl=184, ci=None),
           "L0 closed": SimpleNamespace(ppl=130, ci=None), "L1 open": SimpleNamespace(ppl=120, ci=None),
           "L1 closed": SimpleNamespace(ppl=103, ci=None)}
    fig = plots.layer_ablation(res)
    fig.canvas.draw()
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    labels = [t.get_text() for t in ax.get_yticklabels() if lo <= t.get_position()[1] <= hi and t.get_text()]
    assert len(labels) >= 3 and all(label.replace(",", "").isdigit() for label in labels), labels
    assert _plain(150) == "150" and _plain(2000) == "2,000" and _plain(3e7) == "3e+07"
    plt.close(fig)


def test_head_writes_and_looks_draws_bars_outlines_and_shares():
    """Lesson 02's closed gate: per head, what it writes on each part (the gate's input as an outline, gated
    models only) and where it looks; the k-th bar of a row has one colour in every panel."""
    writes = {"baseline": {"random": torch.tensor([3.0, 5.7]), "copy": torch.tensor([3.3, 1.9])},
              "headwise": {"random": torch.tensor([4.3, 0.01]), "copy": torch.tensor([1.0, 4.4])}}
    before = {"headwise": {"random": torch.tensor([5.0, 4.4]), "copy": torch.tensor([4.3, 4.6])}}
    looks = {"baseline": {"<bos>": torch.tensor([0.06, 0.94]), "source": torch.tensor([0.96, 0.01])},
             "headwise": {"<bos>": torch.tensor([0.92, 0.03]), "source": torch.tensor([0.04, 0.94])}}
    fig = plots.head_writes_and_looks(writes, looks, before, title="Layer 0")
    wb, wh, lb, lh = fig.axes[:4]  # writes, then looks; one column per model
    assert [ax.get_title() for ax in (wb, wh)] == ["baseline", "headwise"]
    filled = lambda ax: sorted(round(p.get_height(), 2) for p in ax.patches if p.get_fill())
    outlines = lambda ax: sorted(round(p.get_height(), 2) for p in ax.patches if not p.get_fill())
    assert filled(wb) == [1.9, 3.0, 3.3, 5.7] and outlines(wb) == []  # no gate, no outline
    assert filled(wh) == [0.01, 1.0, 4.3, 4.4] and outlines(wh) == [4.3, 4.4, 4.6, 5.0]
    assert filled(lh) == [0.03, 0.04, 0.92, 0.94] and lb.get_ylim()[0] == 0 and lh.get_ylim()[1] < 1.2
    assert "0.01" in [t.get_text() for t in wh.texts]  # every bar is labelled with its value
    colors = lambda ax: {c.get_label(): c.patches[0].get_facecolor() for c in ax.containers if c.patches[0].get_fill()}
    assert colors(wb) == colors(wh) and colors(lb) == colors(lh)
    assert [c.get_label() for c in wh.containers] == ["random", "before the gate", "copy", "before the gate"]
    legends = [t.get_text() for ax in (wh, lh) for t in ax.get_legend().get_texts()]
    assert legends == ["random", "copy", "before the gate", "<bos>", "source"]
    assert lh.get_xlabel() == "head" and _whole_ticks(lh) and fig.get_suptitle() == "Layer 0"


def test_head_table_prints_every_number_and_leaves_missing_columns_blank():
    tables = {"baseline": {"<bos>|random": torch.tensor([0.06, 0.94]), "source|copy": torch.tensor([0.96, 0.01])},
              "headwise": {"<bos>|random": torch.tensor([0.9, 0.03]), "source|copy": torch.tensor([0.04, 0.94]),
                           "gate|random": torch.tensor([0.87, 0.0])}}
    fig = plots.head_table(tables, title="Layer 0")
    base, gated = [ax for ax in fig.axes if ax.get_images()]
    assert [t.get_text() for t in gated.get_xticklabels()] == ["<bos>|random", "source|copy", "gate|random"]
    assert sorted(t.get_text() for t in base.texts) == ["0.01", "0.06", "0.94", "0.96"]  # no gate column: blank
    assert len(gated.texts) == 6 and base.get_title() == "baseline"
    rows = plots.head_table({"m": {"a": torch.tensor([0.1, 0.2])}}, row_labels=["L0 h0", "L1 h0"]).axes[0]
    assert [t.get_text() for t in rows.get_yticklabels()] == ["L0 h0", "L1 h0"]


def test_head_table_on_a_log_scale_spans_the_numbers_and_formats_them():
    """Perplexities from 8 to 3.7e7: log colours from the smallest to the largest, each printed with fmt."""
    tables = {"a": {"open": torch.tensor([3.5e5, 36.0]), "pinned": torch.tensor([3.7e7, 17.4])},
              "b": {"pinned": torch.tensor([8.0, 89.6]), "open": torch.tensor([float("nan"), 200.0])}}
    fig = plots.head_table(tables, row_labels=["L0", "L1"], log=True, fmt=".3g")
    a, b = [ax for ax in fig.axes if ax.get_images()]
    assert sorted(t.get_text() for t in a.texts) == sorted(["3.5e+05", "36", "3.7e+07", "17.4"])
    norm = a.get_images()[0].norm
    assert type(norm).__name__ == "LogNorm" and (norm.vmin, norm.vmax) == (8.0, pytest.approx(3.7e7))
    assert {t.get_text() for t in b.texts} == {"8", "89.6", "200"}  # the NaN is blank
    plt.close(fig)


def test_scorecard_grid_colours_each_cell_by_its_verdict():
    from minigate.course.scorecard import CLAIMS, VERDICT_COLORS, Entry, draw

    entries = [Entry("f_attn", "paper", "0.467 -> 0.048", ""), Entry("f_attn", "code", "2.0x", "partly"),
               Entry("m_act", "code", "77 -> 32", "contradicted"), Entry("m_act", "copy", "11.7x", "reproduced")]
    fig = draw(entries, CLAIMS, ["paper", "code", "copy"])
    ax = fig.axes[0]
    colours = {(round(p.get_x()), round(p.get_y())): p.get_facecolor() for p in ax.patches}
    to_rgba = matplotlib.colors.to_rgba
    assert colours[1, 0] == to_rgba(VERDICT_COLORS["partly"])        # f_attn row, code column
    assert colours[1, 1] == to_rgba(VERDICT_COLORS["contradicted"])  # m_act row, code column
    assert colours[2, 1] == to_rgba(VERDICT_COLORS["reproduced"])
    assert colours[0, 0] == to_rgba("white") and colours[2, 0] != colours[0, 0]  # the paper's claim; a missing cell
    assert [t.get_text() for t in ax.get_xticklabels()] == ["paper", "code", "copy"]
    assert len(ax.get_yticklabels()) == 2  # only the claims with entries
    texts = [t.get_text() for t in ax.texts]
    assert "77 -> 32" in texts and "2.0x" in texts
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["reproduced", "partly", "within noise",
                                                                    "not at this scale", "contradicted",
                                                                    "fragile (hatched)"]
    plt.close(fig)


def test_scorecard_grid_groups_claims_by_source_hatches_fragile_cells_and_adds_the_claims_verdict():
    from minigate.course.scorecard import CLAIMS, SOURCES, Entry, draw

    entries = [Entry("f_attn", "code", "2.0x", "partly"),
               Entry("f_attn", "copy", "0.7x", "contradicted", ("one model",)),
               Entry("bos", "code", "0.89x", "contradicted", ("one model",))]
    verdicts = {"f_attn": ("partly", False), "bos": ("contradicted", True)}
    fig = draw(entries, CLAIMS, ["code", "copy"], verdicts=verdicts, sources=SOURCES)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["code", "copy", "the claim"]
    assert [t.get_text() for t in ax.get_yticklabels()] == [CLAIMS["f_attn"].short, CLAIMS["bos"].short]
    texts = [t.get_text() for t in ax.texts]
    assert SOURCES["paper"] in texts and SOURCES["course"] in texts and SOURCES["reported"] not in texts
    assert sum(bool(p.get_hatch()) for p in ax.patches) == 3  # two fragile settings and the all-fragile claim
    assert fig.get_size_inches()[0] <= 12  # the lesson's width
