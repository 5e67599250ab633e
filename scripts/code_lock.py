"""Write data/python-code.lock.json: the pinned wheels of the python-code corpus (minigate/data/code_wheels.py).

    python -m scripts.code_lock            # the list below, each wheel fetched with pip, hashed and its licence read

The list was chosen before any model trained on it, by these criteria (data/README.md states them too):
- pure-Python wheels (py3-none-any) under permissive licences (MIT, BSD, Apache-2.0, PSF, public domain);
- a mix like the scientific Python install the corpus used to be read from: general-purpose libraries of the
  standard library's kind, numerical and machine-learning code, web and data code, and developer tooling;
- enough bytes for the largest recipe that reads it (code-gpu: about 49M tokens), with no wheel above
  per_wheel_max_bytes (8% of the cap), so no one package (transformers alone holds 54 MB of .py) dominates.
Changing the list changes the corpus's SHA-256 and so every number trained on it: it is not tuned for an effect.
"""

from __future__ import annotations

import email
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from minigate.data.code_wheels import LOCK_FILE, _sha256
from minigate.resources import DATA_DIR

MAX_BYTES = 150_000_000  # the corpus's cap (as the earlier python-code's)
PER_WHEEL = 12_000_000  # 8% of the cap
WHEELS = {  # name==version: kind
    "general": ["attrs==26.1.0", "more-itertools==11.2.1", "future==1.0.0", "pip==26.3", "setuptools==84.2.1",
                "twisted==26.10.0", "requests==2.34.2", "urllib3==2.8.0", "jinja2==3.1.6", "rich==15.0.0",
                "prompt-toolkit==3.0.53", "pydantic==2.14.4"],
    "numerical": ["sympy==1.14.0", "mpmath==1.4.1", "networkx==3.6.1", "jax==0.10.2", "keras==3.15.1",
                  "dask==2026.8.0", "xarray==2026.9.0", "pint==0.25.3", "pymc==5.28.5", "pyro-ppl==1.9.2",
                  "lightning==2.6.6", "torch-geometric==2.8.1", "transformers==5.24.0", "datasets==5.2.0",
                  "nltk==3.10.4", "bokeh==3.9.2"],
    "web": ["django==5.2.19", "flask==3.1.3", "werkzeug==3.1.9", "sqlalchemy==2.1.9", "alembic==1.20.1",
            "celery==5.7.0", "scrapy==2.19.0", "botocore==1.44.8", "sqlglot==30.30.0", "openpyxl==3.1.5"],
    "tooling": ["sphinx==9.0.4", "pygments==2.21.0", "jedi==0.20.1", "parso==0.8.7", "mypy==2.4.1", "pytest==9.2.0",
                "ipython==9.18.1", "textual==8.2.8", "fonttools==4.68.0"],
}


def licence(whl: Path) -> str:
    with zipfile.ZipFile(whl) as z:
        meta = email.message_from_bytes(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))))
    if meta.get("License-Expression"):
        return meta["License-Expression"]
    classifiers = [c.split(" :: ")[-1] for c in meta.get_all("Classifier", []) if c.startswith("License ::")]
    text = (meta.get("License") or "").strip()
    return ", ".join(classifiers) or (text.splitlines()[0] if text else "?")


def main() -> int:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, pins in WHEELS.items():
            for pin in pins:
                subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                                "--platform", "any", "--python-version", "3.11", "--implementation", "py", "--abi",
                                "none", "--ignore-requires-python", "-q", "-d", tmp, pin], check=True)
                name, version = pin.split("==")
                whl = next(p for p in Path(tmp).glob("*.whl") if p.name.lower().replace("_", "-").startswith(
                    f"{name.lower()}-{version}-") and "none-any" in p.name)
                rows.append(dict(name=name, version=version, file=whl.name, sha256=_sha256(whl),
                                 license=licence(whl), kind=kind))
    lock = {"about": "the python-code corpus: minigate/data/code_wheels.py reads these wheels; scripts/code_lock.py "
                     "wrote this file", "max_bytes": MAX_BYTES, "per_wheel_max_bytes": PER_WHEEL, "wheels": rows}
    (DATA_DIR / LOCK_FILE).write_text(json.dumps(lock, indent=1) + "\n")
    for r in rows:
        print(f"{r['kind']:10s} {r['name']:18s} {r['version']:12s} {r['license']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
