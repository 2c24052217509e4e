"""A throwaway PostgreSQL server for the tests and the benchmark (not collected by pytest).

``PgServer.start()`` runs ``initdb --no-sync`` into a fresh ``mkdtemp`` folder and starts the
server with ``pg_ctl`` on a random 127.0.0.1 port and a private unix-socket folder. PostgreSQL
refuses to run as root, so when this process is root the server binaries run as the
``postgres`` user (``setpriv``), on folders chowned to it (pytest's own temp root is 0700 and
unreachable for that user, hence ``mkdtemp`` under the system temp folder).

The superuser is ``postgres`` with a password: TCP connections authenticate with
SCRAM, so a test can log in as a profile's role and meet its real privileges.

This module imports nothing outside the standard library.
"""
from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

SUPERUSER = "postgres"
PASSWORD = "eventlog-test"
DBNAME = "eventlog"


def find_bindir() -> Path | None:
    """Where ``initdb``/``pg_ctl`` live: ``$EVENTLOG_PG_BIN``, Debian's newest
    /usr/lib/postgresql/*/bin, or the folder ``initdb`` resolves to on ``PATH``."""
    env = os.environ.get("EVENTLOG_PG_BIN")
    if env:
        return Path(env)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    which = shutil.which("initdb")
    return Path(os.path.realpath(which)).parent if which else None


PORT_TRIES = 5
"""Ports tried before :meth:`PgServer.start` gives up (each picked free, then maybe taken)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """One server; ``url()`` names a database on it. ``stop("immediate")`` is a crash."""

    def __init__(self, bindir: Path | None = None) -> None:
        found = bindir or find_bindir()
        if found is None or not (found / "initdb").exists():
            raise FileNotFoundError("PostgreSQL server binaries (initdb, pg_ctl) not found; "
                                    "install the postgresql package or set EVENTLOG_PG_BIN")
        self.bindir = found
        self.root = Path(tempfile.mkdtemp(prefix="eventlog-pg-"))
        self.data = self.root / "data"
        self.sockets = self.root / "sock"
        self.logfile = self.root / "server.log"
        self.port = free_port()
        self._as_postgres: list[str] = []
        if os.geteuid() == 0:
            self._as_postgres = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]

    # ---- running the binaries

    def _run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = [*self._as_postgres, str(self.bindir / args[0]), *args[1:]]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.root)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()}\n{self.log_tail()}")
        return proc

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def start(self) -> "PgServer":
        self.sockets.mkdir()
        pwfile = self.root / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self._as_postgres:
            pw = pwd.getpwnam("postgres")
            for p in (self.root, self.sockets, pwfile):
                os.chown(p, pw.pw_uid, pw.pw_gid)
        os.chmod(self.root, 0o700)
        self._run("initdb", "--no-sync", "-D", str(self.data), "-U", SUPERUSER, f"--pwfile={pwfile}",
                  "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C")
        pwfile.unlink()
        for attempt in range(PORT_TRIES):
            try:
                self.boot()
                break
            except RuntimeError:
                # The port was free when picked, then released for the server: a process that
                # took it meanwhile (another xdist worker's server picking the same one) makes the
                # server refuse to start. Another port is tried; any other failure is raised.
                if attempt == PORT_TRIES - 1 or "already in use" not in self.log_tail(50):
                    raise
                self.port = free_port()
        self.create_database(DBNAME)
        return self

    def boot(self) -> None:
        """Start (or restart) the server on the same data folder, port and socket folder."""
        opts = (f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.sockets} "
                f"-c max_connections=300 -c shared_buffers=128MB -c fsync=on -c synchronous_commit=on")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-o", opts, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """``mode``: fast (clean), or immediate (no checkpoint: recovery runs on the next boot)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop", check=False)

    def restart_after_crash(self) -> float:
        """``pg_ctl stop -m immediate`` then start again; returns seconds the server was down."""
        t0 = time.monotonic()
        self.stop("immediate")
        self.boot()
        return time.monotonic() - t0

    def psql(self, sql: str, dbname: str = DBNAME) -> str:
        proc = self._run("psql", "-h", str(self.sockets), "-p", str(self.port), "-U", SUPERUSER, "-d", dbname,
                         "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql)
        return proc.stdout.strip()

    def create_database(self, name: str) -> None:
        self.psql(f'CREATE DATABASE "{name}"', dbname="postgres")

    def url(self, dbname: str = DBNAME, user: str = SUPERUSER, password: str = PASSWORD) -> str:
        """A ``postgresql://`` URL over TCP (what a remote host would use)."""
        return f"postgresql://{user}:{password}@127.0.0.1:{self.port}/{dbname}"

    def close(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "PgServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def commits_held(su: Any) -> Iterator[None]:
    """For the block, every COMMIT on the server waits for a synchronous standby that does not
    exist, its commit record already flushed: a connection cut then loses a COMMIT's answer, not
    the commit. ``su``: a superuser connection in autocommit."""
    su.execute("ALTER SYSTEM SET synchronous_standby_names = 'eventlog_absent_standby'")
    su.execute("SELECT pg_reload_conf()")
    time.sleep(0.2)
    try:
        yield
    finally:
        su.execute("ALTER SYSTEM RESET synchronous_standby_names")
        su.execute("SELECT pg_reload_conf()")
