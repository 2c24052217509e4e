"""What a new user (or an attacker) meets in the first hour, through the real console script:
huge numbers, outputs into missing or special folders, hostile homes, duplicate JSON keys,
events of sessions that do not exist, exports under umask 000, a 10 KB search query, imports
into the wrong place, ``log tail --follow --limit 1``, ``--version``, and the wording of
answers and errors. Every failure is one line on stderr (``error: ...`` exit 1, or click's
usage error exit 2), never a traceback.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from eventlog.errors import ValidationError
from eventlog.sessions.store import SessionStore

EXE = str(Path(sys.executable).with_name("eventlog"))
PROFILE = "p"


def run(home: Path | None, *args: str, input: str | None = None, env: dict[str, str] | None = None,
        profile: str = PROFILE, umask: int | None = None) -> subprocess.CompletedProcess[str]:
    argv = [EXE, *(["--home", str(home)] if home is not None else []), "--profile", profile, *args]
    pre = (lambda: os.umask(umask)) if umask is not None else None  # noqa: E731
    return subprocess.run(argv, input=input, capture_output=True, text=True, timeout=60,
                          env=env or dict(os.environ), preexec_fn=pre)


def one_line_error(r: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    if code == 1:
        assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    else:
        assert r.stderr.splitlines()[-1].startswith("Error: "), r.stderr
    return r.stderr


@pytest.fixture(scope="module")
def profile_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A profile with a session ``s1`` of three messages (one a tool call with no text, one
    rewound) and a session ``s2``."""
    home = tmp_path_factory.mktemp("home")
    with SessionStore.open(home, PROFILE, follower=False) as store:
        store.create_session("s1", title="first")
        store.append_message("s1", "user", "gateway latency question")
        store.append_message("s1", "assistant", None, tool_calls=[
            {"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": '{"cmd": "uptime"}'}}])
        late = store.append_message("s1", "user", "never mind")
        store.rewind("s1", late)
        store.create_session("s2")
    return home


# ------------------------------------------------------------------ numbers and paths

@pytest.mark.parametrize("args", [
    ["log", "tail", "--from", "18446744073709551616"],
    ["log", "tail", "--limit", "99999999999999999999999"],
    ["replay", "--until", "99999999999999999999999", "--out", "x.db"],
    ["sessions", "list", "--limit", str(2**64)],
    ["search", "x", "--limit", str(2**63)],
])
def test_huge_numbers_are_usage_errors(profile_home: Path, args: list[str]) -> None:
    one_line_error(run(profile_home, *args), code=2)


def test_the_largest_seq_is_a_valid_start(profile_home: Path) -> None:
    r = run(profile_home, "log", "tail", "--from", str(2**63 - 1))
    assert r.returncode == 0 and r.stdout == "", r.stderr


@pytest.mark.parametrize("args", [
    ["export", "{missing}/x.jsonl"],
    ["export", "--format", "sqlite", "{missing}/x.db"],
    ["export", "--format", "md", "--session", "s1", "{missing}/x.md"],
    ["replay", "--until", "3", "--out", "{missing}/x.db"],
])
def test_outputs_into_a_missing_folder_are_refused_and_no_folder_is_made(profile_home: Path, tmp_path: Path,
                                                                          args: list[str]) -> None:
    missing = tmp_path / "missing"
    err = one_line_error(run(profile_home, *[a.format(missing=missing) for a in args]))
    assert f"the folder {missing} does not exist" in err
    assert not missing.exists()


@pytest.mark.parametrize("out", ["/proc/eventlog-x", "{file}/x"])
@pytest.mark.parametrize("fmt", ["jsonl", "sqlite", "md", "replay"])
def test_outputs_to_special_places_fail_in_one_line_naming_them(profile_home: Path, tmp_path: Path, out: str,
                                                                fmt: str) -> None:
    a_file = tmp_path / "plain"
    a_file.write_text("")
    target = out.format(file=a_file)
    if fmt == "replay":
        args = ["replay", "--until", "2", "--out", target]
    else:
        args = ["export", "--format", fmt, *(["--session", "s1"] if fmt == "md" else []), target]
    err = one_line_error(run(profile_home, *args))
    assert str(Path(target).parent if out.startswith("{file}") else target) in err
    assert "profile directory" not in err  # the hint is about the output (outside audit: it named the profile's)
    assert not list(Path("/proc").glob(".eventlog-x*"))


def test_log_copy_to_a_path_is_checked_as_every_output_is(profile_home: Path, tmp_path: Path) -> None:
    """`log copy --to` made missing folders, wrote into the profile's own directory, and over a
    plain file hinted at restoring the profile's log (outside audit)."""
    a_file = tmp_path / "plain"
    a_file.write_text("")
    own = profile_home / "profiles" / PROFILE
    for target, why in ((a_file, "is not a folder"), (tmp_path / "no" / "such", "does not exist"),
                        (own / "copy", "inside the profile's own directory"), (own / "log", "inside the profile's own")):
        err = one_line_error(run(profile_home, "log", "copy", "--to", str(target)))
        assert err.startswith("error: invalid --to: ") and why in err and "restore" not in err, err
    assert not (tmp_path / "no").exists() and not (own / "copy").exists()
    assert run(profile_home, "log", "copy", "--to", str(tmp_path / "copy")).returncode == 0


def test_exports_are_0600_under_umask_000(profile_home: Path, tmp_path: Path) -> None:
    outs = {"jsonl": tmp_path / "a.jsonl", "sqlite": tmp_path / "a.db", "md": tmp_path / "a.md",
            "html": tmp_path / "a.html"}
    for fmt, out in outs.items():
        r = run(profile_home, "export", "--format", fmt, *(["--session", "s1"] if fmt in ("md", "html") else []),
                str(out), umask=0)
        assert r.returncode == 0, r.stderr
    r = run(profile_home, "replay", "--until", "2", "--out", str(tmp_path / "r.db"), umask=0)
    assert r.returncode == 0, r.stderr
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in tmp_path.iterdir() if p.name != "plain"}
    assert set(modes.values()) == {"0o600"}, modes


def test_a_transcript_export_says_what_it_wrote(profile_home: Path, tmp_path: Path) -> None:
    r = run(profile_home, "export", "--format", "md", "--session", "s1", str(tmp_path / "t.md"))
    assert r.returncode == 0 and r.stdout == ""
    assert r.stderr == f"wrote the md transcript of session s1 (2 messages) to {tmp_path / 't.md'}\n"


# ------------------------------------------------------------------ homes

def test_an_empty_home_is_an_error_both_ways(profile_home: Path, tmp_path: Path) -> None:
    env = dict(os.environ)
    env.pop("EVENTLOG_HOME", None)
    before = set(os.listdir(tmp_path))
    for args, environ in ((["--home", ""], env), ([], dict(env, EVENTLOG_HOME=""))):
        r = subprocess.run([EXE, *args, "init"], capture_output=True, text=True, cwd=tmp_path, env=environ, timeout=60)
        err = one_line_error(r, code=2)
        assert "is empty" in err
    assert set(os.listdir(tmp_path)) == before, "nothing was written into the current directory"


@pytest.mark.parametrize("home", ["/dev/null", "{file}/sub", "{file}"])
def test_a_home_through_a_file_is_a_usage_error(tmp_path: Path, home: str) -> None:
    a_file = tmp_path / "plain"
    a_file.write_text("")
    h = home.format(file=a_file)
    for args in (["init"], ["sessions", "list"], ["log", "verify"]):
        err = one_line_error(run(Path(h), *args), code=2)
        assert "is not a directory" in err or "is a file" in err  # ours, or click's for the path itself
    with pytest.raises(ValidationError) as info:
        SessionStore.open(h, PROFILE)
    assert info.value.field == "home"


@pytest.mark.parametrize("home", ["", "a\x00b", b"/tmp/x"])
def test_sessionstore_open_refuses_a_hostile_home_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          home: Any) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValidationError) as info:
        SessionStore.open(home, PROFILE)
    assert info.value.field == "home"
    assert os.listdir(tmp_path) == []


def test_an_empty_log_copy_target_writes_nothing_into_the_current_directory(profile_home: Path,
                                                                            tmp_path: Path) -> None:
    work = tmp_path / "cwd"
    work.mkdir()
    for option in ("--to", "--from"):
        r = subprocess.run([EXE, "--home", str(profile_home), "--profile", PROFILE, "log", "copy", option, ""],
                           capture_output=True,
                           text=True, cwd=work, timeout=60)
        assert "is empty" in one_line_error(r, code=1)
    assert os.listdir(work) == [], "a log was created in the current directory"


def test_an_empty_eventlog_home_is_refused_by_sessionstore(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EVENTLOG_HOME", "")
    with pytest.raises(ValidationError) as info:
        SessionStore.open(profile=PROFILE)
    assert info.value.field == "home" and "EVENTLOG_HOME" in str(info.value)
    assert os.listdir(tmp_path) == []


@contextlib.contextmanager
def read_only_view(home: Path, tmp_path: Path) -> Iterator[Path]:
    """``home`` seen through a read-only bind mount (root with CAP_SYS_ADMIN), else skip."""
    where = tmp_path / "ro"
    where.mkdir()
    r = subprocess.run(["mount", "--bind", "-o", "ro", str(home), str(where)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot bind-mount read-only here (needs root and CAP_SYS_ADMIN): {r.stderr.strip()}")
    subprocess.run(["mount", "-o", "remount,bind,ro", str(where)], capture_output=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.fixture
def read_only_home(profile_home: Path, tmp_path: Path) -> Any:
    """``profile_home`` seen through a read-only bind mount, else skip."""
    with read_only_view(profile_home, tmp_path) as where:
        yield where


def test_a_read_only_home_answers_or_fails_in_one_line(read_only_home: Path) -> None:
    r = run(read_only_home, "log", "verify")
    assert r.returncode == 0 and r.stdout.startswith("ok: "), r.stderr
    for args in (["sessions", "list"], ["sessions", "show", "s1"], ["search", "gateway"], ["stats"], ["doctor"],
                 ["messages", "add", "s1", "--role", "user", "--content", "x"], ["rebuild"]):
        r = run(read_only_home, *args)
        assert "Traceback" not in r.stderr, (args, r.stderr)
        if r.returncode != 0:
            one_line_error(r)
    r = run(read_only_home, "messages", "add", "s1", "--role", "user", "--content", "x")
    assert r.returncode == 1 and "read-only" in r.stderr.lower(), r.stderr
    for args in (["sessions", "title", "s1", "New title"], ["sessions", "end", "s1"]):  # the rules lock
        r = run(read_only_home, *args)
        assert "read-only" in one_line_error(r).lower(), (args, r.stderr)
    r = run(read_only_home, "init", profile="new")
    assert "read-only" in one_line_error(r).lower()


def test_a_read_only_home_behind_its_log_says_why_it_is_stale(tmp_path: Path) -> None:
    """Projections behind their log on a read-only file system: the read answers from what they
    hold and its warning names the file system, with a hint that helps (it said "free some disk
    space"; outside audit, helper-59)."""
    home = tmp_path / "home"
    with SessionStore.open(home, PROFILE, follower=False) as store:
        store.create_session("s1", title="first")
        assert store.get_session("s1")["title"] == "first"  # projected
    from eventlog.log import EventLog
    from eventlog.sessions.events import make_event

    log = EventLog.open(home / "profiles" / PROFILE / "log")
    try:
        log.append([make_event("message.appended", "s1", {"role": "user", "content": "after the projections"})])
    finally:
        log.close()
    with read_only_view(home, tmp_path) as where:
        r = run(where, "sessions", "show", "s1", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["session"]["id"] == "s1", r
    warning = [line for line in r.stderr.splitlines() if "cannot be updated" in line]
    assert len(warning) == 1 and "read-only" in warning[0], r.stderr
    assert "disk space" not in warning[0] and "writable" in warning[0], r.stderr


# ------------------------------------------------------------------ append input

def test_duplicate_keys_are_refused_and_nothing_is_appended(profile_home: Path) -> None:
    before = run(profile_home, "log", "verify", "--json")
    line = '{"type": "message.appended", "type": "session.deleted", "session": "s2", "data": {}}'
    err = one_line_error(run(profile_home, "append", input=line))
    assert "'type' appears twice" in err
    nested = '{"type": "message.appended", "session": "s2", "data": {"role": "user", "content": "a", "content": "b"}}'
    assert "'content' appears twice" in one_line_error(run(profile_home, "append", input=nested))
    assert run(profile_home, "log", "verify", "--json").stdout == before.stdout
    assert run(profile_home, "sessions", "show", "s2").returncode == 0


def test_events_of_sessions_that_do_not_exist_are_refused(profile_home: Path, tmp_path: Path) -> None:
    before = run(profile_home, "log", "verify", "--json").stdout
    cases = [
        ('{"type": "message.appended", "session": "nope", "data": {"role": "user", "content": "x"}}', "'nope' does not exist"),
        ('{"type": "session.pinned", "session": "nope", "data": {}}', "'nope' does not exist"),
        ('{"type": "session.created", "session": "s1", "data": {}}', "'s1' already exists"),
        ('{"type": "session.created", "session": "s9", "data": {"parent_session_id": "nope"}}', "'nope' does not exist"),
        ('{"type": "session.deleted", "session": "s2", "data": {}}\n'
         '{"type": "message.appended", "session": "s2", "data": {"role": "user", "content": "x"}}', "'s2' does not exist"),
    ]
    for text, why in cases:
        assert why in one_line_error(run(profile_home, "append", input=text)), text
    assert run(profile_home, "log", "verify", "--json").stdout == before
    # in one input: a session created by an earlier line exists for the later ones
    fresh = tmp_path / "fresh"
    r = run(fresh, "append", input='{"type": "session.created", "session": "n1", "data": {}}\n'
                                   '{"type": "message.appended", "session": "n1", "data": {"role": "user", "content": "x"}}')
    assert (r.returncode, r.stdout) == (0, "1\n2\n"), r.stderr
    r = run(fresh, "append", input='{"type": "message.appended", "session": "n0", "data": {"role": "user"}}', profile="q")
    one_line_error(r)


def test_nothing_follows_the_deletion_of_its_session_or_an_ancestor_in_one_input(tmp_path: Path) -> None:
    """An earlier line deleting a parent takes its descendants with it for the later lines
    (found by an outside audit: a message to the child, and a child created under a child of
    the deleted parent, were appended; the second listed as a live orphan)."""
    home = tmp_path / "h"
    for args in (["sessions", "new", "--id", "p"], ["sessions", "new", "--id", "c", "--parent", "p"]):
        assert run(home, *args).returncode == 0
    before = run(home, "log", "verify", "--json").stdout
    deleted = '{"type": "session.deleted", "session": "p", "data": {}}\n'
    cases = [(deleted + '{"type": "message.appended", "session": "c", "data": {"role": "user", "content": "x"}}',
              "line 2.session: session 'c' does not exist"),
             (deleted + '{"type": "session.created", "session": "g", "data": {"parent_session_id": "c"}}',
              "line 2.data.parent_session_id: session 'c' does not exist"),
             ('{"type": "session.created", "session": "q", "data": {}}\n'
              '{"type": "session.deleted", "session": "q", "data": {}}\n'
              '{"type": "session.created", "session": "q2", "data": {"parent_session_id": "q"}}',
              "line 3.data.parent_session_id: session 'q' does not exist")]
    for text, why in cases:
        assert why in one_line_error(run(home, "append", input=text)), text
    assert run(home, "log", "verify", "--json").stdout == before


def test_an_event_without_a_type_is_told_it_needs_one(profile_home: Path) -> None:
    """An outside audit's nit: a line with no "type" was refused as "unknown event type None"."""
    before = run(profile_home, "log", "verify", "--json").stdout
    for text, why in (('{"session": "s1", "data": {}}', "line 1.type: is required"),
                      ('{"type": null, "session": "s1", "data": {}}', "line 1.type: is required"),
                      ('{"type": "no.such", "session": "s1", "data": {}}', "unknown event type 'no.such'"),
                      ('{"type": ["x"], "session": "s1", "data": {}}', "unknown event type ['x']")):
        assert why in one_line_error(run(profile_home, "append", input=text)), text
    assert run(profile_home, "log", "verify", "--json").stdout == before


def test_reactions_and_rewinds_of_messages_not_in_their_session_are_refused(profile_home: Path, tmp_path: Path) -> None:
    """A reaction or a rewind names a message by its seq; ``eventlog append`` wrote them for any
    seq at all — no such event, another session's message, a session.created — which
    SessionStore.react/rewind refuse (found by an outside audit: six such events acknowledged)."""
    before = run(profile_home, "log", "verify", "--json").stdout
    react = '{"type": "message.reaction_set", "session": "%s", "data": {"message_id": %d, "author": "x", "emoji": "+1"}}'
    cases = [react % ("s1", 999999), react % ("s2", 2), react % ("s1", 1),
             '{"type": "message.reaction_removed", "session": "s1", "data": {"message_id": 424242, "author": "x"}}',
             '{"type": "messages.rewound", "session": "s1", "data": {"message_id": 999999}}',
             '{"type": "messages.rewound", "session": "s2", "data": {"message_id": 2}}']
    for text in cases:
        err = one_line_error(run(profile_home, "append", input=text))
        assert "line 1.data.message_id" in err and "is not a message of session" in err, (text, err)
        assert "`eventlog sessions show SESSION`" in err  # a command that exists
    assert run(profile_home, "log", "verify", "--json").stdout == before
    fresh = tmp_path / "fresh"
    r = run(fresh, "append", input='{"type": "session.created", "session": "n1", "data": {}}\n'
                                   '{"type": "message.appended", "session": "n1", "data": {"role": "user", "content": "x"}}')
    assert r.returncode == 0, r.stderr
    r = run(fresh, "append", input=(react % ("n1", 2)) + "\n" + '{"type": "messages.rewound", "session": "n1", '
                                                                  '"data": {"message_id": 2}}')
    assert (r.returncode, r.stdout) == (0, "3\n4\n"), r.stderr
    # An erased session is gone for good: its stream holds stubs (the types kept), which the
    # append's check counted as a live session (found while fixing the above).
    assert run(fresh, "sessions", "erase", "n1", "--reason", "test").returncode == 0
    before = run(fresh, "log", "verify", "--json").stdout
    for text in ('{"type": "message.appended", "session": "n1", "data": {"role": "user", "content": "x"}}',
                 '{"type": "session.created", "session": "n9", "data": {"parent_session_id": "n1"}}'):
        assert "'n1' does not exist" in one_line_error(run(fresh, "append", input=text)), text
    assert run(fresh, "log", "verify", "--json").stdout == before


# ------------------------------------------------------------------ search

def test_a_10kb_query_never_calls_a_healthy_index_degraded(profile_home: Path) -> None:
    words = [f"gateway{i} latency{i % 7}" for i in range(850)]
    query = " ".join(words)
    assert len(query) > 10_000 and len(query.split()) == 1700
    r = run(profile_home, "search", query, "--json")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert json.loads(r.stdout) == {"degraded": False, "results": []}
    r = run(profile_home, "search", "gateway " * 1700, "--json")  # 1,700 terms that all match
    body = json.loads(r.stdout)
    assert not body["degraded"] and [x["message_id"] for x in body["results"]] == [2]
    assert run(profile_home, "doctor").returncode == 0


# ------------------------------------------------------------------ import

def test_import_jsonl_into_other_history_is_refused(profile_home: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    assert run(other, "append", input='{"type": "session.created", "session": "x1", "data": {}}').returncode == 0
    export = tmp_path / "e.jsonl"
    assert run(profile_home, "export", str(export)).returncode == 0
    before = run(other, "log", "verify", "--json").stdout
    err = one_line_error(run(other, "import", str(export)))
    assert "not the start of this export" in err and "--profile NEW" in err
    assert run(other, "log", "verify", "--json").stdout == before
    r = run(other, "import", str(export), profile="new")  # a new profile takes it verbatim
    assert r.returncode == 0 and "mode=verbatim" in r.stdout


def test_an_export_saved_with_a_byte_order_mark_imports_as_without(profile_home: Path, tmp_path: Path) -> None:
    """A file a Windows editor saved (UTF-8 with a BOM) was refused as "line 1: not a JSON
    object": both modes (a whole export restored verbatim, a session's appended) take it."""
    whole, session = tmp_path / "all.jsonl", tmp_path / "s2.jsonl"
    assert run(profile_home, "export", str(whole)).returncode == 0
    assert run(profile_home, "export", "--session", "s2", str(session)).returncode == 0
    for f in (whole, session):
        f.write_bytes(b"\xef\xbb\xbf" + f.read_bytes())
    home = tmp_path / "h"
    r = run(home, "import", str(whole), "--json", profile="restored")
    assert r.returncode == 0 and json.loads(r.stdout)["mode"] == "verbatim", r.stderr
    assert (json.loads(run(home, "log", "verify", "--json", profile="restored").stdout)["head_hash"]
            == json.loads(run(profile_home, "log", "verify", "--json").stdout)["head_hash"])
    r = run(home, "import", str(session), "--json", profile="copy")
    assert r.returncode == 0 and json.loads(r.stdout)["mode"] == "appended", r.stderr
    assert json.loads(r.stdout)["imported"] >= 1
    # A BOM anywhere but the file's start is no part of JSON: still refused, naming its line.
    text = whole.read_bytes()[3:].splitlines(keepends=True)
    (tmp_path / "mid.jsonl").write_bytes(b"".join([text[0], b"\xef\xbb\xbf" + text[1], *text[2:]]))
    assert "line 2" in one_line_error(run(home, "import", str(tmp_path / "mid.jsonl"), profile="mid"))


def test_importing_what_the_profile_already_holds_is_a_no_op_not_a_conflict(profile_home: Path,
                                                                             tmp_path: Path) -> None:
    """A session's export imported a second time, and the start of a profile's own export,
    were refused as "other history" though every event was already there."""
    session, whole, start = tmp_path / "s2.jsonl", tmp_path / "all.jsonl", tmp_path / "start.jsonl"
    assert run(profile_home, "export", "--session", "s2", str(session)).returncode == 0
    assert run(profile_home, "export", str(whole)).returncode == 0
    start.write_text("".join(whole.read_text().splitlines(keepends=True)[:3]))
    home = tmp_path / "h"
    first = run(home, "import", str(session), "--json", profile="copy")
    assert first.returncode == 0 and json.loads(first.stdout)["mode"] == "appended", first.stderr
    before = run(home, "log", "verify", "--json", profile="copy").stdout
    again = run(home, "import", str(session), "--json", profile="copy")
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert json.loads(again.stdout) == {"mode": "appended", "read": 1, "imported": 0, "already_present": 1}
    assert run(home, "import", str(whole), profile="restored").returncode == 0
    prefix = run(home, "import", str(start), "--json", profile="restored")
    assert prefix.returncode == 0, prefix.stderr
    assert json.loads(prefix.stdout) == {"mode": "verbatim", "read": 3, "imported": 0, "already_present": 3}
    assert run(home, "log", "verify", "--json", profile="copy").stdout == before


def test_a_changed_export_is_refused_and_a_partial_one_is_imported_with_a_warning(profile_home: Path,
                                                                                    tmp_path: Path) -> None:
    export = tmp_path / "e.jsonl"
    assert run(profile_home, "export", str(export)).returncode == 0
    lines = export.read_text().splitlines()
    assert len(lines) >= 3
    # change one character of one message's text: its own hash no longer vouches for it
    k, line = next((i, x) for i, x in enumerate(lines) if '"content":"' in x)
    cut = line.index('"content":"') + len('"content":"')
    changed = tmp_path / "changed.jsonl"
    changed.write_text("\n".join(lines[:k] + [line[:cut] + ("Z" if line[cut] != "Z" else "Y") + line[cut + 1:]]
                                 + lines[k + 1:]) + "\n")
    home = tmp_path / "h"
    err = one_line_error(run(home, "import", str(changed), profile="forged"))
    assert f"line {k + 1} " in err and "hash does not match" in err, err
    assert not (home / "profiles" / "forged").exists()
    partial = tmp_path / "partial.jsonl"
    partial.write_text("\n".join(lines[:1] + lines[2:]) + "\n")
    # --whole: a restore, where a missing line must not pass as a session's export (an outside
    # audit restored an export with a line deleted, and got exit 0 and a profile without it)
    err = one_line_error(run(home, "import", "--whole", str(partial), profile="restored"))
    assert "not one whole chain from seq 1" in err and "line 2 holds seq 3 where seq 2 belongs" in err, err
    assert not (home / "profiles" / "restored").exists()
    # a line turned into an erased stub (data removed, hash kept) is not a whole log either:
    # no log.erased record names it (found by an outside audit: imported verbatim, then failed verify)
    stub = json.loads(lines[k])
    stub.pop("data")
    stub["erased"] = True
    forged = tmp_path / "forged.jsonl"
    from eventlog.log import codec

    forged.write_text("\n".join(lines[:k] + [codec.canonical(stub).decode()] + lines[k + 1:]) + "\n")
    err = one_line_error(run(home, "import", "--whole", str(forged), profile="restored"))
    assert f"line {k + 1} (seq {k + 1})" in err and "no log.erased event names it" in err, err
    assert not (home / "profiles" / "restored").exists()
    r = run(home, "import", "--whole", str(export), profile="restored")
    assert r.returncode == 0 and "mode=verbatim" in r.stdout, r.stderr
    r = run(home, "import", str(partial), profile="partial")
    assert r.returncode == 0 and "mode=appended" in r.stdout, r.stderr
    assert "warning: the file is not one whole chain from seq 1" in r.stderr


@pytest.mark.parametrize("size", [0, 100, 8192, 12288, "one byte short"])
def test_a_truncated_log_file_is_named_with_a_restore_hint(tmp_path: Path, size: int | str) -> None:
    """Cut past its two meta pages (a copy or a restore cut short), the file still opened and
    the first read of a page past its end killed the process with SIGBUS: exit 135, not a word."""
    home = tmp_path / "h"
    assert run(home, "init").returncode == 0
    assert run(home, "sessions", "new").returncode == 0
    data = next((home / "profiles" / PROFILE / "log").rglob("data.mdb"))
    if size == "one byte short":
        size = data.stat().st_size - 1
    assert isinstance(size, int) and size < data.stat().st_size
    with open(data, "r+b") as f:
        f.truncate(size)
    for args in (["sessions", "list"], ["log", "verify"]):
        err = one_line_error(run(home, *args))
        assert f"data.mdb is truncated ({size} bytes)" in err and "restore the profile's log/" in err, err


@pytest.mark.parametrize("lost", ["log/", "log/data.mdb", "everything in log/"])
def test_a_lost_log_is_never_replaced_by_a_new_one_over_the_projections(tmp_path: Path, lost: str) -> None:
    """log/ gone (or its data file, or all its files), state.db still there: every command
    (init included) and SessionStore.open refuse, naming the lost log, and touch nothing; with
    the log back all is as before. Losing only log/data.mdb made a read build a new empty log
    and wipe the projections (outside audit, helper-38)."""
    from eventlog.errors import IntegrityError

    home = tmp_path / "h"
    assert run(home, "init").returncode == 0
    assert run(home, "sessions", "new", "--title", "keep me").returncode == 0
    assert run(home, "sessions", "list").returncode == 0
    profile = home / "profiles" / PROFILE
    backup = tmp_path / "log-backup"
    if lost == "log/":
        (profile / "log").rename(backup)
    else:
        backup.mkdir()
        for name in (["data.mdb"] if lost == "log/data.mdb" else os.listdir(profile / "log")):
            (profile / "log" / name).rename(backup / name)
    before = sorted(os.listdir(profile)), sorted(os.listdir(profile / "log")) if lost != "log/" else None
    state = (profile / "state.db").resolve().read_bytes()
    for args in (["sessions", "list"], ["init"], ["append"], ["search", "keep"]):
        err = one_line_error(run(home, *args, input=""))
        assert "lost its log" in err and "restore log/ from a backup" in err, (args, err)
    with pytest.raises(IntegrityError, match="lost its log"):
        SessionStore.open(home, PROFILE)
    after = sorted(os.listdir(profile)), sorted(os.listdir(profile / "log")) if lost != "log/" else None
    assert after == before and (profile / "state.db").resolve().read_bytes() == state
    if lost == "log/":
        backup.rename(profile / "log")
    else:
        for name in os.listdir(backup):
            (backup / name).rename(profile / "log" / name)
    r = run(home, "sessions", "list", "--json")
    assert r.returncode == 0 and [x["title"] for x in json.loads(r.stdout)] == ["keep me"], r.stderr


def test_a_failed_import_leaves_no_profile_and_a_sqlite_file_names_the_right_format(profile_home: Path,
                                                                                    tmp_path: Path) -> None:
    home = tmp_path / "h"
    home.mkdir()
    junk = tmp_path / "junk.jsonl"
    junk.write_text('{"type": "x", "data": {}, "id": "a"}\nnot json\n')
    one_line_error(run(home, "import", str(junk), profile="made"))
    assert not (home / "profiles" / "made").exists()
    db = tmp_path / "state.db"
    sqlite3.connect(db).execute("CREATE TABLE t (x)").connection.close()
    err = one_line_error(run(home, "import", str(db), profile="made"))
    assert "--format hermes" in err
    assert not (home / "profiles" / "made").exists()
    err = one_line_error(run(home, "import", "--format", "hermes", str(junk), profile="made"))  # and the reverse
    assert "is not a SQLite database" in err and "leave out --format hermes" in err, err
    assert not (home / "profiles" / "made").exists()
    r = run(home, "import", "--format", "hermes", str(db), profile="made")
    assert "Traceback" not in r.stderr
    if r.returncode != 0:
        one_line_error(r)
        assert not (home / "profiles" / "made").exists()


# ------------------------------------------------------------------ small ones

def ctrl_c_stops() -> None:
    """In the child before exec: SIGINT as at a terminal. A suite started in the background by a
    shell inherits SIGINT ignored, and so would the command, which Ctrl-C could then not stop."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_log_tail_follow_limit_1_shows_the_last_event_then_every_new_one(profile_home: Path, tmp_path: Path) -> None:
    home = tmp_path / "h"
    assert run(home, "append", input='{"type": "session.created", "session": "f1", "data": {}}').returncode == 0
    proc = subprocess.Popen([EXE, "--home", str(home), "--profile", PROFILE, "log", "tail", "--follow", "--limit", "1",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=ctrl_c_stops)
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["seq"] == 1
        for n in (1, 2):
            run(home, "append", input='{"type": "message.appended", "session": "f1", '
                                      f'"data": {{"role": "user", "content": "m{n}"}}}}')
            line = proc.stdout.readline()
            assert json.loads(line)["data"]["content"] == f"m{n}", line
        assert proc.poll() is None, "still following"
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(10)
    assert code == 0 and "Traceback" not in (proc.stderr.read() if proc.stderr else "")


def test_log_tail_follow_from_beyond_the_head_shows_nothing_before_that_seq(tmp_path: Path) -> None:
    home = tmp_path / "h"
    assert run(home, "append", input='{"type": "session.created", "session": "f1", "data": {}}').returncode == 0
    proc = subprocess.Popen([EXE, "--home", str(home), "--profile", PROFILE, "log", "tail", "--follow", "--from", "4",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=ctrl_c_stops)
    try:
        assert proc.stdout is not None
        for n in range(2, 6):  # seqs 2..5 appended one by one: only 4 and 5 are shown
            assert run(home, "append", input='{"type": "message.appended", "session": "f1", '
                                             f'"data": {{"role": "user", "content": "m{n}"}}}}').returncode == 0
        assert [json.loads(proc.stdout.readline())["seq"] for _ in range(2)] == [4, 5]
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(10)
    assert code == 0 and "Traceback" not in (proc.stderr.read() if proc.stderr else "")


def test_version() -> None:
    r = subprocess.run([EXE, "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("eventlog ") and r.stdout.split()[1][0].isdigit()


def test_not_found_errors_say_where_to_look(profile_home: Path, tmp_path: Path) -> None:
    assert "eventlog sessions list" in one_line_error(run(profile_home, "sessions", "show", "nope"))
    assert "eventlog sessions list" in one_line_error(run(profile_home, "sessions", "pin", "nope"))
    assert "eventlog init" in one_line_error(run(tmp_path / "empty", "sessions", "list"))


def test_an_id_error_names_the_option(profile_home: Path) -> None:
    err = one_line_error(run(profile_home, "sessions", "new", "--id", "has space"))
    assert err.startswith("error: invalid --id: ")


def test_a_title_conflict_hint_names_a_free_title_not_a_python_api(profile_home: Path) -> None:
    err = one_line_error(run(profile_home, "sessions", "new", "--title", "first"))
    assert "'first #2'" in err and "SessionStore" not in err


def test_write_commands_say_what_the_number_is(tmp_path: Path) -> None:
    home = tmp_path / "h"
    sid = run(home, "sessions", "new", "--id", "w1").stdout.strip()
    assert sid == "w1"
    assert run(home, "messages", "add", "w1", "--role", "user", "--content", "x").stdout == "added message 2 to session w1\n"
    assert run(home, "sessions", "pin", "w1").stdout == "pinned session w1 and its lineage (event seq 3)\n"
    assert run(home, "sessions", "title", "w1", "T").stdout == "titled session w1 (event seq 4)\n"
    assert run(home, "sessions", "end", "w1").stdout == "ended session w1 (event seq 5)\n"
    assert run(home, "sessions", "end", "w1").stdout == "already ended\n"
    r = run(home, "sessions", "delete", "w1")
    assert r.stdout == "deleted session w1 and its descendants (the log keeps them) (event seq 6)\n"


def test_sessions_show_prints_tool_calls_and_marks_rewound_messages(profile_home: Path) -> None:
    out = run(profile_home, "sessions", "show", "s1").stdout
    assert "assistant: -> terminal({\"cmd\": \"uptime\"})" in out and "null" not in out
    assert "never mind" not in out
    out = run(profile_home, "sessions", "show", "s1", "--all").stdout
    rewound = [line for line in out.splitlines() if "never mind" in line]
    assert len(rewound) == 1 and "(rewound)" in rewound[0]
    assert all("(rewound)" not in line for line in out.splitlines() if "gateway" in line)


def test_replay_as_of_says_its_zone_in_the_help() -> None:
    r = subprocess.run([EXE, "replay", "--help"], capture_output=True, text=True, timeout=60)
    assert "UTC unless it names a zone" in " ".join(r.stdout.split())


def test_replay_until_past_the_head_says_so(profile_home: Path, tmp_path: Path) -> None:
    """`replay --until 999` on a shorter log wrote the present state and said nothing about it."""
    r = run(profile_home, "replay", "--until", "999", "--out", str(tmp_path / "r.db"))
    assert r.returncode == 0 and r.stdout.startswith(f"wrote {tmp_path / 'r.db'}: ")
    assert "warning: the log ends at seq " in r.stderr and "before --until 999" in r.stderr, r.stderr
    r = run(profile_home, "replay", "--until", "2", "--out", str(tmp_path / "r2.db"))
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr


def test_replay_to_dash_is_a_usage_error_not_a_file_named_dash(profile_home: Path, tmp_path: Path) -> None:
    """`replay --out -` wrote a file named `-`, while its own hint for a device offered `-` for
    stdout (found by an outside audit). A replay is a SQLite file: `-` is a usage error, and the
    hint says to give a file name."""
    r = subprocess.run([EXE, "--home", str(profile_home), "--profile", PROFILE, "replay", "--until", "1",
                        "--out", "-"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and "--out needs a file name" in r.stderr and not (tmp_path / "-").exists()
    r = run(profile_home, "replay", "--until", "1", "--out", "/dev/null")
    assert r.returncode == 1 and "not a regular file" in r.stderr and "`-`" not in r.stderr, r.stderr


def test_no_output_lands_on_the_profiles_own_files(tmp_path: Path) -> None:
    """export and replay refuse an output inside the profile's directory: `export
    profiles/p/log/data.mdb` wrote the export over the log itself and said 'exported 2 events'
    (found by an outside audit). Nothing is written, the log verifies after."""
    home = tmp_path / "home"
    with SessionStore.open(home, PROFILE, follower=False) as store:
        store.create_session("s1")
        store.append_message("s1", "user", "keep me")
    d = home / "profiles" / PROFILE
    data = (d / "log" / "data.mdb").read_bytes()
    for args in (["export", str(d / "log" / "data.mdb")], ["export", "--format", "md", "--session", "s1",
                                                            str(d / "log" / "data.mdb")],
                 ["replay", "--until", "1", "--out", str(d / "log" / "data.mdb")],
                 ["export", "--format", "sqlite", str(d / "state.db")], ["export", str(d / "mine.jsonl")]):
        err = one_line_error(run(home, *args))
        assert "inside the profile's own directory" in err, args
    assert (d / "log" / "data.mdb").read_bytes() == data and not (d / "mine.jsonl").exists()
    assert run(home, "log", "verify").returncode == 0
    assert run(home, "export", str(tmp_path / "elsewhere.jsonl")).returncode == 0
    # nor over another profile's files: an export overwrote another profile's live log
    # (outside audit, helper-38)
    with SessionStore.open(home, "other", follower=False) as store:
        store.create_session("s2")
    theirs = home / "profiles" / "other" / "log" / "data.mdb"
    before = theirs.read_bytes()
    for args in (["export", str(theirs)], ["replay", "--until", "1", "--out", str(theirs)],
                 ["export", str(home / "profiles" / "loose.jsonl")]):
        err = one_line_error(run(home, *args))
        assert "inside the profiles folder of the home" in err, (args, err)
    assert theirs.read_bytes() == before and not (home / "profiles" / "loose.jsonl").exists()


def test_export_of_an_unknown_session_is_not_found_in_every_format(profile_home: Path, tmp_path: Path) -> None:
    for fmt in ("jsonl", "md"):
        err = one_line_error(run(profile_home, "export", "--format", fmt, "--session", "nosuch", str(tmp_path / f"x.{fmt}")))
        assert "session 'nosuch' not found" in err
        assert not (tmp_path / f"x.{fmt}").exists()
    ok = run(profile_home, "export", "--session", "s1", "-")
    assert ok.returncode == 0 and len(ok.stdout.splitlines()) >= 4


def test_a_reader_that_goes_away_ends_an_export_quietly(tmp_path: Path) -> None:
    """`eventlog export - | head -1` exited 1 with "writing the export failed: Broken pipe",
    where every other command exits 0 (found by an outside audit)."""
    home = tmp_path / "h"
    lines = [json.dumps({"type": "session.created", "session": "big", "data": {"source": "cli"}})]
    lines += [json.dumps({"type": "message.appended", "session": "big", "data": {"role": "user", "content": "x" * 500}})
              for _ in range(2000)]  # ~1.5 MB: far more than a pipe holds
    assert run(home, "append", input="\n".join(lines)).returncode == 0
    for args in (["export", "-"], ["export", "--session", "big", "-"], ["log", "tail", "--limit", "2001", "--json"]):
        proc = subprocess.Popen([EXE, "--home", str(home), "--profile", PROFILE, *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        assert json.loads(proc.stdout.readline())["seq"] == 1
        proc.stdout.close()  # the reader goes away, as `head -1` does
        assert proc.wait(60) == 0, args
        assert proc.stderr.read() == b"", args


def test_append_names_bytes_that_are_not_utf8_and_takes_a_byte_order_mark(tmp_path: Path) -> None:
    """A 0xFF byte in `append`'s input was refused as "surrogates not allowed" (orjson's words for
    what stdin made of it), and a UTF-8 byte order mark, which `import` takes, was refused
    (outside audit, helper-38)."""
    home = tmp_path / "h"
    argv = [EXE, "--home", str(home), "--profile", PROFILE, "append"]
    bad = subprocess.run(argv, input=b'{"type": "session.created", "session": "s1", "data": {"title": "a\xffb"}}\n',
                         capture_output=True, timeout=60)
    err = bad.stderr.decode()
    assert bad.returncode == 1 and "not valid UTF-8 (byte 0xff at character 66)" in err, err
    bom = subprocess.run(argv, input=b'\xef\xbb\xbf{"type": "session.created", "session": "s1", "data": {}}\n',
                         capture_output=True, timeout=60)
    assert bom.returncode == 0, bom.stderr
    assert json.loads(run(home, "sessions", "list", "--json").stdout)[0]["id"] == "s1"


def test_import_names_bytes_that_are_not_utf8_as_append_does(profile_home: Path, tmp_path: Path) -> None:
    """A 0xFF byte in an export's line was refused as orjson's "str is not valid UTF-8: surrogates
    not allowed: line 1 column 1", naming neither the byte nor where it is (helper-76)."""
    export = tmp_path / "x.jsonl"
    assert run(profile_home, "export", str(export)).returncode == 0
    lines = export.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b'"data":{', b'"data":{"\xff":1,', 1)
    at = lines[1].index(b"\xff") + 1
    export.write_bytes(b"".join(lines))
    err = one_line_error(run(profile_home, "import", str(export), profile="fresh"))
    assert f"invalid line 2: not valid UTF-8 (byte 0xff at character {at})" in err, err
    assert not (profile_home / "profiles" / "fresh").exists()


def test_a_lost_current_link_names_the_generation_that_holds_the_log(tmp_path: Path) -> None:
    """With log/current gone after a compaction, commands said "No such file or directory" and
    `doctor` failed the same way, though the log was intact in log/g<N> (outside audit,
    helper-42). They name the generation and how to restore the link now, and touch nothing."""
    home = tmp_path / "h"
    assert run(home, "sessions", "new", "--title", "keep me").returncode == 0
    assert run(home, "compact").returncode == 0
    log_dir = home / "profiles" / PROFILE / "log"
    gen = os.readlink(log_dir / "current")
    (log_dir / "current").unlink()
    for args in (["sessions", "list"], ["doctor"], ["log", "verify"], ["init"]):
        err = one_line_error(run(home, *args))
        assert "lost its log's current link" in err and f"ln -s {gen}" in err, (args, err)
    assert not os.path.lexists(log_dir / "current")
    os.symlink(gen, log_dir / "current")
    r = run(home, "sessions", "list", "--json")
    assert r.returncode == 0 and [x["title"] for x in json.loads(r.stdout)] == ["keep me"], r.stderr


def test_text_arguments_that_are_not_utf8_are_refused_naming_the_byte(tmp_path: Path) -> None:
    """`append` refused such bytes on stdin, but `messages add --content` and `sessions new
    --title` stored them as U+FFFD, changing the text without a word (found by an outside audit)."""

    exe = str(Path(sys.executable).with_name("eventlog"))
    home = os.fsencode(str(tmp_path / "home"))

    def run(*args: bytes) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([os.fsencode(exe), b"--home", home, *args], capture_output=True, timeout=60)

    assert run(b"sessions", b"new", b"--id", b"s1").returncode == 0
    for args, name in (((b"messages", b"add", b"s1", b"--role", b"user", b"--content", b"caf\xe9"), b"--content"),
                       ((b"sessions", b"new", b"--title", b"x\xff"), b"--title"),
                       ((b"sessions", b"title", b"s1", b"t\xe9"), b"TITLE")):
        r = run(*args)
        assert r.returncode == 1 and b"Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith(b"error: invalid " + name + b": not valid UTF-8 (byte 0x"), r.stderr
    shown = run(b"sessions", b"show", b"s1", b"--json")
    assert json.loads(shown.stdout)["messages"] == [] and json.loads(shown.stdout)["session"]["title"] is None
    assert len(json.loads(run(b"sessions", b"list", b"--json").stdout)) == 1
