"""The training benchmark's CPU settings contenders: each runs in a process of its own and reports rates."""

import json
import subprocess
import sys

import pytest

from minigate.bench import train as bench_train


def test_settings_cover_the_allocator_precision_and_compile():
    assert set(bench_train.SETTINGS.values()) == {(False, "fp32", False), (True, "fp32", False),
                                                   (True, "bf16", False), (True, "fp32", True)}


@pytest.mark.parametrize("name", ["fp32, glibc's default allocator", "bf16 autocast, tuned allocator"])
def test_a_settings_worker_reports_its_first_step_and_the_rest(name):
    out = subprocess.run([sys.executable, "-m", "minigate.bench", "train", "--worker", name, "--preset", "ci",
                          "--steps", "3", "--threads", "1"], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["first_s"] > 0 and len(got["rates"]) == 2 and all(r > 0 for r in got["rates"])


def test_an_unknown_preset_is_one_line_of_error():
    out = subprocess.run([sys.executable, "-m", "minigate.bench", "train", "--preset", "nope"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "unknown --preset 'nope'" in out.stderr
