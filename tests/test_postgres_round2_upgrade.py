"""Second-round audit of the PostgreSQL log: administrators opening, at once, a profile whose
layout an earlier release left (the erase function of an older version, no zdicts table)."""
from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from eventlog.log.pg_schema import ERASE_VERSION
from eventlog.log.postgres import PostgresLog

pytestmark = pytest.mark.postgres


def open_at_once(url: str, profile: str, n: int) -> list[BaseException]:
    gate = threading.Barrier(n)
    failed: list[BaseException] = []

    def one() -> None:
        gate.wait()
        try:
            with PostgresLog.open(url, profile=profile) as lg:
                lg.append([{"type": "x.y", "session": "s", "data": {}}])
        except BaseException as e:  # collected for the assertion
            failed.append(e)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return failed


def test_administrators_opening_at_once_all_upgrade_an_older_erase_function(pg_url: str, pg_profile: str) -> None:
    with PostgresLog.open(pg_url, profile=pg_profile) as lg:
        schema = lg.info.schema
    failed: list[Any] = []
    for _ in range(6):
        with psycopg.connect(pg_url, autocommit=True) as c:  # as the previous release left it
            c.execute(f'COMMENT ON FUNCTION "{schema}".erase_events(bigint[], bytea[]) IS \'eventlog erase_events 2\'')
        failed += open_at_once(pg_url, pg_profile, 6)
    assert not failed, failed[0]  # was: StorageError "cannot open the log ...: tuple concurrently updated"
    with psycopg.connect(pg_url, autocommit=True) as c:
        row = c.execute(f"SELECT obj_description('\"{schema}\".erase_events(bigint[], bytea[])'::regprocedure, "
                        "'pg_proc')").fetchone()
    assert row is not None and row[0] == ERASE_VERSION
    with PostgresLog.open(pg_url, profile=pg_profile) as lg:
        assert lg.head()[0] == 36 and lg.verify().ok


def test_administrators_opening_at_once_all_add_the_missing_zdicts_table(pg_url: str, pg_profile: str) -> None:
    with PostgresLog.open(pg_url, profile=pg_profile) as lg:
        schema = lg.info.schema
    failed: list[Any] = []
    for _ in range(6):
        with psycopg.connect(pg_url, autocommit=True) as c:  # no dictionary trained yet: nothing lost
            c.execute(f'DROP TABLE "{schema}".zdicts')
        failed += open_at_once(pg_url, pg_profile, 6)
    assert not failed, failed[0]
    with PostgresLog.open(pg_url, profile=pg_profile) as lg:
        assert lg.head()[0] == 36 and lg.verify().ok
