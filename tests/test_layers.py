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


PSYCOPG_MODULES = {"eventlog/log/postgres.py", "eventlog/log/pg_schema.py", "eventlog/log/pg_follow.py",
                   "eventlog/log/pg_watch.py"}


def test_only_the_postgres_backend_imports_psycopg() -> None:
    bad = []
    for layer in ("eventlog", "projections", "sqlite_export"):
        for path in sorted((ROOT / layer).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                if any(n.split(".")[0] == "psycopg" for n in names) and rel not in PSYCOPG_MODULES:
                    bad.append(f"{rel} imports psycopg")
    assert not bad, "\n".join(bad)


def test_the_lmdb_store_and_open_log_never_load_psycopg(tmp_path: Path) -> None:
    code = ("import sys\nfrom eventlog import SessionStore\nfrom eventlog.log import open_log, is_log_url\n"
            f"with SessionStore.open({str(tmp_path)!r}, 'p', follower=False) as s:\n"
            "    s.create_session('x')\n"
            f"open_log({str(tmp_path / 'l')!r}).close()\n"
            "assert is_log_url('postgresql://h/d')\n"
            "print(' '.join(sorted(sys.modules)))")
    env = {k: v for k, v in __import__("os").environ.items() if k != "EVENTLOG_LOG_URL"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout.split()
    assert [m for m in out if m.startswith(("psycopg", "eventlog.log.p"))] == []
