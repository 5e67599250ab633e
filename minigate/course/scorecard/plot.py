"""The scorecard as one figure: claims by settings, each cell coloured by its verdict (`figure(card)` in
__init__.py draws the course's card with its own claims, settings and sources)."""

from __future__ import annotations

import matplotlib.pyplot as plt

from minigate.plots._style import _finish, _wrap

from .rules import CLAIM_VERDICTS, MIXED


# one colour per verdict, in rules.CLAIM_VERDICTS' order (the legend's); "" is the paper's own column
VERDICT_COLORS = {**dict(zip(CLAIM_VERDICTS, ("#4daf4a", "#ffd92f", "#fdae61", "#c6dbef", "#bdbdbd", "#e41a1c"),
                             strict=True)), "": "#ffffff"}


def draw(entries: list, claims: dict, settings: list[str], verdicts: dict | None = None,
              sources: dict | None = None, title: str = "The claims, as the course measured them"):
    """The scorecard (minigate.course.scorecard): one row per claim, grouped by where the claim comes from (a heading
    row per source, `sources` {key: heading}; each claim's `.source`), one column per setting, each cell coloured by
    its verdict and holding its numbers in short (`.short`, else `.value`), hatched where the verdict is fragile; the
    paper's own column is white. `verdicts` {claim: (verdict, fragile)} adds a last column, each claim's own."""
    keys = [c for c in claims if any(e.claim == c for e in entries)]
    groups = {}
    for c in keys:
        groups.setdefault(getattr(claims[c], "source", ""), []).append(c)
    layout = []  # ("head", text) or ("claim", key), top to bottom
    for source, members in groups.items():
        if sources and source in sources:
            layout.append(("head", sources[source]))
        layout += [("claim", c) for c in members]
    columns = list(settings) + (["the claim"] if verdicts else [])
    height = [0.5 if kind == "head" else 1.0 for kind, _ in layout]
    top = [sum(height[:i]) for i in range(len(layout))]
    fig, ax = plt.subplots(figsize=(12, 0.5 * sum(height) + 1.3))
    for (kind, key), y, h in zip(layout, top, height, strict=True):
        if kind == "head":
            ax.text(0.02, y + h / 2, key, ha="left", va="center", fontsize=8, fontweight="bold")
            continue
        for j, setting in enumerate(columns):
            if setting == "the claim":
                verdict, fragile = verdicts.get(key, ("", False))
                text, color = verdict or "-", VERDICT_COLORS.get(verdict, "#f7f7f7")
            else:
                e = next((e for e in entries if e.claim == key and e.setting == setting), None)
                verdict, fragile = (e.verdict, bool(getattr(e, "fragile", ()))) if e else ("", False)
                text = "\n".join(_wrap(getattr(e, "short", "") or e.value, 15)[:2]) if e else "-"
                color = VERDICT_COLORS[verdict] if e else "#f7f7f7"
            ax.add_patch(plt.Rectangle((j, y), 1, h, facecolor=color, edgecolor="white", lw=2))
            if fragile:
                ax.add_patch(plt.Rectangle((j + 0.03, y + 0.05), 0.94, h - 0.1, fill=False, hatch="///",
                                           edgecolor="#666666", lw=0))
            ax.text(j + 0.5, y + h / 2, text, ha="center", va="center", fontsize=7.5,
                    bbox=dict(facecolor=color, edgecolor="none", pad=1) if fragile else None)
    ax.set(xlim=(0, len(columns)), ylim=(sum(height), 0))
    ax.set_title(title, fontsize=10, pad=24)
    ax.set_xticks([j + 0.5 for j in range(len(columns))], columns, fontsize=8)
    ax.xaxis.tick_top()
    claim_rows = [(y + h / 2, key) for (kind, key), y, h in zip(layout, top, height, strict=True) if kind == "claim"]
    label = lambda c: getattr(claims[c], "short", None) or claims[c]
    ax.set_yticks([y for y, _ in claim_rows], ["\n".join(_wrap(label(c), 26)) for _, c in claim_rows], fontsize=8)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    shown = [v for v in VERDICT_COLORS if v and (v != MIXED or verdicts)]
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=VERDICT_COLORS[v]) for v in shown]
    handles.append(plt.Rectangle((0, 0), 1, 1, fill=False, hatch="///", edgecolor="#666666", lw=0))
    ax.legend(handles, [*shown, "fragile (hatched)"], loc="upper center", bbox_to_anchor=(0.5, -0.01),
              ncol=len(handles), fontsize=8, frameon=False, handlelength=1.5, columnspacing=1.2)
    return _finish(fig)
