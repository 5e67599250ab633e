"""Interactive explorers for the lessons (ipywidgets), drawn with minigate.plots.

    widgets.attention_explorer({"baseline": base, "headwise": gated}, tokenizer)
    widgets.models_attention_explorer({"baseline": base, "headwise": gated}, windows, tokenizer)  # side by side

Each explorer is a VBox of controls above a picture. The picture is a PNG (an `Image` widget), so it
re-renders fast, and the explorer's static rendering (a notebook viewed without a live kernel, e.g.
on GitHub) is that same PNG instead of an empty widget area. Both show it at its own size, CSS_DPI CSS pixels per
figure inch (as Jupyter shows matplotlib figures), drawn at PIXEL_RATIO times that: sharp, never stretched.

Works with ipywidgets 8 and with 7.x (Colab ships 7.7.1): 8 displays a widget through
`_repr_mimebundle_`, 7 through `_ipython_display_`; both give the same bundle here (widget view, PNG, text).
"""

from __future__ import annotations

import base64
import io
import struct
import textwrap

import ipywidgets as W
import matplotlib.pyplot as plt
import torch

from .. import ablation as ab
from .. import overrides as ov
from .. import plots
from ..analysis import uniform_first_token_share
from ..gate_analysis import encode_prompt, gate_scores, gated_layers
from ..hooks import get_act_name

IPYWIDGETS_7 = int(W.__version__.split(".")[0]) < 8
VIEW_MIME = "application/vnd.jupyter.widget-view+json"
CSS_DPI = 100  # CSS pixels per figure inch: the size Jupyter's inline backend shows a figure at
PIXEL_RATIO = 2  # PNG pixels per CSS pixel: sharp on high-density screens, evenly scaled down on others


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=CSS_DPI * PIXEL_RATIO, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def display_width(png: bytes) -> int:
    """The width in CSS pixels a picture is shown at: its PNG width (from the header) / PIXEL_RATIO."""
    return round(struct.unpack(">I", png[16:20])[0] / PIXEL_RATIO)


class Explorer(W.VBox):
    """Controls + a picture redrawn by `draw(**values)` (which returns a Figure) whenever a control changes."""

    def __init__(self, name: str, controls: dict, draw):
        self.name, self.controls, self.draw = name, controls, draw
        self.image = W.Image(format="png", layout=W.Layout(max_width="100%", height="auto"))
        self.status = W.HTML()
        super().__init__([W.HBox(list(controls.values())), self.image, self.status])
        for c in controls.values():
            c.observe(lambda change: self.refresh(), names="value")
        self.refresh()

    @property
    def values(self) -> dict:
        return {k: c.value for k, c in self.controls.items()}

    def refresh(self):
        try:
            png = _png(self.draw(**self.values))
            self.image.layout.width = f"{display_width(png)}px"  # not stretched to the cell's width
            self.image.value = png
            self.status.value = ""
        except ValueError as e:  # e.g. an empty prompt: say so under the last good picture
            self.status.value = f"<span style='color:#b00'>{e}</span>"

    def _repr_mimebundle_(self, **kwargs):
        if IPYWIDGETS_7:  # 7.x has no _repr_mimebundle_: the view reference it displays, written out
            bundle = {VIEW_MIME: {"version_major": 2, "version_minor": 0, "model_id": self.model_id}}
        else:
            bundle = super()._repr_mimebundle_(**kwargs)
            bundle = bundle[0] if isinstance(bundle, tuple) else bundle
        settings = ", ".join(f"{k}={v!r}" for k, v in self.values.items() if not isinstance(v, str) or len(v) < 40)
        bundle["text/plain"] = f"<{self.name}: {settings}>"  # stable text (no object addresses) for nbval
        png = bytes(self.image.value)
        bundle["image/png"] = base64.b64encode(png).decode()  # seen where widgets cannot run
        return bundle, {"image/png": {"width": display_width(png)}}

    if IPYWIDGETS_7:
        def _ipython_display_(self, **kwargs):  # how IPython shows a 7.x widget: the same bundle as under 8
            from IPython.display import display

            data, metadata = self._repr_mimebundle_()
            display(data, metadata=metadata, raw=True)


def _as_dict(models) -> dict:
    return models if isinstance(models, dict) else {"model": models}


def prompt_tokens(tokenizer, text: str, max_len: int | None = None) -> tuple[torch.Tensor, list[str]]:
    """(ids (1, pos), token strings) for a prompt; <bos> first when the tokenizer has one."""
    if not text.strip():
        raise ValueError("the prompt is empty: type some text")
    ids = encode_prompt(tokenizer, text)
    ids = ids[:max_len] if max_len else ids
    labels = ["<bos>" if i == tokenizer.bos_id else tokenizer.decode([i]) for i in ids]
    return torch.tensor([ids]), labels


@torch.no_grad()
def attention_explorer(models, tokenizer, prompt: str = "The cat sat on the mat because it was warm.",
                       layer: int = 0, head="mean") -> Explorer:
    """Attention pattern of one layer and head (or the head average) for a prompt you type."""
    models = _as_dict(models)
    first = next(iter(models.values()))
    n_layers, n_heads = first.cfg.n_layers, first.cfg.n_heads
    controls = {
        "model": W.Dropdown(options=list(models), description="model"),
        "layer": W.IntSlider(value=layer, min=0, max=n_layers - 1, description="layer"),
        "head": W.Dropdown(options=["mean", *range(n_heads)], value=head, description="head"),
        "prompt": W.Text(value=prompt, description="prompt", continuous_update=False,
                         layout=W.Layout(width="420px")),
    }

    def draw(model, layer, head, prompt):
        m = models[model]
        ids, labels = prompt_tokens(tokenizer, prompt, m.cfg.max_seq_len)
        name = get_act_name("pattern", layer)
        _, cache = m.run_with_cache(ids.to(next(m.parameters()).device), names_filter=name)
        label = f"{model}, layer {layer}, " + ("mean of heads" if head == "mean" else f"head {head}")
        return plots.attention_maps({label: cache[name][0]}, tokens=labels, head=head, title="")

    return Explorer("attention explorer", controls, draw)


def _windows_for(models: dict, windows, n_tokens: int) -> tuple[int, int]:
    """Check the inputs of models_attention_explorer; (n_layers, n_heads) the models share."""
    if not models:
        raise ValueError("no models given: pass {name: model}, e.g. {'code-baseline': "
                         "release.shipped('code-baseline')}")
    shapes = {name: (m.cfg.n_layers, m.cfg.n_heads) for name, m in models.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"the models differ in (layers, heads) {shapes}: pass models of one shape, whose layer and "
                         "head numbers mean the same thing")
    if not (isinstance(windows, torch.Tensor) and windows.dim() == 2 and windows.numel() > 0
            and not windows.is_floating_point() and not windows.is_complex()):
        what = f"a {windows.dtype} tensor of shape {tuple(windows.shape)}" if isinstance(windows, torch.Tensor) \
            else type(windows).__name__
        raise ValueError(f"windows must be a non-empty (window, pos) tensor of token ids, got {what}: pass e.g. "
                         "minigate.measure.prose_windows(tokenizer_path)")
    vocab = min(m.cfg.vocab_size for m in models.values())
    if windows.min() < 0 or windows.max() >= vocab:
        raise ValueError(f"windows hold token ids from {int(windows.min())} to {int(windows.max())}, outside the "
                         f"models' vocabulary (0 to {vocab - 1}): encode them with the models' tokenizer")
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be at least 1, got {n_tokens}: pass e.g. n_tokens=64")
    return next(iter(shapes.values()))


@torch.no_grad()
def models_attention_explorer(models, windows: torch.Tensor, tokenizer=None, window: int = 0, layer: int = 0,
                              head=0, heads: dict | None = None, n_tokens: int = 64,
                              floor: float | None = 1e-3) -> Explorer:
    """Several models' attention side by side on a held-out window, each model on its own layer and head (or the
    layer's head average): models trained separately do not number their heads alike.

    models: {name: model}, all with the same number of layers and heads (e.g. code-baseline, code-headwise and
    code-elementwise); windows: (window, pos) token ids, <bos> first (minigate.measure.prose_windows, or the lesson's
    prose chunks). Controls: the window (an index into `windows`) and one dropdown per model, named after it, that
    picks its layer and head ("L1 h3", or "L1 mean"). `heads` {name: (layer, head)} starts each model on its own
    head (e.g. its strongest <bos> head); a model it leaves out starts on `layer`, `head`. Each model runs on the
    window's first `n_tokens` tokens (1, n_tokens), quick to redraw on a CPU; each panel is one model's pattern
    (query, key) drawn by plots.attention_maps, with a log colour scale from `floor` (None: linear) so a gated
    model's small shares stay visible, and that panel's layer, head and first-token share (its mean over queries) in
    its title; the title gives uniform attention's share over as many tokens, to compare with. With a tokenizer it
    also quotes the window's beginning (and labels the axes with tokens when n_tokens <= 24)."""
    models = _as_dict(models)
    n_layers, n_heads = _windows_for(models, windows, n_tokens)
    n = min(n_tokens, windows.shape[1], *(m.cfg.max_seq_len for m in models.values()))
    heads = dict(heads or {})
    unknown = [k for k in heads if k not in models]
    if unknown or "window" in models:
        raise ValueError(f"heads names {unknown} that are not among the models {list(models)}: pass heads keyed like "
                         "models" if unknown else "a model is named 'window', the window control's name: rename it")
    start = {label: heads.get(label, (layer, head)) for label in models}
    for what, value, allowed, fix in (
            ("window", window, range(windows.shape[0]), f"a window from 0 to {windows.shape[0] - 1}"),
            *((what, v, allowed, fix) for L, h in start.values() for what, v, allowed, fix in (
                ("layer", L, range(n_layers), f"a layer from 0 to {n_layers - 1}"),
                ("head", h, ["mean", *range(n_heads)], f"a head from 0 to {n_heads - 1}, or 'mean'")))):
        if value not in allowed or isinstance(value, bool):
            raise ValueError(f"{what}={value!r} is out of range: pass {fix}")
    options = [(f"L{L} {'mean' if h == 'mean' else f'h{h}'}", (L, h)) for L in range(n_layers)
               for h in (*range(n_heads), "mean")]
    controls = {"window": W.IntSlider(value=window, min=0, max=windows.shape[0] - 1, description="window",
                                      continuous_update=False)}
    for label, (L, h) in start.items():
        controls[label] = W.Dropdown(options=options, value=(L, h), description=label,
                                     style={"description_width": "initial"}, layout=W.Layout(width="auto"))
    uniform = uniform_first_token_share(n)

    def draw(window, **picks):
        ids = windows[window:window + 1, :n]
        maps = {}
        for label, m in models.items():
            L, h = picks[label]
            name = get_act_name("pattern", L)
            _, cache = m.run_with_cache(ids.to(next(m.parameters()).device), names_filter=name)
            p = cache[name][0]  # (head, query, key)
            which = "mean of heads" if h == "mean" else f"head {h}"
            maps[f"{label}\nlayer {L}, {which}"] = p.mean(0) if h == "mean" else p[h]
        title = f"Window {window}, its first {n} tokens (uniform attention: first-token share {uniform:.2f})"
        labels = None
        if tokenizer is not None:
            ids_list = ids[0].tolist()
            labels = ["<bos>" if i == tokenizer.bos_id else tokenizer.decode([i]) for i in ids_list]
            text = tokenizer.decode([i for i in ids_list if i != tokenizer.bos_id])
            title += "\n" + repr(text[:70] + ("..." if len(text) > 70 else ""))
        width = 30 * min(len(models), 4) + 16  # characters the panels' width holds: fewer panels, more lines
        title = "\n".join(textwrap.fill(line, width) for line in title.splitlines())
        return plots.attention_maps(maps, tokens=labels, title=title, floor=floor)

    return Explorer("models attention explorer", controls, draw)


def _gated_only(models) -> dict:
    gated = {k: m for k, m in _as_dict(models).items() if m.cfg.gate != "none"}
    if not gated:
        raise ValueError("none of these models has a gate (gate='none'); pass a headwise or elementwise model")
    return gated


@torch.no_grad()
def gate_explorer(models, tokenizer, prompt: str = "The capital of France is Paris. The capital of Italy is",
                  head="mean") -> Explorer:
    """Gate score of every token (rows) in every layer (columns) for a prompt; one head or their mean."""
    models = _gated_only(models)
    n_heads = next(iter(models.values())).cfg.n_heads
    controls = {
        "model": W.Dropdown(options=list(models), description="model"),
        "head": W.Dropdown(options=["mean", *range(n_heads)], value=head, description="head"),
        "prompt": W.Text(value=prompt, description="prompt", continuous_update=False,
                         layout=W.Layout(width="420px")),
    }

    def draw(model, head, prompt):
        m = models[model]
        ids, labels = prompt_tokens(tokenizer, prompt, m.cfg.max_seq_len)
        g = gate_scores(m, ids)
        matrix = g.token_matrix(0, head=None if head == "mean" else head)
        which = "mean of heads" if head == "mean" else f"head {head}"
        return plots.gate_token_matrix(matrix, labels, g.layers, title=f"{model}: gate scores, {which}")

    return Explorer("gate explorer", controls, draw)


def _clamp_hooks(model, layer, head, value) -> list:
    if layer == "all" and head == "all":
        return ov.set_gates(model, value)
    if head == "all":
        return ov.force_layer(model, layer, value)
    layers = gated_layers(model) if layer == "all" else [layer]
    return [pair for L in layers for pair in ov.close_head(model, L, head, value)]


@torch.no_grad()
def clamp_explorer(models, tokenizer, chunks: torch.Tensor, prompt: str = "The history of the",
                   max_new_tokens: int = 12) -> Explorer:
    """Pin gates to a value (all of them, one layer's, or one head's) and watch perplexity on `chunks`
    (from ablation.chunks) and a greedy continuation of `prompt` change."""
    models = _gated_only(models)
    first = next(iter(models.values()))
    learned = {k: ab.perplexity(m, chunks, ci=False).ppl for k, m in models.items()}
    controls = {
        "model": W.Dropdown(options=list(models), description="model"),
        "layer": W.Dropdown(options=["all", *range(first.cfg.n_layers)], description="layer"),
        "head": W.Dropdown(options=["all", *range(first.cfg.n_heads)], description="head"),
        "value": W.FloatSlider(value=0.5, min=0.0, max=1.0, step=0.05, description="gate =",
                               continuous_update=False),
    }

    def draw(model, layer, head, value):
        m = models[model]
        hooks = _clamp_hooks(m, layer, head, value)
        clamped = ab.perplexity(m, chunks, hooks, ci=False).ppl
        ids, _ = prompt_tokens(tokenizer, prompt, m.cfg.max_seq_len)
        with m.hooks(hooks):
            out = m.generate(ids.to(next(m.parameters()).device), max_new_tokens, temperature=0)
        text = tokenizer.decode(out[0, ids.shape[1]:].tolist())
        fig, ax = plt.subplots(figsize=(6, 3.2))
        ax.bar(["learned gates", f"layer {layer}, head {head}\ngates = {value:g}"], [learned[model], clamped],
               color=["tab:green", "tab:purple"])
        ax.set(ylabel="perplexity", yscale="log", title=f"{model}: {learned[model]:.4g} -> {clamped:.4g}")
        fig.text(0.02, -0.02, f"{prompt!r} -> {text!r}", fontsize=8, ha="left", va="top", wrap=True)
        fig.tight_layout()
        return fig

    return Explorer("clamp explorer", controls, draw)
