"""The course's scorecard (lesson 08): each claim of the paper against each setting the course measured, with a verdict.

A verdict compares each gated twin with its baseline, and the size of the change with the paper's (`verdict`):
- contradicted: some gated twin moves the number the wrong way, or not at all;
- not at this scale: the baseline does not show the symptom, so there is nothing for the gate to remove;
- reproduced: every gated twin changes it at least half as many times as the paper's models do;
- partly: the right way, by less.
Every number is measured here on the shipped models, or read from the one file that stores it (measurements.json,
data/seeds/code.json); lesson 08 passes in its own learning-rate runs. Only the paper's figures are typed in (PAPER).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import torch

from minigate import ablation as ab
from minigate import data, measure, overrides
from minigate.analysis import GU_LEN, SINK_THRESHOLD, published_measures
from minigate.pretrained import shipped
from minigate.stats import bootstrap_ci

VERDICTS = ("reproduced", "partly", "not at this scale", "contradicted")  # best to worst
GATED = ("headwise", "elementwise")

CLAIMS = {  # key -> the claim, with the measure behind it
    "sink heads": f"fewer sink heads (first-token share > {SINK_THRESHOLD}, windows of {GU_LEN} tokens)",
    "f_attn": "less first-token attention (F-Attn, raw; above uniform in brackets)",
    "m_act": "smaller massive activations (M-Act, each layer's max |residual| averaged over layers)",
    "closed": "the gates carry the model: closing them all costs (perplexity, times the learned one)",
    "bos": "no need for a sink: forbidding attention to <bos> costs less (nats, baseline / gated)",
    "lr spikes": "a high learning rate: no loss spikes or divergence where the baseline has them",
    "lr loss": "a high learning rate: a lower final loss than the baseline's",
    "lr m_act": "... because the gate keeps M-Act small (M-Act at the high learning rate)",
}
SETTINGS = {  # key -> where and how it was measured
    "paper": "the paper: 15B MoE (Table 4), 1.7B dense (Table 2), released 1B models (reported by a third party)",
    "code": "code trio, seed 0 (shipped): 75 held-out WikiText-2 windows of 512 tokens (measurements.json)",
    "seeds": "code recipe, worst of its seeds (data/seeds/code.json), same protocol",
    "code-moe": "code-moe pair (shipped), same protocol",
    "copy": "copy trio (shipped): 256 held-out rows of 64 tokens (lesson 04); 64 rows for perplexity (lesson 06)",
    "induction": "induction trio (shipped): 256 held-out rows of 64 tokens (lesson 04)",
    "lesson 08": "lesson 08's runs: 150 steps at lr 0.1, baseline and elementwise, trained in the notebook",
}
PAPER = {  # the paper's figures (Qiu et al., 2025), and the third-party report on its released 1B models
    "f_attn": {"none": 0.467, "headwise": 0.073, "elementwise": 0.048},  # Table 4, 15B MoE
    "m_act": {"none": 1053, "headwise": 98, "elementwise": 94},  # Table 4, 15B MoE
    "lr loss": {"none": 9.195, "gated": 7.325},  # Table 2, 1.7B dense, lr 8e-3 (the baseline degrades)
    "closed": {"learned": 12.39, "gates=0": 304_000},  # released 1B headwise model, WikiText-2 (reported)
}


@dataclass(frozen=True)
class Entry:
    claim: str  # a key of CLAIMS
    setting: str  # a key of SETTINGS
    value: str  # the numbers, baseline -> gated twins, as printed
    verdict: str  # one of VERDICTS; "" for the paper's own column


def verdict(ratios: list[float], target: float, absent: bool = False) -> str:
    """The verdict of baseline / gated ratios (above 1: the gate lowered the number) against `target`, half the
    paper's own ratio; `absent`: the baseline shows no symptom."""
    if absent:
        return "not at this scale"
    if min(ratios) <= 1:
        return "contradicted"
    return "reproduced" if min(ratios) >= target else "partly"


def worst(verdicts) -> str:
    return max(verdicts, key=VERDICTS.index)


def _ratio(b: float, g: float) -> float:
    return b / g if g > 0 else math.inf


def _x(r: float) -> str:
    return "all gone" if r == math.inf else f"{r:.1f}x"


def _sinks64(r) -> float:
    return r.sink_rate_64 if r.sink_rate_64 is not None else r.sink_rate  # windows of 64 tokens: the same


def measured_entries(setting: str, rows: dict, n_heads: int) -> list[Entry]:
    """The sink, F-Attn and M-Act entries of one trio or pair, rows {variant: Measures} with "none" the baseline."""
    b, gated = rows["none"], [g for g in GATED if g in rows]
    heads = {v: round(_sinks64(r) * n_heads) for v, r in rows.items()}
    f = {g: _ratio(b.f_attn, rows[g].f_attn) for g in gated}
    fx = {g: _ratio(b.f_attn_excess, rows[g].f_attn_excess) for g in gated}
    m = {g: _ratio(b.m_act, rows[g].m_act) for g in gated}
    half = {k: min(PAPER[k]["none"] / PAPER[k][g] for g in gated) / 2 for k in ("f_attn", "m_act")}
    names = " / ".join(gated)
    return [
        Entry("sink heads", setting, f"{heads['none']} -> {' / '.join(str(heads[g]) for g in gated)} of {n_heads}",
              verdict([_ratio(heads["none"], heads[g]) for g in gated], math.inf, absent=heads["none"] == 0)),
        Entry("f_attn", setting, f"{' / '.join(_x(f[g]) for g in gated)} ({' / '.join(_x(fx[g]) for g in gated)}) "
              f"{names}", verdict(list(f.values()), half["f_attn"], absent=b.f_attn_excess < 0.03)),
        Entry("m_act", setting, f"{b.m_act:.0f} -> {' / '.join(f'{rows[g].m_act:.0f}' for g in gated)}: "
              f"{' / '.join(_x(m[g]) for g in gated)}", verdict(list(m.values()), half["m_act"])),
    ]


def seed_entries(seeds: dict[int, dict], n_heads: int = 16) -> list[Entry]:
    """The same three entries over a recipe's seeds: each verdict the worst seed's, each number its range."""
    whole = [rows for _, rows in sorted(seeds.items()) if set(rows) == set(measure.NAMES)]
    per_seed = [measured_entries("seeds", rows, n_heads) for rows in whole]

    def span(values, fmt):
        lo, hi = fmt(min(values)), fmt(max(values))
        return lo if lo == hi else f"{lo}-{hi}"

    heads = {v: [round(_sinks64(rows[v]) * n_heads) for rows in whole] for v in measure.NAMES}
    f = {g: [_ratio(rows["none"].f_attn, rows[g].f_attn) for rows in whole] for g in GATED}
    m = {g: [_ratio(rows["none"].m_act, rows[g].m_act) for rows in whole] for g in GATED}
    values = [f"{span(heads['none'], str)} -> {' / '.join(span(heads[g], str) for g in GATED)} of {n_heads}",
              " / ".join(span(f[g], _x) for g in GATED), " / ".join(span(m[g], _x) for g in GATED)]
    return [Entry(claim, "seeds", f"{len(whole)} seeds: {value}", worst(e[i].verdict for e in per_seed))
            for i, (claim, value) in enumerate(zip(("sink heads", "f_attn", "m_act"), values, strict=True))]


def paper_entries() -> list[Entry]:
    p = PAPER
    return [
        Entry("sink heads", "paper", "no count (its title: attention-sink-free)", ""),
        Entry("f_attn", "paper", f"{p['f_attn']['none']} -> {p['f_attn']['headwise']} / {p['f_attn']['elementwise']}: "
              + " / ".join(_x(p["f_attn"]["none"] / p["f_attn"][g]) for g in GATED), ""),
        Entry("m_act", "paper", f"{p['m_act']['none']} -> {p['m_act']['headwise']} / {p['m_act']['elementwise']}: "
              + " / ".join(_x(p["m_act"]["none"] / p["m_act"][g]) for g in GATED), ""),
        Entry("closed", "paper", f"{p['closed']['gates=0'] / p['closed']['learned']:,.0f}x (1B headwise, reported)",
              ""),
        Entry("bos", "paper", "not measured", ""),
        Entry("lr spikes", "paper", "baseline degrades at lr 8e-3, diverges with 1T tokens", ""),
        Entry("lr loss", "paper", f"{p['lr loss']['none']} -> {p['lr loss']['gated']}", ""),
        Entry("lr m_act", "paper", "its explanation; not measured at the high lr", ""),
    ]


def task_rows(task: str, device="cpu", n: int = 256) -> tuple[dict, int]:
    """Measures of the shipped copy or induction trio on lesson 04's held-out rows (seed 3), and its head count."""
    rows = {"copy": data.copy_task, "induction": data.induction_task}[task](n, seed=3)[:, :-1]  # (n, 64)
    models = {v: shipped(f"{task}-{name}", device=device) for v, name in measure.NAMES.items()}
    return ({v: published_measures(m, rows.to(device)) for v, m in models.items()},
            models["none"].cfg.n_layers * models["none"].cfg.n_heads)


def code_chunks() -> torch.Tensor:
    """Lesson 06's prose chunks: the first 16 windows of 256 held-out WikiText-2 tokens, (16, 257), <bos> first."""
    val_ids = data.encode(data.load_documents("wikitext-2")[1], data.get_tokenizer().tok)
    return ab.chunks(val_ids, n_chunks=16, chunk_len=256)


def bos_cost(model, chunk_ids: torch.Tensor):
    """What forbidding attention to <bos> in every layer costs: the paired loss change in nats (stats.CI: estimate,
    low, high, a bootstrap over chunks), as lesson 06 measures it."""
    hooks = [h for layer in range(model.cfg.n_layers) for h in overrides.forbid_bos(model, layer)]
    res = ab.sweep(model, chunk_ids, {"learned": [], "forbidden": hooks}, ci=False, progress=False)
    return bootstrap_ci(res["forbidden"].chunk_losses - res["learned"].chunk_losses)


def closed_cost(model, chunk_ids: torch.Tensor) -> float:
    """Perplexity with every gate set to 0, as a multiple of the learned perplexity."""
    return (ab.perplexity(model, chunk_ids, overrides.set_gates(model, 0.0), ci=False).ppl
            / ab.perplexity(model, chunk_ids, ci=False).ppl)


def override_entries(setting: str, models: dict, chunk_ids: torch.Tensor) -> list[Entry]:
    """The closed-gates and forbidden-<bos> entries of one trio, models {variant: model}."""
    cost = {v: bos_cost(m, chunk_ids).estimate.item() for v, m in models.items()}
    closed = {g: closed_cost(models[g], chunk_ids) for g in GATED}
    target = PAPER["closed"]["gates=0"] / PAPER["closed"]["learned"] / 2
    return [Entry("closed", setting, " / ".join(f"{closed[g]:.2g}x" for g in GATED),
                  verdict(list(closed.values()), target)),
            Entry("bos", setting, f"{cost['none']:+.3f} -> {' / '.join(f'{cost[g]:+.3f}' for g in GATED)}",
                  verdict([_ratio(cost["none"], cost[g]) for g in GATED], 2, absent=cost["none"] <= 0))]


@dataclass(frozen=True)
class LrRuns:
    """Lesson 08's high-learning-rate pair: spikes, final validation loss and M-Act of the baseline and the gated
    model, and whether each finished (did not diverge)."""
    spikes: dict  # {"none": int, "gated": int}
    final: dict  # {"none": float, "gated": float}: the last validation loss, nats
    m_act: dict  # {"none": float, "gated": float}
    finished: dict  # {"none": bool, "gated": bool}


def lr_entries(runs: LrRuns, margin: float = 0.1) -> list[Entry]:
    """The learning-rate entries. Values say only what lesson 08 asserts on every CPU (a spike count, a loss lower
    by more than `margin`); the numbers behind them vary from CPU to CPU."""
    s, f, m, done = runs.spikes, runs.final, runs.m_act, runs.finished
    trouble = {k: s[k] + (not done[k]) for k in s}  # spikes, and a divergence counted as one more
    lower = f["none"] - f["gated"]
    loss = "reproduced" if lower > margin else ("partly" if lower > 0 else "contradicted")
    diverged = [who for k, who in (("none", "the baseline"), ("gated", "the gated model")) if not done[k]]
    return [Entry("lr spikes", "lesson 08", f"{s['none']} spikes -> {s['gated']}; "
                  + ("neither diverged" if not diverged else " and ".join(diverged) + " diverged"),
                  verdict([_ratio(trouble["none"], trouble["gated"])], math.inf, absent=trouble["none"] == 0)),
            Entry("lr loss", "lesson 08", f"gated {'more' if lower > margin else 'less'} than {margin} nats lower"
                  if lower > 0 else "gated not lower", loss),
            Entry("lr m_act", "lesson 08", "gated M-Act " + ("below" if m["gated"] < m["none"] else "above")
                  + " the baseline's", verdict([_ratio(m["none"], m["gated"])], 1.5))]


def scorecard(lr: LrRuns | None = None, device="cpu") -> list[Entry]:
    """Every entry: the paper's column, then the settings, measured (the shipped models, on a CPU: seconds)."""
    entries = paper_entries()
    n = n_heads_of("code-baseline")
    entries += measured_entries("code", measure.shipped_rows("code"), n)
    entries += seed_entries(measure.seed_rows("code"), n)
    entries += measured_entries("code-moe", measure.shipped_rows("code-moe"), n_heads_of("code-moe-baseline"))
    for task in ("copy", "induction"):
        entries += measured_entries(task, *task_rows(task, device))
    code = {v: shipped(f"code-{n}", device=device) for v, n in measure.NAMES.items()}
    entries += override_entries("code", code, code_chunks())
    copy = {v: shipped(f"copy-{n}", device=device) for v, n in measure.NAMES.items()}
    entries += override_entries("copy", copy, data.copy_task(64, seed=3))
    if lr is not None:
        entries += lr_entries(lr)
    return entries


def lines(entries: list[Entry]) -> list[str]:
    """The scorecard as text: one block per claim, one line per setting (value and verdict)."""
    out = []
    for claim, text in CLAIMS.items():
        rows = [e for e in entries if e.claim == claim]
        if rows:
            out.append(text)
            out += [f"  {e.setting:10s} {e.verdict or '(the claim)':18s} {e.value}" for e in rows]
    return out


def tally(entries: list[Entry]) -> dict[str, int]:
    """How many measured entries got each verdict."""
    return {v: sum(e.verdict == v for e in entries) for v in VERDICTS}


def n_heads_of(name: str) -> int:
    cfg = json.loads((measure.SHIPPED_DIR / name / "config.json").read_text())  # Hugging Face's keys
    return cfg["num_hidden_layers"] * cfg["num_attention_heads"]
