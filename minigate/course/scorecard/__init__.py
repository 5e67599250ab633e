"""The course's scorecard (lesson 08): each claim about the gate against each setting the course measured, with a
verdict, the rule that gave it, and whether it is fragile.

    from minigate.course import scorecard as sc
    card = sc.scorecard()              # every entry: the paper's column, then each setting, measured (seconds on a CPU)
    print("\\n".join(sc.table(card)))    # the card at a glance: a row per claim, a mark per setting
    print("\\n".join(sc.explain(card, "m_act")))  # one claim's rule and numbers; sc.lines(card): every claim

Every claim has one `Rule`: the text printed beside its verdicts and the function that gives them, one object, so the
rule a reader sees is the rule the code applies (rules.py). A rule judges `Evidence`: for each gated twin, an interval
of the gate's effect (baseline / gated, above 1 when the gate lowered the number; or baseline minus gated). The
interval is the range over seeds where the setting has several (the code recipes: data/seeds/*.json; the study's
largest effect, `study`: data/study), else a 95% bootstrap over its windows, rows or chunks (one model per variant:
the MoE pair, the copy and induction trios, the overrides, lesson 08's runs; M-Act, a maximum, over random halves of
the windows instead). The verdicts:
- reproduced: every gated twin changes the number at least half as much as the paper's models do (the rule names the
  bar), clear of the noise (the interval's low end reaches it);
- partly: every gated twin changes it the right way, clear of the noise (the low end above no change), by less;
- within noise: no change is inside some twin's interval;
- contradicted: some gated twin changes it the wrong way or not at all, clear of the noise (the high end at or below no
  change);
- not at this scale: the baseline does not show the symptom, so there is nothing for the gate to remove.
A verdict is fragile when it rests on one model per variant (one seed), on one head, on one seed of several (leaving
any one out changes it) or on a margin under 10% (it changes when the measured numbers move by 10%).

Claims come from three sources, kept apart: the paper (Qiu et al., 2025), a third-party analysis of its released 1B
models ("reported"), and the course, which tests what the paper implies but did not measure. A claim's own verdict
(`claim_verdicts`, what `tally` counts, one per claim) is that of its settings whose verdict is not fragile, or of
all of them, marked fragile, where every one is.

Every number is measured here on the shipped models, or read from the one file that stores it (measurements.json,
data/seeds/<preset>.json); lesson 08 passes in its own learning-rate runs. The paper's and the report's figures are
course/published.py's (TABLE_4, TABLE_2_LR, REPORTED_CLOSED).

    rules.py    the claims, their rules and the verdicts: Interval, Evidence, Rule, Claim, CLAIMS, Entry
    windows.py  the sink, F-Attn and M-Act evidence: a recipe's stored seeds, or models measured window by window
    losses.py   the evidence read from the loss: the overrides (closed gates, forbidden <bos>), lesson 08's lr runs
"""

from __future__ import annotations

import textwrap

from minigate import data, measure
from minigate.presets import NAMES
from minigate.course import release
from minigate.course.release import shipped

from .. import scaling
from ..published import REPORTED_CLOSED, TABLE_2_LR, TABLE_2_LR_GAP, TABLE_4, TABLE_4_RATIOS
from .plot import VERDICT_COLORS, draw
from .losses import LrRuns, chunk_costs, code_chunks, lr_entries, override_entries
from .rules import (BOS_BAR, CLAIM_VERDICTS, CLAIMS, EXCESS_MIN, GATED, LEVEL, MARGIN, MIXED, N_BOOT, SOURCES,
                    VERDICTS, Claim, Entry, Evidence, Interval, Rule, combine, count_rule, gap_rule, judged,
                    ratio_rule, worst, x_text)
from .windows import Windows, measure_windows, seed_entries, shipped_windows, task_windows, window_entries

__all__ = ["BOS_BAR", "CLAIMS", "CLAIM_VERDICTS", "EXCESS_MIN", "GATED", "LEGEND", "LEVEL", "MARGIN", "MIXED",
           "MARKS", "N_BOOT", "SEED_PRESETS", "SETTINGS", "SOURCES", "VERDICTS", "Claim", "Entry", "Evidence",
           "Interval", "LrRuns", "Rule", "Windows", "chunk_costs", "claim_verdicts", "code_chunks", "combine",
           "count_rule", "explain", "gap_rule", "judged", "lines", "lr_entries", "measure_windows", "override_entries",
           "paper_entries", "ratio_rule", "rules_markdown", "scorecard", "seed_entries", "shipped_windows", "table",
           "tally", "task_windows", "window_entries", "worst", "figure", "VERDICT_COLORS", "draw"]

SETTINGS = {  # key -> where and how it was measured
    "paper": "the paper: 15B MoE (Table 4), 1.7B dense (Table 2); the 1B release as reported",
    "code": "code recipe, 3 seeds (seed 0 shipped; data/seeds/code.json): 75 held-out WikiText-2 windows of 512 "
            "tokens; the overrides on seed 0, 16 chunks of 256 tokens (lesson 06)",
    "code-gpu": "code-gpu recipe, 3 seeds trained and measured on an H200 (data/seeds/code-gpu.json; seed 0 in fp16), "
                "same windows",
    "code-moe": "code-moe pair (shipped), same windows",
    "copy": "copy trio (shipped): 256 held-out rows of 64 tokens (lesson 04); 64 rows for the overrides (lesson 06)",
    "induction": "induction trio (shipped): 256 held-out rows of 64 tokens (lesson 04)",
    "study": "the study's setting where the gate's effect was largest (course/scaling.py, `largest`): the code "
             "recipe at another size or training length, its seeds as data/study records them, same windows",
    "lesson 08": "lesson 08's pair at lr 0.1 (baseline and elementwise), trained in the notebook",
}
SEED_PRESETS = {"code": "code", "code-gpu": "code-gpu"}  # setting -> data/seeds/<preset>.json


def paper_entries() -> list[Entry]:
    """The paper's column: its own numbers (Table 4, Table 2) and the report's, no verdicts."""
    f, m, lr = TABLE_4["f_attn"], TABLE_4["m_act"], TABLE_2_LR
    x = {key: " / ".join(x_text(TABLE_4_RATIOS[key][g]) for g in GATED) for key in TABLE_4}
    closed = REPORTED_CLOSED["gates=0"] / REPORTED_CLOSED["learned"]
    return [
        Entry("sink heads", "paper", "no count (its title: attention-sink-free)", "", short="sink-free"),
        Entry("f_attn", "paper", f"{f['none']} -> {f['headwise']} / {f['elementwise']}: raw {x['f_attn']} "
              "(Table 4, 15B MoE)", "", short=f"raw {x['f_attn']}"),
        Entry("m_act", "paper", f"{m['none']} -> {m['headwise']} / {m['elementwise']}: {x['m_act']} (Table 4, 15B MoE)",
              "", short=x["m_act"]),
        Entry("lr spikes", "paper", "baseline degrades at lr 8e-3, diverges with 1T tokens (1.7B dense)", "",
              short="baseline degrades"),
        Entry("lr loss", "paper", f"perplexity {lr['none']} -> {lr['elementwise']}: {TABLE_2_LR_GAP:.2f} nats "
              "(Table 2, 1.7B dense)", "", short=f"{TABLE_2_LR_GAP:+.2f} nats"),
        Entry("closed", "paper", f"{closed:,.0f}x (1B headwise, reported)", "", short=f"{closed:,.0f}x"),
        Entry("bos", "paper", "not measured", "", short="not measured"),
        Entry("lr m_act", "paper", "its explanation; M-Act not measured at the high lr", "", short="its explanation"),
    ]


def scorecard(lr: LrRuns | None = None, device="cpu") -> list[Entry]:
    """Every entry: the paper's column, then the settings, measured (the shipped models, on a CPU: seconds)."""
    entries = paper_entries()
    for setting, preset in SEED_PRESETS.items():
        entries += seed_entries(setting, release.seed_rows(preset))
    study = scaling.largest(scaling.points())
    if study is not None:
        entries += seed_entries("study", study.seeds, f"{study.name}: {study.about}")  # its rows.Row, as stored
    prose = measure.prose_windows(data.DEFAULT_TOKENIZER)
    entries += window_entries("code-moe", shipped_windows("code-moe", device, prose), f"{len(prose)} windows")
    for task in ("copy", "induction"):
        entries += window_entries(task, task_windows(task, device), "256 rows")
    code = {v: shipped(f"code-{n}", device=device) for v, n in NAMES.items()}
    entries += override_entries("code", code, code_chunks())
    copy = {v: shipped(f"copy-{n}", device=device) for v, n in NAMES.items()}
    entries += override_entries("copy", copy, data.copy_task(64, seed=3))
    if lr is not None:
        entries += lr_entries(lr)
    return entries


def claim_verdicts(entries: list[Entry]) -> dict[str, tuple[str, bool]]:
    """{claim: (verdict, fragile)}: each claim measured, once. Its verdict is that of its settings whose verdict is
    not fragile, or, where every one is, of all of them (then marked fragile): one verdict where they agree;
    "partly" where they are reproduced and partly; "depends on the setting" where some hold (reproduced or partly)
    and some are contradicted; within noise and not at this scale count only where nothing else does."""
    out = {}
    for claim in CLAIMS:
        measured = [e for e in entries if e.claim == claim and e.verdict]
        if not measured:
            continue
        robust = [e for e in measured if not e.fragile]
        use = robust or measured
        found = {e.verdict for e in use}
        clear = found - {"within noise", "not at this scale"}
        if not clear:
            v = "not at this scale" if "not at this scale" in found else "within noise"
        elif clear == {"contradicted"}:
            v = "contradicted"
        elif "contradicted" in clear:
            v = MIXED
        else:
            v = "reproduced" if clear == {"reproduced"} else "partly"
        out[claim] = (v, not robust)
    return out


def figure(entries: list[Entry], title: str = "The claims, as the course measured them"):
    """The card as one figure: its claims by SETTINGS, grouped by SOURCES, each cell coloured by its verdict, and a
    last column with each claim's own (claim_verdicts). `draw` (plot.py) draws any entries, claims and settings."""
    return draw(entries, CLAIMS, list(SETTINGS), verdicts=claim_verdicts(entries), sources=SOURCES, title=title)


def tally(entries: list[Entry]) -> dict[str, int]:
    """How many claims got each verdict (claim_verdicts): each claim counted once, whatever its settings."""
    verdicts = [v for v, _ in claim_verdicts(entries).values()]
    return {v: verdicts.count(v) for v in CLAIM_VERDICTS}


def _mark(e: Entry) -> str:
    return e.verdict + ("*" if e.fragile else "") + ("^" if e.straddles else "")


LEGEND = ("[low, high]: the range over seeds, or a 95% bootstrap over one model's windows, rows or chunks (M-Act: "
          "random halves). A setting's verdict is its worse gated twin's. A claim's verdict (=>) reads its settings "
          "that are not fragile (all of them, marked, where every one is): theirs where they agree, partly where some "
          "are reproduced and some partly, depends on the setting where some hold and some are contradicted, within "
          "noise or not at this scale only where nothing else shows.")


def explain(entries: list[Entry], claim: str, width: int = 116) -> list[str]:
    """One claim in full: what it says and its measure, its rule, one line per setting (verdict, numbers with their
    interval; * fragile, with why), then the claim's own verdict (=>). `claim` is a key of CLAIMS."""
    if claim not in CLAIMS:
        raise KeyError(f"no claim {claim!r}: the claims are {', '.join(CLAIMS)}")
    out = [CLAIMS[claim].text]
    out += textwrap.wrap(CLAIMS[claim].rule.text, width, initial_indent="  rule: ", subsequent_indent=" " * 8)
    for e in (e for e in entries if e.claim == claim):
        why = f" [* {', '.join(e.fragile)}]" if e.fragile else ""
        why += f" [^ {' / '.join(e.straddles)} reaches the bar]" if e.straddles else ""
        out.append(f"  {e.setting:10s} {_mark(e) or '(the claim)':14s} {e.value}{why}")
    verdicts = claim_verdicts(entries)
    if claim in verdicts:
        v, fragile = verdicts[claim]
        out.append(f"  => {v}" + (" (every setting fragile)" if fragile else ""))
    return out


def lines(entries: list[Entry], width: int = 116) -> list[str]:
    """The whole scorecard as text: the legend, then the claims by source, each as explain() prints it."""
    out = textwrap.wrap(LEGEND, width)
    for source, heading in SOURCES.items():
        claims = [c for c, claim in CLAIMS.items() if claim.source == source and any(e.claim == c for e in entries)]
        if claims:
            out.append(f"━━ {heading}")
        for c in claims:
            out += explain(entries, c, width)
    return out


MARKS = {"reproduced": "✓", "partly": "~", "within noise": "?", "not at this scale": "–", "contradicted": "✗"}


def table(entries: list[Entry]) -> list[str]:
    """The card at a glance: a row per claim (by source), its own verdict (=>), then a mark per setting (MARKS; *
    fragile; blank: not measured there), and the key."""
    settings = [s for s in SETTINGS if any(e.setting == s and e.verdict for e in entries)]
    verdicts, cell = claim_verdicts(entries), {(e.claim, e.setting): e for e in entries if e.verdict}
    widths = [max(len(s), 3) for s in settings]
    out = [f"{'claim':30s} {'=> verdict':20s} " + " ".join(f"{s:>{w}s}" for s, w in zip(settings, widths, strict=True))]
    for source, heading in SOURCES.items():
        out.append(heading.split(" (")[0])
        for c, claim in CLAIMS.items():
            if claim.source != source:
                continue
            v = verdicts.get(c)
            head = "(not yet measured)" if v is None else v[0] + ("*" if v[1] else "")
            marks = [MARKS[cell[c, s].verdict] + _mark(cell[c, s])[len(cell[c, s].verdict):] if (c, s) in cell else ""
                     for s in settings]
            out.append(f"  {claim.short:28s} {head:20s} " + " ".join(f"{m:>{w}s}" for m, w in
                                                                      zip(marks, widths, strict=True)))
    out.append("  ".join(f"{m} {v}" for v, m in MARKS.items()) + "  * fragile  ^ interval reaches the bar; "
               "sc.explain(card, claim): its rule and numbers")
    return out


def rules_markdown() -> str:
    """docs/scorecard.md: the legend, the verdicts and each claim's rule, as the card prints them (scripts/readme.py
    writes it; tests/test_scorecard.py holds it to this)."""
    out = ["# The scorecard's rules", "",
           "Lesson 08's scorecard (`minigate/course/scorecard/`) judges each claim with the rule below; "
           "`sc.explain(card, claim)` prints a claim's rule with its numbers and intervals in every setting, "
           "`sc.table(card)` the card at a glance. Generated from the code by `python -m scripts.readme`.", "",
           "## How to read it", "", LEGEND, "",
           "Marks: " + ", ".join(f"`{m}` {v}" for v, m in MARKS.items()) + ", `*` fragile, `^` partly, its interval "
           "reaching the reproduced bar.", ""]
    for source, heading in SOURCES.items():
        out += [f"## {heading[0].upper()}{heading[1:]}", ""]
        for key, claim in CLAIMS.items():
            if claim.source == source:
                out += [f"**{claim.text}** (`{key}`)", "", f"Rule: {claim.rule.text}.", ""]
    return "\n".join(out)
