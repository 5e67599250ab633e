"""RunLock and lock_holder across processes: refusal with the holder named, waiting with a timeout, re-entrancy, a
killed holder, a status check that never takes the lock, and no lock files left behind. And a preset's run folder
(runs.RunFolder): its one layout, its states, the command that trains or resumes it, the one rule for a finished run
and minigate 0.1's layouts refused in one line naming the move."""

import os
import re
import socket
import subprocess
import sys
import time

from pathlib import Path

import pytest

from minigate import runfolder
from minigate.runfolder import LOCK_NAME, OS_LOCK_NAME, RunFolderInUse, RunLock, lock_holder
from minigate.runs import FINISHED, NOT_STARTED, RESUMABLE, RunFolder, finished

STARTED = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
_children = []


@pytest.fixture(autouse=True)
def _no_orphans():
    yield
    while _children:
        p = _children.pop()
        p.kill()
        p.wait()
        p.stdin.close()
        p.stdout.close()


def _child(body: str) -> subprocess.Popen:
    """A Python process that runs `body` with minigate/runfolder.py as `rf`, loaded alone (no torch to import)."""
    code = ("import importlib.util, sys, time\n"
            f"spec = importlib.util.spec_from_file_location('rf', {runfolder.__file__!r})\n"
            "rf = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(rf)\n" + body)
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    _children.append(p)
    return p


def _hold(folder, seconds: float | None = None) -> subprocess.Popen:
    """A process that holds `folder`'s RunLock until its stdin closes (or for `seconds`), once it says so."""
    wait = f"time.sleep({seconds})" if seconds else "sys.stdin.read()"
    p = _child(f"with rf.RunLock({str(folder)!r}):\n    print('held', flush=True)\n    {wait}\n")
    assert p.stdout.readline() == "held\n"
    return p


def _let_go(p: subprocess.Popen):
    p.stdin.close()
    assert p.wait(timeout=10) == 0


def _try(folder) -> tuple[int, str]:
    """Another process's non-blocking RunLock on `folder`: (3 and the message if refused, else 0, output)."""
    p = _child(f"try:\n    rf.RunLock({str(folder)!r}).__enter__()\n"
               "except rf.RunFolderInUse as e:\n    print(e)\n    sys.exit(3)\n")
    out, _ = p.communicate(timeout=10)
    return p.returncode, out


def _no_lock_files(folder) -> bool:
    return not (folder / LOCK_NAME).exists() and not (folder / OS_LOCK_NAME).exists()


def test_another_process_is_refused_at_once_with_the_holder_named_then_takes_it(tmp_path):
    holder = _hold(tmp_path)
    start = time.monotonic()
    with pytest.raises(RunFolderInUse) as refused:
        RunLock(tmp_path).__enter__()
    assert time.monotonic() - start < 0.5  # timeout 0: no waiting
    expected = (re.escape(f"{tmp_path.resolve()} is in use by another run (process {holder.pid} on "
                          f"{socket.gethostname()}, started ") + STARTED +
                re.escape("); wait for it to finish, stop it (Ctrl-C checkpoints it), or choose another --out"))
    assert re.fullmatch(expected, str(refused.value)), str(refused.value)
    _let_go(holder)
    assert _no_lock_files(tmp_path)
    with RunLock(tmp_path):
        assert lock_holder(tmp_path)["pid"] != holder.pid
    assert _no_lock_files(tmp_path)


def test_timeout_waits_for_the_holder_and_gives_up_when_it_keeps_the_folder(tmp_path):
    _hold(tmp_path, seconds=0.5)  # lets go by itself
    start = time.monotonic()
    with RunLock(tmp_path, timeout=10):
        waited = time.monotonic() - start
        assert lock_holder(tmp_path)["pid"] == os.getpid()
    assert 0.3 < waited < 5, waited

    holder = _hold(tmp_path)  # keeps it
    start = time.monotonic()
    with pytest.raises(RunFolderInUse, match=f"in use by another run \\(process {holder.pid} on "):
        RunLock(tmp_path, timeout=1.0).__enter__()
    assert 1.0 <= time.monotonic() - start < 3
    _let_go(holder)
    with RunLock(tmp_path, timeout=1.0):
        pass


def test_lock_holder_names_a_live_holder_only(tmp_path, capsys):
    assert lock_holder(tmp_path) is None and lock_holder(tmp_path / "missing") is None
    holder = _hold(tmp_path)
    info = lock_holder(tmp_path)
    assert info.keys() == {"pid", "host", "started"} and re.fullmatch(STARTED, info["started"])
    assert (info["pid"], info["host"]) == (holder.pid, socket.gethostname())
    _let_go(holder)
    assert lock_holder(tmp_path) is None

    holder = _hold(tmp_path)
    holder.kill()  # SIGKILL: the OS drops its lock, its .lock stays behind
    holder.wait()
    assert (tmp_path / LOCK_NAME).exists() and lock_holder(tmp_path) is None
    capsys.readouterr()
    with RunLock(tmp_path):  # taken over, with a note
        pass
    note = capsys.readouterr().out
    assert f"was left by process {holder.pid} on {socket.gethostname()}" in note and "no longer running" in note
    assert _no_lock_files(tmp_path)

    (tmp_path / LOCK_NAME).write_text("pid=999999\nhost=elsewhere\nstarted=yesterday\n")  # cannot be checked
    assert lock_holder(tmp_path) == {"pid": 999999, "host": "elsewhere", "started": "yesterday"}
    (tmp_path / LOCK_NAME).write_text("pid=oops\n")
    assert lock_holder(tmp_path) is None


def test_lock_holder_never_takes_the_lock(tmp_path):
    """A status check in a tight loop while another process takes and releases the folder without waiting: every
    one of its attempts succeeds (a check that took the lock, even briefly, would make some of them fail)."""
    p = _child(f"print('ready', flush=True)\nend, taken = time.monotonic() + 1.0, 0\n"
               "while time.monotonic() < end:\n"
               f"    with rf.RunLock({str(tmp_path)!r}):\n        taken += 1\n"
               "print(taken, flush=True)\n")
    assert p.stdout.readline() == "ready\n"
    seen, end = set(), time.monotonic() + 5
    while p.poll() is None and time.monotonic() < end:
        seen.add((lock_holder(tmp_path) or {}).get("pid"))
    out, _ = p.communicate(timeout=10)
    assert p.returncode == 0 and out.strip().isdigit() and int(out) > 20, out  # a refusal ends it with a traceback
    assert p.pid in seen, "the check never saw the other process hold the folder: nothing was tested"


def test_reentrant_in_one_process_released_on_any_exit(tmp_path):
    with RunLock(tmp_path):
        with RunLock(tmp_path, timeout=5):  # a no-op in the holder, never a wait or a deadlock
            assert lock_holder(tmp_path)["pid"] == os.getpid()
        code, out = _try(tmp_path)  # the inner exit kept it
        assert code == 3 and f"process {os.getpid()} on" in out
    assert _no_lock_files(tmp_path) and lock_holder(tmp_path) is None
    assert _try(tmp_path) == (0, "")

    with pytest.raises(ValueError, match="boom"), RunLock(tmp_path):
        raise ValueError("boom")
    assert _no_lock_files(tmp_path) and _try(tmp_path) == (0, "")


def test_nesting_is_filelocks_own_count_however_deep(tmp_path):
    """Every `with RunLock(folder)` in one process shares filelock's one lock for the folder (is_singleton): an inner
    one, with or without a timeout, takes a level at once, and only the outermost exit lets go."""
    outer = RunLock(tmp_path)
    with outer:
        start = time.monotonic()
        with RunLock(tmp_path, timeout=5), RunLock(str(tmp_path) + "/.", timeout=0), outer:  # the same folder
            assert outer._lock.lock_counter == 4
        assert time.monotonic() - start < 0.5  # no level waited
        assert outer._lock.lock_counter == 1 and lock_holder(tmp_path)["pid"] == os.getpid()
        assert _try(tmp_path)[0] == 3  # still held, with its `.lock`
        assert (tmp_path / LOCK_NAME).exists()
    assert not outer._lock.is_locked and _no_lock_files(tmp_path)
    assert _try(tmp_path) == (0, "")


def test_a_second_process_is_refused_while_the_holder_nests(tmp_path):
    holder = _child(f"with rf.RunLock({str(tmp_path)!r}), rf.RunLock({str(tmp_path)!r}):\n"
                    "    print('held', flush=True)\n    sys.stdin.read()\n")
    assert holder.stdout.readline() == "held\n"
    code, out = _try(tmp_path)
    assert code == 3 and re.fullmatch(
        re.escape(f"{tmp_path.resolve()} is in use by another run (process {holder.pid} on {socket.gethostname()}, "
                  "started ") + STARTED + re.escape("); wait for it to finish, stop it (Ctrl-C checkpoints it), or "
                                                    "choose another --out\n"), out), out
    _let_go(holder)
    assert _no_lock_files(tmp_path)


def test_alive_asks_psutil_and_a_dead_pid_is_dead():
    assert runfolder._alive(os.getpid())
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # ended and waited for: the OS has forgotten its pid
    assert not runfolder._alive(dead.pid)
    assert not any(runfolder._alive(pid) for pid in (0, -1, 2**31))  # no process has these (0: the kernel's, not one)


@pytest.mark.skipif(os.name == "nt", reason="POSIX zombies")
def test_a_zombie_counts_as_alive_until_its_parent_waits_for_it(tmp_path):
    """As os.kill(pid, 0) did: a process that ended but that its parent has not waited for is still listed by the OS
    (course/grow.py reaps the processes it started before asking)."""
    import psutil

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    end = time.monotonic() + 10
    while psutil.Process(p.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < end
        time.sleep(0.02)
    assert runfolder._alive(p.pid)
    p.wait()
    assert not runfolder._alive(p.pid)


# ── a preset's run folder (minigate.runs) ─────────────────────────────────────────────────────────────────────────────

def _finish(folder: Path):
    """What a finished `minigate train` leaves, as far as the rule reads it: its final model's config."""
    folder.joinpath("model").mkdir(parents=True, exist_ok=True)
    folder.joinpath("model", "config.json").write_text("{}")


def test_a_run_folder_has_one_layout_for_presets_and_study_points():
    run = RunFolder("runs", "code", "headwise", seed=2)
    assert (run.base, run.path, run.log) == (Path("runs/code-seed2"), Path("runs/code-seed2/headwise"),
                                              Path("runs/code-seed2/headwise.log"))
    assert RunFolder("runs", "code-gpu", "none").path == Path("runs/code-gpu-seed0/baseline")  # seed 0, NAMES
    point = RunFolder("runs/study", "code-gpu", "elementwise", seed=1, point="m-gpu")
    assert point.path == Path("runs/study/m-gpu-seed1/elementwise") and point.preset == "code-gpu"
    with pytest.raises(ValueError, match="unknown preset 'cod'; use one of .*code"):
        RunFolder("runs", "cod", "none")
    with pytest.raises(ValueError, match="unknown variant 'baseline'; use one of none, headwise, elementwise"):
        RunFolder("runs", "code", "baseline")


def test_a_run_is_not_started_then_resumable_then_finished(tmp_path):
    run = RunFolder(tmp_path, "ci", "elementwise", seed=3)
    assert run.state() == NOT_STARTED and not run.finished
    run.path.mkdir(parents=True)
    (run.path / "checkpoint.pt").write_bytes(b"")
    assert run.state() == RESUMABLE and run.command()[-1] == "--resume"
    _finish(run.path)
    assert run.state() == FINISHED and run.finished and finished(run.path) and finished(str(run.path))


def test_finished_means_the_final_models_config_is_a_file(tmp_path):
    assert not finished(tmp_path / "absent")
    tmp_path.joinpath("model", "config.json").mkdir(parents=True)  # a folder of that name is not a model
    assert not finished(tmp_path)
    _finish(tmp_path / "run")
    assert finished(tmp_path / "run") and not finished(tmp_path / "run" / "model")


def test_the_command_trains_the_preset_into_the_folder_and_resumes_a_checkpoint(tmp_path):
    run = RunFolder(tmp_path, "code", "none", seed=1, point="2x")
    cmd = run.command("--threads", "2", "--quiet", sets={"steps": 8000, "precision": "bf16"}, steps=20)
    assert cmd[0] == sys.executable and cmd[1:] == [
        "-m", "minigate.cli", "train", "--preset", "code", "--variant", "none", "--out", str(tmp_path / "2x-seed1" /
        "baseline"), "--set", "seed=1", "--set", "steps=8000", "--set", "precision=bf16", "--steps", "20",
        "--threads", "2", "--quiet"]
    run.path.mkdir(parents=True)
    (run.path / "checkpoint.pt").write_bytes(b"")
    assert run.command("--quiet") == cmd[:12] + ["--quiet", "--resume"]  # through --set seed=1


def _moved(old: Path, new: Path) -> str:
    """The whole message, as a pattern: one line naming the move."""
    return "^" + re.escape(f"{old} is in minigate 0.1's layout: move it to {new}") + "$"


def test_minigate_01s_layouts_are_refused_naming_the_move(tmp_path):
    """research's runs/study/<point>/seed<S>/<name> moves as a seed folder, ship's runs/<preset>-<variant> (seed 0)
    as a run folder; once moved (or with the new folder there already) nothing is said."""
    study = RunFolder(tmp_path / "study", "code", "headwise", seed=1, point="2x")
    (tmp_path / "study" / "2x" / "seed1" / "headwise").mkdir(parents=True)
    old, new = tmp_path / "study" / "2x" / "seed1", tmp_path / "study" / "2x-seed1"
    for call in (study.state, study.check):
        with pytest.raises(ValueError, match=_moved(old, new)):
            call()
    old.rename(new)
    assert study.check() is study and study.state() == NOT_STARTED
    shipped = RunFolder(tmp_path, "code", "elementwise")
    _finish(tmp_path / "code-elementwise")
    old, new = tmp_path / "code-elementwise", tmp_path / "code-seed0" / "elementwise"
    with pytest.raises(ValueError, match=_moved(old, new)):
        shipped.state()
    assert RunFolder(tmp_path, "code", "elementwise", seed=1).state() == NOT_STARTED  # ship's runs were seed 0
    _finish(shipped.path)
    assert shipped.state() == FINISHED  # the new folder wins: the old one is no longer taken for this run


def test_the_finished_rule_is_written_once():
    """One definition of a finished run (runs.finished): no other file of the checkout spells it out again."""
    root = Path(__file__).resolve().parents[1]
    rule = '"model" / ' + '"config.json"'  # written in two so that this file does not spell it
    found = [p.relative_to(root).as_posix() for d in ("minigate", "scripts", "research", "tests")
             for p in sorted((root / d).rglob("*.py")) if rule in p.read_text()]
    assert found == ["minigate/runs.py"] and (root / "minigate" / "runs.py").read_text().count(rule) == 1
