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
