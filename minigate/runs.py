"""A preset's run folder: one preset (or study point) x variant x seed under a root, in one layout, with its state,
the `minigate train` command that trains or continues it, and the one rule for a finished run.

    run = RunFolder("runs", "code", "headwise", seed=2)
    run.path                # runs/code-seed2/headwise: ROOT/<preset>-seed<N>/<name> (name: presets.NAMES)
    run.base, run.log       # runs/code-seed2 (the seed's trio, their logs); runs/code-seed2/headwise.log
    run.state()             # "not started", "resumable" (a checkpoint is there) or "finished"
    run.command("--progress", "json")  # python -m minigate.cli train --preset code --variant headwise
                                       #   --out runs/code-seed2/headwise --set seed=2 --progress json [--resume]
    finished("runs/code-seed2/headwise")   # the rule: model/config.json is a file (the run wrote its final model)

A study point trains a preset with overrides under a name of its own: RunFolder("runs/study", "code", "none", seed=1,
point="2x") is runs/study/2x-seed1/baseline. Lesson 03's GROW switch (course/grow.py), research/train_study.py and
scripts/ship.py all use this layout. minigate 0.1 had two others: research's runs/study/<point>/seed<N>/<name> and
ship's runs/<preset>-<variant> (seed 0). state() and check() refuse a run found there, in one line naming the move.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .presets import NAMES, PRESETS

CHECKPOINT = "checkpoint.pt"  # what `minigate train --resume` continues (train.py writes it)
NOT_STARTED, RESUMABLE, FINISHED = "not started", "resumable", "finished"  # RunFolder.state()


def finished(folder: str | os.PathLike) -> bool:
    """Whether `folder` holds a finished run: its final model's config, model/config.json, is a file."""
    return (Path(folder) / "model" / "config.json").is_file()


@dataclass(frozen=True)
class RunFolder:
    """Where one run of a preset trains: ROOT/<point or preset>-seed<N>/<NAMES[variant]>. `point`: a study point's
    name, which replaces the preset's in the folder (the run still trains `preset`, with the point's overrides)."""

    root: Path
    preset: str
    variant: str
    seed: int = 0
    point: str | None = None

    def __post_init__(self):
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; use one of {', '.join(PRESETS)}")
        if self.variant not in NAMES:
            raise ValueError(f"unknown variant {self.variant!r}; use one of {', '.join(NAMES)}")
        object.__setattr__(self, "root", Path(self.root))
        object.__setattr__(self, "seed", int(self.seed))

    @property
    def base(self) -> Path:
        """The seed's folder: its three runs, their logs (NAME.log) and what holds them (GROW's lock)."""
        return self.root / f"{self.point or self.preset}-seed{self.seed}"

    @property
    def path(self) -> Path:
        """The run folder `minigate train --out` writes."""
        return self.base / NAMES[self.variant]

    @property
    def log(self) -> Path:
        """Where the run's output goes, beside its folder."""
        return self.base / f"{NAMES[self.variant]}.log"

    @property
    def finished(self) -> bool:
        return finished(self.path)

    @property
    def has_checkpoint(self) -> bool:
        """A checkpoint is there: the command continues it (--resume)."""
        return (self.path / CHECKPOINT).is_file()

    def state(self) -> str:
        """FINISHED, RESUMABLE (a checkpoint, no final model yet) or NOT_STARTED; a ValueError naming the move for a
        run in minigate 0.1's layout (check())."""
        self.check()
        return FINISHED if self.finished else RESUMABLE if self.has_checkpoint else NOT_STARTED

    def old_layout(self) -> tuple[Path, Path] | None:
        """(where minigate 0.1 put this run, where it goes now) when the old folder is there and the new one is not:
        a study point's runs/study/<point>/seed<N> (its trio and logs: the whole seed folder moves), or ship's
        runs/<preset>-<variant> (seed 0: the preset's own seed). None otherwise."""
        if self.point is not None:
            old, new = self.root / self.point / f"seed{self.seed}", self.base
        elif self.seed == 0:
            old, new = self.root / f"{self.preset}-{self.variant}", self.path
        else:
            return None
        return (old, new) if old.is_dir() and not new.exists() else None

    def check(self) -> RunFolder:
        """Itself; a ValueError naming the move when the run is in minigate 0.1's layout (old_layout())."""
        moved = self.old_layout()
        if moved:
            raise ValueError(f"{moved[0]} is in minigate 0.1's layout: move it to {moved[1]}")
        return self

    def command(self, *options: str, sets: dict | None = None, steps: int | None = None) -> list[str]:
        """The `minigate train` command of this run (as `python -m minigate.cli`, the same entry point): its preset,
        variant, folder and seed, then `sets` ({field: value}, each a --set: a point's overrides), --steps, `options`
        (more flags: --progress json, --threads 2) and --resume when its folder holds a checkpoint."""
        cmd = [sys.executable, "-m", "minigate.cli", "train", "--preset", self.preset, "--variant", self.variant,
               "--out", str(self.path), "--set", f"seed={self.seed}"]
        cmd += [a for k, v in (sets or {}).items() for a in ("--set", f"{k}={v}")]
        cmd += ["--steps", str(steps)] if steps else []
        return cmd + list(options) + (["--resume"] if self.has_checkpoint else [])
