"""The course's measurements of the natural-data models: held-out prose windows, measuring a model, a run folder or a
shipped checkpoint with analysis.published_measures, measurements.json, the ratios the course states, and a recipe's
seeds with their range.

    prose = prose_windows()                      # (75, 512): held-out WikiText-2, <bos> first
    rows = measure_preset("code", prose=prose)   # {variant: Measurement}, each checked against its measurements.json
    ratios(rows)                                 # {"headwise": {"f_attn_excess": 2.6, "m_act": 1.9}, ...}

What the release states of these numbers (the READMEs' tables and sentences) and requires of them (the bar every
shipped trio meets) lives outside the package, with the release pipeline: scripts/readme.py and scripts/ship.py.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from . import data, runs
from .analysis import GU_LEN, SINK_THRESHOLD, STATS, PublishedMeasures, published_measures
from .presets import GATED, NAMES
from .pretrained import SEEDS_DIR, SHIPPED_DIR, from_pretrained
from .rows import Measurement, Row, read_rows, write_rows  # the record of a measured model, as its files store it

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


def stored(name: str, shipped: Path = SHIPPED_DIR) -> dict:
    """The measurements.json of a shipped model, as stored (with its protocol), checked by rows.read_rows."""
    path = Path(shipped) / name / MEASUREMENTS
    read_rows(path)
    return json.loads(path.read_text())


CHECKED = tuple(f.name for f in fields(Measurement) if f.name not in (*STATS, "name", "same_windows"))


def agrees(got, want, tol: float) -> bool:
    """Whether a measured number (or list of them) is the stored one: floats to `tol` (relative above 1), whole
    numbers (counts, a head's place) and None exactly."""
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(
            agrees(g, w, tol) for g, w in zip(got, want, strict=True))
    if want is None or got is None or isinstance(want, int):
        return got == want
    return abs(got - want) <= tol * max(1.0, abs(want))


def check_measurement(name: str, row: Measurement, record: dict, tol: float) -> None:
    """A ValueError naming the first field of CHECKED whose measured value is not the stored one."""
    for key in CHECKED:
        if not agrees(getattr(row, key), record.get(key), tol):
            raise ValueError(f"{name}: {key} is {getattr(row, key)} measured here but {record.get(key)} in its "
                             f"{MEASUREMENTS}: these weights or this minigate's measuring code are not the ones the "
                             "file was written from; reinstall minigate at the course's release")


def measure_shipped(name: str, device="cpu", prose: torch.Tensor | None = None, shipped: Path = SHIPPED_DIR,
                    residuals: bool = False) -> Measurement:
    """Measure a shipped model again and check it against its measurements.json: on the same windows (same SHA-256)
    every stored number (CHECKED) must agree, floats to 1e-4 (1e-3 off the CPU), counts exactly, or a ValueError
    names the first that does not; on other windows (another WikiText-2 copy) `same_windows` says so. `prose`:
    prose_windows' windows, if at hand."""
    record = stored(name, shipped)
    prose = prose_windows(Path(shipped) / name / "tokenizer.json") if prose is None else prose
    row = measure_folder(Path(shipped) / name, prose, device, residuals=residuals)
    row.same_windows = windows_digest(prose) == record["protocol"]["windows_sha256"]
    if row.same_windows:
        check_measurement(name, row, record, 1e-4 if str(device) == "cpu" else 1e-3)
    return row


def shipped_variants(preset: str, shipped: Path = SHIPPED_DIR) -> list[str]:
    """The variants of a preset that are shipped (a folder with measurements.json), in NAMES order: all three for
    the code models, none and elementwise for the code-moe pair."""
    return [v for v, name in NAMES.items() if (Path(shipped) / f"{preset}-{name}" / MEASUREMENTS).is_file()]


def measure_preset(preset: str = "code", device="cpu", prose: torch.Tensor | None = None,
                   residuals: bool = False) -> dict[str, Measurement]:
    """{variant: Measurement} of a preset's shipped models, each measured again with measure_shipped on the windows its
    measurements.json records (and checked against it): what a lesson prints about the shipped models."""
    if prose is None:
        prose = prose_windows(SHIPPED_DIR / f"{preset}-baseline" / "tokenizer.json")
    return {v: measure_shipped(f"{preset}-{NAMES[v]}", device, prose, residuals=residuals)
            for v in shipped_variants(preset)}


def shipped_rows(preset: str, shipped: Path = SHIPPED_DIR) -> dict[str, Row]:
    """{variant: Row} of a preset's shipped models as their measurements.json files hold them (no stats)."""
    return {v: read_rows(Path(shipped) / f"{preset}-{NAMES[v]}" / MEASUREMENTS).rows[0]
            for v in shipped_variants(preset, shipped)}


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

def seed_rows(preset: str = "code", path=None) -> dict[int, dict[str, Row]]:
    """{seed: {variant: Row}} of a recipe's seeds as data/seeds/<preset>.json records them (scripts/seeds.py), read
    with rows.read_rows: seed 0 is the shipped trio, every seed measured with the shipped protocol."""
    seeds: dict[int, dict[str, Row]] = {}
    for r in read_rows(path or SEEDS_DIR / f"{preset}.json").rows:
        seeds.setdefault(r.seed, {})[r.variant] = r
    return seeds


def complete_seeds(seeds: dict[int, dict]) -> dict[int, dict]:
    """The seeds that have all three models (a seed still training has fewer), in seed order."""
    return {s: rows for s, rows in sorted(seeds.items()) if set(rows) == set(NAMES)}


@dataclass
class Spread:
    """One number over a recipe's seeds: seed 0's value (the shipped models'), the range over all seeds, and in how
    many seeds the gate helped (lowered the baseline's sink heads, excess or M-Act); a count's total (`of`: the heads
    a sink-head count is out of)."""
    seed0: float
    low: float
    high: float
    helped: int
    seeds: int
    of: int | None = None


def _over(values: dict[int, float], helped: dict[int, bool], of: int | None = None) -> Spread:
    return Spread(values[0], min(values.values()), max(values.values()), sum(helped.values()), len(values), of)


def spread(seeds: dict[int, dict[str, Measurement]]) -> dict[str, dict[str, Spread]]:
    """Each number the course states, over the seeds that have all three models: {gated variant: {"f_attn_excess",
    "m_act": baseline / gated; "sink_heads_64": the gated model's sink heads at T=64; "max_head_64": its strongest
    head at T=64}} and {"none": the baseline's "sink_heads_64" and "max_head_64"}. Helped: a ratio above 1, fewer
    sink heads than that seed's baseline, a strongest head below the baseline's."""
    whole = complete_seeds(seeds)
    if 0 not in whole:
        raise ValueError("spread needs seed 0 (the shipped trio) with all three variants")
    heads = whole[0]["none"].heads
    out = {"none": {}}
    for k in ("sink_heads_64", "max_head_64"):
        of = heads if k == "sink_heads_64" else None
        base = {s: getattr(rows["none"], k) for s, rows in whole.items()}
        out["none"][k] = _over(base, dict.fromkeys(whole, False), of)
        for g in GATED:
            gated = {s: getattr(rows[g], k) for s, rows in whole.items()}
            out.setdefault(g, {})[k] = _over(gated, {s: gated[s] < base[s] for s in whole}, of)
    x = {s: ratios(rows) for s, rows in whole.items()}
    for g in GATED:
        for k in ("f_attn_excess", "m_act"):
            out[g][k] = _over({s: x[s][g][k] for s in whole}, {s: x[s][g][k] > 1 for s in whole})
    return out


def ratio_text(x: Spread) -> str:
    return f"{x.seed0:.1f}x ({x.low:.1f}-{x.high:.1f}x, smaller in {x.helped} of {x.seeds} seeds)"


def count_text(x: Spread) -> str:
    return f"{x.seed0} ({x.low}-{x.high})"


def value_text(x: Spread) -> str:
    return f"{x.seed0:.2f} ({x.low:.2f}-{x.high:.2f})"


def spread_lines(s: dict[str, dict[str, Spread]], seed0: str = "the shipped models") -> list[str]:
    """What the lessons print of `spread(seeds)`: per gated variant, each ratio as seed 0's value, the range over the
    seeds and in how many the gate helped; the sink heads and the strongest head at T=64 next to the baseline's.
    `seed0` says what seed 0 is."""
    b, n = s["none"], s["none"]["sink_heads_64"].seeds
    heads = b["sink_heads_64"].of
    lines = [f"over {n} seeds, seed 0's value ({seed0}) and the range over the seeds:",
             f"  baseline: sink heads at T=64 {count_text(b['sink_heads_64'])} of {heads}; strongest head at "
             f"T=64 {value_text(b['max_head_64'])}"]
    for g in GATED:
        x = s[g]
        lines.append(f"  {g}: F-Attn above uniform {ratio_text(x['f_attn_excess'])}, M-Act {ratio_text(x['m_act'])}; "
                     f"sink heads {count_text(x['sink_heads_64'])}, fewer than the baseline's in "
                     f"{x['sink_heads_64'].helped} of {n}; strongest head {value_text(x['max_head_64'])}, below the "
                     f"baseline's in {x['max_head_64'].helped} of {n}")
    return lines
