"""What the course ships beside the package: its checkpoints (data/checkpoints/) with their measurements.json, and a
recipe's seeds (data/seeds/). Loading them, measuring them again against what the files hold, and a recipe's seeds
with their range, as the lessons and the README state them.

    model = release.shipped("copy-baseline")       # a shipped checkpoint, in eval mode
    rows = release.measure_preset("code")           # {variant: Measurement}, each checked against its measurements.json
    release.spread(release.seed_rows("code"))       # each ratio's range over the recipe's seeds

The library measures (minigate.measure: the prose windows, measure_folder, ratios); this module knows the course's
files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from ..analysis import STATS
from ..model import Transformer
from ..measure import MEASUREMENTS, ratios, measure_folder, prose_windows, windows_digest
from ..presets import GATED, NAMES
from ..pretrained import from_pretrained
from ..resources import DATA_DIR  # data/ of a checkout, or minigate/_data/ when installed
from ..rows import Measurement, Row, read_rows
from ..runfolder import read_run_json

SHIPPED_DIR = DATA_DIR / "checkpoints"
SEEDS_DIR = DATA_DIR / "seeds"  # <preset>.json: a recipe's seeds, measured (scripts/seeds.py)


def shipped_names() -> list[str]:
    """Names of the checkpoints in data/checkpoints/ (e.g. "copy-baseline", "copy-headwise")."""
    return sorted(p.parent.name for p in SHIPPED_DIR.glob("*/config.json"))


def _shipped_folder(name: str) -> Path:
    folder = SHIPPED_DIR / name
    if not (folder / "config.json").exists():
        raise FileNotFoundError(
            f"no shipped checkpoint {name!r} in {SHIPPED_DIR}; available: {shipped_names()}. They come with "
            "the repository (data/checkpoints/): clone it, or in Colab run the lesson's set-up cell")
    return folder


def shipped(name: str, dtype: torch.dtype | str | None = None, device: str | torch.device = "cpu") -> Transformer:
    """A model the course ships: shipped("copy-baseline"), "copy-headwise", "copy-elementwise", ...
    (data/checkpoints/README.md says how each was trained, with one command per model)."""
    return from_pretrained(_shipped_folder(name), dtype=dtype, device=device).eval()


def shipped_run(name: str) -> dict:
    """How a shipped model was trained: its run.json (preset, variant, corpus, train and model configs) and
    its training history (["history"]: a dict of the History fields, metrics recorded every eval)."""
    folder = _shipped_folder(name)
    return dict(read_run_json(folder), history=json.loads((folder / "history.json").read_text()))


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
