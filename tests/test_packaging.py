"""What ``pip install hyperwatch`` puts into someone's training environment.

The slow test builds the wheel from a copy of the source tree, checks its metadata and its
top-level names, then installs it (offline, ``--no-index``) into a fresh virtual environment that
already holds torch, and shows that torch is untouched, that ``import hyperwatch.hooks`` works and
attaches to a model with a JSONL folder sink, and that fastapi and sqlalchemy are not importable.

How the fresh environment "already holds torch" cheaply and honestly: it is a new ``python -m
venv --without-pip`` (driven by this environment's pip through ``--python``) whose site-packages
receives links to this development environment's installed torch
2.13.0 and its runtime dependencies (their package folders *and* their ``.dist-info``), so pip
sees an installed torch exactly as in a user's environment, while copying ~1 GB of torch would
cost minutes. Because the install is ``--no-index`` with only our wheel available, pip cannot
fetch another torch: had the wheel demanded one, the install would fail, never touch the links.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
SERVER_ONLY = {"fastapi", "sqlalchemy", "psycopg", "alembic", "plotly", "scipy", "uvicorn", "tokenizers"}


def base_requirements(requires: list[str]) -> list[Requirement]:
    """Requirements that apply without any extra."""
    out = []
    for raw in requires:
        req = Requirement(raw)
        if req.marker is not None and "extra" in str(req.marker):
            continue
        out.append(req)
    return out


def check_base(reqs: list[Requirement]) -> None:
    names = {r.name.lower() for r in reqs}
    assert names == {"torch", "numpy"}, names
    torch_req = next(r for r in reqs if r.name.lower() == "torch")
    specs = {(s.operator, s.version) for s in torch_req.specifier}
    assert not any(op in ("==", "===", "~=") for op, _ in specs), f"torch is pinned: {torch_req}"
    assert ">=" in {op for op, _ in specs}, f"torch needs a lower bound (the lowest verified): {torch_req}"
    assert torch_req.specifier.contains("2.13.0") and torch_req.specifier.contains("2.11.0")


def test_pyproject_declares_the_hooks_alone_with_torch_as_a_range() -> None:
    """The cheap, always-on half: the declared dependencies, without building anything."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    check_base([Requirement(r) for r in project["dependencies"]])
    extras = project["optional-dependencies"]
    server = {Requirement(r).name.lower() for r in extras["server"]}
    trainer = {Requirement(r).name.lower() for r in extras["trainer"]}
    assert server | trainer >= SERVER_ONLY
    assert "hyperwatch[server,trainer]" in extras["all"]
    assert re.fullmatch(
        r"torch==[0-9.]+", (REPO / "constraints.txt").read_text().split("\n#")[0].strip().splitlines()[-1]
    )


def copy_source(dest: Path) -> Path:
    """The files git tracks (links kept as links), so building never writes into the checkout."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in filter(None, files):
        rel = Path(os.fsdecode(raw))
        src, dst = REPO / rel, dest / rel
        if not src.exists() and not src.is_symlink():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)
    return dest


def build_wheel(tmp: Path) -> Path:
    src = copy_source(tmp / "src")
    out = tmp / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(out),
            ".",
        ],
        cwd=src,
        check=True,
        timeout=300,
    )
    (wheel,) = out.glob("hyperwatch-*.whl")
    return wheel


def runtime_closure(*names: str) -> dict[str, md.Distribution]:
    """Installed distributions ``names`` need at run time (extras and foreign markers left out)."""
    seen: dict[str, md.Distribution] = {}
    todo = list(names)
    while todo:
        dist = md.distribution(todo.pop())
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in seen:
            continue
        seen[key] = dist
        for raw in dist.requires or []:
            req = Requirement(raw)
            if req.marker is not None and ("extra" in str(req.marker) or not Marker(str(req.marker)).evaluate()):
                continue
            todo.append(req.name)
    return seen


def link_installed(dists: dict[str, md.Distribution], site: Path) -> None:
    """Link each distribution's top-level files and its .dist-info into ``site``."""
    for dist in dists.values():
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        root = Path(str(dist.locate_file("")))
        for top in tops:
            target = site / top
            if not target.exists() and (root / top).exists():
                os.symlink(root / top, target)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


USE = r"""
import importlib.util, json, sys, torch
from torch import nn
from hyperwatch import hooks
torch.manual_seed(0)
model = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 2, enable_nested_tensor=False)
with hooks.attach(model, run="fresh", sink=sys.argv[1], every=1) as mon:
    model(torch.randn(2, 4, 16)).square().mean().backward()
    mon.step(0, loss=1.0)
print(json.dumps({
    "torch": torch.__version__, "torch_file": torch.__file__,
    "missing": [m for m in ("fastapi", "sqlalchemy", "psycopg", "alembic", "plotly", "scipy", "uvicorn")
                if importlib.util.find_spec(m) is None],
    "hooks_file": hooks.__file__,
    "loaded": sorted(m.split(".")[0] for m in sys.modules),
}))
"""


@pytest.mark.slow
def test_wheel_installs_into_an_environment_with_torch_and_leaves_torch_alone(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    # Top-level names: only the hyperwatch package (and its .dist-info).
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"hyperwatch"}, tops
    for needed in (
        "hyperwatch/hooks/attach.py",
        "hyperwatch/hooks/mha.py",
        "hyperwatch/migrations/versions/0002_run_unavailable.py",
        "hyperwatch/migrations/alembic.ini",
        "hyperwatch/web/static/run.js",
    ):
        assert needed in names, needed
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    check_base(base_requirements(requires))
    for req in map(Requirement, requires):
        if req.name.lower() in SERVER_ONLY:
            assert req.marker is not None and "extra" in str(req.marker), f"{req} is in the base install"

    # A fresh environment that already holds torch (see the module docstring).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    closure = runtime_closure("torch", "numpy")
    link_installed(closure, site)
    torch_dist = closure["torch"]
    record = Path(str(torch_dist.locate_file(""))) / f"torch-{torch_dist.version}.dist-info" / "RECORD"
    torch_init = Path(str(torch_dist.locate_file("torch/__init__.py")))
    before = (torch_dist.version, sha256(record), sha256(torch_init), torch_init.stat().st_mtime_ns)

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_CONSTRAINT", "PIP_REQUIRE_VIRTUALENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    installed = subprocess.run(
        # This environment's pip drives the fresh one (--python); --isolated ignores pip's
        # configuration and environment (e.g. a find-links folder holding a torch wheel).
        [
            sys.executable,
            "-m",
            "pip",
            "--isolated",
            "--python",
            str(py),
            "install",
            "--no-index",
            "--no-cache-dir",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert "torch" not in installed.stdout.split("Successfully installed", 1)[-1], installed.stdout
    assert "Uninstalling" not in installed.stdout

    used = subprocess.run(
        [str(py), "-c", USE, str(tmp_path / "offline")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
    )
    assert used.returncode == 0, used.stdout + used.stderr
    report = json.loads(used.stdout.strip().splitlines()[-1])
    assert report["torch"] == torch_dist.version
    assert report["hooks_file"].startswith(str(site)), report["hooks_file"]  # the wheel, not the checkout
    assert set(report["missing"]) == {"fastapi", "sqlalchemy", "psycopg", "alembic", "plotly", "scipy", "uvicorn"}
    assert not {"fastapi", "sqlalchemy", "pydantic"} & set(report["loaded"])
    batches = (tmp_path / "offline" / "fresh" / "batches.jsonl").read_text().splitlines()
    points = [p for line in batches for p in json.loads(line)["points"]]
    assert {(p["name"], p["layer"]) for p in points} >= {("attention_z", 0), ("mlp_rms", 1), ("loss", None)}
    after = (torch_dist.version, sha256(record), sha256(torch_init), torch_init.stat().st_mtime_ns)
    assert after == before, "torch was modified"
    assert (site / "torch").is_symlink() and (site / f"torch-{torch_dist.version}.dist-info").is_symlink()

    # The server and trainer commands in this hooks-only install name the extra to install.
    for argv, extra in HOOKS_ONLY_COMMANDS:
        cwd = tmp_path / f"cwd-{argv[0]}"
        cwd.mkdir()
        done = subprocess.run(
            [str(py), "-m", "hyperwatch", *argv], capture_output=True, text=True, env=env, timeout=300, cwd=cwd
        )
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        assert f"pip install 'hyperwatch[{extra}]'" in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert list(cwd.iterdir()) == [], f"hyperwatch {argv[0]} wrote {list(cwd.iterdir())} before refusing"


HOOKS_ONLY_COMMANDS: list[tuple[list[str], str]] = [
    (["serve"], "server"),
    (["fit", "lr", "x.csv"], "server"),
    (["db", "current"], "server"),
    (["forecast", "1"], "server"),
    (["demo", "--fast"], "all"),
    (["sweep", "configs/none.toml"], "all"),
    (["train", "--preset", "tiny"], "trainer"),
    (["data", "prepare"], "trainer"),
]
"""Commands that need an extra, with arguments that would otherwise start real work."""

BLOCK_EXTRAS = r"""
import runpy, sys
from hyperwatch.cli import EXTRAS

BLOCKED = {m for mods in EXTRAS.values() for m in mods}


class HooksOnly:  # the extras' packages unimportable, as in an install of the hooks alone

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, HooksOnly())
sys.argv = ["hyperwatch", *sys.argv[1:]]
runpy.run_module("hyperwatch", run_name="__main__")
"""


@pytest.mark.parametrize(("argv", "extra"), HOOKS_ONLY_COMMANDS, ids=[a[0] for a, _ in HOOKS_ONLY_COMMANDS])
def test_commands_without_their_extra_say_which_to_install_and_write_nothing(
    tmp_path: Path, argv: list[str], extra: str
) -> None:
    """The cheap twin of the slow test's check: the extras are blocked by a meta-path finder in a
    subprocess of this environment (the slow test runs the same commands in a real hooks-only venv)."""
    done = subprocess.run(
        [sys.executable, "-c", BLOCK_EXTRAS, *argv], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"pip install 'hyperwatch[{extra}]'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []  # refused before anything was written (train's data cache)


@pytest.mark.parametrize("command", ["size", "upload"])
def test_commands_of_the_hooks_alone_work_without_any_extra(tmp_path: Path, command: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCK_EXTRAS, command, "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and f"usage: hyperwatch {command}" in done.stdout, done.stdout + done.stderr


def test_tracked_links_stay_inside_the_checkout() -> None:
    """A link git tracks is relative and resolves inside the repository: a worktree's ``.venv``
    link to another checkout, committed once, made CI's ``make`` fail on a loop."""
    staged = subprocess.run(["git", "ls-files", "-s", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(
        b"\0"
    )
    links = [os.fsdecode(e.split(b"\t", 1)[1]) for e in staged if e.startswith(b"120000 ")]
    assert "hyperwatch/hooks" in links, links
    for rel in links:
        target = os.readlink(REPO / rel)
        assert not os.path.isabs(target), f"{rel} links to the absolute path {target}: make it relative"
        resolved = (REPO / rel).resolve()
        assert resolved.is_relative_to(REPO) and resolved.exists(), f"{rel} -> {target} leaves the checkout"
    ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", ".venv"], cwd=REPO)
    assert ignored.returncode == 0, ".gitignore must ignore .venv whether it is a folder or a link"
