"""The facade against the real thing: random operation sequences driven through Hermes'
``hermes_state.SessionDB`` and eventlog's ``SessionDB`` side by side, every result and every
row compared.

Needs the real ``hermes_state`` (hermes-agent 0.19.0): these tests carry the ``hermes`` marker
and run in the Hermes suite's environment with ``python3 run compat`` (the default suite
deselects them). Both classes see the same clock: ``time`` is replaced, in both modules, by a
clock the test moves (days at a time now and then, so prune windows, lock expiry and cooldowns
are exercised).
"""
from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
import tempfile
import time as real_time
import types
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

try:
    import hermes_state
except ImportError:  # pragma: no cover - the marker keeps these tests out of such environments
    hermes_state = None

pytestmark = pytest.mark.hermes

SIDS = ["s1", "s2", "s3", "c1", "c2", "odd id/with space"]
ROLES = ["user", "assistant", "tool", "system", "session_meta"]
TEXTS = ["hello world", "deploy the docker image", "大别山项目 进展", "chat-send P2.2 my-app.config.ts", "",
         "Review the conversation above and update the skill library", "lone \ud800 surrogate", "x" * 300,
         "line one\nline two\r\nthree"]
TITLES = ["My session", "  My   session ", "My session #2", "other", "", "a" * 101, "ctl\x07char", None, "My_%title"]
REASONS = ["compression", "branched", "agent_close", "ws_orphan_reap", "session_reset", "user_exit"]
SOURCES = ["cli", "tui", "telegram", "tool", "cron", "discord"]
CONFIGS = [None, {"_branched_from": "s1"}, {"_delegate_from": "s1"}, {"temperature": 0.5, "a": [1, 2]}]


class Clock(types.ModuleType):
    """Stands in for the ``time`` module: ``time()`` is what the test says, the rest is real."""

    def __init__(self) -> None:
        super().__init__("time")
        self.now = 1_750_000_000.25

    def time(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(real_time, name)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    import importlib
    import pkgutil

    import eventlog.adapters.hermes as facade

    c = Clock()
    monkeypatch.setattr(hermes_state, "time", c)
    for info in pkgutil.iter_modules(facade.__path__):  # every adapter module that reads the clock
        module = importlib.import_module(f"{facade.__name__}.{info.name}")
        if getattr(module, "time", None) is real_time:
            monkeypatch.setattr(module, "time", c)
    return c


# ---- operations ---------------------------------------------------------------------------------

sid = st.sampled_from(SIDS)
opt_text = st.one_of(st.none(), st.sampled_from(TEXTS))
content = st.one_of(st.none(), st.sampled_from(TEXTS), st.just([{"type": "text", "text": "part one"},
                                                                 {"type": "image_url", "image_url": {"url": "x"}}]),
                    st.just({"k": "v", "b": 1}), st.integers(-3, 3))
tool_calls = st.one_of(st.none(), st.just([]), st.just([{"id": "c1", "type": "function",
                                                         "function": {"name": "terminal", "arguments": "{\"cmd\": \"ls\"}"}}]),
                       st.just([{"id": "a"}, {"id": "b"}]))
msg = st.fixed_dictionaries({"role": st.sampled_from(ROLES), "content": content}, optional={
    "tool_calls": tool_calls, "tool_name": opt_text, "reasoning": opt_text, "platform_message_id": st.sampled_from(["p1", "p2"]),
    "timestamp": st.one_of(st.none(), st.floats(1.6e9, 1.8e9)), "observed": st.booleans(),
    "api_content": opt_text, "finish_reason": st.sampled_from(["stop", "tool_calls"]),
    "reasoning_details": st.one_of(st.none(), st.just([{"type": "summary", "text": "why"}]))})


def op(name: str, **kwargs: Any) -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
    return st.fixed_dictionaries(kwargs).map(lambda kw: (name, kw))


OPS = st.one_of(
    op("create_session", session_id=sid, source=st.sampled_from(SOURCES), model=st.sampled_from([None, "gpt", "claude"]),
       model_config=st.sampled_from(CONFIGS), parent_session_id=st.sampled_from([None, "s1", "s2", "c1"]),
       system_prompt=opt_text, cwd=st.sampled_from([None, "/repo", "/repo/sub", "/other"]),
       user_id=st.sampled_from([None, "u1", "u2"]), session_key=st.sampled_from([None, "k1", "k2"]),
       chat_id=st.sampled_from([None, "chat1"]), chat_type=st.sampled_from([None, "dm"])),
    op("ensure_session", session_id=sid, source=st.sampled_from(SOURCES), model=st.sampled_from([None, "gpt"])),
    op("append_message", session_id=sid, message=msg),
    op("append_message", session_id=sid, message=msg),
    op("update_token_counts", session_id=sid, input_tokens=st.integers(0, 500), output_tokens=st.integers(0, 50),
       model=st.sampled_from([None, "gpt", "claude"]), estimated_cost_usd=st.one_of(st.none(), st.floats(0, 2)),
       actual_cost_usd=st.one_of(st.none(), st.floats(0, 2)), billing_provider=st.sampled_from([None, "openai", "anthropic"]),
       api_call_count=st.integers(0, 2), absolute=st.booleans(), cost_status=st.sampled_from([None, "estimated"])),
    op("record_auxiliary_usage", session_id=sid, task=st.sampled_from(["", "title_generation", "vision"]),
       model=st.sampled_from([None, "small"]), input_tokens=st.integers(0, 100),
       estimated_cost_usd=st.one_of(st.none(), st.floats(0, 1))),
    op("end_session", session_id=sid, end_reason=st.sampled_from(REASONS)),
    op("reopen_session", session_id=sid),
    op("promote_to_session_reset", session_id=sid, reason=st.sampled_from(["session_reset", "idle"])),
    op("set_session_title", session_id=sid, title=st.sampled_from(TITLES)),
    op("set_auto_title_if_empty", session_id=sid, title=st.sampled_from(TITLES)),
    op("set_session_archived", session_id=sid, archived=st.booleans()),
    op("update_system_prompt", session_id=sid, system_prompt=st.sampled_from(["You are Hermes", "v2", None])),
    op("update_session_model", session_id=sid, model=st.sampled_from(["gpt-5", None])),
    op("update_session_billing_route", session_id=sid, provider=st.sampled_from(["openrouter", "openai"]),
       base_url=st.sampled_from(["https://x", ""]), billing_mode=st.sampled_from([None, "subscription"])),
    op("update_session_meta", session_id=sid, model_config_json=st.sampled_from(['{"a": 1}', '{"_delegate_from": "s1"}']),
       model=st.sampled_from([None, "m2"])),
    op("update_session_cwd", session_id=sid, cwd=st.sampled_from(["/repo", "", "/w"]),
       git_branch=st.sampled_from([None, "main", "  "]), git_repo_root=st.sampled_from([None, "/repo"])),
    op("backfill_repo_roots", cwd_to_root=st.sampled_from([{"/repo": "/repo"}, {"/w": ""}, {"/repo/sub": "/repo"}])),
    op("record_gateway_session_peer", session_id=sid, source=st.sampled_from(["telegram", "discord"]),
       user_id=st.sampled_from([None, "u1"]), session_key=st.sampled_from([None, "k1", "k2"]),
       chat_id=st.sampled_from([None, "chat1", "chat2"]), chat_type=st.sampled_from(["dm", "group"]),
       thread_id=st.sampled_from([None, "t1"]), display_name=st.sampled_from([None, "Ann"]),
       origin_json=st.sampled_from([None, '{"chat_id": "chat1"}'])),
    op("set_expiry_finalized", session_id=sid, finalized=st.booleans()),
    op("replace_gateway_routing_entries", entries=st.dictionaries(st.sampled_from(["k1", "k2", "k3"]),
                                                                  st.sampled_from(['{"a":1}', '{"b":2}']), max_size=3),
       scope=st.sampled_from(["", "/dir"])),
    op("save_gateway_routing_entry", session_key=st.sampled_from(["k1", "k4"]), entry_json=st.sampled_from(['{"z":0}']),
       scope=st.sampled_from(["", "/dir"])),
    op("delete_gateway_routing_entries", session_keys=st.lists(st.sampled_from(["k1", "k2", "k4"]), max_size=2),
       scope=st.sampled_from(["", "/dir"])),
    op("try_acquire_compression_lock", session_id=sid, holder=st.sampled_from(["h1", "h2"]),
       ttl_seconds=st.sampled_from([1.0, 300.0])),
    op("refresh_compression_lock", session_id=sid, holder=st.sampled_from(["h1", "h2"]), ttl_seconds=st.just(300.0)),
    op("release_compression_lock", session_id=sid, holder=st.sampled_from(["h1", "h2"])),
    op("record_compression_failure_cooldown", session_id=sid, cooldown_until=st.floats(1.7e9, 1.8e9),
       error=st.sampled_from([None, "boom"])),
    op("clear_compression_failure_cooldown", session_id=sid),
    op("set_compression_fallback_streak", session_id=sid, streak=st.integers(-2, 5)),
    op("rewind_to_message", session_id=sid, target_message_id=st.integers(1, 12)),
    op("restore_rewound", session_id=sid, since_message_id=st.integers(1, 12)),
    op("replace_messages", session_id=sid, messages=st.lists(msg, max_size=3), active_only=st.booleans()),
    op("archive_and_compact", session_id=sid, compacted_messages=st.lists(msg, max_size=3)),
    op("set_latest_user_api_content", session_id=sid, content=st.sampled_from(TEXTS[:3]), api_content=st.just("sent")),
    op("clear_messages", session_id=sid),
    op("delete_session", session_id=sid),
    op("delete_session_if_empty", session_id=sid),
    op("delete_sessions", session_ids=st.lists(sid, max_size=3)),
    op("delete_empty_sessions"),
    op("prune_sessions", older_than_days=st.sampled_from([None, 0, 1, 90]), source=st.sampled_from([None, "cli"])),
    op("archive_sessions", older_than_days=st.sampled_from([None, 1]), source=st.sampled_from([None, "cli"])),
    op("prune_empty_ghost_sessions"),
    op("finalize_orphaned_compression_sessions"),
    op("set_meta", key=st.sampled_from(["k", "last_auto_prune"]), value=st.sampled_from(["v", "1"])),
    op("enable_telegram_topic_mode", chat_id=st.sampled_from(["chat1", 5]), user_id=st.just("u1"),
       has_topics_enabled=st.sampled_from([None, True])),
    op("disable_telegram_topic_mode", chat_id=st.sampled_from(["chat1", "5"]), clear_bindings=st.booleans()),
    op("bind_telegram_topic", chat_id=st.just("chat1"), thread_id=st.sampled_from(["t1", "t2"]), user_id=st.just("u1"),
       session_key=st.just("k1"), session_id=sid),
    op("delete_telegram_topic_binding", chat_id=st.just("chat1"), thread_id=st.sampled_from(["t1", "t2"])),
    op("request_handoff", session_id=sid, platform=st.sampled_from(["telegram", "discord"])),
    op("claim_handoff", session_id=sid),
    op("complete_handoff", session_id=sid),
    op("fail_handoff", session_id=sid, error=st.just("nope")),
    op("import_exported", source_id=sid, new_id=st.sampled_from(["i1", "i2", "s1"]), parent=st.sampled_from([None, "s2", "i1"])),
)
PRELUDE: list[tuple[str, dict[str, Any]]] = [
    ("create_session", {"session_id": "s1", "source": "cli", "model": "gpt", "cwd": "/repo"}),
    ("create_session", {"session_id": "s2", "source": "telegram", "user_id": "u1", "session_key": "k1",
                        "chat_id": "chat1", "chat_type": "dm"}),
    ("create_session", {"session_id": "s3", "source": "tui"}),
    ("create_session", {"session_id": "c1", "source": "cli", "parent_session_id": "s1"}),
    ("create_session", {"session_id": "c2", "source": "cli", "parent_session_id": "s2",
                        "model_config": {"_delegate_from": "s2"}}),
    ("create_session", {"session_id": "odd id/with space", "source": "cron"}),
    ("append_message", {"session_id": "s1", "message": {"role": "user", "content": "hello world"}}),
    ("append_message", {"session_id": "s1", "message": {"role": "assistant", "content": "hi", "reasoning": "think"}}),
    ("append_message", {"session_id": "s2", "message": {"role": "user", "content": "deploy the docker image",
                                                        "platform_message_id": "p1"}}),
    ("append_message", {"session_id": "c1", "message": {"role": "user", "content": "hello world"}}),
]
"""Sessions every sequence starts from (a root with a child, a gateway session with a delegate
subagent, a TUI and a cron session whose id is not an eventlog stream id)."""
EXAMPLES = int(os.environ.get("HERMES_DIFF_EXAMPLES", "60"))
STEP = st.one_of(st.just(0.0), st.just(0.5), st.floats(1, 100), st.just(2 * 86400.0), st.just(95 * 86400.0))


def run(db: Any, name: str, kw: dict[str, Any]) -> Any:
    if name == "append_message":
        return db.append_message(kw["session_id"], **kw["message"])
    if name == "import_exported":
        exported = db.export_session(kw["source_id"])
        if exported is None:
            return None
        item = dict(exported, id=kw["new_id"], parent_session_id=kw["parent"])
        return db.import_sessions([item])
    return getattr(db, name)(**kw)


def outcome(db: Any, name: str, kw: dict[str, Any]) -> Any:
    try:
        return ("ok", run(db, name, kw))
    except Exception as e:  # the exception's type is part of the contract
        return ("raised", type(e).__name__, str(e))


TABLES = ("sessions", "messages", "session_model_usage", "state_meta", "gateway_routing", "compression_locks",
          "async_delegations", "telegram_dm_topic_mode", "telegram_dm_topic_bindings", "sqlite_sequence",
          "schema_version", "messages_fts", "messages_fts_trigram")


def typed(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return ("nan",)
    return (type(value).__name__, value)


def dump(path: Path) -> dict[str, Any]:
    """Every row of every Hermes table, typed (1 and 1.0 differ), in rowid order."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        out: dict[str, Any] = {}
        for t in TABLES:
            if t in names:
                rows = conn.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall()
                out[t] = [tuple(typed(v) for v in r) for r in rows]
        return out
    finally:
        conn.close()


def reads(db: Any) -> dict[str, Any]:
    """A battery of public reads with assorted arguments."""
    r: dict[str, Any] = {}
    for s in SIDS + ["nope"]:
        r[f"session {s}"] = db.get_session(s)
        r[f"messages {s}"] = db.get_messages(s)
        r[f"all messages {s}"] = db.get_messages(s, include_inactive=True, limit=3, offset=1)
        r[f"conv {s}"] = db.get_messages_as_conversation(s)
        r[f"conv+ {s}"] = db.get_messages_as_conversation(s, include_ancestors=True, include_inactive=True)
        r[f"resume {s}"] = db.get_resume_conversations(s)
        r[f"prefix {s}"] = db.get_ancestor_display_prefix(s)
        r[f"tip {s}"] = db.get_compression_tip(s)
        r[f"resume-id {s}"] = db.resolve_resume_session_id(s)
        r[f"lineage {s}"] = db.get_compression_lineage(s)
        r[f"export-lineage {s}"] = db.export_session_lineage(s)
        r[f"root {s}"] = db.get_conversation_root(s)
        r[f"recent {s}"] = db.list_recent_user_messages(s, include_inactive=True)
        r[f"title {s}"] = db.get_session_title(s)
        r[f"count {s}"] = db.message_count(s)
        r[f"handoff {s}"] = db.get_handoff_state(s)
        r[f"lock {s}"] = db.get_compression_lock_holder(s)
        r[f"cooldown {s}"] = db.get_compression_failure_cooldown(s)
        r[f"streak {s}"] = db.get_compression_fallback_streak(s)
        r[f"archived-msgs {s}"] = db.has_archived_messages(s)
        r[f"pmid {s}"] = db.has_platform_message_id(s, "p1")
        r[f"around {s}"] = db.get_anchored_view(s, 3, window=2, bookend=1)
        r[f"topic {s}"] = db.get_telegram_topic_binding_by_session(session_id=s)
    for flags in ({}, {"include_children": True}, {"order_by_last_active": True}, {"include_archived": True},
                  {"archived_only": True}, {"project_compression_tips": False}, {"source": "cli"},
                  {"cwd_prefix": "/repo"}, {"exclude_sources": ["tool"]}, {"min_message_count": 1},
                  {"order_by_last_active": True, "search_query": "my ses"}, {"compact_rows": True}):
        r[f"rich {sorted(flags.items())}"] = db.list_sessions_rich(**flags)
        r[f"count {sorted(flags.items())}"] = db.session_count(**{k: v for k, v in flags.items() if k in (
            "source", "cwd_prefix", "min_message_count", "include_archived", "archived_only", "exclude_sources")})
    for q in ("hello", "docker", "大别山", "别山", "chat-send", "my-app.config.ts", '"line two"', "terminal", "P2.2",
              "hello OR deploy", "lone"):
        r[f"search {q}"] = db.search_messages(q)
        r[f"search-inactive {q}"] = db.search_messages(q, include_inactive=True, sort="newest", role_filter=["user"])
    r["search ids"] = db.search_sessions_by_id("s")
    r["search sessions"] = db.search_sessions()
    r["export all"] = db.export_all()
    r["cwds"] = db.distinct_session_cwds(include_archived=True)
    r["empty"] = db.count_empty_sessions()
    r["candidates"] = db.list_prune_candidates(older_than_days=1)
    r["gateway"] = db.list_gateway_sessions(active_only=False)
    r["peer"] = db.find_latest_gateway_session_for_peer(source="telegram", session_key="k1", user_id="u1",
                                                        chat_id="chat1", chat_type="dm")
    r["origin"] = db.find_session_by_origin(platform="telegram", chat_id="chat1")
    r["routing"] = (db.load_gateway_routing_entries(), db.load_gateway_routing_entries(scope="/dir"))
    r["meta"] = (db.get_meta("k"), db.get_meta("last_auto_prune"))
    r["pending"] = db.list_pending_handoffs()
    r["topics"] = (db.list_telegram_topic_bindings_for_chat(chat_id="chat1"),
                   db.is_telegram_topic_mode_enabled(chat_id="chat1", user_id="u1"),
                   db.list_unlinked_telegram_sessions_for_user(chat_id="chat1", user_id="u1"))
    r["titles"] = (db.resolve_session_by_title("My session"), db.get_next_title_in_lineage("My session"),
                   db.get_session_by_title("other"), db.resolve_session_id("s"), db.resolve_session_id("c"))
    return r


def facade_file(db: Any) -> Path:
    return Path(db.db_path).resolve()


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(steps=st.lists(st.tuples(OPS, STEP), min_size=1, max_size=40))
def test_random_sequences_match_the_real_sessiondb(clock: Clock, steps: list[Any]) -> None:
    from eventlog.adapters.hermes import SessionDB as Facade

    Real = getattr(hermes_state, "HermesSessionDB", hermes_state.SessionDB)
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        real, ours = Real(Path(a) / "state.db"), Facade(Path(b) / "state.db")
        try:
            for i, ((name, kw), step) in enumerate([(p, 1.0) for p in PRELUDE] + steps):
                clock.now += step
                expected, got = outcome(real, name, kw), outcome(ours, name, kw)
                assert got == expected, f"step {i}: {name}({kw})"
                assert dump(facade_file(ours)) == dump(Path(a) / "state.db"), f"rows after step {i}: {name}({kw})"
            assert reads(ours) == reads(real)
            ours._engine.rebuild()  # the projection rebuilt from the log alone gives the same rows
            assert dump(facade_file(ours)) == dump(Path(a) / "state.db")
            assert reads(ours) == reads(real)
        finally:
            real.close()
            ours.close()


@settings(max_examples=max(1, EXAMPLES // 2), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(steps=st.lists(st.tuples(OPS, STEP), min_size=1, max_size=30))
def test_switching_an_existing_state_db_is_lossless(clock: Clock, steps: list[Any]) -> None:
    """A state.db written by Hermes, opened with eventlog: same rows, same reads, the original
    file kept byte for byte beside it."""
    from eventlog.adapters.hermes import SessionDB as Facade

    Real = getattr(hermes_state, "HermesSessionDB", hermes_state.SessionDB)
    with tempfile.TemporaryDirectory() as a:
        path = Path(a) / "state.db"
        real = Real(path)
        for (name, kw), step in [(p, 1.0) for p in PRELUDE] + steps:
            clock.now += step
            outcome(real, name, kw)
        expected_reads = reads(real)
        real.close()
        expected_rows = dump(path)
        ours = Facade(path)
        try:
            assert path.is_symlink()
            assert dump(Path(a) / "state.db.pre-eventlog") == expected_rows
            assert dump(facade_file(ours)) == expected_rows
            assert reads(ours) == expected_reads
        finally:
            ours.close()


def _hermes_cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")}
    env["HERMES_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "eventlog.adapters.hermes", "sessions", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_hermes_command_runs_on_an_eventlog_backed_home(tmp_path: Path) -> None:
    """The launcher: a home written by plain Hermes is switched by the first command, and the
    real `hermes sessions` commands read and write through eventlog from then on."""
    home = tmp_path / "hermes-home"
    home.mkdir()
    Real = getattr(hermes_state, "HermesSessionDB", hermes_state.SessionDB)
    db = Real(home / "state.db")
    db.create_session("20250101_100000_abcd", "cli", model="gpt", system_prompt="You are Hermes")
    db.append_message("20250101_100000_abcd", "user", "how do lighthouses work")
    db.set_session_title("20250101_100000_abcd", "Lighthouses")
    db.close()

    listed = _hermes_cli(home, "list")
    assert listed.returncode == 0, listed.stderr
    assert "Lighthouses" in listed.stdout and "how do lighthouses work" in listed.stdout
    assert (home / "state.db").is_symlink() and (home / "state.db.pre-eventlog").exists()

    renamed = _hermes_cli(home, "rename", "20250101_100000_abcd", "Beacons")
    assert renamed.returncode == 0, renamed.stderr
    out = home / "export.jsonl"
    exported = _hermes_cli(home, "export", str(out))
    assert exported.returncode == 0, exported.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["id"], r["title"], r["system_prompt"]) for r in rows] == [
        ("20250101_100000_abcd", "Beacons", "You are Hermes")]
    assert rows[0]["messages"][0]["content"] == "how do lighthouses work"

    # The rename is an event in the log (eventlog's own tools see it too).
    from eventlog.log.lmdb import EventLog

    log = EventLog.open(home / "state.db.eventlog" / "profiles" / "default" / "log")
    try:
        titled = [e["data"]["title"] for e in log.read() if e["type"] == "session.titled"]
    finally:
        log.close()
    assert titled[-1] == "Beacons"
