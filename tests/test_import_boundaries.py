"""Imports point one way, between the top folders and between monitor/'s concept folders.

Every import statement of every module is read (those inside functions too, where lazy imports
hide), relative ones resolved.

- **Floors**: hooks/ <- monitor/ <- web/ <- the app and commands (hyperwatch/*.py) and the trainer.
  Each ``hyperwatch.X`` a module names must sit on its own floor or below.
- **monitor/'s folders** (monitor/README.md draws them): ``api`` -> ``read`` -> ``thresholds`` ->
  ``store`` -> ``core``; ``alerting`` -> ``read`` / ``thresholds`` / ``store``; ``analysis`` imports
  none of them; ``cli`` drives anything but the API; ``processes`` stands alone. Nothing below
  ``api`` imports it.
- **Nothing in monitor/ imports the package that assembles it**: not ``hyperwatch.app``, ``.cli``,
  ``.serve``, and no name of the ``hyperwatch`` root (its ``__version__``: the app is handed it).
- monitor/ keeps no modules at its top: a new module goes in the folder of its concept, and a new
  folder gets its row in :data:`ALLOWED` here (and in monitor/README.md).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
FLOORS = {"hooks": 0, "monitor": 1, "web": 2}
TOP = 3  # hyperwatch/app.py, cli.py, serve.py; and the trainer, which nothing here may import
TOP_MODULES = {p.stem for p in (ROOT / "hyperwatch").glob("*.py") if p.stem not in ("__init__", "__main__")}

_BELOW_API = {"core", "store", "analysis", "thresholds", "read", "alerting"}
ALLOWED: dict[str, set[str]] = {
    "core": {"core"},
    "store": {"core", "store"},
    "analysis": {"analysis"},
    "thresholds": {"core", "store", "thresholds"},
    "read": {"core", "store", "analysis", "thresholds", "read"},
    "alerting": _BELOW_API,
    "api": _BELOW_API | {"api"},
    "cli": _BELOW_API | {"cli"},
    "processes": {"processes"},
}
"""monitor/'s folder -> the monitor/ folders its modules may import."""


def _imported(path: Path, package: str) -> list[tuple[int, str]]:
    """``(line, dotted module)`` for each import in ``path``; ``package`` is the module's own package.
    ``from pkg import name`` is reported as ``pkg.name`` (``name`` may be a module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def _floor(module: str) -> int | None:
    """The floor of a ``hyperwatch.*`` module; None for non-hyperwatch modules. A name of the root
    (``hyperwatch.__version__``) is the assembling package's: top."""
    parts = module.split(".")
    if parts[0] != "hyperwatch" or len(parts) == 1:
        return None
    if parts[1] in FLOORS:
        return FLOORS[parts[1]]
    return TOP  # hyperwatch.app / .cli / .serve, the trainer, or a root name such as __version__


def _package(path: Path) -> str:
    return ".".join(("hyperwatch", *path.relative_to(ROOT).parent.parts))


def upward_imports(folder: str) -> list[str]:
    floor = FLOORS[folder]
    wrong = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for line, module in _imported(path, _package(path)):
            target = _floor(module)
            if target is not None and target > floor:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return wrong


def _concept(module: str) -> str | None:
    """``hyperwatch.monitor.read.lines.x`` -> ``read``; None outside monitor/'s folders."""
    parts = module.split(".")
    if parts[:2] != ["hyperwatch", "monitor"] or len(parts) < 3:
        return None
    return parts[2]


def crossing_imports(monitor: Path) -> list[str]:
    """Imports between monitor/'s folders that :data:`ALLOWED` does not allow."""
    wrong = []
    for path in sorted(monitor.rglob("*.py")):
        rel = path.relative_to(monitor)
        if len(rel.parts) == 1:
            continue  # monitor/__init__.py: a docstring (test_no_module_at_monitor_top)
        own = rel.parts[0]
        allowed = ALLOWED.get(own)
        if allowed is None:
            wrong.append(f"monitor/{own}/ is not in ALLOWED: give it its row (which folders it may import)")
            continue
        package = ".".join(("hyperwatch", "monitor", *rel.parent.parts))
        for line, module in _imported(path, package):
            target = _concept(module)
            if target is not None and target not in allowed and (monitor / target).is_dir():
                wrong.append(f"monitor/{rel}:{line} imports {module} ({own} may import {sorted(allowed)})")
    return wrong


@pytest.mark.parametrize("folder", sorted(FLOORS))
def test_no_import_points_up(folder: str) -> None:
    assert upward_imports(folder) == [], "move the importing code up, or the imported helper down"


def test_monitor_folders_import_one_way() -> None:
    assert crossing_imports(ROOT / "monitor") == [], "see monitor/README.md: which folder holds what"


def test_no_module_at_monitor_top() -> None:
    top = sorted(p.name for p in (ROOT / "monitor").glob("*.py"))
    assert top == ["__init__.py"], f"monitor/ holds {top}: put each module in the folder of its concept"
    body = ast.parse((ROOT / "monitor" / "__init__.py").read_text()).body
    assert all(isinstance(s, ast.Expr) for s in body), "monitor/__init__.py holds its docstring only"
    folders = sorted(p.name for p in (ROOT / "monitor").iterdir() if (p / "__init__.py").is_file())
    assert folders == sorted(ALLOWED), "each folder of monitor/ has its row in ALLOWED, and only those"


def test_the_scan_sees_an_upward_import(tmp_path: Path) -> None:
    """The scanner itself: a lazy import of the app inside a function, a relative one, and the root's
    ``__version__`` are all found above monitor/."""
    source = (
        "def f():\n    from hyperwatch.app import create_app\n\nfrom ...web import router\nimport hyperwatch.serve\n"
        "from hyperwatch import __version__\n"
    )
    path = tmp_path / "mod.py"
    path.write_text(source)
    found = sorted((line, _floor(m)) for line, m in _imported(path, "hyperwatch.monitor.api"))
    assert found == [(2, TOP), (4, FLOORS["web"]), (5, TOP), (6, TOP)]
    assert "app" in TOP_MODULES and "serve" in TOP_MODULES


def test_the_scan_sees_a_crossing_import(tmp_path: Path) -> None:
    """A store module that imports the read layer (lazily, and relatively) is refused; a new folder
    without a row is named."""
    monitor = tmp_path / "monitor"
    for folder in ("store", "read", "newthing"):
        (monitor / folder).mkdir(parents=True)
        (monitor / folder / "__init__.py").write_text("")
    (monitor / "store" / "x.py").write_text(
        "def f():\n    from hyperwatch.monitor.read.lines import group_runs\n\nfrom ..read import reader\n"
        "from hyperwatch.monitor.core.errors import MonitorError\n"
    )
    wrong = crossing_imports(monitor)
    assert sorted(w.split(" (")[0] for w in wrong if w.startswith("monitor/store")) == [
        "monitor/store/x.py:2 imports hyperwatch.monitor.read.lines.group_runs",
        "monitor/store/x.py:4 imports hyperwatch.monitor.read.reader",
    ]
    assert any("monitor/newthing/ is not in ALLOWED" in w for w in wrong)
