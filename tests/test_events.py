"""The event catalogue: validation, normalization, upcasting, title helpers (docs/EVENTS.md)."""
from __future__ import annotations

import math
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventlog.errors import EventTooLargeError, ValidationError
from eventlog.sessions import events
from eventlog.sessions.events import CURRENT_VERSIONS, make_event, next_title, normalize_title, upcast, validate

MIB = 1024 * 1024


def refused(type_: str, data: Any, session: Any = "s1") -> str:
    """Validate expecting a refusal; return the field the error names."""
    with pytest.raises(ValidationError) as info:
        validate(type_, data, session)
    return info.value.field


def msg(**data: Any) -> dict[str, Any]:
    return validate("message.appended", {"role": "user", **data}, "s1")


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


# ---- catalogue ------------------------------------------------------------------------

def test_catalogue_lists_every_documented_type_with_its_version() -> None:
    assert CURRENT_VERSIONS == {
        **dict.fromkeys(
            ["session.created", "session.ended", "session.reopened", "session.titled",
             "session.archived", "session.unarchived", "session.pinned", "session.unpinned",
             "session.hidden", "session.unhidden", "session.meta_updated", "session.deleted",
             "message.reaction_set", "message.reaction_removed", "reactions.seen",
             "messages.rewound", "usage.recorded"], 1),
        "message.appended": 2,
    }


MINIMAL = {
    "session.created": {},
    "session.ended": {"reason": "done"},
    "session.reopened": {},
    "session.titled": {"title": "T"},
    "session.archived": {}, "session.unarchived": {}, "session.pinned": {}, "session.unpinned": {},
    "session.hidden": {}, "session.unhidden": {}, "session.deleted": {},
    "session.meta_updated": {"model": "m"},
    "message.appended": {"role": "assistant"},
    "message.reaction_set": {"message_id": 3, "author": "u", "emoji": "👍"},
    "message.reaction_removed": {"message_id": 3, "author": "u"},
    "reactions.seen": {"up_to": 0},
    "messages.rewound": {"message_id": 1},
    "usage.recorded": {},
}


@pytest.mark.parametrize("type_", sorted(CURRENT_VERSIONS))
def test_minimal_event_of_every_type_is_accepted_and_needs_a_session(type_: str) -> None:
    out = validate(type_, MINIMAL[type_], "s1")
    assert orjson.loads(orjson.dumps(out)) == out
    assert refused(type_, MINIMAL[type_], None) == "session"


def test_unknown_type_is_refused() -> None:
    assert refused("session.exploded", {}) == "type"
    assert refused(42, {}) == "type"  # type: ignore[arg-type]


@pytest.mark.parametrize("session", ["", "a b", "x" * 129, "ümlaut", "a/b", "s\n", 7, b"s1", None])
def test_session_id_format(session: Any) -> None:
    assert refused("session.created", {}, session) == "session"


def test_session_id_edge_of_the_format_is_accepted() -> None:
    validate("session.created", {}, "A-z_0.9:x@y" + "x" * 117)


def test_data_must_be_an_object_and_none_means_empty() -> None:
    assert validate("session.pinned", None, "s1") == {}
    assert refused("session.pinned", [1]) == "data"
    assert refused("session.pinned", "{}") == "data"


def test_unknown_data_keys_are_refused() -> None:
    assert refused("session.pinned", {"x": 1}) == "data.x"
    assert refused("message.appended", {"role": "user", "text": "v1 field"}) == "data.text"
    assert refused("session.created", {1: "a"}).startswith("data.")


@pytest.mark.parametrize("type_,field", [
    ("session.ended", "reason"), ("session.titled", "title"), ("message.appended", "role"),
    ("message.reaction_set", "author"), ("message.reaction_set", "emoji"),
    ("message.reaction_set", "message_id"), ("message.reaction_removed", "author"),
    ("reactions.seen", "up_to"), ("messages.rewound", "message_id"),
])
def test_required_fields_missing_or_null_are_refused(type_: str, field: str) -> None:
    data = dict(MINIMAL[type_])
    data.pop(field)
    assert refused(type_, data) == f"data.{field}"
    assert refused(type_, {**data, field: None}) == f"data.{field}"


def test_required_names_must_not_be_blank() -> None:
    assert refused("session.ended", {"reason": "  "}) == "data.reason"
    assert refused("message.reaction_set", {"message_id": 1, "author": "u", "emoji": ""}) == "data.emoji"


def test_roles_outside_the_catalogue_are_refused() -> None:
    for role in ("system", "user", "assistant", "tool", "session_meta"):
        assert msg(role=role)["role"] == role
    assert refused("message.appended", {"role": "developer"}) == "data.role"
    assert refused("message.appended", {"role": "User"}) == "data.role"
    assert refused("message.appended", {"role": ["user"]}) == "data.role"


# ---- numbers ----------------------------------------------------------------------------

@pytest.mark.parametrize("value", [True, False, 1.0, "3", -1, 2**63, None])
def test_counts_are_non_negative_int64_and_bool_is_not_an_int(value: Any) -> None:
    if value is None:
        assert msg(token_count=None)["token_count"] is None
        return
    assert refused("message.appended", {"role": "user", "token_count": value}) == "data.token_count"
    assert refused("usage.recorded", {"input_tokens": value}) == "data.input_tokens"


def test_seq_references_are_positive_ints() -> None:
    for bad in (0, -5, True, "3", 2**63):
        assert refused("messages.rewound", {"message_id": bad}) == "data.message_id"
    assert refused("reactions.seen", {"up_to": -1}) == "data.up_to"
    assert validate("messages.rewound", {"message_id": 2**63 - 1}, "s1") == {"message_id": 2**63 - 1}


def test_ints_outside_signed_64_bit_are_refused_inside_json_too() -> None:
    assert msg(content=[2**63 - 1, -(2**63)])["content"] == [2**63 - 1, -(2**63)]
    assert refused("message.appended", {"role": "user", "content": [2**63]}) == "data.content[0]"
    assert refused("session.created", {"model_config": {"a": {"b": -(2**63) - 1}}}) == "data.model_config.a.b"


def test_nan_and_infinity_are_refused_anywhere() -> None:
    for bad in (math.nan, math.inf, -math.inf):
        assert refused("message.appended", {"role": "user", "content": {"x": [bad]}}) == "data.content.x[0]"
        assert refused("usage.recorded", {"actual_cost_usd": bad}) == "data.actual_cost_usd"
    assert refused("message.appended", {"role": "user", "tool_calls": "[NaN]"}) == "data.tool_calls"
    assert refused("session.created", {"model_config": '{"t": Infinity}'}) == "data.model_config"


def test_usage_defaults_tokens_to_zero_and_keeps_a_missing_cost_missing() -> None:
    out = validate("usage.recorded", {"model": "m", "estimated_cost_usd": 1, "actual_cost_usd": None}, "s1")
    assert out == {"model": "m", "input_tokens": 0, "output_tokens": 0, "cache_read_tokens": 0,
                   "cache_write_tokens": 0, "reasoning_tokens": 0, "estimated_cost_usd": 1.0,
                   "actual_cost_usd": None}
    assert isinstance(out["estimated_cost_usd"], float)
    for bad in (-0.01, True, "1.5", 1e16):
        assert refused("usage.recorded", {"estimated_cost_usd": bad}) == "data.estimated_cost_usd"


# ---- text ---------------------------------------------------------------------------------

def test_lone_surrogates_are_replaced_everywhere_and_pairs_combined() -> None:
    out = msg(content=[{"k\ud800": ["x\udfff", {"deep": "\udc80"}]}], tool_name="t\ud800",
              display_metadata={"\ud83d\ude00": "ok"})
    assert out["content"] == [{"k\ufffd": ["x\ufffd", {"deep": "\ufffd"}]}]
    assert out["tool_name"] == "t\ufffd"
    assert out["display_metadata"] == {"😀": "ok"}
    assert validate("session.titled", {"title": "a\ud800"}, "s1")["title"] == "a\ufffd"
    assert orjson.loads(orjson.dumps(out)) == out


def test_keys_that_collide_once_surrogates_are_replaced_are_refused() -> None:
    assert refused("message.appended", {"role": "user", "content": {"a\ud800": 1, "a\udc00": 2}}) == "data.content"  # noqa: F601 (distinct keys; ruff folds lone surrogates)


def test_short_text_limit_is_1024_characters_paths_4096() -> None:
    assert msg(tool_name="x" * 1024)["tool_name"] == "x" * 1024
    assert refused("message.appended", {"role": "user", "tool_name": "x" * 1025}) == "data.tool_name"
    assert refused("usage.recorded", {"provider": "x" * 1025}) == "data.provider"
    assert validate("session.created", {"cwd": "/" * 4096}, "s1")["cwd"] == "/" * 4096
    assert refused("session.created", {"cwd": "/" * 4097}) == "data.cwd"


def test_content_and_reasoning_are_limited_to_8_mib_of_utf8() -> None:
    assert len(msg(content="x" * (8 * MIB))["content"]) == 8 * MIB
    assert refused("message.appended", {"role": "user", "content": "x" * (8 * MIB + 1)}) == "data.content"
    # 2-byte characters: few enough characters, too many bytes.
    assert refused("message.appended", {"role": "user", "reasoning": "é" * (4 * MIB + 1)}) == "data.reasoning"
    assert refused("message.appended", {"role": "user", "content": ["x" * (8 * MIB)]}) == "data.content"


def test_text_fields_refuse_other_types_including_bytes() -> None:
    assert refused("message.appended", {"role": "user", "content": b"hi"}) == "data.content"
    assert refused("message.appended", {"role": "user", "content": ["ok", b"hi"]}) == "data.content[1]"
    assert refused("message.appended", {"role": "user", "content": 5}) == "data.content"
    assert refused("message.appended", {"role": "user", "reasoning": ["r"]}) == "data.reasoning"
    assert refused("session.created", {"model": 3}) == "data.model"
    assert refused("session.titled", {"title": b"t"}) == "data.title"
    assert refused("message.appended", {"role": "user", "content": {1, 2}}) == "data.content"


def test_content_list_or_object_stays_structured_and_a_string_stays_a_string() -> None:
    parts = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "data:x"}}]
    assert msg(content=parts)["content"] == parts
    assert msg(content={"a": (1, 2)})["content"] == {"a": [1, 2]}
    assert msg(content='[{"type": "text"}]')["content"] == '[{"type": "text"}]'
    assert msg(content=None)["content"] is None


def test_json_strings_are_decoded_once_and_must_have_the_right_shape() -> None:
    assert msg(display_metadata='{"a": 1}')["display_metadata"] == {"a": 1}
    assert msg(tool_calls='[{"id": "c1"}]')["tool_calls"] == [{"id": "c1"}]
    assert msg(reasoning_details='[{"r": 1}]')["reasoning_details"] == [{"r": 1}]
    assert msg(reasoning_details='{"r": 1}')["reasoning_details"] == {"r": 1}
    assert validate("session.created", {"model_config": '{"t": 0.5}'}, "s1")["model_config"] == {"t": 0.5}
    # decoded once: a JSON string holding a JSON string is not an object
    assert refused("message.appended", {"role": "user", "display_metadata": '"{\\"a\\": 1}"'}) == "data.display_metadata"
    for field, bad in [("display_metadata", "[1]"), ("tool_calls", '{"a": 1}'), ("tool_calls", "null"),
                       ("tool_calls", "not json"), ("tool_calls", ""), ("display_metadata", 5),
                       ("tool_calls", {"a": 1}), ("reasoning_details", '"text"')]:
        assert refused("message.appended", {"role": "user", field: bad}) == f"data.{field}"
    assert refused("session.meta_updated", {"model_config": "[]"}) == "data.model_config"


def test_nesting_deeper_than_64_levels_is_refused() -> None:
    assert msg(content=nested(64))["content"] == nested(64)
    assert refused("message.appended", {"role": "user", "content": nested(65)}).startswith("data.content")
    assert refused("message.appended", {"role": "user", "tool_calls": "[" * 5000 + "]" * 5000}) == "data.tool_calls"
    assert refused("message.appended", {"role": "user", "tool_calls": "[" * 100 + "]" * 100}).startswith("data.tool_calls")
    loop: list[Any] = []
    loop.append(loop)
    assert refused("message.appended", {"role": "user", "content": loop}).startswith("data.content")


def test_object_keys_must_be_strings() -> None:
    assert refused("message.appended", {"role": "user", "display_metadata": {1: "a"}}) == "data.display_metadata"


# ---- times ------------------------------------------------------------------------------

@pytest.mark.parametrize("given_,seconds", [
    (0, 0.0), (1700000000, 1700000000.0), (1700000000.25, 1700000000.25), (4.2e9, 4.2e9),
    ("2024-01-01T00:00:00Z", 1704067200.0), ("2024-01-01T00:00:00", 1704067200.0),
    ("2024-01-01T02:00:00+02:00", 1704067200.0), ("2024-01-01 00:00:00.5z", 1704067200.5),
    ("2024-01-01", 1704067200.0),
    # read the same on every supported Python (3.10's datetime.fromisoformat refused these)
    ("2024-01-01T00:00:00.123456789Z", 1704067200.123456), ("2024-01-01T05:30:00.25+0530", 1704067200.25),
    ("2024-01-01T01:00+01", 1704067200.0), ("2023-12-31t19:00:00,5-05:00", 1704067200.5),
])
def test_times_accept_epoch_seconds_and_iso_8601(given_: Any, seconds: float) -> None:
    for type_, field, base in [("message.appended", "timestamp", {"role": "user"}),
                               ("session.created", "started_at", {}),
                               ("session.ended", "ended_at", {"reason": "r"})]:
        out = validate(type_, {**base, field: given_}, "s1")[field]
        assert out == seconds and type(out) is float


@pytest.mark.parametrize("bad", [True, False, -1, 4.2e9 + 1, 1e30, 10**30, math.nan, math.inf, "1700000000",
                                 "yesterday", "", "1e30", b"2024-01-01", [1700000000], {"t": 1},
                                 "1969-12-31T23:59:59Z", "2024-01-01T00:00:00\ud800", "9" * 100,
                                 # refused on every supported Python, whatever its datetime.fromisoformat reads
                                 "20240101", "20240101T000000Z", "2024-W01-1", "2024-01-01T00:00:00+01:60",
                                 "2024-01-01T00:00:00+24:00", "2024-01-01T24:00:00", "2024-01-01x00:00:00"])
def test_times_refuse_everything_else(bad: Any) -> None:
    assert refused("message.appended", {"role": "user", "timestamp": bad}) == "data.timestamp"
    assert refused("session.created", {"started_at": bad}) == "data.started_at"
    assert refused("session.ended", {"reason": "r", "ended_at": bad}) == "data.ended_at"


def test_times_default_to_the_event_time_so_absent_stays_absent() -> None:
    assert "timestamp" not in msg()
    assert "started_at" not in validate("session.created", {}, "s1")


# ---- per-type rules -----------------------------------------------------------------------

def test_titles_are_normalized_limited_and_default_to_user_provenance() -> None:
    assert validate("session.titled", {"title": "  My\n  title\t"}, "s1") == {"title": "My title", "source": "user"}
    assert validate("session.titled", {"title": "t", "source": "llm"}, "s1")["source"] == "llm"
    assert refused("session.titled", {"title": "   "}) == "data.title"
    assert refused("session.titled", {"title": "x" * 201}) == "data.title"
    assert validate("session.titled", {"title": " " + "x" * 200 + " "}, "s1")["title"] == "x" * 200
    assert refused("session.titled", {"title": "t", "source": "admin"}) == "data.source"
    created = validate("session.created", {"title": " T ", "title_source": None}, "s1")
    assert created == {"title": "T", "title_source": "user"}
    assert validate("session.created", {"title_source": "llm"}, "s1") == {}
    assert refused("session.created", {"title": "t", "title_source": "robot"}) == "data.title_source"


def test_session_created_parent_rules_and_external_ids() -> None:
    assert refused("session.created", {"parent_session_id": "s1"}, "s1") == "data.parent_session_id"
    assert refused("session.created", {"parent_session_id": "bad id"}) == "data.parent_session_id"
    out = validate("session.created", {"chat_id": -1001234, "user_id": "@alice:matrix.org", "thread_id": 7}, "s1")
    assert out == {"chat_id": "-1001234", "user_id": "@alice:matrix.org", "thread_id": "7"}
    assert refused("session.created", {"chat_id": True}) == "data.chat_id"
    assert refused("session.created", {"chat_id": 2**64}) == "data.chat_id"


def test_meta_updated_needs_a_field_and_keeps_null_as_clear() -> None:
    assert refused("session.meta_updated", {}) == "data"
    assert validate("session.meta_updated", {"cwd": None}, "s1") == {"cwd": None}
    assert validate("session.meta_updated", {"tool_names": ("a", "b")}, "s1") == {"tool_names": ["a", "b"]}
    assert refused("session.meta_updated", {"tool_names": ["a", 1]}) == "data.tool_names[1]"
    assert refused("session.meta_updated", {"tool_names": "a,b"}) == "data.tool_names"
    assert refused("session.meta_updated", {"title": "no"}) == "data.title"


def test_validate_does_not_change_its_input() -> None:
    data = {"role": "user", "content": [{"a\ud800": 1}], "tool_calls": '[{"id": 1}]'}
    before = repr(data)
    msg(**{k: v for k, v in data.items() if k != "role"})
    validate("message.appended", data, "s1")
    assert repr(data) == before


# ---- make_event -------------------------------------------------------------------------

def test_make_event_builds_the_envelope_body() -> None:
    assert make_event("session.titled", "s1", {"title": "T"}) == {
        "type": "session.titled", "session": "s1", "data": {"title": "T", "source": "user"}, "v": 1}
    event = make_event("message.appended", "s1", {"role": "user"}, id="evt-1")
    assert event["v"] == 2 and event["id"] == "evt-1"
    with pytest.raises(ValidationError) as info:
        make_event("session.pinned", "s1", {}, id="has space")
    assert info.value.field == "id"


def test_make_event_refuses_an_event_over_16_mib() -> None:
    with pytest.raises(EventTooLargeError):
        make_event("message.appended", "s1", {"role": "user", "content": "x" * (8 * MIB), "reasoning": "y" * (8 * MIB)})


# ---- upcasting -----------------------------------------------------------------------------

def v1_message(data: dict[str, Any]) -> dict[str, Any]:
    return {"seq": 5, "id": "e5", "ts": 1_700_000_000_000_000_000, "type": "message.appended", "v": 1,
            "session": "s1", "data": data, "prev": "0" * 64, "hash": "1" * 64}


def test_message_appended_v1_is_upcast_to_v2() -> None:
    old = v1_message({"role": "assistant", "text": "hello", "tool_calls_json": '[{"id": "c1"}]', "token_count": 3})
    snapshot = repr(old)
    new = upcast(old)
    assert new["v"] == 2
    assert new["data"] == {"role": "assistant", "content": "hello", "tool_calls": [{"id": "c1"}], "token_count": 3}
    assert {k: new[k] for k in ("seq", "id", "ts", "session", "prev", "hash")} == {
        k: old[k] for k in ("seq", "id", "ts", "session", "prev", "hash")}
    assert repr(old) == snapshot  # the input is untouched


@pytest.mark.parametrize("raw", [None, "", "not json", '{"a": 1}', "null", "[NaN]", 5, "[" * 3000])
def test_v1_tool_calls_json_that_is_not_a_list_becomes_null(raw: Any) -> None:
    new = upcast(v1_message({"role": "tool", "text": None, "tool_calls_json": raw}))
    assert new["data"] == {"role": "tool", "content": None, "tool_calls": None}


def test_missing_version_counts_as_1_and_current_data_is_left_alone() -> None:
    env = v1_message({"role": "user", "text": "hi"})
    del env["v"]
    assert upcast(env)["data"]["content"] == "hi"
    current = {**v1_message({"role": "user", "content": "hi"}), "v": 2}
    assert upcast(current) == current


def test_unknown_types_future_versions_and_odd_envelopes_pass_through() -> None:
    for env in [{"type": "plugin.thing", "v": 1, "data": {"text": "x"}},
                {"type": "message.appended", "v": 3, "data": {"text": "x"}},
                {"type": "message.appended", "v": "1", "data": {"text": "x"}},
                {"type": "message.appended", "v": 1, "data": ["x"]},
                {"type": None}]:
        assert upcast(env) == env


def test_upcasters_chain_one_version_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(events.CURRENT_VERSIONS, "test.chained", 3)
    monkeypatch.setattr(events, "_UPCASTERS", dict(events._UPCASTERS))

    @events.register_upcaster("test.chained", 1)
    def one_to_two(data: dict[str, Any]) -> dict[str, Any]:
        data["n"] = int(data.pop("count")) * 10
        return data

    @events.register_upcaster("test.chained", 2)
    def two_to_three(data: dict[str, Any]) -> dict[str, Any]:
        return {"total": data["n"] + 1}

    assert upcast({"type": "test.chained", "v": 1, "data": {"count": "4"}}) == {
        "type": "test.chained", "v": 3, "data": {"total": 41}}
    assert upcast({"type": "test.chained", "v": 2, "data": {"n": 5}})["data"] == {"total": 6}


# ---- titles ---------------------------------------------------------------------------------

def test_normalize_title() -> None:
    assert normalize_title("  a \n\t b  ") == "a b"
    assert normalize_title("x\ud800") == "x\ufffd"
    assert events.TITLE_RANK == {"derived": 0, "llm": 1, "user": 2}


def test_next_title_numbers_after_the_highest_taken() -> None:
    assert next_title("Base", set()) == "Base"
    assert next_title("Base", {"Base"}) == "Base #2"
    assert next_title("Base", {"Base", "Base #2"}) == "Base #3"
    assert next_title("Base #2", {"Base", "Base #2", "Base #7"}) == "Base #8"
    assert next_title(" Base  #3 ", {"Base"}) == "Base #2"
    assert next_title("#5", {"#5"}) == "#5 #2"
    long = "x" * 200
    assert next_title(long, {long}) == "x" * 197 + " #2"
    with pytest.raises(ValidationError):
        next_title("   ", set())


@pytest.mark.parametrize("base", [["Base"], {"a": 1}, 5, None, b"Base"])
def test_next_title_of_a_non_string_is_a_validation_error(base: Any) -> None:
    with pytest.raises(ValidationError) as info:
        next_title(base, set())
    assert info.value.field == "title"


# ---- properties -------------------------------------------------------------------------------

any_text = st.text(st.characters(exclude_categories=()), max_size=12)
timestamps = st.one_of(
    st.floats(), st.integers(), st.just(1e30), st.just(10**30), st.booleans(),
    st.sampled_from(["2024-01-01T00:00:00Z", "1700000000", "yesterday", "1e30", "", "2024-13-45"]),
    st.datetimes().map(lambda d: d.isoformat()), st.binary(max_size=8),
)
leaves = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(), st.just(1e30), any_text, st.binary(max_size=8), timestamps,
    st.sampled_from(["user", "assistant", "llm", "derived", "{}", "[]", '{"a": [1, NaN]}', "[" * 80]),
)
garbage = st.recursive(
    leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                            st.dictionaries(st.one_of(any_text, st.integers()), inner, max_size=4)),
    max_leaves=20,
)
field_names = sorted({name for schema in events._SCHEMAS.values() for name in schema})
event_data = st.one_of(
    st.dictionaries(st.sampled_from(field_names), st.one_of(garbage, timestamps), max_size=6),
    st.dictionaries(st.sampled_from(field_names), garbage, max_size=3).map(lambda d: {**d, "role": "user"}),
    garbage,
)
sessions = st.one_of(st.sampled_from(["s1", "a:b@c", "x" * 128]), any_text, garbage)
types = st.one_of(st.sampled_from(sorted(CURRENT_VERSIONS)), any_text, garbage)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(type_=types, data=event_data, session=sessions)
def test_validate_raises_only_validation_errors_and_output_round_trips(type_: Any, data: Any, session: Any) -> None:
    try:
        out = validate(type_, data, session)
    except ValidationError as e:
        assert e.field == "type" or e.field == "session" or e.field.startswith("data")
        return
    assert orjson.loads(orjson.dumps(out)) == out
    assert validate(type_, out, session) == out  # normalizing is idempotent


@settings(max_examples=200, deadline=None)
@given(depth=st.integers(min_value=0, max_value=200), leaf=garbage)
def test_deep_nesting_is_refused_with_a_validation_error(depth: int, leaf: Any) -> None:
    value: Any = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    try:
        out = msg(content=value, display_metadata={"x": value})
    except ValidationError:
        return
    assert depth <= 64
    assert orjson.loads(orjson.dumps(out)) == out


def test_a_deep_fields_path_is_cut_in_the_message_and_kept_whole_in_field() -> None:
    """A value nested past the limit under long keys: the message named the whole path, a
    one-line error of over a thousand characters (outside audit, helper-87). The message cuts
    its middle; ``.field`` keeps it whole."""
    value: Any = "leaf"
    for i in reversed(range(80)):
        value = {f"level_key_{i}": value}
    with pytest.raises(ValidationError) as info:
        msg(content=value)
    err = info.value
    assert err.field.startswith("data.content.level_key_0.level_key_1.") and len(err.field) > 600
    assert len(err.message) < 300 and "characters)" in err.message, err.message
    assert err.message.startswith(f"invalid {err.field[:80]}") and err.field[-80:] in err.message


def test_validate_session_id_names_the_field() -> None:
    assert events.validate_session_id("abc:1@x") == "abc:1@x"
    with pytest.raises(ValidationError) as info:
        events.validate_session_id("no spaces", "session_id")
    assert info.value.field == "session_id"
    with pytest.raises(ValidationError) as info:
        events.validate_session_id(None)
    assert info.value.field == "session"
