"""The READMEs' generated text: the shipped models' tables and sentence and the seeds' sentence, rendered from the files
that store their numbers (data/checkpoints/*/measurements.json, data/seeds/<preset>.json), and written between the
markers around each in README.md and data/checkpoints/README.md:

    <!-- minigate:table code -->            the shipped code models' table (each preset with measurements.json)
    <!-- minigate:effect code -->           the sentence on what the gates do to them (a preset with all three)
    <!-- minigate:seeds code -->            the sentence on the recipe's seeds and their range
    <!-- minigate:headline code -->         README.md's three numbers of the shipped trio (beside docs/effect.png)
    <!-- minigate:seedline code -->         README.md's one sentence on the seeds: the direction, in how many seeds

each closed by the same marker with a slash (<!-- /minigate:table code -->). scripts/ship.py and scripts/seeds.py
rewrite the text between the markers after measuring; tests/test_release.py checks that it is what the stored numbers
render; the README's prose check (minigate/course/prose.py) reads it as generated, like a notebook's outputs.

    python -m scripts.readme          # rewrite every marked span, docs/effect.png and docs/scorecard.md
"""

from __future__ import annotations

import sys
from pathlib import Path

from minigate import measure
from minigate.course.prose import MARKED, marked, marker
from minigate.presets import NAMES
from minigate.course.release import SHIPPED_DIR
from minigate.course import release

ROOT = Path(__file__).resolve().parent.parent  # the course checkout
DOCS = (ROOT / "README.md", ROOT / "data" / "checkpoints" / "README.md")
FIGURE = ROOT / "docs" / "effect.png"  # the README's figure of the shipped code trio
RULES = ROOT / "docs" / "scorecard.md"  # the scorecard's rules, as the code applies them (scorecard.rules_markdown)


def table(rows: dict, preset: str) -> str:
    """The markdown table of a preset's shipped models (rows keyed by variant, as measurements.json holds them)."""
    lines = ["| model | F-Attn | above uniform | largest head (layer, head) | sink heads, T=512 | sink heads, "
             "T=64 (Gu) | M-Act | val loss (code) |", "|---|---|---|---|---|---|---|---|"]
    for variant, r in rows.items():
        lines.append(f"| {preset}-{NAMES[variant]} | {r.f_attn:.3f} | {r.f_attn_excess:.3f} | "
                     f"{r.max_head:.2f} ({r.max_head_at[0]}, {r.max_head_at[1]}) | {r.sink_rate:.1%} | "
                     f"{r.sink_rate_64:.1%} | {r.m_act:.0f} | {r.val_loss_code:.3f} |")
    return "\n".join(lines)


def effect_summary(rows: dict) -> str:
    """The sentence the READMEs state about a preset's shipped trio, from their measurements (rows by variant)."""
    b, h, e = rows["none"], rows["headwise"], rows["elementwise"]
    x = measure.ratios(rows)
    return (f"By Gu et al.'s protocol (windows of 64 tokens; a sink head puts more than 0.3 of its attention on the "
            f"first token) {b.sink_rate_64:.1%} of the baseline's heads are sink heads, against "
            f"{h.sink_rate_64:.1%} (headwise) and {e.sink_rate_64:.1%} (elementwise); over 512 tokens its "
            f"largest head puts {b.max_head:.2f} on the first token. The gated models have "
            f"{x['headwise']['f_attn_excess']:.1f}x (headwise) and {x['elementwise']['f_attn_excess']:.1f}x "
            f"(elementwise) less first-token attention above uniform (F-Attn at T=512) and "
            f"{x['headwise']['m_act']:.1f}x and {x['elementwise']['m_act']:.1f}x smaller M-Act (each layer's largest "
            f"residual value, averaged over layers; at this size these peaks are tens of times their layer's median, "
            f"not the hundreds to thousands of Sun et al.'s massive activations: lesson 04).")


def seed_sentence(s: dict, preset: str = "code") -> str:
    """The sentence the READMEs state about a recipe's seeds (data/seeds/<preset>.json), from release.spread."""
    b, h, e, n = s["none"], s["headwise"], s["elementwise"], s["none"]["sink_heads_64"].seeds
    ratio, count, value = release.ratio_text, release.count_text, release.value_text
    return (f"Over {n} seeds of the `{preset}` recipe (seed 0 is the shipped trio; `data/seeds/{preset}.json`), "
            f"seed 0's ratios and their range: first-token attention above uniform {ratio(h['f_attn_excess'])} "
            f"smaller with the headwise gate and {ratio(e['f_attn_excess'])} with the elementwise gate; M-Act "
            f"{ratio(h['m_act'])} and {ratio(e['m_act'])}; sink heads at T=64 {count(b['sink_heads_64'])} of "
            f"{b['sink_heads_64'].of} in the baseline against {count(h['sink_heads_64'])} and "
            f"{count(e['sink_heads_64'])}, fewer in {h['sink_heads_64'].helped} and {e['sink_heads_64'].helped} of "
            f"{n}. The strongest head at T=64 is {value(b['max_head_64'])} in the baseline, {value(h['max_head_64'])} "
            f"headwise (below the baseline's in {h['max_head_64'].helped} of {n}) and {value(e['max_head_64'])} "
            f"elementwise (in {e['max_head_64'].helped} of {n}).")


def headline(rows: dict) -> str:
    """README.md's three numbers of a preset's shipped trio: sink heads at T=64, and the two ratios."""
    b, h, e = rows["none"], rows["headwise"], rows["elementwise"]
    x = measure.ratios(rows)
    return (f"{b.sink_heads_64} of the baseline's {b.heads} heads are sink heads (Gu et al.'s protocol: windows of 64 "
            f"tokens, more than 0.3 of a head's attention on the first token), against {h.sink_heads_64} headwise and "
            f"{e.sink_heads_64} elementwise. The gates leave {x['headwise']['f_attn_excess']:.1f}x and "
            f"{x['elementwise']['f_attn_excess']:.1f}x less first-token attention above uniform (F-Attn at T=512), "
            f"and {x['headwise']['m_act']:.1f}x and {x['elementwise']['m_act']:.1f}x smaller M-Act (each layer's "
            f"largest residual value, averaged over layers).")


def seedline(s: dict, preset: str = "code") -> str:
    """README.md's sentence on a recipe's seeds: in how many each gate moved each measure the paper's way."""
    n, h, e = s["none"]["sink_heads_64"].seeds, s["headwise"], s["elementwise"]
    k = lambda key: f"{h[key].helped} and {e[key].helped} of {n}"
    return (f"Over {n} seeds of the recipe (`data/seeds/{preset}.json`), the headwise and elementwise gates lowered "
            f"first-token attention above uniform in {k('f_attn_excess')}, M-Act in {k('m_act')} and the sink heads "
            f"in {k('sink_heads_64')}; lesson 04 gives the ranges.")


def figure(rows: dict, path: Path = FIGURE) -> Path:
    """docs/effect.png: the shipped trio's sink heads at T=64, first-token attention above uniform and M-Act, as
    bars; its PNG metadata holds the numbers drawn (tests/test_release.py reads them back)."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(f"sink heads of {rows['none'].heads}, T=64", "sink_heads_64"),
              ("F-Attn above uniform, T=512", "f_attn_excess"), ("M-Act", "m_act")]
    fig, axes = plt.subplots(1, 3, figsize=(9, 2.6))
    drawn = {}
    for ax, (title, key) in zip(axes, panels, strict=True):
        values = [getattr(rows[v], key) for v in NAMES]
        drawn[key] = values
        ax.bar(list(NAMES.values()), values, color=["tab:gray", "tab:blue", "tab:orange"])
        ax.set_title(title, fontsize=10)
        ax.tick_params(labelsize=8)
    fig.suptitle("The shipped code models on held-out prose: the baseline and two G1 gates", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Description": json.dumps(drawn, sort_keys=True)})
    plt.close(fig)
    return path


def rendered(shipped: Path = SHIPPED_DIR) -> dict[tuple[str, str], str]:
    """{(kind, preset): text} of every span the stored numbers render: each shipped preset's table, the effect
    sentence of a preset with all three models, and each recipe's seeds sentence (data/seeds/<preset>.json)."""
    out = {}
    presets = sorted({p.parent.name.rsplit("-", 1)[0] for p in Path(shipped).glob(f"*/{measure.MEASUREMENTS}")})
    for preset in presets:
        rows = release.shipped_rows(preset, shipped)
        out["table", preset] = f"\n{table(rows, preset)}\n\n"  # the markers on lines of their own, around the table
        if set(rows) == set(NAMES):
            out["effect", preset] = effect_summary(rows)
            out["headline", preset] = headline(rows)
    for path in sorted((Path(shipped).parent / "seeds").glob("*.json")):
        spread = release.spread(release.seed_rows(path.stem, path))
        out["seeds", path.stem] = seed_sentence(spread, path.stem)
        out["seedline", path.stem] = seedline(spread, path.stem)
    return out


def rewrite(doc: Path, spans: dict[tuple[str, str], str]) -> bool:
    """Put each span's text between its markers in `doc` (only the spans whose markers the doc has); whether the doc
    changed. A ValueError names a doc with a marker that opens and does not close."""
    text = doc.read_text()
    for key, new in spans.items():
        text = marked(text, *key, new)
    if text == doc.read_text():
        return False
    doc.write_text(text)
    return True


KINDS = ("table", "effect", "seeds", "headline", "seedline")


def update(presets=None, docs=DOCS, shipped: Path = SHIPPED_DIR, kinds=KINDS) -> list[Path]:
    """Rewrite the marked spans of `docs` for `presets` (None: every preset) and `kinds` from the stored numbers;
    returns the docs that changed. A ValueError names a doc that marks none of them (the markers were deleted: put
    them back, <!-- minigate:KIND PRESET --> ... <!-- /minigate:KIND PRESET -->)."""
    spans = {k: v for k, v in rendered(shipped).items() if k[0] in kinds and (presets is None or k[1] in presets)}
    changed = []
    for doc in docs:
        found = {k for k in spans if marker(*k) in doc.read_text()}
        if not found:
            raise ValueError(f"{doc} marks none of {sorted(spans)} for its generated text: put the markers back "
                             f"({MARKED.pattern!r})")
        if rewrite(doc, {k: spans[k] for k in found}):
            changed.append(doc)
    return changed


if __name__ == "__main__":
    for path in update():
        print(f"readme: rewrote the generated text in {path}")
    print(f"readme: drew {figure(release.shipped_rows('code')).relative_to(ROOT)}")
    from minigate.course.scorecard import rules_markdown

    RULES.write_text(rules_markdown() + "\n", encoding="utf-8")
    print(f"readme: wrote {RULES.relative_to(ROOT)}")
    sys.exit(0)
