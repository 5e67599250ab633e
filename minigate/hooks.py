"""Named hook points and an activation cache, in the style (and with the names) of TransformerLens.

Every interesting activation passes through a `HookPoint` (an identity module). Its name is its
module path, e.g. `blocks.0.attn.hook_pattern`. A hook function `fn(tensor, hook)` may read the
tensor, or return a tensor of the same shape to replace it:

    logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_gate"))
    cache["blocks.0.attn.hook_gate"]                       # (batch, pos, head[, d_head]): the gate scores
    cache["gate", 0]                                       # the same, by TransformerLens' short name

    def close_gates(gate, hook):
        return torch.zeros_like(gate)
    logits = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_gate", close_gates)])

A hook point may have aliases, other names of the same point (TransformerLens' TransformerBridge names, e.g.
`blocks.0.attn.hook_q_gate` for `blocks.0.attn.hook_gate_logits`): `model.hook_dict` holds each point once, under
its own name, `model.hook_aliases` maps the aliases to it. An alias is a name, not a filter's target: it works as
a name or in a list of names, while a filter function sees the points' own names only (so `n.endswith("gate")`
still picks hook_gate alone). One (names, fn) pair hooks a point once, even when it names it twice; run_with_cache
caches it under each name asked for. Two pairs, one per name, are two hooks on the one point.

Hooks are removed when the call returns, also when the forward raises. A hook point fires for any
PyTorch forward hook (`hp.register_forward_hook`), not only for the hooks attached here. Which hook points
run is decided by minigate's own hook points only: a global module hook (a profiler's) changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import contextmanager

import torch
from torch import nn

HookFn = Callable[[torch.Tensor, "HookPoint"], torch.Tensor | None]
NameFilter = str | Iterable[str] | Callable[[str], bool] | None

# TransformerLens' short names (utils.get_act_name); these live on the attention module, blocks.{L}.attn
ATTN_ACTS = ("q", "k", "v", "rot_q", "rot_k", "attn_scores", "pattern", "z", "gate_logits", "gate", "z_gated", "q_gate")
ACT_ALIASES = {"attn": "pattern", "attn_logits": "attn_scores", "query": "q", "key": "k", "value": "v"}


def get_act_name(name: str, layer: int | None = None) -> str:
    """A hook point's full name from TransformerLens' short name, as TL's `utils.get_act_name`:
    ("pattern", 0) -> "blocks.0.attn.hook_pattern", ("resid_pre", 3) -> "blocks.3.hook_resid_pre",
    ("embed") -> "hook_embed"; a full name is returned as it is."""
    if layer is None and ("." in name or name.startswith("hook_")):
        return name
    name = ACT_ALIASES.get(name, name)
    block = "" if layer is None else f"blocks.{layer}."
    return f"{block}{'attn.' if name in ATTN_ACTS else ''}hook_{name}"


class HookPoint(nn.Module):
    """Identity; a place to read or replace an activation. `.name` is its path in the model; `aliases`: other
    names of this point in its module (e.g. ("hook_q_gate",)), hooked and cached as if they were its name."""

    def __init__(self, aliases: tuple[str, ...] = ()):
        super().__init__()
        self.name: str = ""
        self.aliases = tuple(aliases)
        self.layer: int | None = None  # the block it sits in (blocks.{layer}...), None outside the blocks
        self._handles: list = []

    def add_hook(self, fn: HookFn):
        def call(module, inputs, output):
            new = fn(output, self)
            if new is not None and (not isinstance(new, torch.Tensor) or new.shape != output.shape):
                got = tuple(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__
                raise ValueError(f"a hook on {self.name} returned {got}, but it must return None or a tensor of "
                                 f"the activation's shape {tuple(output.shape)}")
            return new

        handle = self.register_forward_hook(call)
        self._handles.append(handle)
        return handle

    def remove_hook(self, handle):
        handle.remove()
        self._handles.remove(handle)

    @property
    def active(self) -> bool:
        """True when a hook is attached to this point: one from add_hook, or any PyTorch forward hook or forward
        pre-hook registered on it. Global module hooks (register_module_forward_hook, a profiler's) do not count:
        they must not move every layer to the explicit path. The attention computes its explicit
        (query_pos x key_pos) pattern only when its hook_attn_scores or hook_pattern is active; a global hook sees
        the pattern when something hooks hook_pattern (a no-op hook is enough)."""
        return bool(self._forward_hooks or self._forward_pre_hooks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def extra_repr(self) -> str:
        return self.name


class ActivationCache(dict):
    """What `run_with_cache` returns: a dict {hook name: tensor} that also speaks TransformerLens'
    `ActivationCache`: `cache["pattern", 0]` (short name and layer, negative layers count from the end),
    `stack_activation`, `accumulated_resid`, `remove_batch_dim`, `to`."""

    def __init__(self, activations=(), n_layers: int = 0, has_batch_dim: bool = True):
        super().__init__(activations)
        self.n_layers = n_layers
        self.has_batch_dim = has_batch_dim

    def __getitem__(self, key: str | tuple[str, int]) -> torch.Tensor:
        if isinstance(key, tuple):
            name, layer = key
            key = get_act_name(name, layer + self.n_layers if layer is not None and layer < 0 else layer)
        elif key not in self:  # a short name without a layer, e.g. "embed"
            key = get_act_name(key)
        if key not in self:
            raise KeyError(f"{key!r} is not in this cache, which holds {len(self)} activations, e.g. {list(self)[:3]}; "
                           "run_with_cache caches only what names_filter lets through")
        return super().__getitem__(key)

    def __repr__(self) -> str:
        return f"ActivationCache with keys {list(self)}"

    def stack_activation(self, name: str, layer: int = -1) -> torch.Tensor:
        """The activation `name` (a short name: "pattern", "resid_post") of layers 0..layer-1 (-1: every layer), stacked
        on a new leading axis: (layer, *shape)."""
        layers = self.n_layers if layer == -1 else layer
        return torch.stack([self[name, L] for L in range(layers)])

    def accumulated_resid(self, layer: int | None = None, incl_mid: bool = False, return_labels: bool = False):
        """The residual stream as it builds up, as TransformerLens orders it: resid_pre of layers 0..layer
        (with resid_mid after each but the last, when incl_mid), and for layer None, -1 or n_layers the final
        resid_post; (component, batch, pos, d_model), and with return_labels their labels ("0_pre", "final_post")."""
        if layer is None or layer == -1:
            layer = self.n_layers
        parts, labels = [], []
        for L in range(layer + 1):
            if L == self.n_layers:
                parts.append(self["resid_post", L - 1])
                labels.append("final_post")
                continue
            parts.append(self["resid_pre", L])
            labels.append(f"{L}_pre")
            if incl_mid and L < layer:
                parts.append(self["resid_mid", L])
                labels.append(f"{L}_mid")
        stacked = torch.stack(parts)
        return (stacked, labels) if return_labels else stacked

    def remove_batch_dim(self) -> "ActivationCache":
        """Drop the leading batch axis of every activation (batch size 1 only), in place; returns the cache."""
        if self.has_batch_dim:
            for name, t in self.items():
                if t.shape[0] != 1:
                    raise ValueError(f"remove_batch_dim needs batch size 1, but {name} has shape {tuple(t.shape)}")
            for name in self:
                super().__setitem__(name, super().__getitem__(name)[0])
            self.has_batch_dim = False
        return self

    def to(self, device) -> "ActivationCache":
        """Move every activation to `device`, in place; returns the cache."""
        for name in self:
            super().__setitem__(name, super().__getitem__(name).to(device))
        return self


def _as_filter(names: NameFilter) -> Callable[[str], bool]:
    if names is None:
        return lambda n: True
    if isinstance(names, str):
        return lambda n: n == names
    if callable(names):
        return names
    names = set(names)
    return lambda n: n in names


class HookedRootModule(nn.Module):
    """Mixin for the model: finds its HookPoints and runs forwards with hooks attached."""

    def setup_hooks(self):
        """Call at the end of __init__: names every HookPoint after its module path. hook_dict holds each point once,
        under its own name; hook_aliases maps each alias (full name) to that name."""
        self.hook_dict: dict[str, HookPoint] = {}
        self.hook_aliases: dict[str, str] = {}
        for name, module in self.named_modules():
            if isinstance(module, HookPoint):
                module.name = name
                module.layer = int(name.split(".")[1]) if name.startswith("blocks.") else None
                self.hook_dict[name] = module
                parent = name.rpartition(".")[0]
                self.hook_aliases.update({f"{parent}.{a}" if parent else a: name for a in module.aliases})
        self.n_hooked_layers = 1 + max((hp.layer for hp in self.hook_dict.values() if hp.layer is not None),
                                       default=-1)

    def _resolve(self, name_or_filter) -> dict[HookPoint, list[str]]:
        """The hook points a name, a list of names or a filter function picks, each once, with the names that picked
        it (its own name or an alias; a function sees own names only)."""
        if isinstance(name_or_filter, str):
            own = self.hook_aliases.get(name_or_filter, name_or_filter)
            if own not in self.hook_dict:
                known = [*self.hook_dict, *self.hook_aliases]
                close = [n for n in known if n.split(".")[-1] == name_or_filter.split(".")[-1]][:3]
                raise KeyError(f"no hook point named {name_or_filter!r}; e.g. {close or list(self.hook_dict)[:3]}"
                               " (model.hook_dict lists them all, model.hook_aliases their other names)")
            return {self.hook_dict[own]: [name_or_filter]}
        keep = _as_filter(name_or_filter)
        found = {hp: [n] for n, hp in self.hook_dict.items() if keep(n)}
        if name_or_filter is not None and not callable(name_or_filter):  # a list of names may hold aliases
            for alias in filter(keep, self.hook_aliases):
                found.setdefault(self.hook_dict[self.hook_aliases[alias]], []).append(alias)
        if not found:
            shown = name_or_filter if not callable(name_or_filter) else getattr(name_or_filter, "__name__", "filter")
            raise ValueError(f"the hook filter {shown!r} matches no hook point, so nothing would be hooked; "
                             f"names look like {list(self.hook_dict)[:3]} (model.hook_dict lists them all; "
                             "an alias in model.hook_aliases is matched by its exact name only)")
        return found

    @contextmanager
    def hooks(self, fwd_hooks: Iterable[tuple] = ()):
        """Context manager: attach `(name_or_filter, fn)` pairs; always detaches them on exit.
        Contexts nest: hooks attached earlier run first, and each context removes only its own."""
        added = []
        try:
            for name_or_filter, fn in fwd_hooks:
                for hp in self._resolve(name_or_filter):  # each point once, whichever of its names matched
                    added.append((hp, hp.add_hook(fn)))
            yield self
        finally:
            for hp, handle in added:
                hp.remove_hook(handle)

    def run_with_hooks(self, *args, fwd_hooks: Iterable[tuple] = (), **kwargs):
        """Forward with hooks `[(name_or_filter, fn)]`; returns what forward returns."""
        with self.hooks(fwd_hooks):
            return self(*args, **kwargs)

    def run_with_cache(self, *args, names_filter: NameFilter = None, detach: bool = True, device=None,
                       remove_batch_dim: bool = False, return_cache_object: bool = True, incl_bwd: bool = False,
                       pos_slice=None, **kwargs):
        """Forward, returning (output, cache) with cache[name] = the activation at that hook point, an
        `ActivationCache` (a plain dict with return_cache_object=False). Only the hook points that
        names_filter lets through are hooked (default: all of them), so the attention keeps its fused
        path unless the pattern or the scores are asked for. device: where to keep the cached tensors;
        remove_batch_dim: drop the batch axis (batch size 1). TransformerLens' incl_bwd and pos_slice
        are refused."""
        if incl_bwd:
            raise ValueError("run_with_cache(incl_bwd=True) is not supported: minigate caches forward activations "
                             "only (to get gradients, run with detach=False and call .retain_grad() on them)")
        if pos_slice is not None:
            raise ValueError("run_with_cache(pos_slice=...) is not supported: cache every position and slice the "
                             "tensors, e.g. cache['resid_post', 0][:, -1]")
        cache = ActivationCache(n_layers=self.n_hooked_layers)

        def saver(names: list[str]) -> HookFn:  # cache the activation under the names that asked for it
            def save(t: torch.Tensor, hook: HookPoint):
                t = t.detach() if detach else t
                t = t if device is None else t.to(device)
                cache.update(dict.fromkeys(names, t))

            return save

        picked = self._resolve(names_filter if names_filter is not None else (lambda n: True))
        with self.hooks([(hp.name, saver(names)) for hp, names in picked.items()]):
            out = self(*args, **kwargs)
        if remove_batch_dim:
            cache.remove_batch_dim()
        return out, (cache if return_cache_object else dict(cache))
