"""Retention and erase over many sessions: choosing what to erase costs work linear in the
sessions. Retention collected its lineages into a list, testing each new one with ``in`` against
everything collected before, and a lineage's descendants were collected the same way: quadratic
(outside audit, helper-87: a dry run over 100,000 one-session lineages took 303 s, nearly all of
it in those tests). Counted here as the comparisons of session ids, not timed."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eventlog.sessions.store import SessionStore

N = 1500


class Counted(str):
    """A session id that counts the equality tests made on it."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        Counted.compared += 1
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = str.__hash__


def _counted(ids: Any) -> list[Counted]:
    return [Counted(i) for i in ids]


def test_retention_picks_many_lineages_with_linear_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with SessionStore.open(tmp_path, follower=False) as store:
        store.log.append([{"type": "session.created", "session": f"s{i:05d}", "data": {"source": "cli"}}
                          for i in range(N)])
        lineage = SessionStore._lineage_in_log
        monkeypatch.setattr(SessionStore, "_lineage_in_log",
                            lambda self, sid, children=None: _counted(lineage(self, sid, children)))
        Counted.compared = 0
        picked = store.retention(0, dry_run=True)["sessions"]
        assert sorted(picked) == [f"s{i:05d}" for i in range(N)]
        assert Counted.compared < 10 * N  # it was N * N / 2 (1,124,250 here)


def test_a_long_lineage_is_collected_with_linear_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain of continuations (each session the parent of the next), as compression makes."""
    with SessionStore.open(tmp_path, follower=False) as store:
        store.log.append([{"type": "session.created", "session": "root", "data": {"source": "cli"}}]
                         + [{"type": "session.created", "session": f"c{i:05d}",
                             "data": {"source": "cli", "parent_session_id": f"c{i - 1:05d}" if i else "root"}}
                            for i in range(N)])
        scan = SessionStore._scan_lineages

        def counted_scan(self: SessionStore, cutoff: float | None = None) -> Any:
            children, deleted, last = scan(self, cutoff)
            return {p: _counted(c) for p, c in children.items()}, deleted, last

        monkeypatch.setattr(SessionStore, "_scan_lineages", counted_scan)
        Counted.compared = 0
        lineage = store._lineage_in_log("root")
        assert lineage == ["root"] + [f"c{i:05d}" for i in range(N)]
        assert Counted.compared < 10 * N  # it was N * N / 2
