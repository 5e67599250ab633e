"""Measuring the natural-data models by one protocol: held-out prose windows, a model or a run folder measured with
analysis.published_measures, its measurements.json, and the gated twins' ratios to the baseline.

    prose = prose_windows()                        # (75, 512): held-out WikiText-2, <bos> first
    row = measure_folder("runs/code-seed0/headwise", prose)   # a Measurement (rows.py)
    ratios({"none": base, "headwise": row})        # {"headwise": {"f_attn_excess": 2.6, "m_act": 1.9}}

The course's shipped checkpoints and seeds, measured again against their files, are minigate/course/release.py's.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import fields
from pathlib import Path

import torch

from . import data, runs
from .analysis import GU_LEN, SINK_THRESHOLD, PublishedMeasures, published_measures
from .pretrained import from_pretrained
from .rows import Measurement, write_rows  # the record of a measured model, as its files store it

PROSE_LEN = 512  # tokens per held-out window
MEASUREMENTS = "measurements.json"  # beside each shipped checkpoint: the one source of its numbers
PROTOCOL = {"prose": "held-out WikiText-2 (the wikitext-2 corpus' validation articles), <bos>-first windows",
            "seq_len": PROSE_LEN, "gu_seq_len": GU_LEN, "sink_threshold": SINK_THRESHOLD,
            "function": "analysis.published_measures", "weights": "the shipped 16-bit weights",
            "val_loss_code": "the run's last validation loss, held-out code"}


def prose_ids(tokenizer=data.DEFAULT_TOKENIZER) -> torch.Tensor:
    """Held-out WikiText-2 (the wikitext-2 corpus' validation articles) as one stream of token ids, encoded with
    `tokenizer` (a tokenizer.json path): what the prose windows and lesson 06's chunks are cut from."""
    return data.encode(data.load_documents("wikitext-2")[1], data.load_tokenizer(tokenizer))


def prose_windows(tokenizer=data.DEFAULT_TOKENIZER, limit: int | None = None) -> torch.Tensor:
    """prose_ids cut into <bos>-first windows of 512: (75, 512), or the first `limit` of them."""
    return torch.cat([x for x, _ in data.eval_batches(prose_ids(tokenizer), 64, PROSE_LEN, 0)])[:limit]


def windows_digest(windows: torch.Tensor) -> str:
    """SHA-256 of a (batch, T) tensor of token ids: whether a lesson measures on the windows the numbers came from."""
    return hashlib.sha256(windows.to(torch.int64).contiguous().numpy().tobytes()).hexdigest()


@torch.no_grad()
def measure_model(model, prose: torch.Tensor, name: str = "", val_loss_code: float = math.nan,
                  residuals: bool = False) -> Measurement:
    """published_measures of `model` on `prose` (batch, 512), with the run's name and validation loss; `residuals`
    keeps the residual stream of the same pass (Measurement.act.resid)."""
    m = published_measures(model.eval(), prose.to(next(model.parameters()).device), batch_size=8,
                           residuals=residuals)
    return Measurement(**{f.name: getattr(m, f.name) for f in fields(PublishedMeasures)}, name=name,
                       val_loss_code=val_loss_code)


def measure_folder(folder, prose: torch.Tensor, device="cpu", name: str | None = None,
                   residuals: bool = False) -> Measurement:
    """Measure the model in `folder`: a shipped checkpoint (history.json beside the weights) or a finished run folder
    (its model/ and history.json), whose last validation loss becomes val_loss_code."""
    folder = Path(folder)
    weights = folder / "model" if runs.finished(folder) else folder
    history = json.loads((folder / "history.json").read_text())
    return measure_model(from_pretrained(weights, device=device), prose, name or folder.name, history["val_loss"][-1],
                         residuals)


def write_measurements(folder, row: Measurement, prose: torch.Tensor) -> None:
    """Store `row` as folder/measurements.json (rows.write_rows), with the protocol and the windows' SHA-256."""
    write_rows(Path(folder) / MEASUREMENTS, row,
               protocol=dict(PROTOCOL, windows=prose.shape[0], windows_sha256=windows_digest(prose)))


def ratios(rows: dict, keys=("f_attn_excess", "m_act")) -> dict:
    """{gated variant: {key: x}}: how many times smaller than the baseline's each gated model's numbers are (rows keyed
    by variant; by default F-Attn's excess over uniform and M-Act, the ratios the course states): baseline / gated,
    inf where the gated model's is 0, nan where the baseline's is 0 too (no symptom: nothing to remove)."""
    b = rows["none"]
    return {v: {k: _ratio(getattr(b, k), getattr(r, k)) for k in keys} for v, r in rows.items() if v != "none"}


def _ratio(baseline: float, gated: float) -> float:
    if gated > 0:
        return baseline / gated
    return math.inf if baseline > 0 else math.nan


# ── a recipe's seeds (data/seeds/<preset>.json, written by scripts/seeds.py) ─────────────────────────────────────
