"""The session rules declared once, and the dispatch tables of the two read models.

The fold and the SQL applier each dispatch through a table keyed by event type; both are checked
against the catalogue's current versions when their module is imported, so a type one side does
not handle fails there. Types this program does not know are skipped by both.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from eventlog.log.memory import MemoryLog
from eventlog.sessions import events, rules
from eventlog.sessions.events import CURRENT_VERSIONS, Handler, check_handlers
from eventlog.sessions.fold import HANDLERS as FOLD_HANDLERS
from eventlog.sessions.fold import Fold
from projections import Projector
from projections.apply import HANDLERS as APPLY_HANDLERS
from projections.testing import answers, diff


def test_both_tables_cover_the_catalogue_at_its_current_versions() -> None:
    for table in (FOLD_HANDLERS, APPLY_HANDLERS):
        assert {t: h.version for t, h in table.items()} == CURRENT_VERSIONS


@pytest.mark.parametrize("change, expected", [
    (lambda t: t.pop("session.pinned"), "no handler for session.pinned (v1)"),
    (lambda t: t.__setitem__("session.pined", Handler(1, lambda *a: None)), "'session.pined', which the catalogue"),
    (lambda t: t.__setitem__("message.appended", Handler(1, t["message.appended"].apply)),
     "the handler for message.appended reads v1, the catalogue is at v2"),
])
def test_a_table_that_does_not_match_the_catalogue_is_refused(change: Any, expected: str) -> None:
    table = dict(FOLD_HANDLERS)
    change(table)
    with pytest.raises(RuntimeError, match="does not match the event catalogue") as info:
        check_handlers("a test table", table)
    assert expected in str(info.value) and "a test table" in str(info.value)


def _import_fails(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode != 0, r.stdout
    return r.stderr


def test_a_catalogue_type_the_fold_lacks_fails_at_import() -> None:
    err = _import_fails("from eventlog.sessions import events\n"
                        "events.CURRENT_VERSIONS['session.renamed'] = 1\n"
                        "import eventlog.sessions.fold\n")
    assert "RuntimeError: the reference fold" in err and "no handler for session.renamed (v1)" in err


def test_a_type_the_applier_lacks_fails_at_import() -> None:
    err = _import_fails("from eventlog.sessions import events, fold\n"
                        "events.CURRENT_VERSIONS['session.renamed'] = 1\n"
                        "fold.HANDLERS['session.renamed'] = events.Handler(1, lambda *a: None)\n"
                        "import projections.apply\n")
    assert "RuntimeError: the projections' applier" in err and "no handler for session.renamed (v1)" in err


def test_a_version_bump_without_handlers_fails_at_import() -> None:
    err = _import_fails("from eventlog.sessions import events\n"
                        "events.CURRENT_VERSIONS['usage.recorded'] = 2\n"
                        "import eventlog.sessions.fold\n")
    assert "the handler for usage.recorded reads v1, the catalogue is at v2" in err


def _history(with_unknown: bool) -> list[dict[str, Any]]:
    extra = [
        {"type": "session.renamed", "session": "a", "data": {"title": "from a newer program"}},
        {"type": "acme.ticket_linked", "session": "a", "data": {"ticket": 42}},
        {"type": "acme.profile_note", "session": None, "data": {"note": "profile-wide"}},
        {"type": "message.appended", "session": "a", "v": 9, "data": {"role": "user", "content": "v9 alpha"}},
    ]
    out: list[dict[str, Any]] = [
        {"type": "session.created", "session": "a", "data": {"source": "cli", "title": "A"}},
        {"type": "message.appended", "session": "a", "v": 2, "data": {"role": "user", "content": "alpha one"}},
    ]
    if with_unknown:
        out += extra[:2]
    out += [
        {"type": "session.created", "session": "b", "data": {"parent_session_id": "a", "cwd": "/w"}},
        {"type": "session.pinned", "session": "b", "data": {}},
        {"type": "usage.recorded", "session": "a", "data": {"input_tokens": 3, "estimated_cost_usd": 0.5}},
    ]
    if with_unknown:
        out += extra[2:]
    out.append({"type": "message.appended", "session": "b", "v": 2,
                "data": {"role": "assistant", "content": "beta alpha"}})
    return out


def test_unknown_event_types_are_skipped_by_the_fold_and_the_projection() -> None:
    """A newer program's or an extension's types in the log change no answer of either read
    model (only the message ids move, since every event takes a seq). A known type at a version
    newer than this program's is folded as the current version, by both read models alike."""
    plain, mixed = MemoryLog(profile="p"), MemoryLog(profile="p")
    for e in _history(False):
        plain.append([e])
    for e in _history(True):
        mixed.append([e])
    fold_plain, fold_mixed = Fold(), Fold()
    fold_plain.apply_all(plain.read())
    fold_mixed.apply_all(mixed.read())
    assert fold_mixed.seq == mixed.head()[0]
    assert [s["id"] for s in fold_mixed.list_sessions()] == [s["id"] for s in fold_plain.list_sessions()]
    assert fold_mixed.get_session("a")["title"] == "A"  # type: ignore[index]
    assert fold_mixed.get_usage("a") == fold_plain.get_usage("a")
    assert [m["content"] for m in fold_mixed.get_messages("a")] == ["alpha one", "v9 alpha"]
    sids, mids = ["a", "b", "zz"], list(range(0, mixed.head()[0] + 2))
    expected = answers(fold_mixed, sids, mids)
    with tempfile.TemporaryDirectory() as tmp, Projector(Path(tmp) / "p", mixed, "p") as p:
        p.advance()
        reader = p.reader()
        got = answers(reader, sids, mids)
        assert reader.cursors() == (mixed.head()[0], mixed.head()[0])
        reader.close()
    assert got == expected, "\n".join(diff(expected, got)[:5])


def test_lineage_walk_stops_on_cycles_and_self_parents() -> None:
    parents = {"a": "b", "b": "a", "c": "b", "d": "d", "e": None}

    def parent_of(s: str) -> str | None:
        return parents[s]  # "d" names itself: the walk has already seen it

    def children_of(s: str) -> list[str]:
        return [c for c, p in parents.items() if p == s and c != s]

    assert rules.lineage_root("c", parent_of) == "a"
    assert rules.lineage("c", parent_of, children_of) == ["a", "b", "c"]
    assert rules.lineage("d", parent_of, children_of) == ["d"]
    assert rules.lineage("e", parent_of, children_of) == ["e"]
    assert rules.descendants("b", children_of) == ["a", "c"]


@pytest.mark.parametrize("value, low, expected", [
    (5, rules.INT64_MIN, 5), (True, rules.INT64_MIN, None), (2**63, rules.INT64_MIN, None),
    (-(2**63), rules.INT64_MIN, -(2**63)), (-1, 0, None), ("5", rules.INT64_MIN, None), (5.0, rules.INT64_MIN, None),
])
def test_as_int_reads_only_64_bit_ints(value: Any, low: int, expected: Any) -> None:
    assert rules.as_int(value, low) == expected


@pytest.mark.parametrize("value, expected", [
    (None, 7.0), (0, 0.0), (rules.MAX_TIME, rules.MAX_TIME), (rules.MAX_TIME + 1, None), (-1, None),
    (float("nan"), None), (True, None), ("2024-01-01", None),
])
def test_a_stored_time_is_read_once_for_every_read_model(value: Any, expected: Any) -> None:
    assert rules.as_time(value, 7.0) == expected


def test_event_time_and_json_text() -> None:
    assert rules.event_time(1_700_000_000_500_000_000) == 1_700_000_000.5
    assert rules.event_time(-1) is None and rules.event_time(10**30) is None and rules.event_time("1") is None
    assert rules.json_text({"a": [1]}, dict) == '{"a":[1]}'
    assert rules.json_text([1], dict) is None and rules.json_text({"a": 2**70}, dict) is None


def test_titles_claim_and_rank() -> None:
    assert rules.title_claim("  Plan \t A ", None) == ("Plan A", "user")
    assert rules.title_claim("   ", "user") is None and rules.title_claim("x", "bogus") is None
    assert rules.title_claim(5, "user") is None
    assert rules.outranked("user", "llm") and not rules.outranked("llm", "user") and not rules.outranked(None, "derived")


def test_the_catalogue_and_the_log_share_the_limits() -> None:
    from eventlog.log import codec

    assert events.MAX_TIME is rules.MAX_TIME and rules.ID_RE is codec.ID_RE
    assert (rules.INT64_MIN, rules.INT64_MAX) == (codec.INT64_MIN, codec.INT64_MAX) == (-(2**63), 2**63 - 1)
    assert rules.MAX_EVENT_BYTES == codec.MAX_EVENT_BYTES
