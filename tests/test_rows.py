"""minigate.rows: one Row for every stored measurement file (measurements.json, data/seeds, data/study), read with
every field checked and written by one function; the files migrated to it with every number unchanged."""

import json
import subprocess
import typing
from dataclasses import fields
from pathlib import Path

import pytest

from minigate import rows
from minigate.course.release import SEEDS_DIR, SHIPPED_DIR
from minigate.resources import DATA_DIR as DATA

ROOT = DATA.parent
STORED = sorted([*DATA.glob("checkpoints/*/measurements.json"), *DATA.glob("seeds/*.json"), *DATA.glob("study/*.json")])
GPU_ROWS = sorted((ROOT / "research" / "gpu").glob("code-gpu-seed*.json"))  # rows brought back from a GPU machine
# the commit before issue 56 migrated the files to rows.Row (their numbers as they were), and the migration's own
MIGRATED = "9c98337b1befc33e8616dcae1b2dea4f5d435b10"
BEFORE = "30ccece4b40db5f10fd51d2066216a30b768b2ce"
ids = lambda paths: [str(p.relative_to(ROOT)) for p in paths]  # noqa: E731


def _row_dicts(doc: dict) -> list[dict]:
    return doc["rows"] if "rows" in doc else [{k: v for k, v in doc.items() if k != "protocol"}]


@pytest.mark.parametrize("path", STORED + GPU_ROWS, ids=ids(STORED + GPU_ROWS))
def test_every_stored_file_reads_as_rows_with_every_value_as_stored(path):
    """read_rows keeps every field of every row: each Row's record is the file's row, value for value (a field left
    out of the file is None)."""
    doc = json.loads(path.read_text())
    got = rows.read_rows(path)
    assert got.protocol == doc.get("protocol") and len(got.rows) == len(_row_dicts(doc))
    for row, stored in zip(got.rows, _row_dicts(doc), strict=True):
        assert isinstance(row, rows.Row) and row.record() == stored
        assert all(getattr(row, f) is None for f in rows.FACTS if f not in stored)
    assert got.header == ({k: v for k, v in doc.items() if k not in ("protocol", "rows")} if "rows" in doc else {})


@pytest.mark.parametrize("path", STORED, ids=ids(STORED))
def test_each_stored_file_is_as_write_rows_writes_it(tmp_path, path):
    """The files are in the one writer's format: read and written again, each is the same bytes."""
    got = rows.read_rows(path)
    doc = json.loads(path.read_text())
    head = {k: v for k, v in doc.items() if k not in ("rows", "name") and k in ("protocol", *got.header)}
    written = rows.write_rows(tmp_path / path.name, got.rows if "rows" in doc else got.rows[0], **head)
    assert written.read_text() == path.read_text()


def _git_show(path: Path, commit: str = BEFORE) -> str | None:
    try:
        out = subprocess.run(["git", "show", f"{commit}:{path.relative_to(ROOT).as_posix()}"], cwd=ROOT,
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


@pytest.mark.parametrize("path", STORED + GPU_ROWS, ids=ids(STORED + GPU_ROWS))
def test_the_migration_changed_no_number(tmp_path, path):
    """Every value of every row as committed before the migration is the migrated file's (as the migration committed
    it: files measured again since hold new numbers), exactly (a null left out is None); the only values added are
    the sink-head counts of the rows from before they were stored (the GPU machine's rows), each its sink rate times
    the heads, a whole number."""
    before, migrated = _git_show(path), _git_show(path, MIGRATED)
    if before is None or migrated is None:
        pytest.skip(f"no git history with {BEFORE[:7]} and {MIGRATED[:7]} here (a shallow clone, an unpacked wheel "
                    "or a file added since)")
    before, now = json.loads(before), json.loads(migrated)
    (tmp_path / path.name).write_text(migrated)
    assert {k: v for k, v in before.items() if k != "rows"} == {k: v for k, v in now.items() if k != "rows"}
    old, new = _row_dicts(before), [r.record() for r in rows.read_rows(tmp_path / path.name).rows]
    assert len(old) == len(new)
    for o, n in zip(old, new, strict=True):
        assert {k: v for k, v in o.items() if v is not None} == {k: v for k, v in n.items() if k in o}
        added = set(n) - set(o)
        assert added <= set(rows.OLD)
        for k in added:
            rate = o["sink_rate" if k == "sink_heads" else "sink_rate_64"] if k != "heads" else None
            assert rate is None or abs(rate * n["heads"] - n[k]) < 1e-6


# ── each field in turn: dropped, of the wrong type, unknown ────────────────────────────────────────────────────────

SEEDS = SEEDS_DIR / "code.json"
STUDY = DATA / "study" / "length.json"
WRONG = {int: "7", float: "x", str: 7, list: "x"}  # a value of the wrong type for each kind of field


def _doc(path: Path, row: dict) -> dict:
    doc = json.loads(path.read_text())
    return dict(doc, rows=[row]) if "rows" in doc else {"protocol": doc["protocol"], **row}


def _fails(tmp_path, path: Path, row: dict) -> str:
    (tmp_path / path.name).write_text(json.dumps(_doc(path, row)))
    with pytest.raises(rows.RowError) as e:
        rows.read_rows(tmp_path / path.name)
    message = str(e.value)
    assert "\n" not in message and str(tmp_path / path.name) in message  # one line, naming the file
    return message


def _kind(name: str):
    kinds = typing.get_args(rows.TYPES[name]) or (rows.TYPES[name],)
    return next(k for k in (int, float, str, list) if k in kinds)


def test_every_field_of_a_row_is_a_stored_field_and_the_reverse():
    stored = {k for p in STORED for r in _row_dicts(json.loads(p.read_text())) for k in r}
    assert stored <= set(rows.RECORDED + rows.FACTS)
    assert {f.name for f in fields(rows.Row)} == set(rows.RECORDED + rows.FACTS) | {"sink", "sink_64", "act",
                                                                                      "same_windows"}


@pytest.mark.parametrize("path", [SHIPPED_DIR / "code-baseline" / "measurements.json", SEEDS, STUDY],
                         ids=["measurements.json", "seeds", "study"])
def test_each_field_dropped_or_of_the_wrong_type_is_named(tmp_path, path):
    """Every field of a stored row, in turn: dropped, a required one (every Measurement field; a seeds or study row's
    seed and variant; a study row's point) fails naming it, an optional one reads as None; given a value of the
    wrong type, every field fails naming it and the type it should be."""
    row = _row_dicts(json.loads(path.read_text()))[0]
    required = set(rows.RECORDED) | ({"seed", "variant"} if path != SHIPPED_DIR / "code-baseline" /
                                     "measurements.json" else set()) | ({"point"} if path == STUDY else set())
    for name in [*rows.RECORDED, *rows.FACTS]:
        dropped = {k: v for k, v in row.items() if k != name}
        if name in required:
            assert f"`{name}`" in _fails(tmp_path, path, dropped)
        else:
            (tmp_path / path.name).write_text(json.dumps(_doc(path, dropped)))
            assert getattr(rows.read_rows(tmp_path / path.name).rows[0], name) is None
        message = _fails(tmp_path, path, dict(row, **{name: WRONG[_kind(name)]}))
        assert f"`{name}` is " in message and f"not {rows._type_name(rows.TYPES[name])}" in message


def test_an_unknown_field_a_bad_variant_and_an_old_row_are_named_with_their_fix(tmp_path):
    row = _row_dicts(json.loads(SEEDS.read_text()))[0]
    assert "unknown field `sink_rate64`: did you mean `sink_rate_64`?" in _fails(tmp_path, SEEDS, dict(
        row, sink_rate64=0.1))
    assert "unknown field `colour`: not a field of minigate.rows.Row" in _fails(tmp_path, SEEDS, dict(row, colour=1))
    assert "variant 'baseline' is not one of none, headwise, elementwise" in _fails(tmp_path, SEEDS, dict(
        row, variant="baseline"))
    old = {k: v for k, v in row.items() if k not in rows.OLD}  # measured before the sink-head counts were stored
    assert "has no `heads`, `sink_heads`, `sink_heads_64`: a row measured before" in _fails(tmp_path, SEEDS, old)
    study = _row_dicts(json.loads(STUDY.read_text()))[0]
    assert "point 'nowhere' is not one of the file's points" in _fails(tmp_path, STUDY, dict(study, point="nowhere"))
    assert "row 0 (2x 0 none)" in _fails(tmp_path, STUDY, dict(study, m_act=None))


def test_write_rows_checks_what_it_writes(tmp_path):
    row = rows.read_rows(SEEDS).rows[0]
    with pytest.raises(rows.RowError, match="variant 'baseline'"):
        rows.write_rows(tmp_path / "x.json", [rows.Row.of(row, seed=0, variant="baseline")], preset="code")
    with pytest.raises(rows.RowError, match="has no `seed`"):
        rows.write_rows(tmp_path / "x.json", [rows.Row.of(row, variant="none")], preset="code")
    assert not (tmp_path / "x.json").exists()


def test_seeds_py_names_the_migration_of_a_run_json_from_before_precision_used(tmp_path):
    from scripts import seeds

    with pytest.raises(ValueError, match=r'run\.json says precision .auto. .* add "precision_used": "fp32" to it'):
        seeds.run_facts({"train": {"precision": "auto"}}, {"tokens_per_s": [1]}, tmp_path)
    assert seeds.run_facts({"train": {"precision": "auto"}, "precision_used": "bf16"}, {"tokens_per_s": [3, 1, 2]},
                           tmp_path)["precision"] == "bf16"
