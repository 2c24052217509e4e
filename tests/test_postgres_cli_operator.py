"""The CLI on a PostgreSQL log, driven as an operator meets it: the server refusing a read or
cutting a statement short is an error that names it (exit 1), never a damaged log, a foreign
projection or an empty answer."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from eventlog.cli import main
from eventlog.log.pg_schema import connect, lookup

pytestmark = pytest.mark.postgres


def run(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


def test_a_read_the_server_refuses_is_an_error_and_the_projection_is_kept(tmp_path: Path, pg_server: Any,
                                                                         pg_url: str, pg_profile: str) -> None:
    """With SELECT on the events revoked from the profile's role (the head still readable),
    `sessions list` took the failed read of seq 1 for a projection of another log: it rebuilt
    state.db and the index, empty, called the log damaged at seq 1 and answered [] with exit 0."""
    base = ["--home", str(tmp_path / "h"), "--profile", pg_profile, "--log-url", pg_url]
    for sid in ("s1", "s2"):
        assert run(*base, "sessions", "new", "--id", sid).exit_code == 0
    assert run(*base, "messages", "add", "s1", "--role", "user", "--content", "kept words").exit_code == 0
    pointer = tmp_path / "h" / "profiles" / pg_profile / "state.db"
    built = os.readlink(pointer)
    with connect(pg_url) as conn:
        info = lookup(conn, pg_profile)
    assert info is not None
    pg_server.psql(f'REVOKE SELECT ON "{info.schema}".events FROM "{info.role}"')
    try:
        for cmd in (["sessions", "list", "--json"], ["search", "kept", "--json"], ["stats", "--json"]):
            res = run(*base, *cmd)
            assert res.exit_code == 1, (cmd, res.output)
            assert "permission denied for table events" in res.stderr, (cmd, res.stderr)
            assert "damaged" not in res.stderr and "another log" not in res.stderr, (cmd, res.stderr)
            assert res.stdout == ""
        assert os.readlink(pointer) == built  # not rebuilt
    finally:
        pg_server.psql(f'GRANT SELECT ON "{info.schema}".events TO "{info.role}"')
    res = run(*base, "sessions", "list", "--json")
    assert res.exit_code == 0 and res.stderr == "", res.stderr
    assert sorted(s["id"] for s in json.loads(res.stdout)) == ["s1", "s2"]
    assert os.readlink(pointer) == built
    res = run(*base, "search", "kept", "--json")
    assert res.exit_code == 0 and [r["session_id"] for r in json.loads(res.stdout)["results"]] == ["s1"]


@pytest.mark.parametrize("cached_head", [False, True])
def test_a_statement_timeout_is_named_and_a_refused_append_is_not_of_unknown_outcome(
        pg_url: str, pg_profile: str, cached_head: bool) -> None:
    """A statement_timeout (here in the URL's options) that ends an append's wait for the
    profile's lock: the server answered, the transaction aborted, nothing was stored. The append
    said "cannot reach PostgreSQL ... check that the server is running", and a handle that wrote
    the head it knew (the one-round-trip append, whose COMMIT is in the same pipeline) raised
    OutcomeUnknownError, "the connection was lost after COMMIT was sent"."""
    from eventlog.errors import OutcomeUnknownError, StorageError
    from eventlog.log.pg_schema import LOCK_NAMESPACE
    from eventlog.log.postgres import PostgresLog

    with PostgresLog.open(pg_url, profile=pg_profile) as admin:
        admin.append([{"type": "note.added", "session": "s1", "data": {"text": "first"}}])
        pid = admin.info.id
    timed = pg_url + "?options=-c%20statement_timeout%3D100"
    with PostgresLog.open(timed, profile=pg_profile, reconnect_timeout=0.5) as log, connect(pg_url) as holder:
        if cached_head:
            log.append([{"type": "note.added", "session": "s1", "data": {"text": "second"}}])
        head = log.head()
        holder.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_NAMESPACE, pid))
        with pytest.raises(StorageError) as info:
            log.append([{"type": "note.added", "session": "s1", "data": {"text": "refused"}, "id": "e-refused"}])
        assert not isinstance(info.value, OutcomeUnknownError), info.value
        assert "cannot reach" not in str(info.value) and "statement timeout" in str(info.value)
        assert info.value.hint is not None and "statement_timeout" in info.value.hint
        holder.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_NAMESPACE, pid))
        assert log.head() == head
        assert log.append([{"type": "note.added", "session": "s1", "data": {"text": "refused"}, "id": "e-refused"}]) \
            == [head[0] + 1]


def test_a_profile_whose_schema_was_dropped_by_hand_is_not_created_by_init_and_names_the_layout(
        tmp_path: Path, pg_server: Any, pg_url: str, pg_profile: str) -> None:
    """The registry still names the profile, its schema is gone: `eventlog init` said it had
    created the profile (exit 0), and every command's hint sent the operator to check the URL
    and the server, which were right."""
    base = ["--home", str(tmp_path / "h"), "--profile", pg_profile, "--log-url", pg_url]
    assert run(*base, "sessions", "new", "--id", "s1").exit_code == 0
    with connect(pg_url) as conn:
        info = lookup(conn, pg_profile)
    assert info is not None
    pg_server.psql(f'DROP SCHEMA "{info.schema}" CASCADE')
    for cmd in (["init"], ["sessions", "list"], ["log", "verify"]):
        res = run(*base, *cmd)
        assert res.exit_code == 1, (cmd, res.output)
        assert f'relation "{info.schema}.head" does not exist' in res.stderr, (cmd, res.stderr)
        assert "not the layout this version of eventlog uses" in res.stderr and "check the PostgreSQL URL" not in res.stderr


def test_demo_writes_to_the_log_the_log_url_names(tmp_path: Path, pg_url: str, pg_profile: str) -> None:
    """`eventlog --log-url URL demo` (or EVENTLOG_LOG_URL) printed "log verify: ok" for a log it
    had made in the home, as LMDB: the server never heard of the profile."""
    from eventlog.log.postgres import PostgresLog

    res = run("--home", str(tmp_path / "h"), "--profile", pg_profile, "--log-url", pg_url, "demo")
    assert res.exit_code == 0, res.output
    assert "log verify: ok (8 events, head 8)" in res.stdout and "eventlog-test" not in res.stdout
    assert not (tmp_path / "h" / "profiles" / pg_profile / "log").exists()
    with PostgresLog.open(pg_url, profile=pg_profile, create=False) as log:
        assert log.head()[0] == 8


@pytest.mark.parametrize("scheme", ["POSTGRESQL", "Postgres"])
def test_a_url_scheme_in_upper_case_is_a_url(tmp_path: Path, pg_url: str, pg_profile: str, scheme: str) -> None:
    """The scheme is taken in any case (the URL check, the redaction, open_log all do), but libpq
    was handed it as typed and read it as a key=value string: 'missing "=" after ...'."""
    url = scheme + pg_url[pg_url.index("://"):]
    base = ["--home", str(tmp_path / "h"), "--profile", pg_profile, "--log-url", url]
    res = run(*base, "sessions", "new", "--id", "s1")
    assert res.exit_code == 0 and res.stdout == "s1\n", res.output
    res = run(*base, "log", "verify", "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["head_seq"] == 1


def test_a_damaged_event_on_postgres_is_reported_without_claiming_appends_are_refused(
        tmp_path: Path, pg_server: Any, pg_url: str, pg_profile: str) -> None:
    """A stored event changed on the server: `doctor` said "damaged at seq 4: ... appends are
    refused" (and a fresh host's read warned the same), then took the next append. Only a log
    with a local directory keeps the damage marker that refuses them."""
    h1 = ["--home", str(tmp_path / "h1"), "--profile", pg_profile, "--log-url", pg_url]
    for i in (1, 2, 3):
        assert run(*h1, "sessions", "new", "--id", f"s{i}").exit_code == 0
        assert run(*h1, "messages", "add", f"s{i}", "--role", "user", "--content", f"words {i}").exit_code == 0
    with connect(pg_url) as conn:
        info = lookup(conn, pg_profile)
    assert info is not None
    pg_server.psql(f"UPDATE \"{info.schema}\".events SET body = overlay(body placing '\\x00'::bytea "
                   "from length(body) - 2 for 1) WHERE seq = 4")
    res = run(*h1, "doctor", "--json")
    assert res.exit_code == 1
    report = json.loads(res.stdout)["log"]
    assert report["first_bad_seq"] == 4 and "appends are not refused" in report["detail"], report
    assert "log/" not in report["hint"] and "schema" in report["hint"]
    h2 = ["--home", str(tmp_path / "h2"), "--profile", pg_profile, "--log-url", pg_url]  # a host that never applied it
    res = run(*h2, "sessions", "list", "--json")
    assert res.exit_code == 0 and "damaged at seq 4" in res.stderr and "appends are not refused" in res.stderr, res.stderr
    assert sorted(s["id"] for s in json.loads(res.stdout)) == ["s1", "s2"]  # s2 was created at seq 3
    res = run(*h2, "messages", "add", "s1", "--role", "user", "--content", "taken")
    assert res.exit_code == 0, res.output  # as the report says


def test_an_administrator_open_leaves_a_later_releases_erase_function_as_it_is(
        tmp_path: Path, pg_server: Any, pg_url: str, pg_profile: str) -> None:
    """Hosts upgraded one at a time: an administrator URL of a host still on this release replaced
    the erase function a later release had installed by its own, older one (it replaced every
    version but its own, where docs/POSTGRES.md says an earlier version is upgraded)."""
    base = ["--home", str(tmp_path / "h"), "--profile", pg_profile, "--log-url", pg_url]
    assert run(*base, "sessions", "new", "--id", "s1").exit_code == 0
    with connect(pg_url) as conn:
        info = lookup(conn, pg_profile)
    assert info is not None
    fn = f'"{info.schema}".erase_events(bigint[], bytea[])'
    later = "eventlog erase_events 99: a later release"
    pg_server.psql(f"COMMENT ON FUNCTION {fn} IS '{later}'")
    res = run(*base, "sessions", "list")
    assert res.exit_code == 0, res.output
    assert pg_server.psql(f"SELECT obj_description('{fn}'::regprocedure, 'pg_proc')") == later


@pytest.mark.parametrize("cached_head", [False, True])
def test_lock_timeout_bounds_an_appends_wait_for_the_append_lock(tmp_path: Path, pg_url: str, pg_profile: str,
                                                                 cached_head: bool) -> None:
    """Another session holds the profile's append lock (a host stopped inside a write, a long
    import): an append waited as long as it was held, whatever ``lock_timeout`` the store was
    opened with (the option was LMDB's only). With it, the append gives up after it with
    WriterBusyError naming the server process that holds the lock, nothing written; without it,
    it still waits (checked for a moment here); once the lock is free the append goes through."""
    import threading

    from eventlog.errors import WriterBusyError
    from eventlog.log.pg_schema import LOCK_NAMESPACE
    from eventlog.log.postgres import PostgresLog
    from eventlog.sessions.store import SessionStore

    with SessionStore.open(tmp_path / "h", pg_profile, log=pg_url, follower=False, lock_timeout=0.3) as store, \
            connect(pg_url) as holder:
        sid = store.create_session(title="t")
        if cached_head:
            store.append_message(sid, "user", "second")
        assert isinstance(store.log, PostgresLog) and store.log.append_lock_timeout == 0.3
        head = store.log.head()
        holder_pid = holder.execute("SELECT pg_backend_pid()").fetchone()[0]
        holder.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_NAMESPACE, store.log.info.id))
        caught: list[BaseException] = []

        def refused() -> None:
            try:
                store.append_message(sid, "user", "refused")
            except BaseException as e:
                caught.append(e)
        t = threading.Thread(target=refused, daemon=True)  # a wait without end fails here, not the run
        t.start()
        t.join(20)
        assert not t.is_alive(), "the append still waits for the lock, 20 s past its 0.3 s bound"
        assert len(caught) == 1 and isinstance(caught[0], WriterBusyError), caught
        busy = caught[0]
        assert f"held by server process {holder_pid}" in str(busy), busy
        assert busy.hint is not None and f"pg_terminate_backend({holder_pid})" in busy.hint
        assert store.log.head() == head
        with PostgresLog.open(pg_url, profile=pg_profile) as unbounded:  # the default: no bound
            done = threading.Event()
            t = threading.Thread(target=lambda: (unbounded.append([{"type": "note.added", "session": "n",
                                                                    "data": {"text": "waits"}}]), done.set()))
            t.start()
            assert not done.wait(1.0)  # still waiting, past the other handle's 0.3 s
            holder.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_NAMESPACE, store.log.info.id))
            t.join(30)
            assert done.is_set()
        assert store.append_message(sid, "user", "after") == head[0] + 2
    with pytest.raises(Exception) as bad:
        PostgresLog.open(pg_url, profile=pg_profile, lock_timeout="x")  # type: ignore[arg-type]
    assert getattr(bad.value, "field", None) == "lock_timeout"
