"""What an erase says it erased is what its record names. `erase_session` reads the streams, then
erases them inside the log's write transaction (also every event appended since its read); it
counted only the events of its read, so with another process writing into the session its
answer (`events`, and `eventlog sessions erase`'s "erased N events") was short of the record it
had written: 592 against 622 with a writer at full speed (outside audit, helper-74)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from eventlog.sessions.store import SessionStore

APPEND = textwrap.dedent("""
    import sys
    from eventlog.sessions.store import SessionStore
    with SessionStore.open(sys.argv[1], "p", follower=False) as store:
        for i in range(3):
            store.append_message(sys.argv[2], "user", f"written meanwhile {i}")
""")


@pytest.mark.parametrize("how", ["erase_session", "retention"])
def test_the_count_an_erase_returns_is_what_its_record_names(tmp_path: Path, how: str) -> None:
    with SessionStore.open(tmp_path, "p", follower=False) as store:
        sid = store.create_session(source="cli", started_at=1_000_000_000.0)
        for i in range(4):
            store.append_message(sid, "user", f"m {i}", timestamp=1_000_000_001.0)
        real = store.log.erase
        done: list[int] = []

        def erase_after_another_process_wrote(*a: Any, **k: Any) -> int:
            if not done:  # between the store's read of the streams and its erase: a real write
                subprocess.run([sys.executable, "-c", APPEND, str(tmp_path), sid], check=True)
            done.append(1)
            return int(real(*a, **k))

        store.log.erase = erase_after_another_process_wrote  # type: ignore[method-assign]
        if how == "erase_session":
            out = store.erase_session(sid, "asked")
            seq, count = out["seq"], out["events"]
        else:
            res = store.retention(86400.0)
            seq, count = res["seq"], res["erased_events"]
        record = store.log.get(seq)
        assert record is not None and record["type"] == "log.erased"
        assert count == len(record["data"]["erased"]) == 8  # the 5 it read and the 3 written meanwhile
        assert store.log.verify().erased == 8


def test_a_record_that_cannot_be_read_back_does_not_turn_a_finished_erase_into_an_error(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The count reads the record back after the erase committed; on PostgreSQL the server can be
    gone at that moment (a StorageError), which made a finished erase fail and skip its cleanup
    (helper-77). The erase now answers with the count it knew before, and the words are gone."""
    from eventlog.errors import StorageError

    with SessionStore.open(tmp_path, "p", follower=False) as store:
        sid = store.create_session(source="cli")
        for i in range(4):
            store.append_message(sid, "user", f"m {i}")
        real_erase, real_get = store.log.erase, store.log.get
        erased_at: list[int] = []

        def erase(*a: Any, **k: Any) -> int:
            erased_at.append(int(real_erase(*a, **k)))
            return erased_at[-1]

        def get(seq: int) -> Any:
            if erased_at and seq == erased_at[-1]:
                raise StorageError("cannot read the log: the server went away")
            return real_get(seq)

        store.log.erase = erase  # type: ignore[method-assign]
        store.log.get = get  # type: ignore[method-assign]
        with caplog.at_level("WARNING", logger="eventlog.sessions"):
            out = store.erase_session(sid, "asked")
        assert out["events"] == 5 and out["seq"] == erased_at[-1]
        assert "counting the 5 events asked for" in caplog.text
        assert store.get_session(sid) is None and store.log.verify().erased == 5
        assert not store.log.erase_pending()  # the cleanup ran
