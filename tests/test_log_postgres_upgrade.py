"""Profiles created by earlier releases keep working: tests/data/pg-release1-profile.sql is a
profile the first PostgreSQL release (1794d19) created and appended to (format 1, no zdicts
table, no erase function), written by tests/data/make_pg_release1_profile.py."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from eventlog.log.pg_schema import ERASE_VERSION, grant_login
from eventlog.log.postgres import PostgresLog

pytestmark = pytest.mark.postgres
FIXTURE = Path(__file__).parent / "data" / "pg-release1-profile.sql"


def load_release1_profile(url: str, name: str) -> tuple[str, str]:
    """Restore the first release's profile as ``name`` under an id never given (its schema, role)."""
    PostgresLog.open(url, profile=name + "-registry").close()  # the registry, as this release keeps it
    with psycopg.connect(url, autocommit=True) as c:
        pid = int(c.execute("SELECT nextval('eventlog.profile_ids')").fetchone()[0])  # type: ignore[index]
        dboid = int(c.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0])  # type: ignore[index]
        schema, role = f"eventlog_p{pid}", f"eventlog_{dboid}_p{pid}"
        text = FIXTURE.read_text(encoding="utf-8")
        for key, value in (("{schema}", schema), ("{role}", role), ("{id}", str(pid)), ("{name}", name)):
            text = text.replace(key, value)
        with c.transaction():
            c.execute(text.encode())  # type: ignore[call-overload]
        c.execute("RESET ALL")
    return schema, role


def test_a_profile_of_the_first_release_takes_appends_from_a_host_login_and_an_administrator(
        pg_server: Any, pg_url: str, pg_profile: str) -> None:
    """Appends to it failed ('relation "eventlog_pN.zdicts" does not exist'): the append's head
    read also read the dictionaries' table, which the first release did not create, and only the
    erase function was ever added to an earlier profile."""
    schema, _role = load_release1_profile(pg_url, pg_profile)
    login = f"host_{pg_profile.replace('-', '_')}"
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute(f"CREATE ROLE \"{login}\" LOGIN PASSWORD 'pw-h'")
        grant_login(c, pg_profile, login)
    with PostgresLog.open(pg_server.url(user=login, password="pw-h"), profile=pg_profile) as host:
        assert host.info.format == 1 and host.head()[0] == 4 and host.verify().ok
        assert host.append([{"type": "note.added", "session": "s1", "data": {"text": "old 0"}, "id": "old0"}]) == [1]
        assert host.append([{"type": "note.added", "session": "s1", "data": {"text": "new"}}],
                           expected_version=3) == [5]
    with psycopg.connect(pg_url, autocommit=True) as c:  # a host login may not add the table: still missing
        assert c.execute("SELECT to_regclass(%s)", (f"{schema}.zdicts",)).fetchone() == (None,)
    with PostgresLog.open(pg_url, profile=pg_profile) as admin:  # an administrator's open upgrades it
        assert admin.append([{"type": "note.added", "session": "s2", "data": {"text": "more"}}]) == [6]
        res = admin.verify()
        assert res.ok and res.events == 6
        assert [e["data"]["text"] for e in admin.read_session("s2")] == ["héllo ☃", "more"]
    with psycopg.connect(pg_url, autocommit=True) as c:
        assert c.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{schema}.zdicts",)).fetchone() == (True,)
        fn = f"{schema}.erase_events(bigint[], bytea[])"
        assert c.execute("SELECT obj_description(to_regprocedure(%s), 'pg_proc')", (fn,)).fetchone() == (ERASE_VERSION,)
        c.execute(f'SET ROLE "{_role}"')  # and the profile's role may use the new table
        assert c.execute(f"SELECT count(*) FROM {schema}.zdicts").fetchone() == (0,)


def test_an_erase_record_imported_into_a_first_release_profile_says_the_events_stay_whole(
        pg_url: str, pg_profile: str, caplog: pytest.LogCaptureFixture) -> None:
    """A mirror on a format-1 profile (which cannot be erased) refreshed after an erase at its
    source got the log.erased record and kept the events it names whole, silently: POSTGRES.md
    promises a warning to erase on the target when a record stubs nothing."""
    from eventlog.log.copy import copy_log
    from eventlog.log.memory import MemoryLog

    load_release1_profile(pg_url, pg_profile)
    source = MemoryLog()
    with PostgresLog.open(pg_url, profile=pg_profile) as mirror:
        copy_log(mirror, source)
        assert source.erase([2], {"reason": "asked"}) == 5
        with caplog.at_level("WARNING", logger="eventlog"):
            copy_log(source, mirror)
        assert mirror.info.format == 1 and mirror.head()[0] == 5 and mirror.stubbed == 0
        assert [e["data"]["text"] for e in mirror.read(2, 2)] == ["old 1"]  # as it was
    assert "format-1 log holds whole (1)" in caplog.text and "log copy" in caplog.text
