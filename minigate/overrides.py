"""Overrides: hook lists that pin a part of the model to a value given up front (no data needed).

    from minigate import overrides as ov
    ov.set_gates(model, 0.116)       # every gate fixed at 0.116
    ov.force_layer(model, 0, 1.0)    # layer 0's gates forced open, the other layers keep theirs
    ov.close_head(model, 1, 3)       # one head's gate closed
    ov.scale_output(model, 2, 1.5)   # a control: layer 2's attention output multiplied by 1.5
    ov.forbid_bos(model, 1)          # attention to <bos> forbidden in layer 1

Every factory returns `[(hook_name, fn), ...]`, usable with `model.hooks(...)`, `model.run_with_hooks` or
`ablation.perplexity(..., fwd_hooks)`. Their `fn`s are `Edit`s: hook functions that are also plain data (an op, a
value, a head), which is what lets `ablation.sweep` batch them; `forbid_bos` is a plain hook, which a sweep runs
one condition at a time. Overrides whose constant is measured on data (a mean, a norm) are in ablation.py.

Gate values are gate *scores*, after the activation: for the paper's sigmoid G1 gate, 1 = open (the
head's output passes unchanged, as in a model without a gate) and 0 = closed (the head is silenced).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from .gate_analysis import check_layer, gated_layers
from .hooks import get_act_name

COMPONENTS = {"attn": "hook_attn_out", "mlp": "hook_mlp_out"}  # the outputs the controls can act on


@dataclass(eq=False)
class Edit:
    """A hook function that is also data: what to do to the activation at one hook point.

        op="set"    x[:, :, head] = value  (head=None: all of x). value: a number, or a tensor that
                    broadcasts against what it replaces (e.g. a mean per head, or per head and dim)
        op="scale"  x * value
        op="norm"   each position's vector (last dim) rescaled to L2 norm `value`

    An Edit treats every batch row on its own, so applying it to rows i..j of a batch gives those rows
    exactly what applying it to the whole batch gives: that is what lets `ablation.sweep` stack conditions.
    """

    op: str
    value: float | torch.Tensor
    head: int | None = None

    def __post_init__(self):
        if self.op not in ("set", "scale", "norm"):
            raise ValueError(f"Edit op={self.op!r}; allowed: 'set', 'scale', 'norm'")

    def __call__(self, x: torch.Tensor, hook=None) -> torch.Tensor:
        return self.apply(x)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        value = torch.as_tensor(self.value, dtype=x.dtype, device=x.device)
        if self.op == "scale":
            return x * value
        if self.op == "norm":
            return x * (value / x.norm(dim=-1, keepdim=True).clamp_min(1e-12))
        out = x.clone()
        if self.head is None:
            out[...] = value
        else:
            out[:, :, self.head] = value  # gate tensors are (batch, pos, head[, d_head])
        return out


# -- checks shared with ablation.py's measured overrides ----------------------------------------------------
def check_gated(model, layers: Iterable[int] | None = None) -> list[int]:
    """`layers` (None: every gated layer), each checked to hold a gate (see gate_analysis.gated_layers)."""
    return gated_layers(model, layers, hint="; the controls (scale_output, mean_output, fixed_norm) work on any model")


def check_gate_heads(model) -> int:
    """How many heads a gate override can address per layer: the query heads, or the kv heads for G2/G3."""
    cfg = model.cfg
    if cfg.gate == "G5":
        raise ValueError("G5 gates act on o_proj's output, which has no heads; use set_gates or force_layer")
    return cfg.n_gate_heads


def output_hook(model, layer: int, component: str = "attn") -> str:
    """The hook point of a layer's attention output (component "attn", after the gate and o_proj:
    `blocks.L.hook_attn_out`) or MLP output ("mlp": `blocks.L.hook_mlp_out`)."""
    if component not in COMPONENTS:
        raise ValueError(f"component={component!r}; use 'attn' (hook_attn_out) or 'mlp' (hook_mlp_out)")
    return f"blocks.{check_layer(model, layer)}.{COMPONENTS[component]}"


def _check_head(head, n: int, what: str) -> int:
    """`head` as an int, or a ValueError naming `what` has n of them per layer."""
    if not isinstance(head, numbers.Integral) or isinstance(head, bool) or not 0 <= head < n:
        raise ValueError(f"head {head!r} is out of range: {what.format(n=n)} per layer, use 0..{n - 1}")
    return int(head)


def _gate_value(model, value) -> float:
    """`value` as a gate score the model's gate activation can produce: [0, 1] for a sigmoid gate,
    >= min silu = -0.2785 for a SiLU gate; a ValueError otherwise (NaN included)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"gate value {value!r}: must be a finite number")
    if model.cfg.gate_activation == "sigmoid" and not 0 <= value <= 1:
        raise ValueError(f"gate value {value!r}: a sigmoid gate lives in [0, 1] (0 closed, 1 open); "
                         "use a value in that range, or scale_output to scale the attention output instead")
    if model.cfg.gate_activation == "silu" and value < -0.2785:
        raise ValueError(f"gate value {value!r}: a SiLU gate never goes below -0.2785")
    return float(value)


# -- the gates ----------------------------------------------------------------------------------------------
def set_gates(model, value: float, layers: Iterable[int] | None = None) -> list[tuple[str, Edit]]:
    """Every gate (of every layer, or of `layers`) fixed at `value` (in [0, 1] for the sigmoid gate)."""
    layers = check_gated(model, layers)
    return [(get_act_name("gate", L), Edit("set", _gate_value(model, value))) for L in layers]


def force_layer(model, layer: int, value: float) -> list[tuple[str, Edit]]:
    """One layer's gates forced to `value` (1.0 = open, 0.0 = closed); the other layers keep theirs."""
    return set_gates(model, value, [layer])


def close_head(model, layer: int, head: int, value: float = 0.0) -> list[tuple[str, Edit]]:
    """One head's gate forced to `value` (default 0: closed), for headwise and elementwise gates alike
    (an elementwise head has all its dimensions set)."""
    check_gated(model, [layer])
    head = _check_head(head, check_gate_heads(model), "the gate has {n} heads")
    return [(get_act_name("gate", layer), Edit("set", _gate_value(model, value), head=head))]


# -- a control: the same kind of override on a part that is not a gate ---------------------------------------
def scale_output(model, layer: int, scale: float, component: str = "attn") -> list[tuple[str, Edit]]:
    """A layer's attention (or MLP) output multiplied by a constant; ablation.matched_scale gives the factor
    that changes it as much as forcing the layer's gates to a value does."""
    return [(output_hook(model, layer, component), Edit("scale", float(scale)))]


# -- beyond the gates: attention to <bos> forbidden ------------------------------------------------------
def forbid_bos(model, layer: int, head: int | None = None) -> list[tuple[str, Callable]]:
    """Attention to `<bos>` (key 0) forbidden in layer `layer` (only in head `head`, if given): on
    `blocks.{layer}.attn.hook_pattern` (batch, head, query, key), every query but query 0 gets weight 0 on key 0
    and its row is renormalised over the remaining keys; query 0 can only attend to itself and keeps it. Works on
    any model, gated or not. The hook is a plain function, not an Edit: a sweep runs it one condition at a time.
    Combine layers by adding the lists: `sum((forbid_bos(model, L) for L in range(n_layers)), [])`."""
    layer = check_layer(model, layer)
    heads = slice(None) if head is None else _check_head(head, model.cfg.n_heads, "the model has {n} query heads")

    def forbid(pattern: torch.Tensor, hook=None) -> torch.Tensor:
        p = pattern.clone()
        p[:, heads, 1:, 0] = 0
        total = p.sum(-1, keepdim=True)  # a row whose other keys all underflowed to 0 stays 0 rather than 0/0
        return torch.where(total > 0, p / total, p)

    return [(get_act_name("pattern", layer), forbid)]
