"""Shared fixtures. Every test gets its own EVENTLOG_HOME under tmp_path."""
from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any, Iterator

import pytest
from hypothesis import settings

settings.register_profile("default", max_examples=int(os.environ.get("EVENTLOG_EXAMPLES", "100")), deadline=None)
settings.register_profile("campaign", max_examples=5000, deadline=None)
settings.load_profile("campaign" if os.environ.get("EVENTLOG_CAMPAIGN") else "default")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    monkeypatch.setenv("EVENTLOG_HOME", str(h))
    return h


# ---- PostgreSQL: one throwaway server per test session (tests/pg_server.py), one profile per test


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    """A PostgreSQL server started for this test session. Skips where no server binaries are
    installed, except in CI (``CI`` set), where a missing server is a failure: .ci/run installs it."""
    from pg_server import PgServer, find_bindir

    missing = None
    if find_bindir() is None:
        missing = "PostgreSQL server binaries not found (apt-get install postgresql, or set EVENTLOG_PG_BIN)"
    else:
        try:
            import psycopg  # noqa: F401
        except ImportError:
            missing = "psycopg is not installed (pip install -e .[test])"
    if missing:
        if os.environ.get("CI"):
            pytest.fail(missing + ": the PostgreSQL tests must run in CI")
        pytest.skip(missing)
    srv = PgServer().start()
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture
def pg_url(pg_server: Any) -> str:
    """An administrator URL of the session's server (profiles are created on first open)."""
    return str(pg_server.url())


_PG_NAMES = itertools.count(1)


@pytest.fixture
def pg_profile() -> str:
    """A profile name no other test of this session uses (so one schema per test)."""
    return f"t{os.getpid()}-{next(_PG_NAMES)}"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    # A report's keywords carry its test's markers, also when an xdist worker ran it (the
    # controlling process collects nothing itself).
    counts = {k: sum(1 for r in terminalreporter.stats.get(k, [])
                     if "postgres" in (getattr(r, "keywords", None) or {})
                     and getattr(r, "when", "call") in ("call", "setup"))
              for k in ("passed", "failed", "skipped", "error")}
    ran = counts["passed"] + counts["failed"]
    if ran or counts["skipped"] or counts["error"]:
        terminalreporter.write_line(
            f"PostgreSQL: {ran} tests ran against a server the tests started "
            f"({counts['passed']} passed, {counts['failed']} failed; {counts['skipped']} skipped, {counts['error']} errors)")
