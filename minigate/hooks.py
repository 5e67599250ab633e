"""Named hook points, in the style of TransformerLens.

Every interesting activation passes through a `HookPoint` (an identity module). Its name is its
module path, e.g. `blocks.0.attn.hook_pattern`. A hook function `fn(tensor, hook)` may read the
tensor, or return a tensor of the same shape to replace it:

    logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_gate"))
    cache["blocks.0.attn.hook_gate"]                       # (batch, pos, head[, d_head])

    def close_gates(gate, hook):
        return torch.zeros_like(gate)
    logits = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_gate", close_gates)])

Hooks are removed when the call returns, also when the forward raises.
"""

from __future__ import annotations

from contextlib import contextmanager
from collections.abc import Callable, Iterable

import torch
from torch import nn

HookFn = Callable[[torch.Tensor, "HookPoint"], torch.Tensor | None]
NameFilter = str | Iterable[str] | Callable[[str], bool] | None


class HookPoint(nn.Module):
    """Identity; a place to read or replace an activation. `.name` is its path in the model."""

    def __init__(self):
        super().__init__()
        self.name: str = ""
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

    def remove_hooks(self):
        for h in self._handles:
            h.remove()
        self._handles = []

    @property
    def active(self) -> bool:
        """True when some hook is attached (the attention uses this to choose its explicit path)."""
        return bool(self._handles)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def extra_repr(self) -> str:
        return self.name


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
        """Call at the end of __init__: names every HookPoint after its module path."""
        self.hook_dict: dict[str, HookPoint] = {}
        for name, module in self.named_modules():
            if isinstance(module, HookPoint):
                module.name = name
                self.hook_dict[name] = module

    def _resolve(self, name_or_filter) -> list[HookPoint]:
        if isinstance(name_or_filter, str):
            if name_or_filter not in self.hook_dict:
                close = [n for n in self.hook_dict if n.split(".")[-1] == name_or_filter.split(".")[-1]][:3]
                raise KeyError(f"no hook point named {name_or_filter!r}; e.g. {close or list(self.hook_dict)[:3]}"
                               " (model.hook_dict lists them all)")
            return [self.hook_dict[name_or_filter]]
        keep = _as_filter(name_or_filter)
        found = [hp for n, hp in self.hook_dict.items() if keep(n)]
        if not found:
            shown = name_or_filter if not callable(name_or_filter) else getattr(name_or_filter, "__name__", "filter")
            raise ValueError(f"the hook filter {shown!r} matches no hook point, so nothing would be hooked; "
                             f"names look like {list(self.hook_dict)[:3]} (model.hook_dict lists them all)")
        return found

    def reset_hooks(self):
        for hp in self.hook_dict.values():
            hp.remove_hooks()

    @contextmanager
    def hooks(self, fwd_hooks: Iterable[tuple] = ()):
        """Context manager: attach `(name_or_filter, fn)` pairs; always detaches them on exit.
        Contexts nest: hooks attached earlier run first, and each context removes only its own."""
        added = []
        try:
            for name_or_filter, fn in fwd_hooks:
                for hp in self._resolve(name_or_filter):
                    added.append((hp, hp.add_hook(fn)))
            yield self
        finally:
            for hp, handle in added:
                hp.remove_hook(handle)

    def run_with_hooks(self, *args, fwd_hooks: Iterable[tuple] = (), **kwargs):
        """Forward with hooks `[(name_or_filter, fn)]`; returns what forward returns."""
        with self.hooks(fwd_hooks):
            return self(*args, **kwargs)

    def run_with_cache(self, *args, names_filter: NameFilter = None, detach: bool = True, **kwargs):
        """Forward, returning (output, cache) with cache[name] = the activation at that hook point."""
        cache: dict[str, torch.Tensor] = {}

        def save(t: torch.Tensor, hook: HookPoint):
            cache[hook.name] = t.detach() if detach else t

        with self.hooks([(names_filter if names_filter is not None else (lambda n: True), save)]):
            out = self(*args, **kwargs)
        return out, cache
