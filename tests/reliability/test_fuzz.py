"""Issue 14: schemathesis (all checks, write token) against the real service on both databases.

The short version of ``make fuzz`` (scripts/fuzz.py): a few hundred cases per database, counted
from the recorded exchanges. No response may be >= 500; a 503 would be a client error reported as
an outage (the database is up throughout).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from tests.reliability.support import REPO

_spec = importlib.util.spec_from_file_location("hw_fuzz_script", REPO / "scripts" / "fuzz.py")
assert _spec is not None and _spec.loader is not None
_fuzz_script = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _fuzz_script  # dataclasses look their module up there
_spec.loader.exec_module(_fuzz_script)
fuzz = _fuzz_script.fuzz


def test_schemathesis_finds_no_server_error(db_url: str, tmp_path: Path) -> None:
    database = "postgresql" if db_url.startswith("postgresql") else "sqlite"
    result = fuzz(db_url, database, max_examples=1, workdir=tmp_path)
    assert result.cases >= 200, result.line() + "\n" + result.failed_checks
    assert result.server_errors == 0 and result.unavailable == 0, result.line() + "\n" + "\n".join(result.examples)
