"""The record of a measured model, wherever it is stored: one dataclass, `Row`, read with `read_rows` (validated: a
one-line error naming the file, the row, the field and the fix) and written with `write_rows`, the one function that
writes these files.

    data/checkpoints/<name>/measurements.json  one model: {"name", "protocol", the numbers}    measure.py
    data/seeds/<preset>.json                   a recipe's seeds: {"preset", "protocol", "rows"}   scripts/seeds.py
    data/study/<axis>.json                     the study: {"axis", "protocol", "points", "rows"}  research/

    f = read_rows("data/seeds/code.json")       # RowFile: .rows (list of Row), .protocol, .header ({"preset": ...})
    f.rows[0].variant, f.rows[0].m_act          # attributes, typed: "none", 73.7
    write_rows(path, f.rows, protocol=f.protocol, **f.header)

A Row is a `Measurement` (the numbers of analysis.PublishedMeasures, the model's name, its validation loss) with what
tells the run apart: its place (point, seed, variant), the corpus it read, its precision and speed, and for the study
its size, time and tracker. Every stored row has all of Measurement's fields; a row of a seeds or study file names its
seed and variant, a study row its point; the rest is optional (None, and left out of the file).
"""

from __future__ import annotations

import difflib
import json
import math
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path

from .analysis import STATS, PublishedMeasures
from .presets import VARIANTS


@dataclass
class Measurement(PublishedMeasures):
    """One model's PublishedMeasures on the prose windows, with its name and its run's validation loss: what
    measurements.json stores (the shipped models), a row of data/seeds/<preset>.json (a recipe's seeds) and what lesson
    04 reads of a learner's own runs. Stored, it is a Row (below)."""
    name: str = ""  # the model's name, e.g. "code-baseline" (its checkpoint folder), "seed1-headwise"
    val_loss_code: float = math.nan  # the run's last validation loss, on held-out code
    same_windows: bool | None = None  # measured on the windows its measurements.json records (not stored)

    def record(self) -> dict:
        """What measurements.json stores: the numbers, under the field names."""
        return {"name": self.name, **self.numbers(), "val_loss_code": self.val_loss_code}

    @classmethod
    def from_record(cls, record: dict) -> Measurement:
        """From a dict of some of the numbers (the others None), unchecked: a Measurement made up in a test. A stored
        file is read with read_rows, which checks every field."""
        return cls(**{f.name: record.get(f.name) for f in fields(cls) if f.name not in (*STATS, "same_windows")})


IDENTITY = ("point", "seed", "variant")  # where a row sits in its file: written first


@dataclass
class Row(Measurement):
    """A measured model as a file stores it: its Measurement and what tells its run apart (None: not recorded)."""
    point: str | None = None  # the study's setting (data/study): research/train_study.py's POINTS
    seed: int | None = None  # the run's seed; 0 in a seeds file is the shipped trio
    variant: str | None = None  # presets.VARIANTS: none, headwise, elementwise
    corpus_sha256: str | None = None  # the python-code corpus the run read: its contents' SHA-256 ...
    corpus_files: int | None = None  # ... and files
    corpus_lock: str | None = None  # the pinned corpus' lock (data/python-code.lock.json) SHA-256
    python: str | None = None  # rows from before the pinned corpus: the Python whose files the corpus was
    precision: str | None = None  # what the run trained in: fp32, bf16, fp16
    tokens_per_s: int | None = None  # the run's median training speed
    device: str | None = None  # measured elsewhere (a GPU machine): its name
    params: int | None = None  # the study: the model's parameters, tokens, steps ...
    tokens: int | None = None
    steps: int | None = None
    cpus: list | None = None  # ... the CPUs its invocations ran on, the GPU (None: a CPU) ...
    gpu: str | None = None
    wall_s: int | None = None  # ... the wall seconds of its invocations, its training seconds (tokens / speed) ...
    train_s: int | None = None
    tracker: list | None = field(default=None, repr=False)  # ... and the tracker's numbers along training

    @classmethod
    def of(cls, measured: Measurement, **facts) -> Row:
        """A measured model with the facts of its run (IDENTITY and the other fields above)."""
        return cls(**{f.name: getattr(measured, f.name) for f in fields(Measurement)}, **facts)

    def record(self) -> dict:
        """What a file stores of the row: its place, its Measurement's record, then the run's facts recorded."""
        mine = {f.name: getattr(self, f.name) for f in fields(Row) if f.name in FACTS}
        return {**{k: mine.pop(k) for k in IDENTITY if mine[k] is not None}, **super().record(),
                **{k: v for k, v in mine.items() if v is not None}}


# the fields every stored row has: Measurement.record()'s
RECORDED = ("name", *(f.name for f in fields(PublishedMeasures) if f.name not in STATS), "val_loss_code")
FACTS = tuple(f.name for f in fields(Row) if f.name not in {g.name for g in fields(Measurement)})
TYPES = typing.get_type_hints(Row)
OLD = ("heads", "sink_heads", "sink_heads_64")  # fields the rows measured before issue 48 lack


class RowError(ValueError):
    """A stored row that is not a Row: the message names the file, the row, the field and the fix."""


def _fits(value, kind) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _type_name(kind) -> str:
    return " or ".join("null" if k is type(None) else k.__name__ for k in typing.get_args(kind) or (kind,))


def _show(value) -> str:
    try:
        return json.dumps(value)
    except TypeError:
        return repr(value)


def parse(record: dict, where: str, required: tuple[str, ...] = ()) -> Row:
    """A Row from a stored dict, every field checked: RowError naming `where` and the field when one is missing
    (RECORDED and `required`), unknown, of the wrong type, or a variant not in VARIANTS."""
    if not isinstance(record, dict):
        raise RowError(f"{where}: is {type(record).__name__}, not an object of a Row's fields")
    missing = [k for k in (*RECORDED, *required) if k not in record]
    if set(missing) == set(OLD):
        raise RowError(f"{where}: has no `{'`, `'.join(OLD)}`: a row measured before the sink-head counts were stored; "
                       "migrate it: heads = layers x heads per layer, sink_heads(_64) = round(sink_rate(_64) x heads)")
    if missing:
        raise RowError(f"{where}: has no `{missing[0]}`: every stored row records it; measure the model again with "
                       "the script that wrote the file, or add the field")
    for k, value in record.items():
        if k not in TYPES or k in (*STATS, "same_windows"):
            near = difflib.get_close_matches(k, RECORDED + FACTS, 1)
            raise RowError(f"{where}: unknown field `{k}`: " + (f"did you mean `{near[0]}`?" if near else
                           "not a field of minigate.rows.Row; drop it, or add it to Row"))
        kinds = typing.get_args(TYPES[k]) or (TYPES[k],)
        if not any(_fits(value, kind) for kind in kinds):
            raise RowError(f"{where}: `{k}` is {_show(value)}, not {_type_name(TYPES[k])}: write it as "
                           f"{_type_name(TYPES[k])}")
    if record.get("variant") is not None and record["variant"] not in VARIANTS:
        raise RowError(f"{where}: variant {record['variant']!r} is not one of {', '.join(VARIANTS)} (presets.VARIANTS; "
                       "`baseline` and the folder names are NAMES, display text): write the variant")
    return Row(**record)


@dataclass
class RowFile:
    """A stored file of rows: its rows, its protocol (measure.PROTOCOL with the windows' count and SHA-256; None where
    the file has none) and its other keys (header: a seeds file's preset, a study file's axis and points)."""
    rows: list[Row]
    protocol: dict | None = None
    header: dict = field(default_factory=dict)


def read_rows(path) -> RowFile:
    """A measurements.json (one row) or a file of rows (data/seeds, data/study, a GPU machine's rows), every row
    checked (parse); a study file's rows name one of its points."""
    path = Path(path)
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict):
        raise RowError(f"{path}: holds a {type(doc).__name__}, not an object with rows")
    protocol = doc.get("protocol")
    if "rows" not in doc and "name" not in doc:
        raise RowError(f"{path}: holds no `rows` and no `name`: neither a file of rows nor a measurements.json")
    if "rows" not in doc:  # one model's measurements.json: the row itself, with its protocol
        row = parse({k: v for k, v in doc.items() if k != "protocol"}, str(path))
        return RowFile([row], protocol)
    header = {k: v for k, v in doc.items() if k not in ("protocol", "rows")}
    required = ("point", "seed", "variant") if "points" in doc else ("seed", "variant")
    rows = []
    for i, r in enumerate(doc["rows"]):
        place = " ".join(str(r.get(k)) for k in IDENTITY if isinstance(r, dict) and k in r)
        rows.append(parse(r, f"{path}: row {i}" + (f" ({place})" if place else ""), required))
        if "points" in doc and rows[-1].point not in doc["points"]:
            raise RowError(f"{path}: row {i} ({place}): point {rows[-1].point!r} is not one of the file's points "
                           f"({', '.join(doc['points'])}): add it to `points`, or fix the row's point")
    return RowFile(rows, protocol, header)


def write_rows(path, rows: Measurement | list[Row], **doc) -> Path:
    """Write `rows` to `path`, each checked as read_rows would read it: one Measurement or Row as a measurements.json
    ({"name", "protocol", the numbers}, indented by 2), a list as a file of rows (`doc`'s keys in their order, then
    "rows", indented by 1)."""
    path = Path(path)
    if isinstance(rows, Measurement):
        record = rows.record()
        parse(record, str(path))
        out, indent = {"name": record.pop("name"), **doc, **record}, 2
    else:
        records = [r.record() for r in rows]
        required = ("point", "seed", "variant") if "points" in doc else ("seed", "variant")
        for i, r in enumerate(records):
            parse(r, f"{path}: row {i}", required)
        out, indent = {**doc, "rows": records}, 1
    path.write_text(json.dumps(out, indent=indent) + "\n")
    return path
