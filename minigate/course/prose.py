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

# the README and the reference pages it moved to docs/: their prose is held to the same sources
FRONT_DOCS = ("README.md", "docs/package.md", "docs/training.md", "docs/benchmarks.md", "docs/testing.md")

_FENCE = re.compile(r"```.*?```", re.S)
_VERSION_AFTER = r"(?:>=|==|<=|~=|\bv)\s*\d+\.\d+(?:\.\d+)*"  # a version pin, not a measurement
# the READMEs' generated text, as scripts/readme.py writes it: <!-- minigate:KIND PRESET -->the text<!-- /minigate:KIND
# PRESET -->
MARKED = re.compile(r"<!-- minigate:(\w+) ([\w-]+) -->(.*?)<!-- /minigate:\1 \2 -->", re.S)


def marker(kind: str, preset: str, end: bool = False) -> str:
    """The comment that opens (or, with end, closes) a generated span of a README."""
    return f"<!-- {'/' if end else ''}minigate:{kind} {preset} -->"


def marked(text: str, kind: str, preset: str, new: str) -> str:
    """`text` with `new` between the markers of (kind, preset), where it has them; a ValueError where one opens and
    does not close."""
    start, end = marker(kind, preset), marker(kind, preset, end=True)
    if start not in text:
        return text
    if end not in text.split(start, 1)[1]:
        raise ValueError(f"{start} has no {end} after it")
    head, rest = text.split(start, 1)
    return head + start + new + end + rest.split(end, 1)[1]


def generated_spans(text: str) -> dict[tuple[str, str], str]:
    """{(kind, preset): the text between its markers} of a README."""
    return {(m.group(1), m.group(2)): m.group(3) for m in MARKED.finditer(text)}


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
    version numbers, sizes (8 x 512) and generated text (between scripts/readme.py's markers); a table is generated
    or a configuration, not a claim written by hand."""
    paragraphs, versions = [], _versions()
    for para in re.split(r"\n\s*\n", _FENCE.sub("\n\n", MARKED.sub(" ", text))):
        prose = "\n".join(line for line in para.splitlines() if not line.lstrip().startswith("|"))
        if prose.strip():
            paragraphs.append(_SIZE.sub(" ", versions.sub(" ", prose)))
    return paragraphs


def generated_sources(root: Path) -> dict[str, str]:
    """{source: its text}: what the README may state numbers from. Every solutions notebook's outputs; the READMEs'
    generated text (README.md's and data/checkpoints/README.md's marked spans: each shipped preset's table and sentence
    and each recipe's seeds sentence, which tests/test_release.py holds to measurements.json and data/seeds); each
    data/seeds/<preset>.json as the lessons print it (release.spread_lines); the tables of docs/gpu.md; and the
    lessons' study times as the README adds them up."""
    import nbformat

    from minigate.course import release

    from .study import study_minutes

    sources = {}
    for path in sorted((root / "solutions").glob("0*.ipynb")):
        sources[f"solutions/{path.name} (outputs)"] = printed_text(nbformat.read(path, as_version=4))
    for doc in (root / "README.md", root / "data" / "checkpoints" / "README.md"):
        for (kind, preset), text in generated_spans(doc.read_text(encoding="utf-8")).items():
            sources[f"{doc.relative_to(root).as_posix()} ({kind} {preset}, scripts/readme.py)"] = text
    for path in sorted((root / "data" / "seeds").glob("*.json")):
        sources[f"data/seeds/{path.name} (release.spread_lines)"] = "\n".join(
            release.spread_lines(release.spread(release.seed_rows(path.stem, path))))
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


# ── claims are asserts: each summary claim carries a mark [✓N] tied to `# ✓N` on an assert in a code cell above ─────

SUMMARY = re.compile(r"^(?:#+ What we (?:saw|measured)|\*\*What we (?:saw|measured)\.\*\*)")
CLAIM_MARK = re.compile(r"\[✓(\d+)\]")  # in the markdown: [✓3]
ASSERT_MARK = re.compile(r"#.*?✓(\d+)\b")  # in the code: assert ...  # ✓3 (or a comment line right above the assert)
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z*`(])")


def summary_claims(text: str) -> list[str]:
    """The claims of a summary cell ("What we saw" / "What we measured"): each bullet, or where the cell has none,
    each sentence after the heading."""
    body = SUMMARY.sub("", text.strip(), count=1).strip()
    bullets = re.split(r"^- ", body, flags=re.M)
    if len(bullets) > 1:
        return [b.strip() for b in bullets[1:] if b.strip()]
    return [s.strip() for s in _SENTENCE.split(" ".join(body.split())) if s.strip()]


def asserted_marks(source: str) -> set[str]:
    """The marks a code cell ties to its asserts: `# ✓N` on an assert's line, or on a comment line directly above
    one (an assert spanning lines: on any of its lines)."""
    marks, lines = set(), source.splitlines()
    for i, line in enumerate(lines):
        for n in ASSERT_MARK.findall(line):
            statement = line.lstrip()
            above = statement.startswith("#") and i + 1 < len(lines) and lines[i + 1].lstrip().startswith("assert")
            inside = any(lines[j].lstrip().startswith("assert") for j in range(max(0, i - 3), i + 1)) and not \
                statement.startswith("#")
            if statement.startswith("assert") or above or inside:
                marks.add(n)
    return marks


def unbacked(nb) -> list[tuple[int, str]]:
    """(cell, the claim's first words) for each summary claim with no mark, or whose mark no assert above it
    carries; a mark used twice in one lesson counts as unbacked the second time."""
    out, seen, tied = [], set(), set()
    for i, cell in enumerate(nb["cells"]):
        source = "".join(cell["source"])
        if cell["cell_type"] == "code":
            tied |= asserted_marks(source)
        elif SUMMARY.match(source.strip()) and "answers" not in cell.get("metadata", {}).get("tags", []):
            for claim in summary_claims(source):
                marks = CLAIM_MARK.findall(claim)
                if not marks or any(m not in tied or m in seen for m in marks):
                    out.append((i, " ".join(claim.split()[:8])))
                seen |= set(marks)
    return out
