"""Explorers build and update on a tiny model without a display; their static rendering is a PNG."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from minigate import ModelConfig, Transformer  # noqa: E402
from minigate.course import widgets  # noqa: E402
from minigate.data import get_tokenizer  # noqa: E402

PNG = b"\x89PNG"


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    cfg = dict(vocab_size=4096, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48)
    models = {"baseline": Transformer(cfg := ModelConfig(**cfg)),
              "headwise": Transformer(ModelConfig(**{**cfg.to_dict(), "gate": "G1", "gate_granularity": "headwise"}))}
    return models, get_tokenizer()


def test_attention_explorer_updates_and_renders_statically(setup):
    models, tok = setup
    ex = widgets.attention_explorer(models, tok, prompt="Hello world, hello again.")
    first = bytes(ex.image.value)
    assert first.startswith(PNG)
    ex.controls["layer"].value = 1
    assert bytes(ex.image.value).startswith(PNG) and bytes(ex.image.value) != first
    ex.controls["head"].value = 2
    ex.controls["model"].value = "headwise"
    bundle, metadata = ex._repr_mimebundle_()
    assert bundle["text/plain"] == ("<attention explorer: model='headwise', layer=1, head=2, "
                                    "prompt='Hello world, hello again.'>")
    assert bundle["image/png"] and "application/vnd.jupyter.widget-view+json" in bundle
    assert metadata == {"image/png": {"width": widgets.display_width(bytes(ex.image.value))}}


def test_the_picture_is_shown_at_the_size_it_was_drawn_for(setup):
    """PIXEL_RATIO PNG pixels per CSS pixel, live and static: neither blurred by stretching nor shrunk."""
    import struct

    models, tok = setup
    ex = widgets.attention_explorer(models, tok, prompt="Hello world, hello again.")
    png = bytes(ex.image.value)
    width = struct.unpack(">I", png[16:20])[0]
    css = widgets.display_width(png)
    assert css == round(width / widgets.PIXEL_RATIO) and 300 < css < 1200  # a figure of a few inches
    assert ex.image.layout.width == f"{css}px" and ex.image.layout.max_width == "100%"
    assert ex.image.layout.height == "auto"


def test_empty_prompt_keeps_the_picture_and_says_why(setup):
    models, tok = setup
    ex = widgets.attention_explorer(models, tok)
    before = bytes(ex.image.value)
    ex.controls["prompt"].value = "   "
    assert bytes(ex.image.value) == before and "empty" in ex.status.value
    ex.controls["prompt"].value = "back again"
    assert ex.status.value == "" and bytes(ex.image.value) != before


def test_prompt_tokens_puts_bos_first(setup):
    _, tok = setup
    ids, labels = widgets.prompt_tokens(tok, "a b c")
    assert ids[0, 0].item() == tok.bos_id and labels[0] == "<bos>" and len(labels) == ids.shape[1]
    assert tok.decode(ids[0, 1:].tolist()) == "a b c"


def test_gate_explorer(setup):
    models, tok = setup
    ex = widgets.gate_explorer(models, tok, prompt="one two three")
    assert list(ex.controls["model"].options) == ["headwise"]  # the baseline has no gate to show
    first = bytes(ex.image.value)
    ex.controls["head"].value = 3
    assert bytes(ex.image.value).startswith(PNG) and bytes(ex.image.value) != first
    with pytest.raises(ValueError, match="none of these models has a gate"):
        widgets.gate_explorer({"baseline": models["baseline"]}, tok)


def test_clamp_explorer_changes_perplexity_and_text(setup):
    from minigate import ablation as ab

    models, tok = setup
    chunks = ab.chunks(torch.randint(0, 4096, (300,), generator=torch.Generator().manual_seed(0)), 2, 16)
    ex = widgets.clamp_explorer(models, tok, chunks, max_new_tokens=4)
    m = models["headwise"]
    assert widgets._clamp_hooks(m, "all", "all", 0.3)[0][0] == "blocks.0.attn.hook_gate"
    assert [n for n, _ in widgets._clamp_hooks(m, "all", 2, 0.0)] == ["blocks.0.attn.hook_gate",
                                                                       "blocks.1.attn.hook_gate"]
    before = bytes(ex.image.value)
    ex.controls["layer"].value = 1
    ex.controls["value"].value = 0.0
    assert bytes(ex.image.value) != before
    assert ex._repr_mimebundle_()[0]["text/plain"] == \
        "<clamp explorer: model='headwise', layer=1, head='all', value=0.0>"


@pytest.fixture(scope="module")
def windows(setup):
    """Three <bos>-first windows of 40 token ids, like held-out prose windows (shorter than n_tokens=64)."""
    _, tok = setup
    ids = torch.randint(1, 4096, (3, 40), generator=torch.Generator().manual_seed(1))
    ids[:, 0] = tok.bos_id
    return ids


@pytest.mark.slow
def test_models_attention_explorer_shows_every_model_side_by_side_and_redraws(setup, windows):
    models, tok = setup
    ex = widgets.models_attention_explorer(models, windows, tok, layer=1, head=2, heads={"headwise": (0, 3)})
    c = ex.controls
    assert list(c) == ["window", "baseline", "headwise"]  # the window, then one layer-and-head choice per model
    assert (c["window"].min, c["window"].max) == (0, 2)
    assert [label for label, _ in c["baseline"].options] == [f"L{L} {h}" for L in range(2)
                                                              for h in ("h0", "h1", "h2", "h3", "mean")]
    assert (c["baseline"].value, c["headwise"].value) == ((1, 2), (0, 3))  # each model starts on its own head
    fig = ex.draw(**ex.values)  # one panel per model, the window's first 40 tokens (all it has), share in the title
    panels = [ax for ax in fig.axes if ax.images and ax.get_title()]
    assert [ax.get_title().splitlines()[:2] for ax in panels] == [["baseline", "layer 1, head 2"],
                                                                  ["headwise", "layer 0, head 3"]]
    assert all(ax.images[0].get_array().shape == (40, 40) for ax in panels)
    assert all("first-token share" in ax.get_title() for ax in panels)
    title = fig._suptitle.get_text()
    assert title.startswith("Window 0, its first 40 tokens (uniform attention: ")
    plt.close(fig)
    pictures = [bytes(ex.image.value)]
    for control, value in (("window", 2), ("baseline", (0, 1)), ("headwise", (1, "mean"))):
        c[control].value = value
        pictures.append(bytes(ex.image.value))
        assert pictures[-1].startswith(PNG) and pictures[-1] != pictures[-2], f"no redraw after {control} changed"
    assert ex.status.value == ""
    bundle, metadata = ex._repr_mimebundle_()
    assert bundle["text/plain"] == "<models attention explorer: window=2, baseline=(0, 1), headwise=(1, 'mean')>"
    assert metadata == {"image/png": {"width": widgets.display_width(pictures[-1])}}
    assert ex.image.layout.width == f"{widgets.display_width(pictures[-1])}px"


def test_models_attention_explorer_draws_the_pattern_the_model_computes(setup, windows):
    models, _ = setup
    ex = widgets.models_attention_explorer({"headwise": models["headwise"]}, windows, window=1, layer=1, head=3,
                                           n_tokens=16, floor=None)
    panel = next(ax for ax in ex.draw(**ex.values).axes if ax.images)
    _, cache = models["headwise"].run_with_cache(windows[1:2, :16], names_filter="blocks.1.attn.hook_pattern")
    p = cache["blocks.1.attn.hook_pattern"][0, 3]
    assert torch.allclose(torch.as_tensor(panel.images[0].get_array()), p, atol=1e-6)
    assert f"first-token share {p[:, 0].mean():.2f}" in panel.get_title()
    plt.close("all")


@pytest.mark.parametrize("change, fix", [
    (dict(windows=torch.rand(3, 40)), "tensor of token ids"),
    (dict(windows=torch.arange(40)), "tensor of token ids"),
    (dict(windows=[[0, 1, 2]]), "tensor of token ids"),
    (dict(windows=torch.full((2, 8), 5000)), "encode them with the models' tokenizer"),
    (dict(window=3), "pass a window from 0 to 2"),
    (dict(layer=2), "pass a layer from 0 to 1"),
    (dict(head=4), "pass a head from 0 to 3, or 'mean'"),
    (dict(heads={"headwise": (2, 0)}), "pass a layer from 0 to 1"),
    (dict(heads={"headwise": (0, 5)}), "pass a head from 0 to 3, or 'mean'"),
    (dict(heads={"gated": (0, 1)}), "pass heads keyed like models"),
    (dict(n_tokens=0), "pass e.g. n_tokens=64"),
    (dict(models={}), "no models given"),
    (dict(models="other shape"), "pass models of one shape"),
])
def test_models_attention_explorer_bad_input_says_the_fix_in_one_line(setup, windows, change, fix):
    models, tok = setup
    if change.get("models") == "other shape":
        change["models"] = {**models, "deeper": Transformer(ModelConfig(**{**models["baseline"].cfg.to_dict(),
                                                                           "n_layers": 3}))}
    args = dict(dict(models=models, windows=windows), **change)
    with pytest.raises(ValueError, match=fix) as e:
        widgets.models_attention_explorer(args.pop("models"), args.pop("windows"), tok, **args)
    assert "\n" not in str(e.value)


def test_static_rendering_under_ipywidgets_7(setup, monkeypatch):
    """Colab ships ipywidgets 7.7.1, which has no _repr_mimebundle_ on widgets: the bundle is written out."""
    models, tok = setup
    ex = widgets.attention_explorer(models, tok, prompt="Hello world.")
    monkeypatch.setattr(widgets, "IPYWIDGETS_7", True)
    bundle, _ = ex._repr_mimebundle_()
    assert bundle[widgets.VIEW_MIME] == {"version_major": 2, "version_minor": 0, "model_id": ex.model_id}
    assert bundle["image/png"] and bundle["text/plain"].startswith("<attention explorer: model='baseline'")
    import ipywidgets

    # 7.x displays through _ipython_display_ (defined only there); 8.x through _repr_mimebundle_
    assert hasattr(widgets.Explorer, "_ipython_display_") == (int(ipywidgets.__version__.split(".")[0]) < 8)
