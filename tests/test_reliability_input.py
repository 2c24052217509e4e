"""Bad input through ``eventlog append``: hypothesis writes stdin (JSONL that is valid, nearly
valid or garbage), the command runs in-process under click's CliRunner.

Either exit 0 — the printed seqs name events of exactly the input's types, sessions and ids,
visible in ``log tail --json``, the chain verifies and every read (list, messages, search,
stats) still works — or exit 1 with one line on stderr, nothing on stdout and the log's data
file byte-for-byte unchanged (with ``--each``: the lines before the failing one were appended,
in order, and nothing else). 200 examples by default, the "campaign" hypothesis profile of
tests/conftest.py (5,000) in the campaign.

Invalid UTF-8 on stdin cannot go through CliRunner (its stdin decodes strictly, the real one
does not), so those inputs run the real console script.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from campaign import log_dir
from campaign.summary import note, record
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventlog.cli import main
from eventlog.sessions.events import CURRENT_VERSIONS, ROLES

pytest_plugins = ["campaign.summary"]

PROFILE = "p"
DEFAULT_EXAMPLES = 200

# ------------------------------------------------------------------ strategies

surrogates = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=2)
texts = st.one_of(st.text(max_size=24), surrogates, st.sampled_from(["", " ", "a\nb", "\x00", "é", "日本語", "🎉"]))
ids = st.one_of(st.from_regex(r"[A-Za-z0-9_.:@-]{1,10}", fullmatch=True),
                st.sampled_from(["m1", "ev-s1", "", "a b", "x" * 129, "../x", "é"]), st.integers(), st.none(),
                st.lists(st.just("s1"), max_size=1), st.just({"s1": 1}))
sessions = st.one_of(st.sampled_from(["s1", "s2", "s3"]), st.none(), ids)
numbers = st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0, 1, -1, 2**63 - 1, 2**63, 1e30, 1.5, 4.2e9, 4.3e9]))
times = st.one_of(numbers, st.sampled_from(["2024-05-01T10:00:00Z", "2024-05-01", "1700000000", "yesterday", ""]),
                  st.booleans())
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
                      max_leaves=6)

message_data = st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(sorted(ROLES)), texts)},
    optional={"content": st.one_of(texts, values), "tool_calls": st.one_of(values, st.just('[{"id": "c1"}]')),
              "tool_name": texts, "tool_call_id": texts, "reasoning": texts, "token_count": numbers,
              "display_metadata": st.one_of(values, st.just('{"a": 1}')), "timestamp": times,
              "finish_reason": texts})
session_data = st.fixed_dictionaries(
    {}, optional={"source": texts, "model": texts, "title": texts, "cwd": texts, "started_at": times,
                  "title_source": st.sampled_from(["user", "llm", "derived", "bogus"]), "parent_session_id": sessions,
                  "model_config": st.one_of(values, st.just('{"t": 0.2}')), "user_id": st.one_of(ids, texts)})
usage_data = st.fixed_dictionaries(
    {}, optional={"model": texts, "input_tokens": numbers, "output_tokens": numbers, "message_id": numbers,
                  "estimated_cost_usd": st.one_of(numbers, st.none(), texts), "actual_cost_usd": numbers})
reaction_data = st.fixed_dictionaries({"message_id": st.one_of(st.just(2), numbers), "author": texts, "emoji": texts})
typed = st.one_of(
    st.tuples(st.just("message.appended"), message_data),
    st.tuples(st.just("session.created"), session_data),
    st.tuples(st.just("usage.recorded"), usage_data),
    st.tuples(st.just("message.reaction_set"), reaction_data),
    st.tuples(st.sampled_from(sorted(CURRENT_VERSIONS)), st.one_of(st.dictionaries(texts, values, max_size=3), values)),
    # odd types: text, unknown names, numbers, and lists / objects (unhashable: no lookup may raise)
    st.tuples(st.one_of(texts, st.just("test.happened"), st.integers(), values), st.dictionaries(texts, values, max_size=2)),
)


@st.composite
def events(draw: st.DrawFn) -> Any:
    etype, data = draw(typed)
    obj: dict[str, Any] = {"type": etype, "data": data}
    if draw(st.booleans()):
        obj["session"] = draw(sessions)
    if draw(st.integers(0, 3)) == 0:
        obj["id"] = draw(ids)
    if draw(st.integers(0, 9)) == 0:
        obj[draw(st.sampled_from(["extra", "seq", "hash", "v"]))] = draw(scalars)
    if draw(st.integers(0, 9)) == 0:
        obj.pop(draw(st.sampled_from(["type", "data"])))
    return obj


def render(obj: Any, ascii_only: bool) -> str:
    try:
        text = json.dumps(obj, allow_nan=True, ensure_ascii=ascii_only)
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:  # lone surrogates: only as \\u escapes (stdin is UTF-8)
        return json.dumps(obj, allow_nan=True, ensure_ascii=True)


plain = st.text(st.characters(exclude_categories=["Cs", "Cc"]), max_size=30)
good_ids = st.one_of(st.none(), st.just("m1"), st.from_regex(r"[A-Za-z0-9_.:@-]{1,12}", fullmatch=True))
good_sessions = st.sampled_from(["s1", "s2", "s3"])
good = st.one_of(
    st.builds(lambda sid, role, content, calls, n: {"type": "message.appended", "session": sid, "data": {
        "role": role, "content": content, "tool_calls": calls, "token_count": n}},
        good_sessions, st.sampled_from(sorted(ROLES)), st.one_of(plain, st.lists(st.fixed_dictionaries(
            {"type": st.just("text"), "text": plain}), max_size=2)),
        st.one_of(st.none(), st.just([{"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}}])),
        st.integers(0, 10**6)),
    st.builds(lambda sid, src, title, ts: {"type": "session.created", "session": sid, "data": {
        "source": src, "title": title, "started_at": ts}},
        good_sessions, st.sampled_from(["cli", "telegram", None]), st.one_of(st.none(), plain.filter(str.strip)),
        st.one_of(st.none(), st.floats(0, 4.2e9), st.just("2024-05-01T10:00:00Z"))),
    st.builds(lambda sid, a, b, c: {"type": "usage.recorded", "session": sid, "data": {
        "model": "m", "input_tokens": a, "output_tokens": b, "estimated_cost_usd": c}},
        good_sessions, st.integers(0, 2**40), st.integers(0, 10**6), st.one_of(st.none(), st.floats(0, 1e3))),
    st.builds(lambda sid, kind: {"type": kind, "session": sid, "data": {}}, good_sessions,
              st.sampled_from(["session.pinned", "session.archived", "session.deleted", "session.reopened"])),
)


@st.composite
def good_event(draw: st.DrawFn) -> Any:
    obj = draw(good)
    eid = draw(good_ids)
    if eid is not None:
        obj["id"] = eid
    return obj


@st.composite
def lines(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 9)) < 6:
        return render(draw(good_event()), draw(st.booleans()))
    kind = draw(st.integers(0, 19))
    if kind == 0:
        return draw(st.text(st.characters(exclude_categories=["Cs"]), max_size=30))  # garbage
    if kind == 1:
        return ""
    if kind == 2:
        return render(draw(values), draw(st.booleans()))  # JSON, but maybe not an object
    if kind == 3:
        return '{"type": "message.appended", "session": "s1", "data": {"role": "user", "content": ' + "[" * 80 + "]" * 80 + "}}"
    return render(draw(events()), draw(st.booleans()))


inputs = st.tuples(st.lists(lines(), min_size=1, max_size=4), st.booleans(), st.booleans())

# ------------------------------------------------------------------ the property


def cli(home: Path, *args: str, input: str | None = None) -> Any:
    return CliRunner().invoke(main, ["--home", str(home), "--profile", PROFILE, *args], input=input)


def envelopes(home: Path) -> list[dict[str, Any]]:
    r = cli(home, "log", "tail", "--from", "1", "--json")
    assert r.exit_code == 0, r.stderr
    return [orjson.loads(x) for x in r.stdout.splitlines()]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("baseline")
    seed = [{"type": "session.created", "session": "s1", "id": "ev-s1", "data": {"source": "cli", "title": "first"}},
            {"type": "message.appended", "session": "s1", "id": "m1", "data": {"role": "user", "content": "hello"}}]
    r = cli(home, "append", input="\n".join(json.dumps(e) for e in seed))
    assert r.exit_code == 0, r.stderr
    return home


def reads_still_work(home: Path) -> None:
    from eventlog.sessions.store import SessionStore

    with SessionStore.open(home, PROFILE, read_model="projection") as store:
        everything = store.list_sessions(archived=None, pinned=None, hidden=None, limit=None)
        store.list_sessions()
        for s in everything:
            store.get_messages(s["id"], include_inactive=True)
            store.get_usage(s["id"])
        store.stats()
        store.search("hello")


COUNTS = {"runs": 0, "passed": 0, "accepted": 0, "refused": 0}


@pytest.fixture(scope="module", autouse=True)
def summary_row() -> Any:
    yield
    if COUNTS["runs"]:
        record("bad input via `eventlog append`", runs=COUNTS["runs"], passed=COUNTS["passed"])
        note(f"bad input via `eventlog append`: {COUNTS['accepted']} inputs accepted, {COUNTS['refused']} refused")


def check_append(baseline: Path, text: str, each: bool, as_json: bool) -> None:
    COUNTS["runs"] += 1
    _check_append(baseline, text, each, as_json)
    COUNTS["passed"] += 1


def _check_append(baseline: Path, text: str, each: bool, as_json: bool) -> None:
    work = Path(tempfile.mkdtemp(prefix="evl-input-"))
    try:
        shutil.copytree(log_dir(baseline, PROFILE), log_dir(work, PROFILE))
        before_bytes = (log_dir(work, PROFILE) / "data.mdb").read_bytes()
        before = envelopes(work)
        r = cli(work, "append", *(["--each"] if each else []), *(["--json"] if as_json else []), input=text)
        assert r.exception is None or isinstance(r.exception, SystemExit), (
            f"crashed: {r.exception!r}\n{''.join(__import__('traceback').format_exception(r.exception))}")
        given_lines = [line for line in text.split("\n") if line.strip()]
        after = envelopes(work)
        assert after[:len(before)] == before, "existing events never change"
        if r.exit_code == 0:
            COUNTS["accepted"] += 1
            seqs = json.loads(r.stdout)["seqs"] if as_json else [int(x) for x in r.stdout.split()]
            assert len(seqs) == len(given_lines)
            for line, s in zip(given_lines, seqs):
                obj, e = json.loads(line), after[s - 1]  # the stdlib reads a lone surrogate escape, as append does
                assert (e["type"], e["session"]) == (obj["type"], obj.get("session"))
                if obj.get("id") is not None:  # null, like absent, asks for a generated id
                    assert e["id"] == obj["id"]
                else:
                    assert isinstance(e["id"], str) and e["id"]
            fresh = list(dict.fromkeys(s for s in seqs if s > len(before)))  # a repeated id returns its seq again
            assert fresh == list(range(len(before) + 1, len(after) + 1)), "new events get the next seqs, in order"
            assert cli(work, "log", "verify").exit_code == 0
            reads_still_work(work)
        elif r.exit_code == 1:
            COUNTS["refused"] += 1
            if not each:
                assert r.stdout == ""
            assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1 and r.stderr.endswith("\n"), r.stderr
            if not each:
                assert (log_dir(work, PROFILE) / "data.mdb").read_bytes() == before_bytes, "a refused batch changes nothing"
            else:
                added = after[len(before):]
                assert len(added) < len(given_lines)
                if not as_json:  # --each reports each line's seq as it lands, up to the failure
                    printed = [int(x) for x in r.stdout.split()]
                    assert len(printed) < len(given_lines)
                    assert all(1 <= s <= len(after) for s in printed)
                for line, e in zip(given_lines, added):
                    obj = orjson.loads(line)
                    assert (e["type"], e["session"]) == (obj["type"], obj.get("session"))
                if added:
                    reads_still_work(work)
        else:
            raise AssertionError(f"exit {r.exit_code}: {r.stderr}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def examples(default: int) -> int:
    return max(default, settings.default.max_examples)


SUPPRESS = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]


@settings(max_examples=examples(DEFAULT_EXAMPLES), deadline=None, suppress_health_check=SUPPRESS)
@given(inputs)
def test_append_input_is_accepted_whole_or_refused_cleanly(baseline: Path, case: tuple[list[str], bool, bool]) -> None:
    text_lines, each, as_json = case
    check_append(baseline, "\n".join(text_lines), each, as_json)


@pytest.mark.campaign
@settings(settings.get_profile("campaign"), suppress_health_check=SUPPRESS)
@given(inputs)
def test_append_input_campaign(baseline: Path, case: tuple[list[str], bool, bool]) -> None:
    text_lines, each, as_json = case
    check_append(baseline, "\n".join(text_lines), each, as_json)


@pytest.mark.parametrize("raw", [
    b'{"type": "session.created", "session": "s\xff1", "data": {}}\n',
    b'\xc3\x28\n',
    b'{"type": "message.appended", "session": "s1", "data": {"role": "user", "content": "caf\xe9"}}\n',
])
def test_invalid_utf8_on_stdin_is_refused_by_the_console_script(baseline: Path, tmp_path: Path, raw: bytes) -> None:
    shutil.copytree(log_dir(baseline, PROFILE), log_dir(tmp_path, PROFILE))
    before = (log_dir(tmp_path, PROFILE) / "data.mdb").read_bytes()
    exe = Path(sys.executable).with_name("eventlog")
    r = subprocess.run([str(exe), "--home", str(tmp_path), "--profile", PROFILE, "append"], input=raw, capture_output=True)
    assert r.returncode == 1 and r.stdout == b""
    assert r.stderr.startswith(b"error: ") and r.stderr.count(b"\n") == 1, r.stderr
    assert (log_dir(tmp_path, PROFILE) / "data.mdb").read_bytes() == before


# ------------------------------------------------------------------ pinned examples of what the property checks

@pytest.mark.parametrize("line,code", [
    ('{"type": "message.appended", "session": "s1", "id": "m1", "data": {"role": "user", "content": "changed"}}', 1),
    ('{"type": "message.appended", "session": "s1", "id": "m1", "data": {"role": "user", "content": "hello"}}', 0),
])
def test_a_refused_or_replayed_id_leaves_the_data_file_untouched(baseline: Path, tmp_path: Path, line: str, code: int) -> None:
    """A reused id with other content is refused, the same content is an idempotent replay
    (returns seq 2): either way nothing is written, so the data file keeps its bytes."""
    shutil.copytree(log_dir(baseline, PROFILE), log_dir(tmp_path, PROFILE))
    before = (log_dir(tmp_path, PROFILE) / "data.mdb").read_bytes()
    r = cli(tmp_path, "append", input=line)
    assert r.exit_code == code, r.stderr
    assert code == 1 or r.stdout == "2\n"
    assert (log_dir(tmp_path, PROFILE) / "data.mdb").read_bytes() == before


@pytest.mark.parametrize("line", [
    '{"\\n": null}',
    '{"type": "session.created", "session": "s9", "data": {"a\\nb": 1}}',
    '{"type": "session.created", "session": "s9", "data": {"\\u001b[2J": 1}}',
])
def test_an_error_naming_an_odd_field_is_one_line(tmp_path: Path, line: str) -> None:
    r = cli(tmp_path, "append", input=line)
    assert r.exit_code == 1
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1 and "\x1b" not in r.stderr, repr(r.stderr)
