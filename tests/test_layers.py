"""The layers: imports point only down (log <- sessions <- projections / sqlite_export <- adapters, cli)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# What each layer may import from this project (besides itself).
ALLOWED = {
    "eventlog/log": ("eventlog.errors", "eventlog.profiles", "eventlog.log"),
    "eventlog/sessions": ("eventlog.errors", "eventlog.profiles", "eventlog.log", "eventlog.sessions"),
    "projections": ("eventlog.errors", "eventlog.profiles", "eventlog.log", "eventlog.sessions", "projections"),
    "sqlite_export": ("eventlog.errors", "eventlog.profiles", "eventlog.log", "eventlog.sessions", "projections",
                      "sqlite_export"),
}
# The facade opens its read model from the projections, lazily (a documented exception).
EXCEPTIONS = {("eventlog/sessions/store.py", "projections.store_reads")}


def project_imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return [n for n in names if n.split(".")[0] in ("eventlog", "projections", "sqlite_export")]


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_imports_point_only_down(layer: str) -> None:
    bad = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        for name in project_imports(path):
            if name == "eventlog" or not name.startswith(ALLOWED[layer]) and (rel, name) not in EXCEPTIONS:
                bad.append(f"{rel} imports {name}")
    assert not bad, "\n".join(bad)


def test_importing_the_log_loads_neither_the_domain_nor_sqlite() -> None:
    code = ("import sys, eventlog.log\n"
            "from eventlog.log import EventLog, MemoryLog, Log\n"
            "print(' '.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    loaded = [m for m in out if m.startswith(("eventlog.sessions", "projections", "sqlite_export", "eventlog.cli"))
              or m in ("sqlite3", "_sqlite3")]
    assert loaded == [], loaded
    assert "eventlog.log.lmdb" in out and "eventlog.log.memory" in out


def test_the_package_root_still_exports_the_facade_and_the_log() -> None:
    from eventlog import EventLog, SessionStore
    from eventlog.log.lmdb import EventLog as LMDBLog
    from eventlog.sessions.store import SessionStore as Store

    assert EventLog is LMDBLog and SessionStore is Store
