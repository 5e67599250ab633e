"""The explorers where learners see them: JupyterLab in a headless Chromium, driven by selenium.

One notebook builds the four explorers of lessons 01, 04, 05 and 06 on the shipped models, as the lessons do, and runs
in JupyterLab. Each must render as a live widget (not the static PNG a viewer without a kernel shows), redraw its
picture when a control changes, and show the picture at the size it was drawn for; no cell may fail. Skips, saying
why, where Chromium, ChromeDriver or selenium is missing (.ci/run installs Debian's chromium and chromium-driver).
MINIGATE_BROWSER_OUT=<folder> keeps a screenshot of each explorer there."""

import os
import shutil
import subprocess
import sys
import time
import urllib.request

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from minigate.course import widgets

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
CHROMEDRIVER = shutil.which("chromedriver") or (os.path.exists("/usr/bin/chromedriver") and "/usr/bin/chromedriver")
REQUIRED = os.environ.get("MINIGATE_REQUIRE_BROWSER") == "1"  # .ci/run sets it where it has the browser: never skip
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER) and not REQUIRED, reason="no browser here: the "
                                 "widget test needs Chromium and ChromeDriver (Debian: apt-get install chromium "
                                 "chromium-driver)")]

SETUP = """import torch

import minigate
from minigate.course import widgets
from minigate.ablation import chunks
from minigate.data import CopyTokenizer, copy_task, encode, get_tokenizer, load_documents
from minigate.course import release

torch.manual_seed(0)
copy = {name: release.shipped(f"copy-{name}") for name in ("baseline", "headwise", "elementwise")}
text = {f"text-{gate}": release.shipped(f"text-{gate}") for gate in ("headwise", "elementwise")}
code = {f"code-{name}": release.shipped(f"code-{name}") for name in ("baseline", "headwise", "elementwise")}
ctok, rows = CopyTokenizer(), copy_task(64, seed=3)
tok = get_tokenizer()
prose = chunks(encode(load_documents("wikitext-2")[1], tok.tok), n_chunks=16, chunk_len=511)  # held-out windows"""
EXPLORERS = {  # as lessons 01, 04, 05 and 06 build them; the control the test changes
    "attention": ('widgets.attention_explorer({"copy-baseline": copy["baseline"]}, ctok, ctok.decode(rows[0, 1:64]), '
                  'layer=0, head=3)', "head"),
    "models_attention": ("widgets.models_attention_explorer(code, prose, tok, heads={'code-baseline': (0, 2), "
                         "'code-headwise': (1, 1), 'code-elementwise': (3, 0)})", "code-baseline"),
    "gate": ('widgets.gate_explorer(text, get_tokenizer(), "def add(a, b):\\n    return a + b  # The capital of '
             'France is Paris.")', "head"),
    "clamp": ('widgets.clamp_explorer({n: copy[n] for n in ("headwise", "elementwise")}, ctok, rows[:16], '
              'prompt=ctok.decode(rows[0, 1:34].tolist()), max_new_tokens=8)', "layer"),
}
DONE = "ALL CELLS RAN"
CHROMIUM_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1400,1000", "--force-device-scale-factor=1")

# JavaScript run in the page (window.jupyterapp: JupyterLab started with expose_app_in_browser)
NOTEBOOK = "const nb = window.jupyterapp && Array.from(window.jupyterapp.shell.widgets('main')).find(" \
           "w => w.context && w.context.path === 'explorers.ipynb');"
KERNEL_IDLE = NOTEBOOK + "return !!(nb && nb.sessionContext && nb.sessionContext.session && " \
                         "nb.sessionContext.session.kernel && nb.sessionContext.session.kernel.status === 'idle');"
OUTPUTS = NOTEBOOK + "return nb.content.widgets.map(c => c.model.type === 'code' ? c.model.outputs.toJSON() : []);"
PICTURE = NOTEBOOK + """
const area = nb.content.widgets[arguments[0]].node.querySelector('.jp-OutputArea');
const img = area.querySelector('img.jupyter-widget-image, img.widget-image');
const status = area.querySelector('.widget-html-content');
let hash = '';
if (img && img.complete && img.naturalWidth > 0) {
  const canvas = document.createElement('canvas');
  canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
  canvas.getContext('2d').drawImage(img, 0, 0);
  const data = canvas.toDataURL();
  let h = 0;
  for (let i = 0; i < data.length; i++) h = (h * 31 + data.charCodeAt(i)) >>> 0;
  hash = data.length + ':' + h;
}
return {live: !!area.querySelector('.jupyter-widgets'), static: !!area.querySelector('.jp-RenderedImage'),
        text: area.innerText, hash: hash, natural: img ? img.naturalWidth : 0, shown: img ? img.clientWidth : 0,
        status: status ? status.innerText : ''};"""
SELECT = NOTEBOOK + """
const area = nb.content.widgets[arguments[0]].node.querySelector('.jp-OutputArea');
return [...area.querySelectorAll('.widget-dropdown')].find(
  d => d.querySelector('label').innerText.trim() === arguments[1]).querySelector('select');"""


def _wait(predicate, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture(scope="module")
def lab(tmp_path_factory, free_port):
    """JupyterLab on a free local port, serving a folder with the explorers notebook; yields (url, folder)."""
    folder = tmp_path_factory.mktemp("lab")
    cells = [new_code_cell(SETUP), *(new_code_cell(code) for code, _ in EXPLORERS.values()),
             new_code_cell(f"print({DONE!r})")]
    nbformat.write(new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                      "language": "python"}}),
                   folder / "explorers.ipynb")
    port, token = free_port(), "minigate-browser-test"
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(folder / ".config"), "JUPYTER_RUNTIME_DIR": str(folder / ".run"),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    log = open(folder / "lab.log", "w")  # noqa: SIM115 (closed below)
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={folder}",
         "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)

    def up():
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2).status == 200
        except OSError:
            assert server.poll() is None, (folder / "lab.log").read_text()[-3000:]
            return False

    try:
        _wait(up, 90, "JupyterLab to start")
        yield f"http://127.0.0.1:{port}/lab/tree/explorers.ipynb?token={token}", folder
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture(scope="module")
def browser(lab, tmp_path_factory):
    assert CHROMIUM and CHROMEDRIVER, "MINIGATE_REQUIRE_BROWSER=1, but no chromium and chromedriver on PATH"
    if REQUIRED:
        from selenium import webdriver
    else:
        webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed: pip install -e .[dev]")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def ran(lab, browser):
    """The notebook opened in JupyterLab and run with Run All: (driver, every cell's outputs)."""
    from selenium.webdriver.common.by import By

    url, folder = lab
    browser.get(url)
    _wait(lambda: browser.execute_script(KERNEL_IDLE), 120, "the notebook and its kernel")
    # a click gives the notebook the focus, which makes it the current one that Run All runs
    browser.find_element(By.CSS_SELECTOR, ".jp-NotebookPanel .jp-Cell .jp-InputPrompt").click()
    _wait(lambda: browser.execute_script("return !!window.jupyterapp.shell.currentWidget"), 30, "the notebook's focus")
    browser.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells');")

    def finished():
        outputs = browser.execute_script(OUTPUTS)
        done = any(DONE in o.get("text", "") for o in outputs[-1])
        failed = any(o.get("output_type") == "error" for cell in outputs for o in cell)
        return outputs if done or failed else None

    return browser, _wait(finished, 240, f"the notebook to run (log: {folder / 'lab.log'})")


def test_every_cell_runs(ran):
    _, outputs = ran
    errors = [f"cell {i}: {o['ename']}: {o['evalue']}" for i, cell in enumerate(outputs) for o in cell
              if o.get("output_type") == "error"]
    assert not errors, errors
    assert any(DONE in o.get("text", "") for o in outputs[-1])


@pytest.mark.parametrize("index, name", [(i + 1, name) for i, name in enumerate(EXPLORERS)])
def test_each_explorer_is_live_redraws_and_is_crisp(ran, index, name):
    from selenium.webdriver.support.ui import Select

    driver, _ = ran
    before = _wait(lambda: (p := driver.execute_script(PICTURE, index))["hash"] and p, 60, f"the {name} picture")
    assert before["live"] and not before["static"], f"the {name} explorer shows the static fallback: {before}"
    assert "Error displaying widget" not in before["text"]
    # drawn for its size: PIXEL_RATIO picture pixels per CSS pixel (fewer CSS pixels only where the cell is narrower)
    assert before["shown"] == round(before["natural"] / widgets.PIXEL_RATIO), before

    select = Select(driver.execute_script(SELECT, index, EXPLORERS[name][1]))
    current = select.first_selected_option.text
    select.select_by_visible_text(next(o.text for o in select.options if o.text != current))
    after = _wait(lambda: (p := driver.execute_script(PICTURE, index))["hash"] not in ("", before["hash"]) and p,
                  60, f"the {name} picture to redraw after {EXPLORERS[name][1]} changed")
    assert after["status"] == "" and after["live"]
    assert after["shown"] == round(after["natural"] / widgets.PIXEL_RATIO)
    if os.environ.get("MINIGATE_BROWSER_OUT"):  # a folder: keep a screenshot of each explorer, to look at
        area = driver.execute_script(NOTEBOOK + "return nb.content.widgets[arguments[0]].node.querySelector("
                                     "'.jp-OutputArea');", index)
        driver.execute_script("arguments[0].scrollIntoView();", area)
        area.screenshot(os.path.join(os.environ["MINIGATE_BROWSER_OUT"], f"{name}_explorer.png"))
