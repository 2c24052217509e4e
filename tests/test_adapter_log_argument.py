"""The adapters' ``log=`` argument: where the profile's events live, as for
``SessionStore.open(home, profile, log=...)`` — a PostgreSQL URL, an LMDB log directory or a
Log object — without setting ``EVENTLOG_LOG_URL`` for the whole process."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")
pytest.importorskip("langgraph.checkpoint.base")

from langgraph.checkpoint.base import empty_checkpoint  # noqa: E402

from eventlog.adapters.langgraph import EventlogSaver  # noqa: E402
from eventlog.adapters.openai_agents import EventlogSession  # noqa: E402
from eventlog.errors import IntegrityError, ValidationError  # noqa: E402
from eventlog.log import open_log  # noqa: E402

CONFIG = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}


def use_both(home: Path, profile: str, log: Any) -> None:
    """An OpenAI session item and a LangGraph checkpoint written and read back through ``log``."""
    session = EventlogSession("chat", home=home, profile=profile, log=log)
    try:
        asyncio.run(session.add_items([{"role": "user", "content": "kept elsewhere"}]))
        assert [i["content"] for i in asyncio.run(session.get_items())] == ["kept elsewhere"]
    finally:
        session.close()
    with EventlogSaver(home=home, profile=profile, log=log) as saver:
        cp = empty_checkpoint()
        saver.put(CONFIG, cp, {"source": "input", "step": -1}, {})
        got = saver.get_tuple(CONFIG)
        assert got is not None and got.checkpoint["id"] == cp["id"]


def stored_types(url_or_dir: str, profile: str) -> list[str]:
    with open_log(url_or_dir, profile=profile) as lg:
        return [e["type"] for e in lg.read()]


def test_a_log_directory_given_to_both_adapters_holds_their_events(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EVENTLOG_LOG_URL", raising=False)
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere" / "log"
    use_both(home, "p", elsewhere)
    types = stored_types(str(elsewhere), "p")
    assert "message.appended" in types and any(t.startswith("langgraph.") for t in types), types
    assert not (home / "profiles" / "p" / "log").exists()  # nothing went to the home's own log
    # The profile's projections follow that log: opening it without `log=` is refused rather
    # than starting an empty log under them.
    other = EventlogSession("chat", home=home, profile="p")
    try:
        with pytest.raises(IntegrityError, match="lost its log"):
            asyncio.run(other.get_items())
    finally:
        other.close()
    assert not (home / "profiles" / "p" / "log").exists()


@pytest.mark.postgres
def test_a_postgresql_url_given_to_both_adapters_holds_their_events(tmp_path: Path, pg_url: str, pg_profile: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EVENTLOG_LOG_URL", raising=False)
    use_both(tmp_path / "home", pg_profile, pg_url)
    types = stored_types(pg_url, pg_profile)
    assert "message.appended" in types and any(t.startswith("langgraph.") for t in types), types
    assert not (tmp_path / "home" / "profiles" / pg_profile / "log").exists()


@pytest.mark.parametrize("bad", [42, b"/tmp/log", object()])
def test_a_bad_log_argument_is_refused_when_the_adapter_is_made(bad: object) -> None:
    with pytest.raises(ValidationError, match="log"):
        EventlogSession("chat", log=bad)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="log"):
        EventlogSaver(log=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["", "  ", "mysql://db.example/app", "host=db.example dbname=app"])
def test_a_log_text_no_open_would_take_is_refused_when_the_adapter_is_made(tmp_path: Path, bad: str) -> None:
    """As documented (docs/ADAPTERS.md): a bad ``log=`` is refused when the object is made, not
    at its first call -- an empty text, another scheme, a libpq key=value string were taken and
    failed only inside the first add_items/put, after the agent or graph had run."""
    with pytest.raises(ValidationError, match="log"):
        EventlogSession("chat", home=tmp_path, log=bad)
    with pytest.raises(ValidationError, match="log"):
        EventlogSaver(home=tmp_path, log=bad)
    assert not (tmp_path / "profiles").exists()
