"""PostgresLog under real failures: SIGKILLed writers, a server crash (``pg_ctl stop -m immediate``)
under load, a connection terminated in the middle of its COMMIT, and two hosts in separate
processes converging on identical projections."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pg_server import commits_held

from eventlog import SessionStore
from eventlog.log.contract import ev
from eventlog.log.postgres import PostgresLog

pytestmark = pytest.mark.postgres
HERE = Path(__file__).parent
KILLS = 6


def child(script: str, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, str(HERE / script), *args], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, env=env)


def acks(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "ACK":  # a line cut by the kill is not an ack
            out[parts[1]] = int(parts[2])
    return out


def check(url: str, profile: str, acked: dict[str, int]) -> int:
    """Every acknowledged event at its seq, seqs gapless, the chain intact; returns the head."""
    with PostgresLog.open(url, profile=profile) as lg:
        res = lg.verify()
        assert res.ok, res
        by_id = {e["id"]: e["seq"] for e in lg.read()}
        assert sorted(by_id.values()) == list(range(1, len(by_id) + 1)), "seqs must be gapless"
        lost = {i: s for i, s in acked.items() if by_id.get(i) != s}
        assert not lost, f"acknowledged appends lost or moved: {list(lost.items())[:5]}"
        return res.head_seq


def sigkill_rounds(url: str, profile: str, rounds: int, seed: int) -> None:
    """``rounds`` times: two writer processes of 3 threads each, SIGKILLed at a random moment;
    after each round every acknowledged write is at its seq and the chain verifies."""
    PostgresLog.open(url, profile=profile).close()
    rng = random.Random(seed)
    acked: dict[str, int] = {}
    for round_ in range(rounds):
        procs = [child("proc_log_writer.py", url, f"r{round_}p{n}", "3", "100000", str(rng.choice([1, 1, 4])),
                       profile) for n in range(2)]
        first = [p.stdout.readline() if p.stdout else "" for p in procs]  # both are appending now
        time.sleep(rng.uniform(0.05, 0.5))
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p, line in zip(procs, first):
            out, _ = p.communicate()
            assert p.returncode == -signal.SIGKILL
            acked.update(acks(line + out))
        assert check(url, profile, acked) >= len(acked)
    assert len(acked) > 2 * rounds  # the kills did land mid-work
    with PostgresLog.open(url, profile=profile) as lg:
        before = lg.head()[0]
        assert lg.append([ev(after="kills")]) == [before + 1] and lg.verify().ok


def test_sigkilled_writers_lose_no_acknowledged_write(pg_url: str, pg_profile: str) -> None:
    sigkill_rounds(pg_url, pg_profile, KILLS, seed=19)


@pytest.mark.campaign
def test_sigkill_campaign_on_postgres(pg_url: str, pg_profile: str) -> None:
    sigkill_rounds(pg_url, pg_profile, int(os.environ.get("EVENTLOG_PG_KILLS", "100")), seed=int(time.time()))


def test_a_server_crash_under_load_loses_no_acknowledged_write(pg_server: Any, pg_url: str, pg_profile: str) -> None:
    PostgresLog.open(pg_url, profile=pg_profile).close()
    follower = child("proc_pg_follower.py", pg_url, pg_profile, "60")
    assert follower.stdout is not None and follower.stdout.readline().strip() == "READY"
    writers = [child("proc_log_writer.py", pg_url, f"w{n}", "4", "100000", "1", pg_profile) for n in range(2)]
    first = [p.stdout.readline() if p.stdout else "" for p in writers]  # both are appending now
    time.sleep(0.5)
    with PostgresLog.open(pg_url, profile=pg_profile) as lg:
        at_crash = lg.head()[0]
    assert at_crash > 0, "the writers should be appending before the crash"
    down = pg_server.restart_after_crash()  # pg_ctl stop -m immediate, then start again
    # The writers reconnect and go on: wait (up to 30 s) until the log is well past the crash,
    # where a fixed 2 s could end before they resumed on a machine busy with other tests.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with PostgresLog.open(pg_url, profile=pg_profile) as lg:
            if lg.head()[0] > at_crash + 100:
                break
        time.sleep(0.2)
    for p in writers:
        p.send_signal(signal.SIGKILL)
    acked: dict[str, int] = {}
    for p, line in zip(writers, first):
        out, _ = p.communicate()
        acked.update(acks(line + out))
    head = check(pg_url, pg_profile, acked)
    after = [s for s in acked.values() if s > at_crash + 50]
    assert after, f"the writers did not resume after the restart (down {down:.1f} s, head {head}, crash at {at_crash})"
    with PostgresLog.open(pg_url, profile=pg_profile) as lg:
        lg.append([{"type": "test.end", "session": None, "data": {}}])
    out, _ = follower.communicate(timeout=90)
    seen = [int(line.split()[1]) for line in out.splitlines() if line.startswith("F ")]
    assert seen == list(range(1, head + 1)), "the follower must ride out the restart and see every event once"


def _backend(su: psycopg.Connection[Any], wait_event: str, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = su.execute("SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'eventlog %%' AND wait_event = %s",
                         (wait_event,)).fetchone()
        if row is not None:
            return int(row[0])
        time.sleep(0.01)
    raise AssertionError(f"no eventlog backend waiting on {wait_event}")


def test_a_connection_killed_during_commit_is_retried_to_the_original_seqs(pg_url: str, pg_profile: str) -> None:
    """The COMMIT is made to wait for a synchronous standby that does not exist: the commit
    record is on disk, the client has no answer yet. Terminating that backend then loses the
    connection during COMMIT with the transaction committed; the retry must find it."""
    with PostgresLog.open(pg_url, profile=pg_profile) as lg, psycopg.connect(pg_url, autocommit=True) as su:
        lg.append([ev("s", n=0)])
        commits = lg.commits
        su.execute("SET synchronous_commit = local")
        got: list[Any] = []
        batch = [dict(ev("s", n=1), id="caller-id"), ev("s", n=2), ev("s", n=3)]  # caller and generated ids
        with commits_held(su):
            t = threading.Thread(target=lambda: got.append(lg.append(batch, expected_version=1)))
            t.start()
            pid = _backend(su, "SyncRep")
            assert su.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
        t.join(30)
        assert got == [[2, 3, 4]]
        assert lg.commits == commits, "the retry found the stored events and wrote nothing"
        assert lg.head()[0] == 4 and [e["data"]["n"] for e in lg.read()] == [0, 1, 2, 3]
        assert lg.stream_version("s") == 4 and lg.verify().ok
        assert lg.append([dict(ev("s", n=1), id="caller-id")]) == [2]


def test_a_connection_killed_before_commit_is_retried_and_written_once(pg_url: str, pg_profile: str) -> None:
    with PostgresLog.open(pg_url, profile=pg_profile) as lg, psycopg.connect(pg_url, autocommit=True) as su:
        lg.append([ev("s", n=0)])
        got: list[Any] = []
        with su.transaction():  # hold the profile's advisory lock: the append waits for it
            su.execute(lg._sql.lock, lg._sql.lock_args)
            t = threading.Thread(target=lambda: got.append(lg.append([ev("s", n=1), ev("s", n=2)])))
            t.start()
            pid = _backend(su, "advisory")
            su.execute("SELECT pg_terminate_backend(%s)", (pid,))
        t.join(30)
        assert got == [[2, 3]] and lg.head()[0] == 3 and lg.verify().ok
        assert [e["data"]["n"] for e in lg.read()] == [0, 1, 2]


def test_two_hosts_following_one_log_converge_to_identical_projections(tmp_path: Path, pg_url: str,
                                                                        pg_profile: str) -> None:
    sessions, messages = 6, 12
    total = 2 * sessions * (messages + 3)
    hosts = [child("proc_pg_host.py", str(tmp_path / f"home{n}"), pg_url, pg_profile, f"h{n}",
                   str(sessions), str(messages), str(total)) for n in range(2)]
    results = []
    for p in hosts:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out
        line = [ln for ln in out.splitlines() if ln.startswith("DIGEST ")]
        assert line, out
        results.append(line[0].split()[1:])
    (d0, head0, seen0), (d1, head1, seen1) = results
    assert head0 == head1 == str(total) and seen0 == seen1 == str(2 * sessions)
    assert d0 == d1, "two hosts' projections of one log must answer every query alike"
    sys.path.insert(0, str(HERE))
    from proc_pg_host import digest

    with SessionStore.open(tmp_path / "fresh", pg_profile, log=pg_url, follower=False) as store:
        store.sync()
        assert digest(store) == (d0, 2 * sessions)  # and alike a third host built from scratch


def test_an_erase_rides_out_a_server_restart_and_fails_typed_when_it_is_down(pg_server: Any, pg_url: str,
                                                                             pg_profile: str) -> None:
    """Erase went without the reconnecting every other write has: right after a restart it failed
    ('terminating connection due to administrator command'), and with the server down it raised
    psycopg's own OperationalError, not an EventLogError (found by an outside audit)."""
    from eventlog.errors import StorageError

    with PostgresLog.open(pg_url, profile=pg_profile, reconnect_timeout=20) as lg:
        first = lg.append([{"type": "note.added", "session": "s1", "data": {"text": "forget me"}}] * 2)
        keep = lg.append([{"type": "note.added", "session": "s2", "data": {"text": "keep me"}}])
        pg_server.stop("fast")
        pg_server.boot()
        seq = lg.erase([first[0]], {"reason": "after a restart"})
        assert seq == keep[0] + 1 and lg.get(first[0]).get("erased") is True and lg.verify().ok
        lg.reconnect_timeout = 1.0
        pg_server.stop("fast")
        try:
            with pytest.raises(StorageError):
                lg.erase([first[1]], {"reason": "server down"})
        finally:
            pg_server.boot()
        assert lg.erase([first[1]], {"reason": "back"}) == seq + 1 and lg.verify().ok


GUARDED_WRITER = """
import sys
from eventlog.errors import ConcurrencyError
from eventlog.log.postgres import PostgresLog
log = PostgresLog.open(sys.argv[1], profile=sys.argv[2])
refused = 0
for i in range(150):
    try:
        log.append([{"type": "test.happened", "session": "s", "data": {"i": i}}],
                   expected_version=log.stream_version("s"))
        print("ACK", flush=True)
    except ConcurrencyError:
        refused += 1
print("REFUSED", refused, flush=True)
log.close()
"""


def test_refused_guarded_appends_of_competing_processes_print_nothing(pg_url: str, pg_profile: str) -> None:
    """Three processes appending to one stream at the version each read: the losers get
    ConcurrencyError and nothing else — psycopg printed "error ignored terminating <Pipeline>:
    pipeline aborted" to stderr for some of those refusals (found by an outside audit)."""
    PostgresLog.open(pg_url, profile=pg_profile).close()
    env = dict(os.environ, PYTHONPATH=str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, "-c", GUARDED_WRITER, pg_url, pg_profile], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(3)]
    acked = refused = 0
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and err == "", err
        acked += out.count("ACK")
        refused += int(out.split("REFUSED")[1])
    assert acked + refused == 450 and refused > 0
    with PostgresLog.open(pg_url, profile=pg_profile) as lg:
        assert lg.stream_version("s") == acked and lg.verify().ok
