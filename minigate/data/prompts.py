"""The prompt sets written for this course (data/prompts/), one per input type."""

from __future__ import annotations

import json

from ..resources import DATA_DIR

PROMPT_DIR = DATA_DIR / "prompts"
PROMPT_TYPES = ("factual", "technical", "conversational", "repetitive", "code")


def load_prompts(type: str | None = None) -> dict[str, list[str]]:
    """The prompt sets written for this course (data/prompts/): {type: [prompt, ...]}, every type or one.
    Prose types are `<type>.txt`, one prompt per line; code is `code.json`, a list of (multi-line) snippets."""
    if type is not None and type not in PROMPT_TYPES:
        raise ValueError(f"unknown prompt type {type!r}; the types are {PROMPT_TYPES}")
    out = {}
    for kind in PROMPT_TYPES if type is None else (type,):
        txt, js = PROMPT_DIR / f"{kind}.txt", PROMPT_DIR / f"{kind}.json"
        if js.is_file():
            out[kind] = json.loads(js.read_text(encoding="utf-8"))
        else:
            out[kind] = [line.strip() for line in txt.read_text(encoding="utf-8").splitlines() if line.strip()]
    return out
