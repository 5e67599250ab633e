"""Gate anatomy: what the learned G1 gates do, measured as an independent analysis of the
1B checkpoints did, with error bars.

    g = gate_scores(model, prompts, tokenizer=tok)  # every gate value at every token of every prompt
    g.distribution(ci=True)      # mean, median, std, fraction < 0.1 and > 0.9, histogram
    g.layer_means(), g.head_means()                  # (layer,), (layer, head)
    g.first_vs_rest()            # gate on the first token (<bos>) vs on all others, and their ratio
    g.token_matrix(0, head=2)    # (pos, layer): the gates of prompt 0, a heatmap
    g.layer_quantiles()          # (layer, 5): the shape of each layer's distribution
    g.dimension_classes()        # always-closed / input-dependent / always-open gate dimensions
    compare_gates({"headwise": g_hw, "elementwise": g_ew})  # a table: one row per model or input type
    compare_gates(gate_scores_by_type(model, load_prompts(), tokenizer=tok), ci=True)

Numbers for the paper's 1B models on WikiText-2, reported by a third-party analysis of the released 1B
checkpoints (not the paper's; not checked here; lesson 05 shows them with their source): headwise mean 0.185, median
0.141, 36.6% of values < 0.1, 0.15% > 0.9, first token 0.068 vs 0.179 for the others; elementwise mean
0.104, median 0.043, 70.4% < 0.1.

Definitions. A gate value is *closed* when < CLOSED = 0.1 and *open* when > OPEN = 0.9. A gate
dimension (one (layer, head, d) of an elementwise gate, one (layer, head) of a headwise gate) is
*always closed* when its 95th percentile over all tokens is < 0.1, *always open* when its 5th
percentile is > 0.9, and *input-dependent* otherwise (it moves with the input, or sits in between).
Means pool all tokens (a long prompt counts more), as that analysis's numbers do.

Error bars: `ci=True` (95%) or `ci=0.9` on any aggregate gives a bootstrap interval that resamples
whole sequences (prompts, or the rows of a (batch, pos) token tensor), never single tokens (see stats.py).

Memory: one float32 per gate value per token, (token, layer, head[, d_head]). The 1B elementwise
model has 28 * 16 * 128 gates per token (230 KB); pass layers=[...] or fewer tokens for big runs.
"""

from __future__ import annotations

import numbers
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from einops import rearrange

from .data import TextTokenizer
from .hooks import get_act_name
from .model import check_token_ids
from .stats import CI, bootstrap_ci, quantile

CLOSED, OPEN = 0.1, 0.9  # a gate value below CLOSED is closed, above OPEN is open
DIM_QUANTILES = (0.05, 0.95)  # always closed: q95 < CLOSED; always open: q05 > OPEN
CLASSES = ("always_closed", "input_dependent", "always_open")  # DimensionClasses.label 0, 1, 2


def _level(ci) -> float:
    """ci=True means a 95% interval; a number in (0, 1) is the coverage itself."""
    return 0.95 if ci is True else float(ci)


@dataclass
class GateDistribution:
    mean: torch.Tensor  # () 0-d tensors, all but hist and edges
    median: torch.Tensor
    std: torch.Tensor
    frac_closed: torch.Tensor  # share of gate values < CLOSED
    frac_open: torch.Tensor  # share of gate values > OPEN
    hist: torch.Tensor  # (bins,) share of gate values in each bin
    edges: torch.Tensor  # (bins + 1,) bin edges
    ci: dict | None = None  # with ci: {"mean" | "frac_closed" | "frac_open": (low, high)}


@dataclass
class FirstVsRest:
    first: torch.Tensor  # () or (layer,): mean gate on position 0 (<bos>)
    rest: torch.Tensor  # same shape: mean gate on every other position
    ratio: torch.Tensor  # first / rest
    ci: dict | None = None  # with ci: {"first" | "rest" | "ratio": (low, high)}


@dataclass
class DimensionClasses:
    label: torch.Tensor  # (layer, head[, d_head]) long: index into CLASSES
    q05: torch.Tensor  # same shape: 5th percentile of each dimension over tokens
    q95: torch.Tensor  # 95th percentile

    @property
    def fractions(self) -> dict[str, float]:
        """Share of gate dimensions in each class (the three add up to 1)."""
        return {c: (self.label == i).float().mean().item() for i, c in enumerate(CLASSES)}

    @property
    def per_layer(self) -> torch.Tensor:
        """(layer, 3): the same shares within each layer, columns in CLASSES order."""
        flat = self.label.flatten(1)  # (layer, dims)
        return torch.stack([(flat == i).float().mean(1) for i in range(len(CLASSES))], dim=1)


@dataclass
class GateScores:
    """Every gate value, one row per token of every prompt (no padding)."""

    values: torch.Tensor  # (token, layer, head) headwise or (token, layer, head, d_head) elementwise
    prompt: torch.Tensor  # (token,) which prompt (bootstrap unit) each row comes from, 0..n_prompts-1
    pos: torch.Tensor  # (token,) position within its prompt; 0 is the first token
    tokens: torch.Tensor  # (token,) token ids
    layers: list[int]  # the model layer of each entry of the layer axis

    @property
    def granularity(self) -> str:
        return "headwise" if self.values.dim() == 3 else "elementwise"

    @property
    def n_prompts(self) -> int:
        return int(self.prompt.max()) + 1

    def _per_prompt(self, x: torch.Tensor, mask=None):
        """Sums of x (token, ...) over each prompt's (masked) tokens, (prompt, ...), and counts (prompt,)."""
        keep = torch.ones_like(self.prompt, dtype=torch.bool) if mask is None else mask
        sums = torch.zeros(self.n_prompts, *x.shape[1:], dtype=torch.float64)
        sums.index_add_(0, self.prompt[keep], x[keep].double())
        return sums, torch.bincount(self.prompt[keep], minlength=self.n_prompts).double()

    def _pooled(self, x: torch.Tensor, mask=None, ci=False, **boot):
        """Mean of x (token, ...) over all (masked) tokens: a tensor, or with ci a CI over prompts."""
        sums, counts = self._per_prompt(x, mask)
        if not ci:
            return (sums.sum(0) / counts.sum()).float()
        means = sums / counts.clamp(min=1).reshape(-1, *[1] * (sums.dim() - 1))
        return bootstrap_ci(means, weights=counts, ci=_level(ci), **boot)

    def _per_token(self, x: torch.Tensor, keep: int) -> torch.Tensor:
        """Mean over every axis of x (token, layer, head[, d_head]) after the first `keep` ones."""
        return x.float() if keep >= x.dim() else x.float().flatten(keep).mean(keep)

    # -- the views that analysis reported --------------------------------------------------------------------
    def distribution(self, bins: int = 20, ci=False, **boot) -> GateDistribution:
        """Global distribution of every gate value (all tokens, layers, heads[, dims])."""
        flat = self.values.flatten()
        lo, hi = min(0.0, flat.min().item()), max(1.0, flat.max().item())  # [0, 1] for sigmoid gates
        d = GateDistribution(
            mean=flat.double().mean().float(), median=quantile(flat, 0.5), std=flat.double().std().float(),
            frac_closed=(flat < CLOSED).double().mean().float(), frac_open=(flat > OPEN).double().mean().float(),
            hist=torch.histc(flat, bins, lo, hi) / flat.numel(), edges=torch.linspace(lo, hi, bins + 1))
        if ci:
            parts = {"mean": self.values, "frac_closed": self.values < CLOSED, "frac_open": self.values > OPEN}
            d.ci = {k: tuple(self._pooled(self._per_token(v, 1), ci=ci, **boot)[1:]) for k, v in parts.items()}
        return d

    def layer_means(self, ci=False, **boot) -> torch.Tensor | CI:
        """(layer,) mean gate of each layer."""
        return self._pooled(self._per_token(self.values, 2), ci=ci, **boot)

    def head_means(self, ci=False, **boot) -> torch.Tensor | CI:
        """(layer, head) mean gate of each head (over its dimensions, for elementwise gates)."""
        return self._pooled(self._per_token(self.values, 3), ci=ci, **boot)

    def first_vs_rest(self, by_layer: bool = False, ci=False, **boot) -> FirstVsRest:
        """Mean gate on the first token vs on all later tokens; shapes () or, by_layer, (layer,)."""
        x = self._per_token(self.values, 2 if by_layer else 1)  # (token[, layer])
        first, rest = self._pooled(x, self.pos == 0), self._pooled(x, self.pos > 0)
        out = FirstVsRest(first, rest, first / rest)
        if ci:
            f, _ = self._per_prompt(x, self.pos == 0)  # (prompt[, layer]): each prompt has one first token
            r, n = self._per_prompt(x, self.pos > 0)  # sums over the later tokens, and how many (prompt,)
            n = n.reshape(-1, *[1] * (r.dim() - 1)).expand_as(r)

            def ratio(s, dim):  # s (..., prompt, 3[, layer]): mean first gate / pooled mean of the rest
                f, r, n = s.unbind(dim + 1)
                return f.mean(dim) / (r.sum(dim) / n.sum(dim))

            out.ci = {"first": tuple(self._pooled(x, self.pos == 0, ci=ci, **boot)[1:]),
                      "rest": tuple(self._pooled(x, self.pos > 0, ci=ci, **boot)[1:]),
                      "ratio": tuple(bootstrap_ci(torch.stack([f, r, n], 1), stat=ratio, ci=_level(ci), **boot)[1:])}
        return out

    def token_matrix(self, prompt: int = 0, head: int | None = None) -> torch.Tensor:
        """(pos, layer) gates of one prompt: of one head, or averaged over heads (and dimensions)."""
        n = self.n_prompts
        if not 0 <= prompt < n:
            raise ValueError(f"prompt {prompt} is out of range: there are {n} prompts (0..{n - 1})")
        n_heads = self.values.shape[2]
        if head is not None and not 0 <= head < n_heads:
            raise ValueError(f"head {head} is out of range: this model has {n_heads} heads (0..{n_heads - 1})")
        rows = self._per_token(self.values[self.prompt == prompt], 3)  # (pos, layer, head)
        return rows.mean(-1) if head is None else rows[..., head]

    def prompt_tokens(self, prompt: int = 0) -> torch.Tensor:
        """(pos,) the token ids of one prompt, e.g. to label token_matrix's rows."""
        return self.tokens[self.prompt == prompt]

    def layer_quantiles(self, q=(0.05, 0.25, 0.5, 0.75, 0.95)) -> torch.Tensor:
        """(layer, len(q)) quantiles of each layer's gate values: the shape of its distribution."""
        per_layer = rearrange(self.values, "token layer ... -> layer (token ...)")
        return quantile(per_layer, list(q), dim=1).T

    def dimension_classes(self) -> DimensionClasses:
        """Classify every gate dimension by its 5th / 95th percentile over tokens (see the module doc)."""
        q05, q95 = quantile(self.values, list(DIM_QUANTILES), dim=0)  # each (layer, head[, d_head])
        label = torch.ones_like(q05, dtype=torch.long)  # input-dependent unless proven otherwise
        label[q95 < CLOSED] = 0
        label[q05 > OPEN] = 2
        return DimensionClasses(label, q05, q95)

    def head_averaged(self) -> GateScores:
        """Elementwise gates averaged over each head's dimensions (headwise gates come back as they are),
        to compare an elementwise model with a headwise one head by head."""
        if self.granularity == "headwise":
            return self
        return GateScores(self.values.mean(-1), self.prompt, self.pos, self.tokens, self.layers)


# -- which layers hold a gate (overrides.py checks its overrides with the same functions) ---------------------
def check_layer(model, layer) -> int:
    """`layer` as an int, or a ValueError if it is not a layer index of the model."""
    n = model.cfg.n_layers
    if not isinstance(layer, numbers.Integral) or isinstance(layer, bool) or not 0 <= layer < n:
        raise ValueError(f"layer {layer!r} is out of range: the model has {n} layers, use 0..{n - 1}")
    return int(layer)


def gated_layers(model, layers: Iterable[int] | None = None, hint: str = "") -> list[int]:
    """`layers` (None: every gated layer), each checked to be in range and to hold a gate (see
    ModelConfig.gate_layers). `hint` is added to the error a model without any gate raises."""
    cfg = model.cfg
    if cfg.gate == "none":
        raise ValueError("this model has no gate (gate='none'); load a headwise or elementwise model, or build one "
                         "with ModelConfig(gate='G1')" + hint)
    if layers is None:
        return [L for L in range(cfg.n_layers) if cfg.is_gated(L)]
    layers = [check_layer(model, L) for L in layers]
    if not layers:
        raise ValueError("layers=[] selects nothing; pass None for every gated layer")
    for L in layers:
        if not cfg.is_gated(L):
            raise ValueError(f"layer {L} has no gate: gate_layers={cfg.gate_layers} gates layers "
                             f"0..{cfg.gate_layers - 1} only")
    return layers


# -- collecting the gates ------------------------------------------------------------------------------------
def encode_prompt(tokenizer, text: str) -> list[int]:
    """The ids of a text prompt, <bos> first when the tokenizer has one. `tokenizer`: a data.TextTokenizer
    (data.get_tokenizer()), a data.CopyTokenizer, or a bare `tokenizers.Tokenizer`."""
    tok = tokenizer if hasattr(tokenizer, "bos_id") else TextTokenizer(tokenizer)
    return ([] if tok.bos_id is None else [tok.bos_id]) + tok.encode(text)


def _as_prompts(tokens_or_prompts, tokenizer, vocab_size: int) -> list[torch.Tensor]:
    """A (batch, pos) tensor or a list of prompts (token ids, or text with a tokenizer) -> 1-d id tensors."""
    if isinstance(tokens_or_prompts, torch.Tensor):
        if tokens_or_prompts.dim() != 2:
            raise ValueError(f"a token tensor must be (batch, pos), got shape {tuple(tokens_or_prompts.shape)}; "
                             "pass a list of prompts for different lengths")
        prompts = list(tokens_or_prompts.long())
    else:
        prompts = []
        for p in tokens_or_prompts:
            if isinstance(p, str):
                if tokenizer is None:
                    raise ValueError("these prompts are text: pass tokenizer= (e.g. minigate.data.get_tokenizer())")
                p = encode_prompt(tokenizer, p)
            prompts.append(torch.as_tensor(p, dtype=torch.long).reshape(-1))
    if not prompts:
        raise ValueError("the prompt set is empty: pass at least one prompt (e.g. load_prompts()['factual'])")
    for i, p in enumerate(prompts):
        if p.numel() == 0:
            raise ValueError(f"prompt {i} has no tokens")
        check_token_ids(p, vocab_size, what=f"the tokens of prompt {i}")
    return prompts


@torch.no_grad()
def gate_scores(model, tokens_or_prompts, tokenizer=None, layers: list[int] | None = None,
                batch_size: int = 16) -> GateScores:
    """Read the G1 gate at `blocks.L.attn.hook_gate` for every token of every prompt.

    tokens_or_prompts: a (batch, pos) tensor of ids (each row, e.g. a chunk, is one unit), or a list
        of prompts of any lengths: lists or tensors of ids (starting with <bos>), or strings, which
        `tokenizer` encodes with its bos id in front.
    Prompts of equal length run together in batches of up to batch_size, so nothing is padded.
    layers: which layers to keep (all by default); the layer axis of the result follows this list.
    """
    if model.cfg.gate != "G1":
        which = "has no gate (gate='none')" if model.cfg.gate == "none" else f"gates at {model.cfg.gate}"
        raise ValueError(f"gate anatomy reads the paper's G1 gate (on the attention output); this model {which}; "
                         "load a headwise or elementwise G1 model (gate='G1')")
    layers = gated_layers(model, layers)
    prompts = _as_prompts(tokens_or_prompts, tokenizer, model.cfg.vocab_size)
    names = [get_act_name("gate", i) for i in layers]
    seen: dict[str, torch.Tensor] = {}

    def record(gate, hook):  # gate (batch, pos, head[, d_head])
        seen[hook.name] = gate.detach().float().cpu()

    by_length = defaultdict(list)  # length -> indices of the prompts that long
    for i, p in enumerate(prompts):
        by_length[len(p)].append(i)
    out: list[torch.Tensor | None] = [None] * len(prompts)
    with model.hooks([(lambda name: name in names, record)]):
        for idx in by_length.values():
            for start in range(0, len(idx), batch_size):
                chunk = idx[start:start + batch_size]
                model(torch.stack([prompts[i] for i in chunk]).to(model.device))
                gates = torch.stack([seen[n] for n in names], dim=2)  # (batch, pos, layer, head[, d_head])
                for row, i in enumerate(chunk):
                    out[i] = gates[row]
    return GateScores(
        values=torch.cat(out),
        prompt=torch.cat([torch.full((len(p),), i) for i, p in enumerate(prompts)]),
        pos=torch.cat([torch.arange(len(p)) for p in prompts]),
        tokens=torch.cat(prompts),
        layers=layers)


def gate_scores_by_type(model, prompts_by_type: dict, tokenizer=None, **kw) -> dict[str, GateScores]:
    """gate_scores for each input type, e.g. of load_prompts(): {type: GateScores}."""
    if not prompts_by_type:
        raise ValueError("the prompt set is empty: pass {type: prompts}, e.g. load_prompts()")
    for kind, prompts in prompts_by_type.items():
        if len(prompts) == 0:
            raise ValueError(f"the prompt set of type {kind!r} is empty")
    return {kind: gate_scores(model, prompts, tokenizer, **kw) for kind, prompts in prompts_by_type.items()}


def compare_gates(scores: dict[str, GateScores], ci=False, **boot) -> dict[str, dict[str, float]]:
    """A table side by side, one row per entry (models, e.g. headwise vs elementwise, or input types):
    {name: {n_prompts, n_tokens, mean, median, std, frac_closed, frac_open, first, rest, first_rest_ratio}},
    with ci also `<stat>_low` / `<stat>_high` for mean, frac_closed, frac_open, first, rest, first_rest_ratio.
    `pandas.DataFrame(table).T` shows it as a table. Compare granularities head by head with
    g.head_averaged()."""
    table = {}
    for name, g in scores.items():
        d, f = g.distribution(ci=ci, **boot), g.first_vs_rest(ci=ci, **boot)
        row = {"n_prompts": g.n_prompts, "n_tokens": len(g.pos), "mean": d.mean.item(),
               "median": d.median.item(), "std": d.std.item(), "frac_closed": d.frac_closed.item(),
               "frac_open": d.frac_open.item(), "first": f.first.item(), "rest": f.rest.item(),
               "first_rest_ratio": f.ratio.item()}
        if ci:
            intervals = {**d.ci, "first": f.ci["first"], "rest": f.ci["rest"], "first_rest_ratio": f.ci["ratio"]}
            for k, (low, high) in intervals.items():
                row[f"{k}_low"], row[f"{k}_high"] = low.item(), high.item()
        table[name] = row
    return table
