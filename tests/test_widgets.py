"""Explorers build and update on a tiny model without a display; their static rendering is a PNG."""

import matplotlib

matplotlib.use("Agg")
import pytest  # noqa: E402
import torch  # noqa: E402

from minigate import ModelConfig, Transformer, widgets  # noqa: E402
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
