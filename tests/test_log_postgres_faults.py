"""PostgresLog when connections die or hosts vanish: the rules lock, commits of unknown outcome,
requests too large for one statement. Each test here failed before its fix (outside audit)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from eventlog.errors import WriterBusyError
from eventlog.log.postgres import PostgresLog

pytestmark = pytest.mark.postgres
ROOT = Path(__file__).parent.parent


def superuser(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


def terminate(url: str, pids: list[int]) -> None:
    with superuser(url) as c:
        for pid in pids:
            c.execute("SELECT pg_terminate_backend(%s)", (pid,))


def test_the_rules_lock_rides_out_connections_cut_under_it(pg_url: str, pg_profile: str) -> None:
    """rules_lock took a pooled connection without the reconnect that every other call has: after
    the server cut the host's connections (a restart, a failover), set_title failed 'cannot reach
    PostgreSQL' while the server was up."""
    with PostgresLog.open(pg_url, profile=pg_profile) as lg:
        for _ in range(2):
            with lg.rules_lock(5):
                pass  # leaves its connection idle in the pool
            pids = [c.info.backend_pid for c in lg._pool._idle]
            assert pids
            terminate(pg_url, pids)
            with lg.rules_lock(5):
                with PostgresLog.open(pg_url, profile=pg_profile) as other:  # and it is held
                    with pytest.raises(WriterBusyError):
                        with other.rules_lock(0.2):
                            pass


HOLDER = """
import sys, time
from eventlog.log import postgres
postgres.IDLE_IN_TRANSACTION_S = 2
lg = postgres.PostgresLog.open(sys.argv[1], profile=sys.argv[2])
with lg.rules_lock(5):
    print("held", flush=True)
    time.sleep(600)
"""


def test_the_rules_lock_of_a_stopped_or_vanished_host_is_freed_by_the_server(pg_url: str, pg_profile: str) -> None:
    """A session advisory lock on an idle connection stayed held while the holder's TCP stack
    (its kernel, a proxy) still answered: a host SIGSTOPped or cut off behind a proxy blocked
    every other host's set_title for ~2 h. Held inside a transaction, it is freed by the server
    after idle_in_transaction_session_timeout (60 s; 2 s in the holder here)."""
    PostgresLog.open(pg_url, profile=pg_profile).close()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, pg_url, pg_profile], stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        os.kill(proc.pid, signal.SIGSTOP)
        with PostgresLog.open(pg_url, profile=pg_profile) as lg:
            with pytest.raises(WriterBusyError):
                with lg.rules_lock(0.5):
                    pass
            t0 = time.monotonic()
            with lg.rules_lock(15):
                waited = time.monotonic() - t0
        assert waited < 10, waited
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
