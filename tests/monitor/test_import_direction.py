"""Imports point down only: hooks/ <- monitor/ <- web/ <- the app and commands (hyperwatch/*.py).

Every import statement of every module under hooks/, monitor/ and web/ is read (those inside
functions too, where lazy imports hide), relative ones resolved, and each ``hyperwatch.X`` it names
must sit on the module's own floor or below. The package root ``hyperwatch`` itself (its
``__version__``) imports nothing and is allowed everywhere; ``trainer`` is above all three.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
FLOORS = {"hooks": 0, "monitor": 1, "web": 2}
TOP = 3  # hyperwatch/app.py, cli.py, serve.py; and the trainer, which nothing here may import
TOP_MODULES = {p.stem for p in (ROOT / "hyperwatch").glob("*.py") if p.stem not in ("__init__", "__main__")}


def _imported(path: Path, package: str) -> list[tuple[int, str]]:
    """``(line, dotted module)`` for each import in ``path``; ``package`` is the module's own package."""
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
            if module == "hyperwatch":  # ``from hyperwatch import X``: X may be a subpackage
                found += [(node.lineno, f"hyperwatch.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, module))
    return found


def _floor(module: str) -> int | None:
    """The floor of a ``hyperwatch.*`` module; None for the root's own names and non-hyperwatch modules."""
    parts = module.split(".")
    if parts[0] != "hyperwatch" or len(parts) == 1:
        return None
    if parts[1] in FLOORS:
        return FLOORS[parts[1]]
    if parts[1] in TOP_MODULES or parts[1] == "trainer":
        return TOP
    return None  # a name of the root package (``__version__``)


def upward_imports(folder: str) -> list[str]:
    floor = FLOORS[folder]
    wrong = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        rel = path.relative_to(ROOT)
        package = ".".join(("hyperwatch", *rel.parent.parts))
        for line, module in _imported(path, package):
            target = _floor(module)
            if target is not None and target > floor:
                wrong.append(f"{rel}:{line} imports {module}")
    return wrong


@pytest.mark.parametrize("folder", sorted(FLOORS))
def test_no_import_points_up(folder: str) -> None:
    assert upward_imports(folder) == [], "move the importing code up, or the imported helper down"


def test_the_scan_sees_an_upward_import(tmp_path: Path) -> None:
    """The scanner itself: a lazy import of the app inside a function, and a relative one, are found."""
    source = (
        "def f():\n    from hyperwatch.app import create_app\n\nfrom ...web import router\nimport hyperwatch.serve\n"
    )
    path = tmp_path / "mod.py"
    path.write_text(source)
    found = sorted((line, _floor(m)) for line, m in _imported(path, "hyperwatch.monitor.api"))
    assert found == [(2, TOP), (4, FLOORS["web"]), (5, TOP)]
    assert "app" in TOP_MODULES and "serve" in TOP_MODULES
