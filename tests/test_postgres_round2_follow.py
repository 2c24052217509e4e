"""Second-round audit of the PostgreSQL log: a follower of a profile removed from the server."""
from __future__ import annotations

import threading
import time

import pytest

from eventlog.errors import ProfileGoneError
from eventlog.log.postgres import PostgresLog, drop_empty_profile

pytestmark = pytest.mark.postgres


def test_a_follower_of_a_removed_profile_gets_profile_gone(pg_url: str, pg_profile: str) -> None:
    with PostgresLog.open(pg_url, profile=pg_profile) as lg:
        ended: list[BaseException | None] = []

        def follow() -> None:
            try:
                for _ in lg.follow(1, timeout=5):
                    pass
                ended.append(None)
            except BaseException as e:  # collected for the assertion
                ended.append(e)

        t = threading.Thread(target=follow)
        t.start()
        time.sleep(0.3)
        assert drop_empty_profile(pg_url, pg_profile)
        t.join(15)
        # was: a warning "...; still trying" every second, and with no timeout a follower forever
        assert len(ended) == 1 and isinstance(ended[0], ProfileGoneError), ended
