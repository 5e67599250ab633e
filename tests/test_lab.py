"""`make lab`, the README's first command, as a learner runs it: JupyterLab starts (as root too: a container, a cloud
VM, a CI runner), serves the lessons, and logs no warning that is not the learner's business."""

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request

import pytest
from minigate.course import ROOT

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (shutil.which("make") and (ROOT / ".venv" / "bin" / "jupyter").exists()),
                                 reason="make lab runs from a checkout installed by make (.venv/bin/jupyter)")]


def test_make_lab_serves_the_lessons(tmp_path, free_port):
    port, token = free_port(), "minigate-lab-test"
    log = tmp_path / "lab.log"
    args = f"--no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port={port} --IdentityProvider.token={token}"
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    with open(log, "w") as out:
        server = subprocess.Popen(["make", "--no-print-directory", "lab", f"ARGS={args}"], cwd=ROOT, env=env,
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        listing, deadline = None, time.time() + 90
        while listing is None and time.time() < deadline and server.poll() is None:
            try:
                url = f"http://127.0.0.1:{port}/api/contents/?token={token}"
                listing = json.load(urllib.request.urlopen(url, timeout=2))
            except OSError:
                time.sleep(0.5)
        text = log.read_text()
        assert listing is not None, f"make lab did not serve JupyterLab within 90 s (exit {server.poll()}):\n{text}"
        names = {item["name"] for item in listing["content"]}
        lessons = {p.name for p in (ROOT / "lessons").glob("[0-9][0-9]_*.ipynb")}
        assert lessons and lessons <= names, f"the lab's root lists {sorted(names)}, not the lessons"
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token={token}", timeout=10)
        assert page.status == 200
        text = log.read_text()  # what the learner sees while the lab runs (stopping it kills its helpers: npm ...)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
    assert "Running as root is not recommended" not in text
    noise = [line for line in text.splitlines() if "nbgrader_config" in line or line.startswith(("[W ", "[E "))]
    assert not noise, "make lab logs warnings a learner cannot act on:\n" + "\n".join(noise)
