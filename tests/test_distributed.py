"""Training across processes: `torchrun --nproc_per_node 2 minigate train` (gloo, CPU) follows the loss curve of a
single-process run with the same global batch, only rank 0 writes, and an interrupted run resumes bitwise."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from minigate import distributed
from minigate.cli import main

pytestmark = pytest.mark.slow  # torchrun processes: two ranks and a single-process run to compare with
# short runs (most of a run here is starting three processes that import torch): a checkpoint every CKPT steps, two
# validation points of a few batches (rank 0 evaluates alone while rank 1 waits), and a warmup that fits in STEPS
STEPS, CKPT = 20, 5
ARGS = ["--preset", "ci", "--variant", "headwise", "--quiet", "--set", f"steps={STEPS}", "--set", "eval_every=10",
        "--set", "eval_batches=4", "--set", f"ckpt_every={CKPT}", "--set", "warmup_steps=5", "--set", "lr=3e-3"]


def torchrun(out, *extra, nproc=2, wait=True):
    """`torchrun --standalone --nproc_per_node N -m minigate.cli train ...`, one thread per process."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           "-m", "minigate.cli", "train", *ARGS, "--out", str(out), *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if not wait:
        return proc
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    return stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One process, two processes, and two processes stopped by SIGTERM after a checkpoint, then resumed."""
    root = tmp_path_factory.mktemp("ddp")
    assert main(["train", *ARGS, "--out", str(root / "one"), "--threads", "1"]) == 0
    stdout = torchrun(root / "two")
    stop = torchrun(root / "stopped", wait=False)
    deadline = time.monotonic() + 300  # a guard against a hang: two busy cores can take minutes
    while not (root / "stopped" / "checkpoint.pt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.send_signal(signal.SIGTERM)  # torchrun passes it on to both workers
    stop_out, stop_err = stop.communicate(timeout=120)
    stopped_at = torch.load(root / "stopped" / "checkpoint.pt", weights_only=True)["step"]
    resumed = torchrun(root / "stopped", "--resume")
    return dict(root=root, stdout=stdout, stop_out=stop_out, stop_err=stop_err, stopped_at=stopped_at,
                resumed=resumed)


def history(folder):
    return json.loads((folder / "history.json").read_text())


def test_two_processes_follow_the_single_process_loss_curve(runs):
    one, two = history(runs["root"] / "one"), history(runs["root"] / "two")
    assert one["step"] == two["step"] == list(range(1, STEPS + 1))
    diff = max(abs(a - b) for a, b in zip(one["loss"], two["loss"], strict=True))
    assert diff < 1e-5, f"largest loss difference {diff}"
    assert max(abs(a - b) for a, b in zip(one["val_loss"], two["val_loss"], strict=True)) < 1e-5
    assert one["info"]["processes"] == 1 and two["info"]["processes"] == 2
    assert one["loss"][-1] < one["loss"][0] - 0.5  # it trained: the comparison is not between two flat lines


def test_rank_zero_alone_writes_and_speaks(runs):
    out = runs["stdout"]
    assert out.count("done: validation loss") == 1 and "data-parallel on 2 processes (gloo)" in out
    files = sorted(p.name for p in (runs["root"] / "two").iterdir())
    assert files == ["checkpoint.pt", "history.json", "model", "run.json"], files  # no temp files, no lock left


def test_stopped_run_resumes_bitwise(runs):
    assert CKPT <= runs["stopped_at"] < STEPS, "the SIGTERM came after the run ended: nothing was tested"
    assert "continue with: minigate train" in runs["stop_out"]
    assert f"resuming {runs['root'] / 'stopped'} at step {runs['stopped_at']}" in runs["resumed"]
    a = load_file(runs["root"] / "two" / "model" / "model.safetensors")
    b = load_file(runs["root"] / "stopped" / "model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert history(runs["root"] / "two")["loss"] == history(runs["root"] / "stopped")["loss"]


def test_a_batch_that_does_not_split_is_refused():
    with pytest.raises(ValueError, match="does not split over 3 processes"):
        distributed.check_batch(16, distributed.Ranks(0, 3))
    rows = torch.arange(8)
    assert [distributed.my_rows(rows, distributed.Ranks(r, 2)).tolist() for r in (0, 1)] == [[0, 1, 2, 3],
                                                                                              [4, 5, 6, 7]]


def test_a_run_rank_zero_cannot_start_stops_every_rank_with_one_error(runs):
    """Into a folder with a checkpoint, without --resume: rank 0 refuses it in one line; rank 1 stops instead of
    waiting for it, with no traceback of its own."""
    proc = torchrun(runs["root"] / "two", wait=False)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert stderr.count("already has a checkpoint; add --resume") == 1 and "[rank1]" not in stderr, stderr[-2000:]


def test_resuming_on_another_number_of_processes_says_it_is_not_bitwise(runs, tmp_path):
    import shutil

    shutil.copytree(runs["root"] / "two", tmp_path / "two")
    with pytest.warns(UserWarning, match="resuming on 1 process.* checkpointed on 2: .* not bitwise"):
        assert main(["train", *ARGS, "--out", str(tmp_path / "two"), "--resume", "--threads", "1"]) == 0
    assert history(tmp_path / "two")["info"]["processes"] == 1
