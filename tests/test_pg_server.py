"""The test suite's PostgreSQL server (tests/pg_server.py) starts when the port it picked was
taken in the meantime -- under pytest-xdist each worker starts its own server, each picking a
free port by binding and releasing it, so two could pick the same one."""
from __future__ import annotations

import os
import socket

import pytest

pg_server = pytest.importorskip("pg_server")


@pytest.mark.postgres
def test_a_server_whose_port_was_taken_starts_on_another() -> None:
    if pg_server.find_bindir() is None:  # as conftest's pg_server fixture: a failure in CI, which installs it
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL server binaries not found: the PostgreSQL tests must run in CI")
        pytest.skip("PostgreSQL server binaries not found (apt-get install postgresql, or set EVENTLOG_PG_BIN)")
    srv = pg_server.PgServer()
    taken = srv.port
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        try:
            srv.start()
            assert srv.port != taken
            assert srv.psql("SELECT 1") == "1"
        finally:
            srv.close()
