"""SessionStore on a PostgreSQL log: selecting it (URL, EVENTLOG_LOG_URL), a host's projections
recognising another or a rewound log, and copying logs between backends."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from eventlog import SessionStore
from eventlog.errors import ConflictError, IntegrityError, ValidationError
from eventlog.log import EventLog, open_log
from eventlog.log.contract import ev, stored
from eventlog.log.copy import copy_log
from eventlog.log.postgres import PostgresLog
from eventlog.profiles import profile_dir
from projections.projector import Projector

pytestmark = pytest.mark.postgres


def state_status(home: Path, profile: str, log: Any) -> str:
    with Projector(profile_dir(home, profile), log, profile) as pj:
        return str(pj.health(full=False)["state"]["status"])


def fill(store: SessionStore, sid: str, n: int) -> None:
    store.create_session(sid, source="cli")
    for i in range(n):
        store.append_message(sid, "user", f"message {i} of {sid}")


def test_a_url_selects_postgres_and_the_store_closes_what_it_opened(tmp_path: Path, pg_url: str, pg_profile: str) -> None:
    with SessionStore.open(tmp_path / "h", pg_profile, log=pg_url, follower=False) as store:
        assert isinstance(store.log, PostgresLog)
        fill(store, "s1", 3)
        assert [m["content"] for m in store.get_messages("s1")][-1] == "message 2 of s1"
        log = store.log
    assert log.closed
    with PostgresLog.open(pg_url, profile=pg_profile) as lg:  # the events are on the server, not in the home
        assert lg.head()[0] == 4 and lg.verify().ok
    assert not (tmp_path / "h" / "profiles" / pg_profile / "log").exists()


def test_EVENTLOG_LOG_URL_selects_postgres(tmp_path: Path, pg_url: str, pg_profile: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVENTLOG_LOG_URL", pg_url)
    with SessionStore.open(tmp_path / "h", pg_profile, follower=False) as store:
        assert isinstance(store.log, PostgresLog) and store.log.profile == pg_profile
        fill(store, "env", 1)
    with SessionStore.open(tmp_path / "other-host", pg_profile, follower=False) as store:
        assert [s["id"] for s in store.list_sessions()] == ["env"]  # a second home projects the same log


def test_open_log_needs_a_profile_for_a_url_and_knows_its_schemes(tmp_path: Path, pg_url: str) -> None:
    with pytest.raises(ValidationError) as info:
        open_log(pg_url)
    assert info.value.field == "profile"
    with pytest.raises(ValidationError):
        open_log("mysql://x@y/z", profile="p")
    with open_log(tmp_path / "lmdb", profile="p") as lg:
        assert isinstance(lg, EventLog)


def test_pointing_a_host_at_another_log_is_detected_and_rebuilt(tmp_path: Path, pg_url: str, pg_profile: str) -> None:
    home = tmp_path / "h"
    with PostgresLog.open(pg_url, profile=f"{pg_profile}-b") as other:
        with SessionStore.open(home, pg_profile, log=other, follower=False) as store:
            fill(store, "from-b", 4)
    with SessionStore.open(home, pg_profile, log=pg_url, follower=False) as store:
        fill(store, "from-a", 4)
        store.sync()  # a read: the projection now follows log a (writers alone leave it to the next reader)
    with PostgresLog.open(pg_url, profile=f"{pg_profile}-b") as other:
        assert state_status(home, pg_profile, other) == "foreign"  # the projection follows log a
        with SessionStore.open(home, pg_profile, log=other, follower=False) as store:
            assert [s["id"] for s in store.list_sessions()] == ["from-b"]
        assert state_status(home, pg_profile, other) == "ok"


def _rewind(url: str, profile: str, keep: int) -> None:
    """What restoring an older backup of the server does to a profile's log: events after
    ``keep`` are gone and the head is back there (done as the superuser: no role of eventlog can)."""
    with psycopg.connect(url, autocommit=True) as c:
        row = c.execute("SELECT schema_name FROM eventlog.profiles WHERE name = %s", (profile,)).fetchone()
        assert row is not None
        s = row[0]
        with PostgresLog.open(url, profile=profile) as lg:
            env = lg.get(keep)
            assert env is not None
        with c.transaction():
            c.execute(f'DELETE FROM "{s}".events WHERE seq > %s', (keep,))
            c.execute(f'UPDATE "{s}".head SET seq = %s, hash = %s', (keep, env["hash"]))
            c.execute(f'DELETE FROM "{s}".streams')
            c.execute(f'INSERT INTO "{s}".streams SELECT session, count(*) FROM "{s}".events '
                      f'WHERE session IS NOT NULL GROUP BY session')


@pytest.mark.parametrize("then_diverges", [False, True])
def test_a_rewound_log_is_detected_and_rebuilt(tmp_path: Path, pg_url: str, pg_profile: str, then_diverges: bool) -> None:
    home = tmp_path / "h"
    with SessionStore.open(home, pg_profile, log=pg_url, follower=False) as store:
        fill(store, "kept", 2)
        fill(store, "lost", 5)
        store.sync()  # the projection holds all of it before the log is rewound under it
    _rewind(pg_url, pg_profile, keep=3)
    with PostgresLog.open(pg_url, profile=pg_profile) as lg:
        assert lg.verify().ok and lg.head()[0] == 3
        if then_diverges:  # other events now stand where the projection's cursor points
            lg.append([{"type": "session.created", "session": f"new{i}", "data": {"source": "cli"}} for i in range(9)])
        expect = "foreign" if then_diverges else "ahead"
        assert state_status(home, pg_profile, lg) == expect
    with SessionStore.open(home, pg_profile, log=pg_url, follower=False) as store:
        ids = sorted(s["id"] for s in store.list_sessions(limit=None))
        assert ids == sorted(["kept"] + ([f"new{i}" for i in range(9)] if then_diverges else []))
        assert [m["content"] for m in store.get_messages("kept")] == ["message 0 of kept", "message 1 of kept"]


def test_copy_between_backends_keeps_seqs_and_hashes(tmp_path: Path, pg_url: str, pg_profile: str) -> None:
    with EventLog.open(tmp_path / "src", profile="p") as src:
        src.append([dict(ev(f"s{i % 7}", i=i, text="☃" * (i % 5)), id=f"e{i}") for i in range(2500)])
        with PostgresLog.open(pg_url, profile=pg_profile) as pg:
            seen: list[int] = []
            res = copy_log(src, pg, progress=lambda done, total: seen.append(done))
            assert (res.copied, res.skipped, res.head_seq) == (2500, 0, 2500) and res.verify.ok
            assert seen == [1000, 2000, 2500]
            assert stored(pg) == stored(src) and pg.head() == src.head()
            assert pg.stream_version("s3") == src.stream_version("s3") and pg.event_seq("e77") == 78
            pg.append([ev("s1", after="copy")])
            with EventLog.open(tmp_path / "back", profile="p") as back:
                back.append_sealed(stored(pg)[:100])  # an interrupted copy back resumes where it stopped
                res = copy_log(pg, back)
                assert (res.copied, res.skipped) == (2401, 100) and stored(back) == stored(pg)
            with EventLog.open(tmp_path / "diverged", profile="p") as diverged:
                diverged.append([ev(n=1)])
                with pytest.raises(IntegrityError):
                    copy_log(pg, diverged)
                assert diverged.head()[0] == 1


def test_erase_session_on_postgres_leaves_no_word_in_the_rows_or_the_host_files(tmp_path: Path, pg_url: str,
                                                                                  pg_profile: str) -> None:
    marker = "PgEraseMarker31"
    home = tmp_path / "h"
    with SessionStore.open(home, pg_profile, log=pg_url, follower=False) as store:
        secret = store.create_session(source="cli", title=f"about {marker}")
        store.append_message(secret, "user", f"{marker} in a message")
        fill(store, "kept", 2)
        assert store.search(marker)["results"]
        done = store.erase_session(secret, "asked to forget", by="test")
        assert done["events"] == 2 and store.get_session(secret) is None and not store.search(marker)["results"]
        assert [m["content"] for m in store.get_messages("kept")] == ["message 0 of kept", "message 1 of kept"]
        with pytest.raises(ConflictError):
            store.compact()  # only the LMDB log compacts; the server reclaims its own pages
    with PostgresLog.open(pg_url, profile=pg_profile) as lg:
        res = lg.verify()
        assert res.ok and res.erased == 2
        assert not any(marker.encode() in raw or marker.lower().encode() in raw for _, raw in lg.read(raw=True))
    found = [p for p in home.rglob("*") if p.is_file() and not (p.is_symlink() and not p.exists())
             and marker.lower().encode() in p.read_bytes().lower()]
    assert found == []


def test_an_erase_by_another_host_is_purged_from_this_hosts_files_at_its_next_read(tmp_path: Path, pg_url: str,
                                                                                 pg_profile: str) -> None:
    marker = "PgOtherHostMarker52"
    a, b = tmp_path / "host-a", tmp_path / "host-b"
    with SessionStore.open(a, pg_profile, log=pg_url, follower=False) as host_a, \
            SessionStore.open(b, pg_profile, log=pg_url, follower=False) as host_b:
        secret = host_a.create_session(source="cli", title="secret")
        host_a.append_messages(secret, [{"role": "user", "content": f"{marker} {i}"} for i in range(10)])
        fill(host_a, "kept", 3)
        assert host_b.search(marker)["results"]  # host B's own files index the words
        host_a.erase_session(secret, "asked to forget")
        assert host_b.search(marker)["results"] == [] and host_b.get_session(secret) is None
        assert [m["content"] for m in host_b.get_messages("kept")][0] == "message 0 of kept"
    found = [p for p in b.rglob("*") if p.is_file() and not (p.is_symlink() and not p.exists())
             and marker.lower().encode() in p.read_bytes().lower()]
    assert found == []


RACER = """
import sys, time
from eventlog import SessionStore
from eventlog.errors import TitleConflictError
home, url, profile, sid, go, title = sys.argv[1:7]
with SessionStore.open(home, profile, log=url, follower=False) as st:
    st.sync(5)
    while time.time() < float(go):
        pass
    try:
        print("ACK", st.set_title(sid, title))
    except TitleConflictError:
        print("CONFLICT")
"""


def test_two_hosts_racing_for_one_title_on_postgres_get_one_acknowledgement(tmp_path: Path, pg_url: str,
                                                                          pg_profile: str) -> None:
    """The title rule's check and append were serialized by a lock file in each host's home:
    two hosts on one PostgreSQL log each got theirs acknowledged and the fold dropped one (found
    by an outside audit). The rules lock is also taken on the server now."""
    import os
    import subprocess
    import sys
    import time

    homes = [tmp_path / "hostA", tmp_path / "hostB"]
    root = str(Path(__file__).resolve().parent.parent)
    for rnd in range(3):
        with SessionStore.open(homes[0], pg_profile, log=pg_url, follower=False) as st:
            sids = [st.create_session(source="cli"), st.create_session(source="cli")]
        go, title = time.time() + 2.5, f"release notes {rnd}"
        racers = [subprocess.Popen([sys.executable, "-c", RACER, str(homes[k]), pg_url, pg_profile, sids[k], str(go), title],
                                   stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=root))
                  for k in range(2)]
        outs = sorted(p.communicate(timeout=60)[0].split()[0] for p in racers)
        assert outs == ["ACK", "CONFLICT"], (rnd, outs)
        with SessionStore.open(homes[1], pg_profile, log=pg_url, follower=False) as st:
            st.sync(5)
            assert sorted(str((st.get_session(s) or {}).get("title")) for s in sids) == ["None", title]


_ERASE_OTHER = """
import sys
from eventlog import SessionStore
home, profile, url, sid = sys.argv[1:5]
with SessionStore.open(home, profile, log=url, follower=False) as st:
    st.erase_session(sid, "asked to forget", by="test")
print("erased")
"""


def test_a_write_to_a_session_another_process_erased_is_refused_on_postgres(tmp_path: Path, pg_url: str,
                                                                             pg_profile: str) -> None:
    """An erase changes no stream version, so a handle that appended to a session (its fast path
    appends at the version it knew) wrote on into the erased stream: acknowledged, then gone.
    The PostgreSQL log now refuses an append at a version to a stream whose first and last
    events are erased, as the LMDB log does; the store then finds the session gone."""
    import subprocess
    import sys

    from eventlog.errors import NotFoundError

    home = tmp_path / "h"
    with SessionStore.open(home, pg_profile, log=pg_url, follower=False) as store:
        fill(store, "doomed", 2)
        fill(store, "kept", 1)
        done = subprocess.run([sys.executable, "-c", _ERASE_OTHER, str(home), pg_profile, pg_url, "doomed"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stdout.strip() == "erased", done.stderr
        head = store.log.head()[0]
        with pytest.raises(NotFoundError):
            store.append_message("doomed", "user", "written after the erase")
        assert store.log.head()[0] == head
        store.append_message("kept", "user", "still taken")
        assert [m["content"] for m in store.get_messages("kept")][-1] == "still taken"


def test_a_langgraph_write_to_a_thread_another_process_erased_is_refused_on_postgres(
        tmp_path: Path, pg_url: str, pg_profile: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The saver's put/put_writes append at the thread stream's version: on PostgreSQL that was
    not refused after another process erased the thread (a documented gap until now)."""
    import subprocess
    import sys

    pytest.importorskip("langgraph")
    from eventlog.adapters.langgraph import EventlogSaver
    from eventlog.errors import NotFoundError

    monkeypatch.setenv("EVENTLOG_LOG_URL", pg_url)
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    eraser = ("import sys\nfrom eventlog.adapters.langgraph import EventlogSaver\n"
              "with EventlogSaver(home=sys.argv[1], profile=sys.argv[2], erase_deleted=True) as s:\n"
              "    s.delete_thread('t')\nprint('erased')\n")

    def checkpoint(n: int) -> dict[str, Any]:
        return {"v": 4, "id": f"1ef0000{n}-0000-6000-8000-000000000000", "ts": "2026-12-06T00:00:00+00:00",
                "channel_values": {"v": f"value {n}"}, "channel_versions": {"v": n}, "versions_seen": {},
                "updated_channels": ["v"]}

    with EventlogSaver(home=tmp_path, profile=pg_profile) as s:
        c = s.put(config, checkpoint(1), {"step": 0}, {"v": 1})  # type: ignore[arg-type]
        s.put_writes(c, [("v", "pending")], "task-1")
        done = subprocess.run([sys.executable, "-c", eraser, str(tmp_path), pg_profile], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0 and done.stdout.strip() == "erased", done.stderr
        store = s._open()
        head = store.log.head()[0]
        with pytest.raises(NotFoundError):
            s.put(c, checkpoint(2), {"step": 1}, {"v": 2})  # type: ignore[arg-type]
        with pytest.raises(NotFoundError):
            s.put_writes(c, [("v", "again")], "task-2")
        assert store.log.head()[0] == head and s.get_tuple(config) is None  # type: ignore[arg-type]
