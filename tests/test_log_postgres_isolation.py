"""Profiles stay apart on a shared server even when the profile's role is misused or a profile is
removed under an open handle (invariant 9). Each test here failed before its fix (outside audit)."""
from __future__ import annotations

from typing import Any

import psycopg
import pytest

from eventlog.errors import ProfileGoneError
from eventlog.log.contract import ev
from eventlog.log.postgres import PostgresLog, drop_empty_profile

pytestmark = pytest.mark.postgres


def superuser(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


def terminate(url: str, *pids: int) -> None:
    with superuser(url) as c:
        for pid in pids:
            c.execute("SELECT pg_terminate_backend(%s)", (pid,))


def test_a_removed_profiles_id_is_never_given_again_and_its_open_handle_reaches_no_other_log(
        pg_url: str, pg_profile: str) -> None:
    """Ids were max(id) + 1: after a refused import removed the newest profile X, the next one
    created got X's id, so X's schema and role names, and a handle still open on X read Y's
    sessions and, once reconnected, appended into Y's log."""
    x, y = f"{pg_profile}-x", f"{pg_profile}-y"
    stale = PostgresLog.open(pg_url, profile=x)
    try:
        writer_pid = stale._writer.info.backend_pid if stale._writer else 0
        assert drop_empty_profile(pg_url, x)
        with PostgresLog.open(pg_url, profile=y) as ly:
            assert ly.info.id > stale.info.id and ly.info.schema != stale.info.schema
            assert ly.info.role != stale.info.role
            ly.append([ev("s", secret="of y")])
            with pytest.raises(ProfileGoneError, match="was removed"):
                stale.head()
            with pytest.raises(ProfileGoneError):
                stale.append([ev("s", written="by x")])  # on the connection opened before the removal
            terminate(pg_url, writer_pid)
            with pytest.raises(ProfileGoneError):
                stale.append([ev("s", written="by x")])  # on a new connection
            assert [e["data"] for e in ly.read()] == [{"secret": "of y"}] and ly.verify().ok
    finally:
        stale.close()


def test_a_handle_on_a_profile_removed_and_created_anew_refuses_every_new_connection(
        pg_url: str, pg_profile: str) -> None:
    stale = PostgresLog.open(pg_url, profile=pg_profile)
    try:
        assert drop_empty_profile(pg_url, pg_profile)
        with PostgresLog.open(pg_url, profile=pg_profile) as fresh:  # same name, another profile
            fresh.append([ev("s", n=1)])
            with pytest.raises(ProfileGoneError, match="removed and created anew"):
                stale.read_session("s").__next__()
            with pytest.raises(ProfileGoneError):
                stale.append([ev("s", n=2)])
            assert fresh.head()[0] == 1
    finally:
        stale.close()
