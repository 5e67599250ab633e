"""The evidence read from the loss: closing the gates and forbidding <bos> (lesson 06's overrides, on the shipped
code and copy trios), and lesson 08's pair trained at a high learning rate (spikes, final loss, M-Act).

    override_entries("code", models, code_chunks())  # 95% bootstraps over the chunks, every model on the same ones
    lr_entries(LrRuns.measure(histories, models, chunk_ids, probe))
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from minigate import ablation as ab
from minigate import measure, overrides
from minigate.analysis import massive_activations
from minigate.stats import bootstrap_ci

from .rules import GATED, LEVEL, N_BOOT, Entry, Evidence, Interval, boot, halves, iv_text, judged


def _nats(iv: Interval) -> str:
    return f"{iv.estimate:+.3f} [{iv.low:+.3f}, {iv.high:+.3f}]"


# ── the overrides: closing the gates, forbidding <bos> ────────────────────────────────────────────────────

def code_chunks() -> torch.Tensor:
    """Lesson 06's prose chunks: the first 16 windows of 256 held-out WikiText-2 tokens, (16, 257), <bos> first."""
    return ab.chunks(measure.prose_ids(), n_chunks=16, chunk_len=256)


def chunk_costs(model, chunk_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each chunk's loss change (nats, (chunk,)) with attention to <bos> forbidden in every layer ("bos", as lesson
    06 measures it) and, for a gated model, with every gate set to 0 ("closed")."""
    conds = {"learned": [], "bos": [h for layer in range(model.cfg.n_layers)
                                    for h in overrides.forbid_bos(model, layer)]}
    if model.cfg.gate != "none":
        conds["closed"] = overrides.set_gates(model, 0.0)
    res = ab.sweep(model, chunk_ids, conds, ci=False, progress=False)
    return {k: res[k].chunk_losses - res["learned"].chunk_losses for k in conds if k != "learned"}


def override_entries(setting: str, models: dict, chunk_ids: torch.Tensor) -> list[Entry]:
    """The closed-gates and forbidden-<bos> entries of one trio, models {variant: model}: 95% bootstraps over the
    chunks (paired: every model on the same resamples)."""
    cost = {v: chunk_costs(m, chunk_ids) for v, m in models.items()}
    gated = [g for g in GATED if g in models]
    over = f"{len(chunk_ids)} {'chunks' if chunk_ids.shape[1] > 100 else 'rows'}"
    closed = {g: Interval(*(math.exp(t.item()) for t in bootstrap_ci(cost[g]["closed"], n_boot=N_BOOT, ci=LEVEL)))
              for g in gated}
    bos = torch.stack([cost[v]["bos"] for v in ("none", *gated)], 1)  # (chunk, model)
    means = boot(bos, lambda x, dim: x.mean(dim))  # each model's cost
    ratios = boot(bos, lambda x, dim: x.mean(dim)[..., :1] / x.mean(dim)[..., 1:])
    ev_closed = Evidence(closed, over)
    ev_bos = Evidence(dict(zip(gated, ratios, strict=True)), over, symptom=means[0])
    return [judged("closed", setting, ev_closed,
                   " / ".join(f"{closed[g].estimate:.2g}x {iv_text(closed[g], '.2g')}" for g in gated) + f" ({over})",
                   " / ".join(f"{closed[g].estimate:.2g}x" for g in gated)),
            judged("bos", setting, ev_bos,
                   f"{_nats(means[0])} -> {' / '.join(_nats(c) for c in means[1:])} nats: "
                   + " / ".join(f"{r.estimate:.2f}x {iv_text(r, '.2f')}" for r in ratios) + f" ({over})",
                   " / ".join(f"{r.estimate:.2f}x" for r in ratios))]


# ── lesson 08's learning-rate runs ───────────────────────────────────────────────────────────────────────

@dataclass(frozen=True)
class LrRuns:
    """Lesson 08's high-learning-rate pair, "none" (the baseline) and "elementwise": spikes and whether each run
    finished (did not diverge); each chunk's validation loss at the end; each probe window's largest |residual| per
    layer."""
    spikes: dict  # {"none": int, "elementwise": int}
    finished: dict  # {"none": bool, "elementwise": bool}
    losses: dict  # {"none": (chunk,), "elementwise": (chunk,)}: mean next-token loss of each validation chunk, nats
    maxima: dict  # {"none": (window, layer), "elementwise": (window, layer)}: ActivationStats.per_window on the probe

    @classmethod
    def measure(cls, histories: dict, models: dict, chunk_ids: torch.Tensor, probe: torch.Tensor) -> LrRuns:
        """From the two runs' histories and models {"none": ..., "elementwise": ...}, on validation chunks
        (ablation.chunks) and probe windows."""
        return cls(spikes={k: len(h.spikes) for k, h in histories.items()},
                   finished={k: "stopped" not in h.info for k, h in histories.items()},
                   losses={k: ab.perplexity(m, chunk_ids.long(), ci=False).chunk_losses for k, m in models.items()},
                   maxima={k: massive_activations(m.eval(), probe).per_window for k, m in models.items()})


def lr_entries(runs: LrRuns) -> list[Entry]:
    """The learning-rate entries (the gated model is elementwise, as in the paper's Table 2)."""
    s, done, point = runs.spikes, runs.finished, Interval.point
    trouble = {k: s[k] + (not done[k]) for k in s}  # spikes, and a divergence counted as one more
    ev_spikes = Evidence({"elementwise": point(trouble["none"] - trouble["elementwise"])}, "one run each",
                         symptom=point(trouble["none"]), gated={"elementwise": point(trouble["elementwise"])})
    diverged = [who for k, who in (("none", "the baseline"), ("elementwise", "the gated model")) if not done[k]]
    losses = torch.stack([runs.losses["none"], runs.losses["elementwise"]], 1).double()
    over = f"{len(losses)} validation chunks"
    (gap,) = boot(losses, lambda x, dim: x.mean(dim)[..., :1] - x.mean(dim)[..., 1:])
    maxima = torch.stack([runs.maxima["none"], runs.maxima["elementwise"]], 1)  # (window, model, layer)
    m = halves(maxima, lambda x, d: x.amax(d)[..., 0, :].mean(-1) / x.amax(d)[..., 1, :].mean(-1))
    m_over = f"halves of {len(maxima)} windows"
    m_act = {k: runs.maxima[k].amax(0).mean().item() for k in ("none", "elementwise")}
    return [judged("lr spikes", "lesson 08", ev_spikes, f"{s['none']} spikes -> {s['elementwise']}; "
                   + ("neither diverged" if not diverged else " and ".join(diverged) + " diverged"),
                   f"{s['none']} -> {s['elementwise']} spikes"),
            judged("lr loss", "lesson 08", Evidence({"elementwise": gap}, over),
                   f"{losses[:, 0].mean():.2f} -> {losses[:, 1].mean():.2f} nats: {gap.estimate:+.2f} "
                   f"{iv_text(gap, '+.2f')} ({over})", f"{gap.estimate:+.2f} nats"),
            judged("lr m_act", "lesson 08", Evidence({"elementwise": m}, m_over),
                   f"{m_act['none']:.2g} -> {m_act['elementwise']:.2g}: {m.estimate:.2f}x {iv_text(m, '.2f')} "
                   f"({m_over})", f"{m.estimate:.2f}x")]
