"""The reference fold: one test per domain rule of docs/EVENTS.md."""
from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventlog.sessions import events
from eventlog.sessions.fold import MESSAGE_KEYS, REACTION_KEYS, SESSION_KEYS, USAGE_KEYS, Fold, search_terms

T0 = 1_700_000_000


class Log:
    """Feeds envelopes to a Fold, assigning seq and ts (event time = T0 + seq seconds)."""

    def __init__(self) -> None:
        self.fold = Fold()
        self.seq = 0
        self.envelopes: list[dict[str, Any]] = []

    def add(self, type_: str, session: Any, data: Any = None, *, raw: bool = False, v: int | None = None,
            ts: Any = None) -> int:
        self.seq += 1
        body = data if raw else events.validate(type_, data, session)
        env = {"seq": self.seq, "id": f"e{self.seq}", "ts": (T0 + self.seq) * 10**9 if ts is None else ts,
               "type": type_, "v": v or events.CURRENT_VERSIONS.get(type_, 1), "session": session,
               "data": body, "prev": "0" * 64, "hash": "0" * 64}
        self.envelopes.append(env)
        self.fold.apply(env)
        return self.seq

    def create(self, sid: str, **data: Any) -> int:
        return self.add("session.created", sid, data)

    def message(self, sid: str, role: str = "user", **data: Any) -> int:
        return self.add("message.appended", sid, {"role": role, **data})

    def session(self, sid: str) -> dict[str, Any]:
        row = self.fold.get_session(sid)
        assert row is not None
        return row


@pytest.fixture()
def log() -> Log:
    return Log()


def ids(rows: list[dict[str, Any]], key: str = "id") -> list[Any]:
    return [r[key] for r in rows]


# ---- sessions ---------------------------------------------------------------------------

def test_created_session_has_every_key_and_documented_defaults(log: Log) -> None:
    log.create("s1", source="telegram", model="m", model_config={"t": 1})
    row = log.session("s1")
    assert tuple(row) == SESSION_KEYS
    assert row["started_at"] == row["last_activity_at"] == T0 + 1.0
    assert (row["message_count"], row["tool_call_count"], row["input_tokens"]) == (0, 0, 0)
    assert row["estimated_cost_usd"] is None and row["actual_cost_usd"] is None
    assert (row["archived"], row["pinned"], row["hidden"]) == (False, False, False)
    assert row["model_config"] == {"t": 1} and row["title"] is None and row["tool_names"] is None
    log.create("s2", started_at=1000)
    assert log.session("s2")["started_at"] == log.session("s2")["last_activity_at"] == 1000.0


def test_second_created_is_ignored_even_after_delete(log: Log) -> None:
    log.create("s1", model="first")
    log.create("s1", model="second")
    assert log.session("s1")["model"] == "first"
    log.add("session.deleted", "s1")
    log.create("s1", model="third")
    assert log.fold.get_session("s1") is None and not log.fold.is_live("s1")


def test_events_for_unknown_or_deleted_sessions_are_ignored(log: Log) -> None:
    log.message("ghost", content="boo")
    log.add("session.titled", "ghost", {"title": "T"})
    log.create("s1")
    log.add("session.deleted", "s1")
    log.message("s1", content="late")
    assert log.fold.title_holder("T") is None
    assert log.fold.search("boo") == [] and log.fold.search("late") == []
    assert log.fold.stats()["sessions"] == 0


# ---- titles -----------------------------------------------------------------------------

def test_titles_are_unique_first_holder_wins(log: Log) -> None:
    log.create("a", title="Plan")
    log.create("b", title="Plan")  # created untitled
    log.add("session.titled", "b", {"title": "plan"})  # case matters
    log.create("c")
    log.add("session.titled", "c", {"title": "Plan"})
    assert log.session("b")["title"] == "plan"
    assert log.session("c")["title"] is None and log.session("c")["title_source"] is None
    assert log.fold.title_holder("  Plan ") == "a"
    assert log.fold.titles() == {"Plan", "plan"}


def test_a_retitled_session_frees_its_old_title(log: Log) -> None:
    log.create("a", title="Old")
    log.add("session.titled", "a", {"title": "New"})
    log.create("b", title="Old")
    assert log.session("b")["title"] == "Old" and log.fold.title_holder("New") == "a"


def test_title_provenance_never_goes_down(log: Log) -> None:
    log.create("s", title="Derived", title_source="derived")
    log.add("session.titled", "s", {"title": "By LLM", "source": "llm"})
    assert (log.session("s")["title"], log.session("s")["title_source"]) == ("By LLM", "llm")
    log.add("session.titled", "s", {"title": "Other LLM", "source": "llm"})  # equal rank replaces
    assert log.session("s")["title"] == "Other LLM"
    log.add("session.titled", "s", {"title": "Mine"})  # default provenance is user
    log.add("session.titled", "s", {"title": "Late LLM", "source": "llm"})
    log.add("session.titled", "s", {"title": "Late derived", "source": "derived"})
    assert (log.session("s")["title"], log.session("s")["title_source"]) == ("Mine", "user")
    assert log.fold.title_holder("Late LLM") is None
    log.add("session.titled", "s", {"title": "Mine again"})
    assert log.session("s")["title"] == "Mine again"


def test_fold_normalizes_raw_titles_and_ignores_odd_provenance(log: Log) -> None:
    log.create("s")
    log.add("session.titled", "s", {"title": "  Raw \n title "}, raw=True)
    assert log.session("s")["title"] == "Raw title"
    log.add("session.titled", "s", {"title": "X", "source": "admin"}, raw=True)
    log.add("session.titled", "s", {"title": "   "}, raw=True)
    log.add("session.titled", "s", {"title": 5}, raw=True)
    assert log.session("s")["title"] == "Raw title"


# ---- lineage ----------------------------------------------------------------------------

def test_child_inherits_cwd_and_git_from_a_live_parent(log: Log) -> None:
    log.create("p", cwd="/w", git_repo_root="/w", git_branch="main")
    log.create("c", parent_session_id="p", git_branch="feature")
    row = log.session("c")
    assert (row["cwd"], row["git_repo_root"], row["git_branch"]) == ("/w", "/w", "feature")
    log.create("orphan", parent_session_id="missing")
    row = log.session("orphan")
    assert row["parent_session_id"] == "missing" and row["cwd"] is None


@pytest.mark.parametrize("on,off,flag", [("session.archived", "session.unarchived", "archived"),
                                         ("session.pinned", "session.unpinned", "pinned"),
                                         ("session.hidden", "session.unhidden", "hidden")])
def test_flags_apply_to_the_whole_lineage_including_late_children(log: Log, on: str, off: str, flag: str) -> None:
    log.create("root")
    log.create("child", parent_session_id="root")
    log.create("grand", parent_session_id="child")
    log.create("other")
    log.add(on, "grand")
    assert [log.session(s)[flag] for s in ("root", "child", "grand", "other")] == [True, True, True, False]
    log.create("late", parent_session_id="child")
    assert log.session("late")[flag] is True
    log.add(off, "root")
    assert [log.session(s)[flag] for s in ("root", "child", "grand", "late")] == [False] * 4
    assert log.fold.lineage("grand") == ["root", "child", "grand", "late"]
    assert log.fold.lineage("nope") == []


def test_parent_created_after_its_child_joins_the_lineage(log: Log) -> None:
    log.create("c", parent_session_id="p")
    log.create("p")
    log.add("session.pinned", "p")
    assert log.session("c")["pinned"] is True
    assert log.fold.lineage("c") == ["p", "c"]


def test_parent_cycles_from_odd_logs_terminate(log: Log) -> None:
    log.create("a", parent_session_id="b")
    log.create("b", parent_session_id="a")
    log.add("session.archived", "a")
    assert log.session("a")["archived"] and log.session("b")["archived"]
    assert sorted(log.fold.lineage("a")) == ["a", "b"]
    log.add("session.deleted", "a")
    assert not log.fold.is_live("a") and not log.fold.is_live("b")


# ---- ending -----------------------------------------------------------------------------

def test_first_end_reason_wins_and_reopen_clears(log: Log) -> None:
    log.create("s")
    log.add("session.ended", "s", {"reason": "user_exit"})
    log.add("session.ended", "s", {"reason": "timeout", "ended_at": 5})
    row = log.session("s")
    assert (row["end_reason"], row["ended_at"]) == ("user_exit", T0 + 2.0)
    log.add("session.reopened", "s")
    assert (log.session("s")["end_reason"], log.session("s")["ended_at"]) == (None, None)
    log.add("session.ended", "s", {"reason": "compressed", "ended_at": "2024-01-01T00:00:00Z"})
    assert (log.session("s")["end_reason"], log.session("s")["ended_at"]) == ("compressed", 1704067200.0)


def test_meta_updated_replaces_only_given_keys(log: Log) -> None:
    log.create("s", model="a", cwd="/x", source="cli")
    log.add("session.meta_updated", "s", {"model": "b", "tool_names": ["read", "write"], "model_config": '{"k": 2}'})
    log.add("session.meta_updated", "s", {"cwd": None})
    row = log.session("s")
    assert (row["model"], row["cwd"], row["source"]) == ("b", None, "cli")
    assert row["tool_names"] == ["read", "write"] and row["model_config"] == {"k": 2}


# ---- messages -----------------------------------------------------------------------------

def test_messages_count_tool_calls_and_advance_last_activity(log: Log) -> None:
    log.create("s")
    m1 = log.message("s", content="hi", timestamp=T0 + 100)
    m2 = log.message("s", "assistant", tool_calls=[{"id": "a"}, {"id": "b"}], timestamp=T0 + 50)
    row = log.session("s")
    assert (row["message_count"], row["tool_call_count"], row["last_activity_at"]) == (2, 2, T0 + 100.0)
    msgs = log.fold.get_messages("s")
    assert ids(msgs) == [m1, m2] and tuple(msgs[0]) == MESSAGE_KEYS
    assert msgs[0]["active"] is True and msgs[0]["session_id"] == "s"
    m3 = log.message("s")
    assert log.fold.get_messages("s")[-1]["timestamp"] == T0 + m3  # event time by default
    assert ids(log.fold.get_messages("s", after=m1, limit=1)) == [m2]
    assert log.fold.message_session(m2) == "s" and log.fold.message_session(999) is None


def test_structured_content_is_kept_as_structure(log: Log) -> None:
    log.create("s")
    parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:x"}}]
    log.message("s", content=parts, display_metadata={"k": [1]})
    msg = log.fold.get_messages("s")[0]
    assert msg["content"] == parts and msg["display_metadata"] == {"k": [1]}


def test_rewind_hides_the_message_and_everything_after_it(log: Log) -> None:
    log.create("s")
    log.create("other")
    m1 = log.message("s", content="one", timestamp=T0 + 500)
    m2 = log.message("s", "assistant", content="two", tool_calls=[{"id": "x"}])
    x = log.message("other", content="elsewhere")
    m3 = log.message("s", content="three")
    log.add("messages.rewound", "s", {"message_id": m2})
    assert ids(log.fold.get_messages("s")) == [m1]
    assert [m["active"] for m in log.fold.get_messages("s", include_inactive=True)] == [True, False, False]
    row = log.session("s")
    assert (row["message_count"], row["tool_call_count"], row["last_activity_at"]) == (1, 0, T0 + 500.0)
    log.add("messages.rewound", "s", {"message_id": m3})  # already inactive: ignored
    log.add("messages.rewound", "s", {"message_id": x})  # another session's message: ignored
    assert log.session("s")["message_count"] == 1 and log.session("other")["message_count"] == 1
    m4 = log.message("s", content="four")
    assert ids(log.fold.get_messages("s")) == [m1, m4]
    assert log.fold.search("two") == []


# ---- reactions ----------------------------------------------------------------------------

def react(log: Log, sid: str, mid: int, author: str, emoji: str) -> int:
    return log.add("message.reaction_set", sid, {"message_id": mid, "author": author, "emoji": emoji})


def test_reactions_set_retract_replace_and_one_per_author(log: Log) -> None:
    log.create("s")
    m = log.message("s", content="hi")
    react(log, "s", m, "bob", "👍")
    s2 = react(log, "s", m, "ann", "🎉")
    assert log.fold.get_reactions(m) == [
        {"message_id": m, "author": "ann", "emoji": "🎉", "set_seq": s2, "seen": False},
        {"message_id": m, "author": "bob", "emoji": "👍", "set_seq": s2 - 1, "seen": False}]
    assert tuple(log.fold.get_reactions(m)[0]) == REACTION_KEYS
    react(log, "s", m, "bob", "👍")  # the same emoji again retracts
    assert log.fold.current_reaction(m, "bob") is None
    react(log, "s", m, "ann", "❤")  # a different emoji replaces
    assert ids(log.fold.get_reactions(m), "emoji") == ["❤"]
    log.add("message.reaction_removed", "s", {"message_id": m, "author": "ann"})
    log.add("message.reaction_removed", "s", {"message_id": m, "author": "nobody"})
    assert log.fold.get_reactions(m) == []


def test_reactions_need_a_message_of_that_session_active_or_not(log: Log) -> None:
    log.create("s")
    log.create("t")
    m = log.message("s")
    log.message("s")
    react(log, "t", m, "bob", "👍")  # message of another session
    react(log, "s", 999, "bob", "👍")  # no such message
    assert log.fold.get_reactions(m) == []
    log.add("messages.rewound", "s", {"message_id": m})
    react(log, "s", m, "bob", "👀")
    assert log.fold.current_reaction(m, "bob") == "👀"


def test_seen_marks_reactions_up_to_a_seq_and_a_new_reaction_is_unseen_again(log: Log) -> None:
    log.create("s")
    m1, m2 = log.message("s"), log.message("s")
    r1 = react(log, "s", m2, "bob", "👍")
    react(log, "s", m1, "bob", "👍")
    react(log, "s", m1, "ann", "🎉")
    assert [(r["message_id"], r["author"]) for r in log.fold.unseen_reactions("s")] == [
        (m1, "ann"), (m1, "bob"), (m2, "bob")]
    log.add("reactions.seen", "s", {"up_to": r1})
    assert [(r["message_id"], r["author"]) for r in log.fold.unseen_reactions("s")] == [(m1, "ann"), (m1, "bob")]
    log.add("reactions.seen", "s", {"up_to": log.seq})
    assert log.fold.unseen_reactions("s") == []
    react(log, "s", m2, "bob", "🔥")  # replaced: new set_seq, unseen again
    assert [(r["message_id"], r["emoji"]) for r in log.fold.unseen_reactions("s")] == [(m2, "🔥")]


# ---- usage ----------------------------------------------------------------------------------

def test_usage_sums_per_session_and_per_model_provider_task(log: Log) -> None:
    log.create("s")
    log.add("usage.recorded", "s", {"model": "m", "provider": "p", "input_tokens": 10, "output_tokens": 2})
    log.add("usage.recorded", "s", {"model": "m", "provider": "p", "input_tokens": 5, "estimated_cost_usd": 0.5})
    log.add("usage.recorded", "s", {"model": "m", "provider": "p", "estimated_cost_usd": 0.25, "actual_cost_usd": 0})
    log.add("usage.recorded", "s", {"reasoning_tokens": 7, "cache_read_tokens": 1, "cache_write_tokens": 2})
    log.add("usage.recorded", "s", {"model": "a", "task": "compress", "output_tokens": 1})
    row = log.session("s")
    assert [row[k] for k in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
                             "reasoning_tokens", "estimated_cost_usd", "actual_cost_usd")] == [15, 3, 1, 2, 7, 0.75, 0.0]
    usage = log.fold.get_usage("s")
    assert tuple(usage[0]) == USAGE_KEYS
    assert [(u["model"], u["provider"], u["task"], u["records"]) for u in usage] == [
        (None, None, None, 1), ("a", None, "compress", 1), ("m", "p", None, 3)]
    assert usage[0]["estimated_cost_usd"] is None and usage[1]["actual_cost_usd"] is None
    assert (usage[2]["input_tokens"], usage[2]["estimated_cost_usd"], usage[2]["actual_cost_usd"]) == (15, 0.75, 0.0)


def test_a_missing_cost_stays_missing(log: Log) -> None:
    log.create("s")
    log.add("usage.recorded", "s", {"input_tokens": 3, "estimated_cost_usd": None})
    assert log.session("s")["estimated_cost_usd"] is None
    assert log.fold.stats()["estimated_cost_usd"] is None
    assert log.fold.get_usage("s")[0]["estimated_cost_usd"] is None


# ---- deletion -------------------------------------------------------------------------------

def test_delete_cascades_to_descendants_and_frees_titles(log: Log) -> None:
    log.create("root", title="Root")
    log.create("child", parent_session_id="root", title="Child")
    log.create("grand", parent_session_id="child")
    log.create("keep", title="Keep")
    m = log.message("grand", content="needle")
    react(log, "grand", m, "bob", "👍")
    log.add("usage.recorded", "grand", {"input_tokens": 4})
    log.add("session.deleted", "child")
    assert log.fold.is_live("root") and not log.fold.is_live("child") and not log.fold.is_live("grand")
    assert log.fold.get_messages("grand", include_inactive=True) == [] and log.fold.get_usage("grand") == []
    assert log.fold.get_reactions(m) == [] and log.fold.message_session(m) is None
    assert log.fold.search("needle") == [] and log.fold.unseen_reactions("grand") == []
    assert log.fold.titles() == {"Root", "Keep"}
    log.create("new", title="Child")
    assert log.session("new")["title"] == "Child"
    log.add("session.deleted", "root")
    assert ids(log.fold.list_sessions(limit=None)) == ["new", "keep"]


# ---- list_sessions --------------------------------------------------------------------------

def test_list_sessions_order_is_last_activity_then_id_descending_nulls_last(log: Log) -> None:
    log.create("a")
    log.create("b")
    log.create("c")
    log.add("session.created", "d", {"started_at": "bad"}, raw=True)  # unknown time
    log.add("session.created", "e", {}, raw=True, ts="odd")
    log.message("a", timestamp=T0 + 100)
    log.create("f", started_at=T0 + 3)  # ties with c (created at T0 + 3)
    assert ids(log.fold.list_sessions()) == ["a", "f", "c", "b", "e", "d"]
    assert ids(log.fold.list_sessions(limit=2, offset=1)) == ["f", "c"]
    assert ids(log.fold.list_sessions(limit=None, offset=4)) == ["e", "d"]


def test_list_sessions_flag_filters(log: Log) -> None:
    for sid in ("plain", "arch", "hid", "pin"):
        log.create(sid)
    log.add("session.archived", "arch")
    log.add("session.hidden", "hid")
    log.add("session.pinned", "pin")
    ls = log.fold.list_sessions
    assert set(ids(ls())) == {"plain", "pin"}
    assert set(ids(ls(archived=True))) == {"arch"}
    assert set(ids(ls(archived=None, hidden=None))) == {"plain", "arch", "hid", "pin"}
    assert set(ids(ls(hidden=True))) == {"hid"}
    assert set(ids(ls(pinned=True))) == {"pin"} and set(ids(ls(pinned=False))) == {"plain"}


def test_list_sessions_source_children_and_workspace_filters(log: Log) -> None:
    log.create("nosrc", cwd="/w/p")
    log.create("cli", source="cli", git_repo_root="/w/p", cwd="/elsewhere")
    log.create("tg", source="telegram", cwd="/w/p/sub")
    log.create("near", source="web", cwd="/w/pq")
    log.create("kid", parent_session_id="tg")  # the source is not inherited
    ls = log.fold.list_sessions
    assert set(ids(ls(source="cli"))) == {"nosrc", "cli", "kid"}
    assert set(ids(ls(source="telegram"))) == {"tg"}
    assert "kid" not in ids(ls(children=False)) and "kid" in ids(ls())
    assert set(ids(ls(workspace="/w/p"))) == {"nosrc", "cli", "tg", "kid"}


def test_pinned_sessions_outside_the_page_are_always_appended(log: Log) -> None:
    for sid in ("a", "b", "c", "d"):
        log.create(sid)
    log.create("x", source="other")
    log.add("session.pinned", "a")
    log.add("session.pinned", "x")
    assert ids(log.fold.list_sessions(limit=2)) == ["x", "d", "a"]
    assert ids(log.fold.list_sessions(limit=2, source="cli")) == ["d", "c", "a"]
    assert ids(log.fold.list_sessions(limit=1, offset=4)) == ["a", "x"]  # in the list order
    log.add("session.archived", "a")
    assert "a" not in ids(log.fold.list_sessions(limit=1))  # pinned but filtered out


# ---- search -------------------------------------------------------------------------------

def test_search_matches_every_word_case_insensitively_newest_first(log: Log) -> None:
    log.create("s", source="telegram")
    log.create("h")
    a = log.message("s", content="Deploy the Rocket today")
    b = log.message("s", "assistant", content=[{"type": "text", "text": "rocket launch"}])
    c = log.message("s", "tool", tool_name="Rocket_Tool", content="done")
    d = log.message("s", "assistant", tool_calls=[{"function": {"name": "launch", "arguments": "{\"q\": \"rocket\"}"}}])
    log.message("h", content="rocket hidden")
    log.add("session.hidden", "h")
    s = log.fold.search
    assert ids(s("rocket")) == [d, c, b, a]
    assert ids(s("ROCKET launch")) == [d, b]
    assert ids(s("rocket deploy")) == [a]
    # Punctuation is matched exactly as typed (the substring rule): nothing is stripped.
    assert ids(s('"ROCKET" launch*')) == [] and ids(s("(rocket)")) == []
    assert ids(s('\\"rocket\\"')) == [d]  # as the tool-call arguments hold it, escaped in JSON
    assert ids(s("type")) == []  # keys of structured content are not text
    assert ids(s("rocket", role="assistant")) == [d, b]
    assert ids(s("rocket", source="telegram", limit=2)) == [d, c]
    assert ids(s("rocket", source="cli")) == []
    assert ids(s("rocket", session_id="h")) == []
    assert s("   ") == [] and s('""') == []
    assert tuple(s("deploy")[0]) == MESSAGE_KEYS


def test_search_terms() -> None:
    assert search_terms(' "Hello" (World) foo* ^bar it\'s C++ ++ ') == [
        '"hello"', "(world)", "foo*", "^bar", "it's", "c++", "++"]
    assert search_terms(None) == []


# ---- stats ------------------------------------------------------------------------------------

def test_stats_counts_live_roots_by_source_excluding_children(log: Log) -> None:
    log.create("a")
    log.create("b", source="telegram")
    log.create("kid", parent_session_id="a", source="telegram")
    log.create("orphan", parent_session_id="gone", source="telegram")
    log.create("dead")
    log.add("session.archived", "b")  # archived sessions still count
    for sid in ("a", "a", "b", "kid", "orphan", "dead"):
        log.message(sid)
    log.add("messages.rewound", "a", {"message_id": log.seq - 4})  # a's second message
    log.add("usage.recorded", "a", {"input_tokens": 5, "actual_cost_usd": 1.5})
    log.add("usage.recorded", "kid", {"input_tokens": 100, "actual_cost_usd": 10})
    log.add("usage.recorded", "b", {"output_tokens": 3})
    log.add("session.deleted", "dead")
    st_ = log.fold.stats()
    assert st_["sessions"] == 3 and st_["messages"] == 3
    assert st_["by_source"] == {"cli": {"sessions": 1, "messages": 1}, "telegram": {"sessions": 2, "messages": 2}}
    assert (st_["input_tokens"], st_["output_tokens"], st_["actual_cost_usd"], st_["estimated_cost_usd"]) == (5, 3, 1.5, None)
    assert set(st_) == {"sessions", "messages", "by_source", "input_tokens", "output_tokens", "cache_read_tokens",
                        "cache_write_tokens", "reasoning_tokens", "estimated_cost_usd", "actual_cost_usd"}


# ---- robustness -------------------------------------------------------------------------------

def test_v1_envelopes_are_upcast_before_folding(log: Log) -> None:
    log.create("s")
    m = log.add("message.appended", "s", {"role": "assistant", "text": "old text",
                                          "tool_calls_json": '[{"id": 1}]'}, raw=True, v=1)
    msg = log.fold.get_messages("s")[0]
    assert (msg["id"], msg["content"], msg["tool_calls"]) == (m, "old text", [{"id": 1}])
    assert log.session("s")["tool_call_count"] == 1


def test_odd_stored_values_read_as_unknown(log: Log) -> None:
    log.add("session.created", "s", {"started_at": 1e30, "model": 5, "model_config": "{}", "cwd": ["x"],
                                     "title": ["t"], "source": None}, raw=True)
    row = log.session("s")
    assert (row["started_at"], row["model"], row["model_config"], row["cwd"], row["title"]) == (None,) * 5
    log.add("message.appended", "s", {"role": 3, "content": 12, "tool_calls": "[1]", "timestamp": "TEXT",
                                      "token_count": -4, "display_metadata": [1], "reasoning": b"x"}, raw=True)
    log.add("message.appended", "s", {"role": "user", "timestamp": True, "tool_calls": [1, 2]}, raw=True)
    msgs = log.fold.get_messages("s")
    assert [m[k] for m in msgs[:1] for k in ("role", "content", "tool_calls", "timestamp", "token_count",
                                              "display_metadata", "reasoning")] == [None] * 7
    assert msgs[1]["timestamp"] is None and log.session("s")["tool_call_count"] == 2
    log.add("usage.recorded", "s", {"input_tokens": "9", "output_tokens": True, "reasoning_tokens": 2**70,
                                    "estimated_cost_usd": float("nan"), "actual_cost_usd": -1, "model": {}}, raw=True)
    assert [log.session("s")[k] for k in ("input_tokens", "output_tokens", "reasoning_tokens",
                                          "estimated_cost_usd", "actual_cost_usd")] == [0, 0, 0, None, None]
    log.add("session.ended", "s", {"reason": 5, "ended_at": "noon"}, raw=True)
    assert (log.session("s")["ended_at"], log.session("s")["end_reason"]) == (None, None)
    for type_, data in [("messages.rewound", {"message_id": "1"}), ("message.reaction_set", {"message_id": [2]}),
                        ("reactions.seen", {"up_to": None}), ("session.meta_updated", {"tool_names": "a"}),
                        ("session.titled", {"title": None, "source": []}), ("session.pinned", "not a dict")]:
        log.add(type_, "s", data, raw=True)
    assert log.session("s")["tool_names"] is None
    for env in [None, [], {"seq": "x"}, {"seq": 99, "type": "session.created", "session": 5},
                {"seq": 100, "type": "session.created", "session": "t", "ts": 10**40, "data": {}}]:
        log.fold.apply(env)  # type: ignore[arg-type]
    assert log.session("t")["started_at"] is None
    log.fold.stats()
    log.fold.list_sessions(limit=None)
    log.fold.search("x")


def test_query_results_are_fresh_copies(log: Log) -> None:
    log.create("s", model_config={"a": [1]})
    log.add("session.meta_updated", "s", {"tool_names": ["t"]})
    log.message("s", content=[{"text": "x"}], tool_calls=[{"id": 1}])
    log.add("usage.recorded", "s", {"input_tokens": 1})
    row = log.fold.get_session("s")
    assert row is not None
    row["model_config"]["a"].append(2)
    row["tool_names"].append("u")
    log.fold.list_sessions()[0]["title"] = "mutated"
    msg = log.fold.get_messages("s")[0]
    msg["content"][0]["text"] = "changed"
    msg["tool_calls"].clear()
    log.fold.search("x")[0]["content"].clear()
    log.fold.get_usage("s")[0]["input_tokens"] = 99
    fresh = log.session("s")
    assert fresh["model_config"] == {"a": [1]} and fresh["tool_names"] == ["t"] and fresh["title"] is None
    assert log.fold.get_messages("s")[0]["content"] == [{"text": "x"}]
    assert log.fold.get_messages("s")[0]["tool_calls"] == [{"id": 1}]
    assert log.fold.get_usage("s")[0]["input_tokens"] == 1


def test_input_data_is_copied_on_apply(log: Log) -> None:
    log.create("s")
    content = [{"text": "x"}]
    log.message("s", content=content)
    log.envelopes[-1]["data"]["content"][0]["text"] = "mutated later"
    assert log.fold.get_messages("s")[0]["content"] == [{"text": "x"}]


def test_apply_all_equals_apply_one_by_one(log: Log) -> None:
    log.create("s", title="T")
    log.message("s", content="hi")
    log.add("session.pinned", "s")
    other = Fold()
    other.apply_all(log.envelopes)
    assert other.seq == log.fold.seq == log.seq
    assert other.list_sessions() == log.fold.list_sessions() and other.stats() == log.fold.stats()


odd = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5), st.binary(max_size=3),
              st.sampled_from(["s1", "s2", "user", "llm", "👍", "2024-01-01"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=8,
)
fields = sorted({name for schema in events._SCHEMAS.values() for name in schema} | {"text", "tool_calls_json"})
envelope = st.fixed_dictionaries({
    "seq": st.one_of(st.integers(min_value=1, max_value=40), odd),
    "ts": st.one_of(st.integers(min_value=0, max_value=5 * 10**18), odd),
    "type": st.one_of(st.sampled_from(sorted(events.CURRENT_VERSIONS)), odd),
    "v": st.one_of(st.sampled_from([1, 2]), odd),
    "session": st.one_of(st.sampled_from(["s1", "s2", "s3"]), odd),
    "data": st.one_of(st.dictionaries(st.sampled_from(fields), st.one_of(odd, st.integers(1, 40)), max_size=5), odd),
})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(envelope, max_size=40))
def test_the_fold_never_crashes_on_arbitrary_envelopes(envs: list[dict[str, Any]]) -> None:
    fold = Fold()
    fold.apply_all(envs)
    for sid in ("s1", "s2", "s3"):
        fold.get_session(sid)
        fold.get_messages(sid, include_inactive=True)
        fold.get_usage(sid)
        fold.unseen_reactions(sid)
        fold.lineage(sid)
    for mid in range(1, 41):
        fold.get_reactions(mid)
    fold.list_sessions(archived=None, hidden=None, limit=None)
    fold.list_sessions(workspace="/", source="cli", children=False)
    fold.search("s1 a")
    fold.stats()
