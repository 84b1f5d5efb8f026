"""docker-compose.yml, checked statically: files, ports, commands and env it refers to exist."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from hyperwatch.cli import COMMANDS
from hyperwatch.monitor.core.config import Settings

REPO = Path(__file__).resolve().parents[1]


def _compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_services_present() -> None:
    assert {"hyperwatch", "postgres", "prometheus", "alertmanager", "migrate"} <= set(_compose()["services"])


def test_bind_mounts_and_build_context_exist() -> None:
    for name, svc in _compose()["services"].items():
        for vol in svc.get("volumes", []):
            src = vol.split(":", 1)[0]
            if src.startswith("."):
                assert (REPO / src).is_file(), f"{name}: mounted file {src} is missing"
        if "build" in svc:
            context = REPO / (svc["build"] if isinstance(svc["build"], str) else svc["build"].get("context", "."))
            assert (context / "Dockerfile").is_file()


def test_dockerfile_copies_existing_paths() -> None:
    text = (REPO / "Dockerfile").read_text()
    copies = re.findall(r"^COPY\s+(.+?)\s+\S+$", text, flags=re.M)
    assert copies
    for line in copies:
        for src in line.split():
            assert (REPO / src).exists(), f"Dockerfile copies {src}, which does not exist"
    # hyperwatch/ links the top-level folders (migrations/ included: monitor.store.migrate looks
    # there), so every linked folder must be copied too; the image installs the service extra.
    for link in (REPO / "hyperwatch").iterdir():
        if link.is_symlink():
            assert f"COPY {link.name} " in text, f"Dockerfile must copy {link.name}/ (hyperwatch/{link.name} links it)"
    assert "pip install -e '.[server]'" in text


def test_commands_parse_with_the_real_cli() -> None:
    for name, svc in _compose()["services"].items():
        cmd = svc.get("command")
        if not (isinstance(cmd, list) and cmd and cmd[0] == "hyperwatch"):
            continue
        sub, *rest = cmd[1:]
        assert sub in COMMANDS, f"{name}: unknown command {sub}"
        module = __import__(COMMANDS[sub][0], fromlist=["build_parser"])
        module.build_parser(f"hyperwatch {sub}").parse_args(rest)  # exits on a bad flag


def test_ports_and_targets_agree() -> None:
    services = _compose()["services"]
    hw = services["hyperwatch"]
    port = hw["command"][hw["command"].index("--port") + 1]
    assert any(p.endswith(f":{port}") for p in hw["ports"])
    assert all(p.startswith("127.0.0.1:") for s in services.values() for p in s.get("ports", []))
    prom = yaml.safe_load((REPO / "prometheus/prometheus.yml").read_text())
    targets = [t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    assert f"hyperwatch:{port}" in targets
    am = prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"][0]
    host, am_port = am.split(":")
    assert host in services and any(p.endswith(f":{am_port}") for p in services[host]["ports"])
    # Rule files Prometheus loads are the ones mounted into its container.
    mounted = {v.split(":")[1] for v in services["prometheus"]["volumes"] if v.startswith(".")}
    assert set(prom["rule_files"]) <= mounted
    for flag in services["prometheus"]["command"] + services["alertmanager"]["command"]:
        if flag.startswith("--config.file="):
            assert flag.split("=", 1)[1] in {v.split(":")[1] for s in services.values() for v in s.get("volumes", [])}


def test_environment_names_are_settings() -> None:
    fields = {f"HYPERWATCH_{n.upper()}" for n in Settings.model_fields}
    for name in ("hyperwatch", "migrate"):
        for var in _compose()["services"][name]["environment"]:
            assert var in fields, f"{name}: {var} is not a setting"
    assert "HYPERWATCH_WRITE_TOKEN" in _compose()["services"]["hyperwatch"]["environment"]
