"""``EventlogSession.clear_session(erase=True)`` is "deletion for real: the words leave every
file" (docs/ADAPTERS.md). An SDK session lives in successive eventlog sessions (incarnations):
one ended by a plain ``eventlog sessions delete`` keeps its words in the log, and the erase took
only the incarnation the session was at, so the SDK session's earlier items stayed on disk —
also when the current incarnation had nothing written yet (outside audit, helper-52)."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from eventlog.adapters.openai_agents import EventlogSession
from eventlog.cli import main
from eventlog.sessions.store import SessionStore

sys.path.insert(0, str(Path(__file__).parent))
from test_erase import MARKER, traces  # noqa: E402


@pytest.mark.parametrize("then", ["written again", "nothing written since"])
def test_clear_session_erase_takes_the_incarnations_a_deletion_ended(tmp_path: Path, then: str) -> None:
    s = EventlogSession("chat", home=tmp_path)
    other = EventlogSession("other", home=tmp_path)
    try:
        asyncio.run(s.add_items([{"role": "user", "content": f"first life {MARKER}"}]))
        asyncio.run(other.add_items([{"role": "user", "content": "plain"}]))
        first = s.key
        r = CliRunner().invoke(main, ["--home", str(tmp_path), "sessions", "delete", first])
        assert r.exit_code == 0, r.output
        assert asyncio.run(s.get_items()) == [] and s.key != first  # the next incarnation
        if then == "written again":
            asyncio.run(s.add_items([{"role": "user", "content": f"second life {MARKER}"}]))
        assert traces(tmp_path), "a deletion keeps the words (the test can fail)"
        asyncio.run(s.clear_session(erase=True))
        assert traces(tmp_path) == []
        assert asyncio.run(s.get_items()) == [] and [i["content"] for i in asyncio.run(other.get_items())] == ["plain"]
        asyncio.run(s.add_items([{"role": "user", "content": "afterwards"}]))
        assert [i["content"] for i in asyncio.run(s.get_items())] == ["afterwards"]
    finally:
        s.close()
        other.close()
    with SessionStore.open(tmp_path, follower=False) as store:
        assert store.log.verify().ok and store.gone(first)
