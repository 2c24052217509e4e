"""The framework adapters on a profile whose log is on PostgreSQL, used from several hosts
(separate processes with separate homes, `EVENTLOG_LOG_URL` naming the shared log)."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")
pytest.importorskip("langgraph.checkpoint.base")

from eventlog.adapters.langgraph import EventlogSaver  # noqa: E402
from eventlog.adapters.openai_agents import EventlogSession  # noqa: E402
from eventlog.errors import NotFoundError  # noqa: E402
from eventlog.log.postgres import PostgresLog  # noqa: E402

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[1]


def other_host(home: Path, url: str, code: str) -> None:
    """Run ``code`` in a process of its own with its own home, on the shared log."""
    env = {**os.environ, "EVENTLOG_LOG_URL": url, "EVENTLOG_HOME": str(home),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def chat_and_thread(home: Path, profile: str) -> tuple[EventlogSession, EventlogSaver, Any]:
    """Host objects on the shared log: the OpenAI session "chat", a saver, and thread t1's config."""
    return (EventlogSession("chat", home=home, profile=profile), EventlogSaver(home=home, profile=profile),
            {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}})


def test_an_erase_on_another_host_reaches_an_open_session_and_saver(tmp_path: Path, pg_url: str, pg_profile: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Host A erases an OpenAI session (clear_session(erase=True)) and a LangGraph thread
    (delete_thread with erase_deleted=True) that host B's objects have open. The PostgreSQL log
    kept no erase mark, so B's caches, keyed on the stream version an erase does not change,
    kept serving the erased items and checkpoint, and B's session never moved to its next
    incarnation: every add_items raised NotFoundError (three tries, each answered from the
    stale history) and get_items returned the erased words."""
    monkeypatch.setenv("EVENTLOG_LOG_URL", pg_url)
    home_b = tmp_path / "host-b"
    session, saver, config = chat_and_thread(home_b, pg_profile)
    try:
        asyncio.run(session.add_items([{"role": "user", "content": "secret words"}]))
        assert [i["content"] for i in asyncio.run(session.get_items())] == ["secret words"]
        from langgraph.checkpoint.base import empty_checkpoint
        cp = empty_checkpoint()
        saver.put(config, cp, {"source": "input", "step": -1}, {})
        got = saver.get_tuple(config)
        assert got is not None and got.checkpoint["id"] == cp["id"]

        other_host(tmp_path / "host-a", pg_url, (
            "import asyncio\n"
            "from eventlog.adapters.openai_agents import EventlogSession\n"
            "from eventlog.adapters.langgraph import EventlogSaver\n"
            f"s = EventlogSession('chat', profile={pg_profile!r})\n"
            "asyncio.run(s.clear_session(erase=True)); s.close()\n"
            f"with EventlogSaver(profile={pg_profile!r}, erase_deleted=True) as g:\n"
            "    g.delete_thread('t1')\n"))

        assert asyncio.run(session.get_items()) == []  # was: ["secret words"], read after the erase
        assert session.key != "chat"  # it went on in its next incarnation
        asyncio.run(session.add_items([{"role": "user", "content": "after"}]))  # was: NotFoundError
        assert [i["content"] for i in asyncio.run(session.get_items())] == ["after"]
        assert saver.get_tuple(config) is None  # was: the erased checkpoint, from the saver's copy
        with pytest.raises(NotFoundError):
            saver.put(config, empty_checkpoint(), {"source": "input", "step": -1}, {})
    finally:
        session.close()
        saver.close()
    # A third host built from scratch sees the same.
    fresh = EventlogSession("chat", home=tmp_path / "host-c", profile=pg_profile)
    try:
        assert [i["content"] for i in asyncio.run(fresh.get_items())] == ["after"]
        assert fresh.key == session.key
    finally:
        fresh.close()


def test_the_postgres_log_keeps_an_erase_mark(pg_url: str, pg_profile: str, tmp_path: Path) -> None:
    """The seq of the last erase record, as the LMDB log's mark; moved by an erase of any handle
    and by an import that brings a log.erased record."""
    ev: list[dict[str, Any]] = [{"type": "note.added", "session": "s1", "data": {"text": "hi"}},
                                {"type": "note.added", "session": "s2", "data": {"text": "there"}}]
    with PostgresLog.open(pg_url, profile=pg_profile) as a, PostgresLog.open(pg_url, profile=pg_profile) as b:
        a.append(ev)
        assert a.erase_mark() == b.erase_mark() == 0
        first = a.erase([1], {"reason": "test"})
        assert b.erase_mark() == first > 0
        second = b.erase([2], {"reason": "test"})
        assert a.erase_mark() == second > first
        assert a.stream_version("s1") == 1 and a.stream_version("s2") == 1  # no stream moved
        raws = [raw for _, raw in a.read(raw=True)]
    with PostgresLog.open(pg_url, profile=pg_profile + "-copy") as c:
        c.append_sealed(raws)
        assert c.erase_mark() == second


def test_a_warm_adapter_read_is_one_statement(tmp_path: Path, pg_url: str, pg_profile: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A read the adapters can answer from what they hold asks the log only whether the stream
    and the erase mark moved: one statement (``stream_state``), where it took two — the stream
    version and the erase mark, two round trips to the server on every get_items / get_tuple /
    list. Counted on the real connection (the statements this thread's calls send; the
    projection follower's own are not the adapters')."""
    import threading

    import psycopg

    monkeypatch.setenv("EVENTLOG_LOG_URL", pg_url)
    sent: list[str] = []
    real = psycopg.Cursor.execute

    def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if not threading.current_thread().name.startswith("eventlog-"):
            sent.append(str(query))
        return real(self, query, *args, **kwargs)

    session, saver, config = chat_and_thread(tmp_path / "home", pg_profile)
    try:
        asyncio.run(session.add_items([{"role": "user", "content": "hello"}]))
        from langgraph.checkpoint.base import empty_checkpoint
        cp = empty_checkpoint()
        saver.put(config, cp, {"source": "input", "step": -1}, {})
        assert [i["content"] for i in asyncio.run(session.get_items())] == ["hello"]
        assert saver.get_tuple(config) is not None and len(list(saver.list(config))) == 1
        monkeypatch.setattr(psycopg.Cursor, "execute", counted)
        for name, read in [("get_items", lambda: asyncio.run(session.get_items())),
                           ("get_items(limit=1)", lambda: asyncio.run(session.get_items(limit=1))),
                           ("get_tuple", lambda: saver.get_tuple(config)),
                           ("list", lambda: list(saver.list(config)))]:
            sent.clear()
            assert read()
            assert len(sent) == 1 and "streams" in sent[0], (name, sent)
    finally:
        monkeypatch.undo()
        session.close()
        saver.close()
