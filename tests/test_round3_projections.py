"""Self-healing projections under load, through the CLI one-shots (third-round outside audit,
helper-59): real processes (a lease holder stopped with SIGSTOP), real files, the real CLI."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from eventlog.errors import LeaseError, process_state
from eventlog.log import open_log
from eventlog.sessions.store import SessionStore
from projections.projector import Projector

EXE = str(Path(sys.executable).with_name("eventlog"))
PROFILE = "agent"

_HOLD_AND_STOP = """
import os, signal, sys
from pathlib import Path
from projections.lease import Lease
assert Lease(Path(sys.argv[1])).acquire(0)
print("held", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""


@pytest.fixture
def seeded(tmp_path: Path) -> tuple[Path, list[int]]:
    """A profile with one session of 30 messages; the ids acknowledged."""
    home = tmp_path / "home"
    with SessionStore.open(home, PROFILE, follower=False) as s:
        s.create_session("seed", title="seed")
        acked = [s.append_message("seed", "user", f"seed probe {i}") for i in range(30)]
    return home, acked


@pytest.fixture
def stopped_holder(seeded: tuple[Path, list[int]]) -> Iterator[int]:
    """A process that holds the profile's projector lease and is stopped (SIGSTOP); its pid."""
    home, _ = seeded
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_AND_STOP, str(home / "profiles" / PROFILE)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        while process_state(holder.pid) != "stopped":  # it stops itself right after saying so
            time.sleep(0.01)
        yield holder.pid
    finally:
        os.kill(holder.pid, signal.SIGCONT)
        holder.kill()
        holder.wait()


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # The timeout only keeps a hung command from hanging the suite (the lease wait it replaced
    # was 120 s); what is asserted is the answer.
    return subprocess.run([EXE, "--home", str(home), "--profile", PROFILE, *args],
                          capture_output=True, text=True, timeout=300)


def test_a_read_without_state_db_names_a_stopped_lease_holder_instead_of_waiting(
        seeded: tuple[Path, list[int]], stopped_holder: int) -> None:
    """state.db deleted while another process holding the projector lease is stopped (SIGSTOP,
    Ctrl-Z): `sessions list`, `search` and `rebuild` waited for the lease for the whole lease
    timeout (120 s) and then said only that the lease had been held too long. Now each is one
    typed error naming the stopped process and how to resume it; the log is not touched, and once
    the holder is gone the projections heal with every acknowledged message."""
    home, acked = seeded
    profile_dir = home / "profiles" / PROFILE
    log_before = (profile_dir / "log" / "data.mdb").read_bytes()
    os.unlink(profile_dir / "state.db")
    for args in (["sessions", "list", "--json"], ["search", "probe", "--json"], ["rebuild"]):
        r = _cli(home, *args)
        assert r.returncode == 1, (args, r.returncode, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:"), (args, r.stderr)
        assert f"process {stopped_holder} " in lines[0] and "is stopped" in lines[0], (args, lines[0])
        assert f"kill -CONT {stopped_holder}" in lines[0], (args, lines[0])
        assert "Traceback" not in r.stderr and r.stdout == ""
    assert (profile_dir / "log" / "data.mdb").read_bytes() == log_before


def test_the_store_api_names_a_stopped_lease_holder_when_state_db_must_be_rebuilt(
        seeded: tuple[Path, list[int]], stopped_holder: int) -> None:
    """The same through a Projector with a short lease timeout: heal() of a missing state.db
    raised LeaseError 'held ... for over 3 s', as if a long rebuild were running."""
    home, acked = seeded
    profile_dir = home / "profiles" / PROFILE
    os.unlink(profile_dir / "state.db")
    log = open_log(profile_dir / "log")
    try:
        projector = Projector(profile_dir, log, PROFILE, lease_timeout=3.0)
        try:
            with pytest.raises(LeaseError) as caught:
                projector.heal()
            assert f"process {stopped_holder} " in str(caught.value) and "is stopped" in str(caught.value)
            assert caught.value.hint is not None and f"kill -CONT {stopped_holder}" in caught.value.hint
        finally:
            projector.close()
    finally:
        log.close()


def test_after_the_stopped_holder_is_gone_the_read_heals_with_every_acknowledged_write(
        seeded: tuple[Path, list[int]]) -> None:
    """The other side of the two tests above: with the lease free, a missing state.db is rebuilt
    by the one-shot itself and every acknowledged message is there."""
    home, acked = seeded
    os.unlink(home / "profiles" / PROFILE / "state.db")
    r = _cli(home, "sessions", "show", "seed", "--json")
    assert r.returncode == 0, r.stderr
    assert [m["id"] for m in json.loads(r.stdout)["messages"]] == acked
