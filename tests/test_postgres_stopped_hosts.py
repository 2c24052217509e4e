"""A host process stopped (SIGSTOP) inside a write on a PostgreSQL log, for longer than the
server's ``idle_in_transaction_session_timeout``: the server ends its session (freeing the
profile's lock for the other hosts), and the host, once resumed, must go on as after any lost
connection. Found by the outside audit of stopped holders on PostgreSQL (helper-83)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import psycopg
import pytest

from eventlog.log.postgres import PostgresLog

pytestmark = pytest.mark.postgres
ROOT = Path(__file__).parent.parent

# The child shortens the server's idle-in-transaction timeout for its own sessions to 1 s, tells
# the parent its writer connection's server pid, and stops itself inside the write's transaction
# (the profile's append lock held). The parent resumes it once the server has ended that session.
STOPPED_WRITER = """
import os, signal, sys
from eventlog.log import postgres
postgres.IDLE_IN_TRANSACTION_S = 1
url, profile, kind, lmdb_dir = sys.argv[1:5]
lg = postgres.PostgresLog.open(url, profile=profile)
created = {"type": "session.created", "session": "s", "data": {"source": "cli"}}
said = {"type": "message.appended", "session": "s", "data": {"role": "user", "content": "secret words"}}

stops = [1]

def stop():  # the first time only: a retry goes through
    if stops:
        stops.pop()
        print("pid", lg._writer_conn().info.backend_pid, flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)

if kind == "erase":
    seqs = lg.append([created, said])
    real = postgres.erasable
    def erasable(*a, **k):
        stop()
        return real(*a, **k)
    postgres.erasable = erasable
    print("erased", lg.erase(seqs, {"reason": "test"}), flush=True)
elif kind == "append":  # the two-round-trip way: stopped between the lock and the write
    lg.append([created])
    lg._fast_backoff = 10**6
    real_rows = postgres.PostgresLog._write_rows
    def write_rows(self, *a, **k):
        stop()
        return real_rows(self, *a, **k)
    postgres.PostgresLog._write_rows = write_rows
    print("appended", *lg.append([said]), flush=True)
elif kind == "copy":  # copy_log into the profile, stopped inside its import's transaction
    from eventlog.errors import IntegrityError
    from eventlog.log import open_log
    from eventlog.log.copy import copy_log
    with open_log(lmdb_dir, profile=profile) as src:
        src.append([created, said])
        real_write = postgres.PostgresLog._write_sealed
        def write_sealed(self, *a, **k):
            stop()
            return real_write(self, *a, **k)
        postgres.PostgresLog._write_sealed = write_sealed
        try:
            print("copied", copy_log(src, lg).copied, flush=True)
        except IntegrityError as e:
            print("refused:", e, "| hint:", e.hint, flush=True)
else:  # an import (append_sealed): one transaction
    from eventlog.log import open_log
    with open_log(lmdb_dir, profile=profile) as src:
        src.append([created, said])
        raws = [raw for _seq, raw in src.read(raw=True)]
    real_write = postgres.PostgresLog._write_sealed
    def write_sealed(self, *a, **k):
        stop()
        return real_write(self, *a, **k)
    postgres.PostgresLog._write_sealed = write_sealed
    print("imported", lg.append_sealed(raws), flush=True)
lg.close()
"""


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _run_stopped(pg_url: str, profile: str, kind: str, tmp_path: Path,
                 meanwhile: Callable[[], object] | None = None) -> tuple[int, str, str]:
    """Run STOPPED_WRITER, let the server end its stopped session (then run ``meanwhile``),
    resume it and return its exit status, stdout and stderr."""
    PostgresLog.open(pg_url, profile=profile).close()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", STOPPED_WRITER, pg_url, profile, kind, str(tmp_path / "src")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line[:1] == ["pid"], (line, proc.stderr.read() if proc.stderr else "")
        backend = int(line[1])
        deadline = time.monotonic() + 10
        while _state(proc.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.02)
        with psycopg.connect(pg_url, autocommit=True) as su:  # the server ends the stopped host's session
            while su.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (backend,)).fetchone():
                assert time.monotonic() < deadline, "the server did not end the stopped host's session"
                time.sleep(0.05)
        if meanwhile is not None:
            meanwhile()
        os.kill(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out, err


@pytest.mark.parametrize("kind", ["erase", "import", "append"])
def test_a_write_stopped_past_the_idle_timeout_goes_on_once_resumed(pg_url: str, pg_profile: str, kind: str,
                                                                    tmp_path: Path) -> None:
    """The server ends a session idle in a transaction with FATAL 25P03, which psycopg raises as
    an InternalError, not an OperationalError: an erase or an import whose host had been stopped
    (or paused in a debugger) past the timeout failed on resuming with "erase failed: terminating
    connection due to idle-in-transaction timeout" and a hint to check the URL, where a lost
    connection is reconnected and the write run again (its transaction had not committed). Now it
    is a lost connection like any other: the erase and the import go through once resumed."""
    rc, out, err = _run_stopped(pg_url, pg_profile, kind, tmp_path)
    assert rc == 0, err
    with PostgresLog.open(pg_url, profile=pg_profile) as lg:
        assert lg.verify().ok
        if kind == "erase":
            assert out.split() == ["erased", "3"]
            assert [e["type"] for e in lg.read()] == ["session.created", "message.appended", "log.erased"]
            assert b"secret words" not in b"".join(raw for _seq, raw in lg.read(raw=True))
        elif kind == "append":
            assert out.split() == ["appended", "2"]
            assert lg.head()[0] == 2 and lg.get(2)["data"]["content"] == "secret words"
        else:
            assert out.split() == ["imported", "2"]
            assert lg.head()[0] == 2 and lg.get(2)["data"]["content"] == "secret words"


def test_the_command_line_keeps_the_server_process_to_end_in_its_hint(pg_url: str, pg_profile: str,
                                                                      tmp_path: Path) -> None:
    """A command behind a host holding the profile's rules lock (stopped, or slow) gave up after
    10 s naming the server process, but its hint was the command line's generic one ("retry once
    that process's write is done"): the library's remedy, which server process to end and how,
    was replaced because every WriterBusyError hint not about a stopped local process was taken
    for the one naming the Python lock timeout. Now only that one is reworded."""
    with PostgresLog.open(pg_url, profile=pg_profile) as lg:
        lg.append([{"type": "session.created", "session": "s1", "data": {"source": "cli"}}])
        with lg.rules_lock(5):
            holder = lg._rules.pid
            env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                       EVENTLOG_HOME=str(tmp_path / "other-host"), EVENTLOG_LOG_URL=pg_url)
            done = subprocess.run([sys.executable, "-m", "eventlog.cli", "--profile", pg_profile, "sessions", "title",
                                   "s1", "a title"], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1, done.stderr
        assert f"held by server process {holder}" in done.stderr, done.stderr
        assert f"pg_terminate_backend({holder})" in done.stderr and f"kill -CONT {holder}" in done.stderr, done.stderr
        assert [e["type"] for e in lg.read()] == ["session.created"]  # nothing written
        # ... and which client holds it: this process, on this host (it may be the one stopped)
        client = f"for eventlog process {os.getpid()} on host {socket.gethostname()}"
        assert client in done.stderr and f"`kill -CONT {os.getpid()}` on {socket.gethostname()}" in done.stderr, \
            done.stderr


def test_a_copy_whose_target_another_host_wrote_to_meanwhile_says_so(pg_url: str, pg_profile: str,
                                                                    tmp_path: Path) -> None:
    """A copy into a profile (``eventlog log copy --to``) stopped past the idle timeout runs its
    import again once resumed; another host had appended to the profile meanwhile (its append lock
    was free), so the copy no longer fits. It said "imported event 2 does not continue the chain"
    with the hint for a damaged log ("`eventlog log verify` names the first bad seq"), which
    passes; now it says that the target moved under the copy, which wrote nothing."""
    def other_host_appends() -> None:
        with PostgresLog.open(pg_url, profile=pg_profile) as other:
            other.append([{"type": "session.created", "session": "other", "data": {"source": "cli"}}])

    rc, out, err = _run_stopped(pg_url, pg_profile, "copy", tmp_path, meanwhile=other_host_appends)
    assert rc == 0, err
    assert out.startswith("refused:"), out
    assert "another process appended to it" in out and "does not continue the chain" not in out, out
    assert "log verify" not in out.split("| hint:")[1], out
    with PostgresLog.open(pg_url, profile=pg_profile) as lg:
        assert lg.verify().ok and [e["session"] for e in lg.read()] == ["other"]  # nothing of the copy
