"""The package's layers: the library at the bottom, never importing course or benchmark code, and no cycles.

    python tests/test_layout.py        # prints the import layers (layer 0 imports no other minigate module)
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "minigate"
ABOVE_THE_LIBRARY = ("minigate.course", "minigate.bench")


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """{module: the minigate modules it imports}, read from the source: imports inside functions count too."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: `from ..x import y` inside package a.b is a.x
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                for a in node.names:  # `from . import data` imports the module minigate.data
                    deps.add(f"{base}.{a.name}" if f"{base}.{a.name}" in files else base)
        graph[name] = {d for d in deps if d in files and d != name}
    return graph


def layers(graph: dict[str, set[str]]) -> dict[str, int]:
    """Layer 0: imports no minigate module; layer n: imports something of layer n - 1 and nothing higher.
    A ValueError naming the cycle if there is one."""
    level: dict[str, int] = {}

    def visit(m, path):
        if m in path:
            raise ValueError("import cycle: " + " -> ".join(path[path.index(m):] + [m]))
        if m not in level:
            level[m] = 1 + max((visit(d, path + [m]) for d in graph[m]), default=-1)
        return level[m]

    for m in graph:
        visit(m, [])
    return level


def library_modules(root: Path = PACKAGE) -> list[str]:
    """Every module of the package below the course and the benchmarks, from the files on disk: a new one is covered
    as soon as it exists."""
    return sorted(m for m in import_graph(root) if not m.startswith(ABOVE_THE_LIBRARY))


LIBRARY = library_modules()


def test_the_library_list_is_read_from_the_package():
    """The package itself, modules of its own and the modules of a subpackage are all listed."""
    assert {"minigate", "minigate.run", "minigate.checkpoint", "minigate.presets", "minigate.measure",
            "minigate.data", "minigate.data.tasks"} <= set(LIBRARY)
    assert not [m for m in LIBRARY if m.startswith(ABOVE_THE_LIBRARY)]


def test_the_import_graph_has_no_cycles():
    assert layers(import_graph())  # raises on a cycle


def test_the_library_never_imports_course_or_benchmark_code_even_lazily():
    graph = import_graph()
    for name in LIBRARY:
        seen, todo = set(), [name]
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo += graph[m]
        assert not [m for m in seen if m.startswith(ABOVE_THE_LIBRARY)], name


def test_the_library_runs_no_process_and_holds_no_release_pipeline():
    """The library measures and trains in-process: no subprocess (of its own CLI or anything else), and shipping
    models (training, rewriting docs, re-running lessons) is scripts/ship.py's, outside the package. One process is
    allowed, as datasets.load_dataset downloads: pip, fetching python-code's pinned wheels (issue 57 asks for pip, which
    honours the user's index, proxy and PIP_FIND_LINKS), and nothing else."""
    for name in LIBRARY:
        path = PACKAGE.joinpath(*name.split(".")[1:])
        source = (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).read_text()
        assert "nbclient" not in source, name
        if name == "minigate.data.code_wheels":
            assert source.count("subprocess.") == 1 and '"-m", "pip", "download"' in source, name
            continue
        assert "subprocess" not in source, name
    assert (PACKAGE.parent / "scripts" / "ship.py").is_file() and not (PACKAGE / "ship.py").exists()


def test_lessons_import_the_library_and_course_code_never_a_benchmark_or_a_script():
    """A lesson measures with minigate.measure and quotes the paper from the library: it imports no benchmark
    (minigate.bench) and nothing of scripts/ (the release pipeline)."""
    import json
    import re

    for nb in sorted((PACKAGE.parent / "solutions").glob("0*.ipynb")):
        code = "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code")
        imports = [line for line in code.splitlines() if line.lstrip().startswith(("import ", "from "))]
        assert not [line for line in imports if "minigate.bench" in line or "scripts" in line], nb.name
        assert not [line for line in imports if re.match(r"from minigate import .*\bship\b", line)], nb.name


def test_benchmarks_and_course_code_never_import_each_other():
    for name, deps in import_graph().items():
        for this, other in (("minigate.bench", "minigate.course"), ("minigate.course", "minigate.bench")):
            if name.startswith(this):
                assert not [d for d in deps if d.startswith(other)], name


@pytest.mark.slow
def test_importing_a_library_module_loads_no_course_or_benchmark_module():
    """Each library module imported in turn in one fresh process: whatever course or benchmark module appears after an
    import is blamed on that import (so, on the first library module that loads it)."""
    code = (f"import importlib, sys\n"
            f"for name in {LIBRARY!r}:\n"
            f"    importlib.import_module(name)\n"
            f"    loaded = sorted(m for m in sys.modules if m.startswith({ABOVE_THE_LIBRARY!r}))\n"
            f"    if loaded:\n"
            f"        print(name, 'loads', loaded)\n"
            f"        break\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "", run.stdout


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE
    graph = import_graph(root)
    by_layer: dict[int, list[str]] = {}
    for m, n in layers(graph).items():
        by_layer.setdefault(n, []).append(m)
    for n in sorted(by_layer):
        print(f"layer {n}: " + ", ".join(sorted(by_layer[n])))
