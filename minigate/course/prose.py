"""Prose = output: every measured number a lesson's text states is one its cells print.

    unprinted(nb)   # [(cell index, "4.5x"), ...]: decimals and ratios in the markdown that no output shows

A number in the text is a decimal (0.27, 5.74) or a ratio (4.5x, 2×). It counts as printed when the same digits
stand in an output of the same notebook as a number of their own (0.27 in "head 0.27", not in 10.275). Text inside
code spans, code blocks, math and links is not prose. The only other numbers allowed are the figures a lesson
quotes from the paper or another named publication: `published.PUBLISHED`, one list with each figure's source.
"""

from __future__ import annotations

import re

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
