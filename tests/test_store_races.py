"""Writers in several processes racing a delete or an erase of the session they write to: no write
is acknowledged into a session that is gone (found by an outside audit: an erase read the streams
outside the log's write lock and missed what was appended meanwhile, after which the writers'
appends were accepted again; an append refused three times was made without a version)."""
from __future__ import annotations

import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from eventlog.errors import NotFoundError
from eventlog.sessions.store import SessionStore

WRITER = textwrap.dedent("""
    import sys
    from eventlog.errors import NotFoundError
    from eventlog.sessions.store import SessionStore
    s = SessionStore.open(sys.argv[1], follower=sys.argv[2] == "1")
    print("ready", flush=True)
    for line in sys.stdin:
        sid = line.strip()
        acked = []
        try:
            while True:
                acked.append(s.append_message(sid, "user", "w" + sys.argv[3] + " " + str(len(acked))))
        except NotFoundError:
            pass
        except Exception as e:  # anything else is a failure the parent names
            print("error", type(e).__name__, str(e).replace(chr(10), " "), flush=True)
            continue
        print(" ".join(map(str, acked)), flush=True)
    s.close()
""")


class Writers:
    """Writer processes that each append to a session until they are told it is gone."""

    def __init__(self, home: Path, n: int) -> None:
        self.procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(home), str(i % 2), str(i)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for i in range(n)]
        for p in self.procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"

    def start(self, sid: str) -> None:
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(sid + "\n")
            p.stdin.flush()

    def acked(self) -> list[int]:
        out: list[int] = []
        for p in self.procs:
            assert p.stdout is not None
            # A writer still appending a minute after the delete or erase is the bug: fail, not hang.
            if not select.select([p.stdout], [], [], 60)[0]:
                for q in self.procs:
                    q.kill()
                pytest.fail("a writer was still appending to the session a minute after it was removed")
            line = p.stdout.readline()
            assert not line.startswith("error"), line
            out += [int(x) for x in line.split()]
        return out

    def close(self) -> None:
        for p in self.procs:
            assert p.stdin is not None
            try:
                p.stdin.close()
            except BrokenPipeError:
                pass
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.mark.parametrize("how", ["delete", "erase"])
def test_writers_racing_a_delete_or_an_erase_are_refused_after_it(tmp_path: Path, how: str) -> None:
    store = SessionStore.open(tmp_path, follower=False)
    writers = Writers(tmp_path, 3)
    try:
        for r in range(4):
            sid = f"s{r}"
            store.create_session(sid)
            store.append_message(sid, "user", "first")
            writers.start(sid)
            time.sleep(0.15)  # the writers are appending flat out
            if how == "delete":
                store.delete_session(sid)
            else:
                store.erase_session(sid, "asked to forget", by="test")
            acked = writers.acked()
            assert acked, "the writers never got to append"
            envs = [e for e in store.log.read() if e.get("session") == sid
                    or (e["type"] == "log.erased" and sid in (e.get("data") or {}).get("sessions", []))]
            if how == "delete":
                end = next(e["seq"] for e in envs if e["type"] == "session.deleted")
                assert all(q < end for q in acked), (sid, end, [q for q in acked if q > end])
            else:
                end = [e["seq"] for e in envs if e["type"] == "log.erased"][-1]
                assert [e["seq"] for e in envs if e.get("session") == sid and not e.get("erased")] == []
                assert all(q < end for q in acked), (sid, end, [q for q in acked if q > end])
            assert store.get_session(sid) is None
        assert store.log.verify().ok
    finally:
        writers.close()
        store.close()


def _child(home: Path, code: str) -> None:
    r = subprocess.run([sys.executable, "-c", "import sys\nfrom eventlog.sessions.store import SessionStore\n"
                        "with SessionStore.open(sys.argv[1], follower=False) as s:\n" + textwrap.indent(code, "    "),
                        str(home)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("call", ["update_meta", "archive", "reopen", "set_title", "end_session", "react",
                                  "append_events", "rewind"])
@pytest.mark.parametrize("how", ["delete", "erase"])
def test_every_write_of_a_handle_that_knows_the_session_is_refused_after_another_process_removed_it(
        tmp_path: Path, call: str, how: str) -> None:
    """The store's other write methods checked the session on a read model caught up only to their
    own writes (a follower had not applied the other process's delete yet) and appended without
    a version: acknowledged into a deleted session. Each now appends at the version it checked."""
    s = SessionStore.open(tmp_path, follower=True)
    try:
        s.create_session("chat")
        mid = s.append_message("chat", "user", "hello")
        s.update_meta("chat", model="m")
        _child(tmp_path, 's.delete_session("chat")' if how == "delete" else 's.erase_session("chat", "t")')
        head = s.log.head()[0]
        calls: dict[str, Any] = {
            "update_meta": lambda: s.update_meta("chat", model="n"),
            "archive": lambda: s.archive("chat"),
            "reopen": lambda: s.reopen("chat"),
            "set_title": lambda: s.set_title("chat", "a title"),
            "end_session": lambda: s.end_session("chat", "done"),
            "react": lambda: s.react(mid, "me", "+1"),
            "append_events": lambda: s.append_events([{"type": "message.appended", "session": "chat",
                                                       "data": {"role": "user", "content": "x"}}]),
            "rewind": lambda: s.rewind("chat", mid),
        }
        with pytest.raises(NotFoundError):
            calls[call]()
        assert s.log.head()[0] == head
    finally:
        s.close()


def test_a_projection_file_going_away_under_the_bare_read_is_not_the_writes_error(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The append path's quick look at the read model (no catch-up) uses the bare reader; another
    process deleting or swapping state.db under it made add_items raise projections.site.Broken,
    an error outside the store's typed errors (an outside audit). The full check, which heals,
    answers instead."""
    from projections.site import Broken

    s = SessionStore.open(tmp_path, follower=False)
    try:
        s.create_session("chat")
        _child(tmp_path, 's.append_message("chat", "user", "from elsewhere")')
        s._live.clear()  # as a handle that never wrote to the session

        class Gone:
            def is_live(self, sid: str) -> bool:
                raise Broken("missing", "no state.db generation")

        monkeypatch.setattr(s._reads, "peek", lambda: Gone())
        seq = s.append_message("chat", "user", "still written")
        assert [m["id"] for m in s.get_messages("chat")][-1] == seq
    finally:
        s.close()
