"""Second-round audit of the PostgreSQL log: a host login whose grant of the profile was revoked
while its handle was open is told so, not that the profile was removed (with the advice to
restore its log from a backup)."""
from __future__ import annotations

from typing import Any

import psycopg
import pytest

from eventlog.errors import ProfileGoneError, StorageError, ValidationError
from eventlog.log.pg_schema import grant_login
from eventlog.log.postgres import PostgresLog

pytestmark = pytest.mark.postgres


def test_a_revoked_login_is_told_so_and_the_profile_is_not_called_removed(pg_server: Any, pg_url: str,
                                                                          pg_profile: str) -> None:
    login = "round2_" + pg_profile.replace("-", "_")
    with PostgresLog.open(pg_url, profile=pg_profile) as a:
        a.append([{"type": "x.y", "session": "s", "data": {}}])
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute(f"CREATE ROLE {login} LOGIN PASSWORD 'pw'")
        grant_login(c, pg_profile, login)
    with PostgresLog.open(pg_server.url(user=login, password="pw"), profile=pg_profile) as host:
        assert host.head()[0] == 1
        with psycopg.connect(pg_url, autocommit=True) as c:
            c.execute(f'REVOKE "{host.info.role}" FROM {login}')
            c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (login,))
        with pytest.raises(StorageError) as info:
            host.head()
        assert not isinstance(info.value, ProfileGoneError)  # was: "was removed", hint: restore it from a backup
        assert "revoked" in str(info.value) and "grant_login" in str(info.value.hint)
    with PostgresLog.open(pg_url, profile=pg_profile) as a:
        assert a.head()[0] == 1 and a.verify().ok


@pytest.mark.parametrize("options", [{"reconnect_timeout": "5"}, {"reconnect_timeout": float("nan")},
                                     {"reconnect_timeout": -1}, {"connect_timeout": float("nan")},
                                     {"connect_timeout": "10"}, {"connect_timeout": True}])
def test_timeouts_that_are_not_seconds_are_refused_at_open(pg_url: str, pg_profile: str, options: Any) -> None:
    """Were taken: NaN failed the open with a raw ValueError, and a string failed the first append
    that met a lost connection with a raw TypeError, out of the group commit's except clause."""
    with pytest.raises(ValidationError) as info:
        PostgresLog.open(pg_url, profile=pg_profile, **options)
    assert info.value.field == next(iter(options))


def test_a_reconnect_timeout_without_end_is_taken(pg_url: str, pg_profile: str) -> None:
    with PostgresLog.open(pg_url, profile=pg_profile, reconnect_timeout=float("inf"), connect_timeout=0) as lg:
        assert lg.append([{"type": "x.y", "session": "s", "data": {}}]) == [1]
