"""Prose = output: every measured number a lesson's text states is one its cells print.

    unprinted(nb)   # [(cell index, "4.5x"), ...]: decimals and ratios in the markdown that no output shows

A number in the text is a decimal (0.27, 5.74) or a ratio (4.5x, 2×). It counts as printed when the same digits
stand in an output of the same notebook as a number of their own (0.27 in "head 0.27", not in 10.275). Text inside
code spans, code blocks, math and links is not prose. The only other numbers allowed are the figures a lesson
quotes from the paper or another named publication: `published.PUBLISHED`, one list with each figure's source.
"""

from __future__ import annotations

import re
from pathlib import Path

from .published import PUBLISHED

# a decimal or a ratio, not part of a longer number, a version (2.13.0) or an arXiv id (2505.06708)
NUMBER = re.compile(r"(?<![\w.,])(\d+(?:\.\d+)?\s?[x×](?!\w)|\d+\.\d+)(?![.\d]*\d)")
_NOT_PROSE = [re.compile(p, re.S) for p in (r"```.*?```", r"`[^`\n]*`", r"\$\$.*?\$\$", r"\$[^$\n]*\$",
                                             r"\]\([^)]*\)", r"<[^>\n]+>", r"\b\d{4}\.\d{4,5}\b")]


def prose_numbers(markdown: str) -> list[str]:
    """The decimals and ratios a markdown cell states, as written ("4.5x", "0.27"), outside code, math and links."""
    for pattern in _NOT_PROSE:
        markdown = pattern.sub(" ", markdown)
    return [m.group(1).replace(" ", "").replace("×", "x") for m in NUMBER.finditer(markdown)]


def printed_text(nb) -> str:
    """Everything the notebook's code cells print or display as text."""
    parts = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            parts.append("".join(out.get("text", "")))
            parts += ["".join(v) for k, v in out.get("data", {}).items() if k.startswith("text/")]
    return "\n".join(parts)


def is_printed(number: str, printed: str) -> bool:
    """Do the digits of `number` ("4.5x" -> 4.5) stand in `printed` as a number of their own?"""
    return re.search(r"(?<![\d.])" + re.escape(number.rstrip("x")) + r"(?![\d])", printed) is not None


def unprinted(nb, lesson: str) -> list[tuple[int, str]]:
    """(markdown cell index, number) for every number the text states that no output prints and that is not a
    published figure of this lesson (PUBLISHED[lesson])."""
    printed, quoted = printed_text(nb), PUBLISHED.get(lesson, {})
    return [(i, n) for i, cell in enumerate(nb["cells"]) if cell["cell_type"] == "markdown"
            for n in prose_numbers("".join(cell["source"])) if n not in quoted and not is_printed(n, printed)]


# ── the README: its hand-written paragraphs against the generated sources ─────────────────────────────────────────

_FENCE = re.compile(r"```.*?```", re.S)
_VERSION_AFTER = r"(?:>=|==|<=|~=|\bv)\s*\d+\.\d+(?:\.\d+)*"  # a version pin, not a measurement


def _versions() -> re.Pattern:
    """A version, not a measurement: a number after a pin (>=, ==) or right after the name of Python or of a package
    this environment has ("torch 2.13", "transformers 5.15")."""
    from importlib.metadata import distributions

    names = {"python", "cuda"} | {(d.metadata["Name"] or "").lower() for d in distributions()}
    names = sorted((re.escape(n) for n in names if n), key=len, reverse=True)
    return re.compile(rf"{_VERSION_AFTER}|\b(?:{'|'.join(names)})\s+\d+\.\d+(?:\.\d+)*(?![\d.]*\s?[x×])", re.I)
_SIZE = re.compile(r"\b\d+ ?[x×] ?\d+\b")  # a size (8 x 512 tokens), not a ratio


def readme_paragraphs(text: str) -> list[str]:
    """The README's prose: its paragraphs (blank-line separated, list items included), without code blocks, table rows
    version numbers and sizes (8 x 512); a table is generated or a configuration, not a claim written by hand."""
    paragraphs, versions = [], _versions()
    for para in re.split(r"\n\s*\n", _FENCE.sub("\n\n", text)):
        prose = "\n".join(line for line in para.splitlines() if not line.lstrip().startswith("|"))
        if prose.strip():
            paragraphs.append(_SIZE.sub(" ", versions.sub(" ", prose)))
    return paragraphs


def generated_sources(root: Path) -> dict[str, str]:
    """{source: its text}: what the README may state numbers from. Every solutions notebook's outputs; each shipped
    preset's measurements.json as the README's table and sentence render it (measure.table, measure.effect_summary);
    each data/seeds/<preset>.json as measure.spread renders it (seed_sentence, spread_lines); the tables of
    docs/gpu.md; and the lessons' study times as the README adds them up."""
    import nbformat

    from minigate import measure
    from minigate.presets import model_config

    from .study import study_minutes

    sources = {}
    for path in sorted((root / "solutions").glob("0*.ipynb")):
        sources[f"solutions/{path.name} (outputs)"] = printed_text(nbformat.read(path, as_version=4))
    presets = sorted({p.parent.name.rsplit("-", 1)[0] for p in measure.SHIPPED_DIR.glob(f"*/{measure.MEASUREMENTS}")})
    for preset in presets:
        rows = measure.shipped_rows(preset)
        text = measure.table(rows, preset)
        if {"headwise", "elementwise"} <= set(rows):
            text += "\n" + measure.effect_summary(rows)
        sources[f"measurements.json ({preset})"] = text
    for path in sorted((root / "data" / "seeds").glob("*.json")):
        cfg = model_config(path.stem)
        s, n = measure.spread(measure.seed_rows(path.stem, path)), cfg.n_layers * cfg.n_heads
        sources[f"data/seeds/{path.name} (measure.spread)"] = "\n".join(
            [measure.seed_sentence(s, path.stem, n), *measure.spread_lines(s, n)])
    gpu = root / "docs" / "gpu.md"
    sources["docs/gpu.md (tables)"] = "\n".join(line for line in gpu.read_text().splitlines() if line.startswith("|"))
    minutes = {p.name[:2]: study_minutes(nbformat.read(p, as_version=4))
               for p in sorted((root / "lessons").glob("0*.ipynb"))}
    hours = lambda m: f"{round(m / 30) / 2:g} hours"  # as the README adds them up (tests/test_course.py)
    core = sum(minutes[n] for n in ("01", "02", "03", "04") if n in minutes)
    sources["the lessons' study times (course.study_minutes)"] = (
        f"{minutes}; lessons 01-04: {hours(core)}; all: {hours(sum(minutes.values()))}")
    return sources


def readme_unsourced(readme: str, sources: dict[str, str], quoted: dict[str, str]) -> list[tuple[str, str]]:
    """(the paragraph's first words, number) for every decimal or ratio the README's prose states that no generated
    source prints and that is not a figure quoted with its source (`published.README_QUOTED`)."""
    printed = "\n".join(sources.values())
    return [(" ".join(para.split()[:6]), n) for para in readme_paragraphs(readme) for n in prose_numbers(para)
            if n not in quoted and not (is_printed_ratio(n, printed) if n.endswith("x") else is_printed(n, printed))]


def is_printed_ratio(ratio: str, printed: str) -> bool:
    """Does the ratio ("4.5x") stand in `printed` as a ratio of its own ("4.5x", "4.5 x"), not just its digits?"""
    return re.search(r"(?<![\d.])" + re.escape(ratio[:-1]) + r"\s?[x×]", printed) is not None
