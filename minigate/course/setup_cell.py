# ruff: noqa: E401
"""The set-up cell of every notebook (a code cell tagged `setup`), kept here as code so that it reads, and lints, as
what it is. header.SETUP is this file below the line `# ── cell ──`, with __REF__ and __REPOSITORY__ filled in from
header.py. Nothing imports this module."""
# ── cell ──
# Set-up, safe to run twice. In Colab: fetch the course at __REF__ into ./minigate (/content/minigate),
# install minigate from it (with its data and the course extra) and keep Colab's own torch. Locally (`make lab`), it
# does nothing.
import sys

if "google.colab" in sys.modules:
    import importlib, importlib.metadata, os, subprocess

    def import_minigate():  # the installed package, or None (a bare ./minigate folder imports as an empty namespace)
        importlib.invalidate_caches()
        if getattr(sys.modules.get("minigate"), "__file__", "") is None:
            del sys.modules["minigate"]
        try:
            import minigate
        except ImportError:
            return None
        return minigate if minigate.__file__ else None

    REF = os.environ.get("MINIGATE_REF", "__REF__")  # set MINIGATE_REF to try another tag, branch or commit
    url, clone = "https://github.com/__REPOSITORY__", os.path.abspath("minigate")
    if import_minigate() is None:
        if not os.path.isfile(os.path.join(clone, "pyproject.toml")):
            for cmd in (["init", "-q", clone], ["-C", clone, "fetch", "-q", "--depth", "1", url, REF],
                        ["-C", clone, "checkout", "-q", "FETCH_HEAD"]):
                subprocess.run(["git", *cmd], check=True)
        torch_pin = f"torch=={importlib.metadata.version('torch')}"  # Colab's torch, left as it is
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", clone + "[course]", torch_pin], check=True)
    minigate = import_minigate()
    assert minigate is not None, f"minigate did not install from {clone}: see the messages above"
    print(f"minigate {minigate.__version__} ({REF}) from {url}; data in {minigate.resources.DATA_DIR}; "
          f"torch {importlib.metadata.version('torch')}")
