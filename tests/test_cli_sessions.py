"""The session, message, search, export and import commands, driven as a user would.

Exit codes and JSON shapes are asserted exactly (issue 5).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from eventlog.cli import main


def cli(home: Path, *args: str, input: str | None = None, profile: str = "p") -> tuple[int, str, str]:
    r = CliRunner().invoke(main, ["--home", str(home), "--profile", profile, *args], input=input)
    if r.exception and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def new(home: Path, *args: str) -> str:
    code, out, err = cli(home, "sessions", "new", *args)
    assert code == 0, err
    return out.strip()


def test_sessions_new_list_show(home: Path) -> None:
    sid = new(home, "--source", "gateway", "--title", "Flaky test", "--model", "m1", "--cwd", "/w/pay")
    child = new(home, "--parent", sid)
    code, out, _ = cli(home, "messages", "add", sid, "--role", "user", "--content", "why does the refund test flake?",
                       "--json")
    assert code == 0
    mid = json.loads(out)["id"]
    code, out, _ = cli(home, "messages", "add", sid, "--role", "user", "--content", "and again")
    assert code == 0 and out == f"added message {mid + 1} to session {sid}\n"  # says what the number is
    code, out, _ = cli(home, "sessions", "list", "--json")
    rows = json.loads(out)
    assert code == 0 and {r["id"] for r in rows} == {sid, child}
    required = {"id", "title", "source", "started_at", "last_activity_at", "message_count", "archived", "pinned",
                "parent_session_id"}
    assert all(required <= set(r) for r in rows)
    top = next(r for r in rows if r["id"] == sid)
    assert (top["title"], top["source"], top["message_count"], top["archived"], top["pinned"]) == \
        ("Flaky test", "gateway", 2, False, False)
    assert next(r for r in rows if r["id"] == child)["parent_session_id"] == sid
    code, out, _ = cli(home, "sessions", "show", sid, "--json")
    body = json.loads(out)
    assert code == 0 and set(body) == {"session", "messages"}
    assert body["session"]["id"] == sid
    m = body["messages"][0]
    assert {"id", "role", "content", "timestamp"} <= set(m)
    assert (m["id"], m["role"], m["content"]) == (mid, "user", "why does the refund test flake?")


def test_title_conflict_exits_1_and_creates_nothing(home: Path) -> None:
    new(home, "--title", "Taken")
    code, out, err = cli(home, "sessions", "new", "--title", "Taken")
    assert code == 1 and out == "" and err.startswith("error: --title:") and err.count("\n") == 1
    assert len(json.loads(cli(home, "sessions", "list", "--json")[1])) == 1


def test_archived_are_left_out_unless_asked(home: Path) -> None:
    a, b = new(home), new(home)
    assert cli(home, "sessions", "archive", a)[0] == 0
    ids = {r["id"] for r in json.loads(cli(home, "sessions", "list", "--json")[1])}
    assert ids == {b}
    ids = {r["id"] for r in json.loads(cli(home, "sessions", "list", "--archived", "--json")[1])}
    assert ids == {a, b}


def test_write_commands_by_hand(home: Path) -> None:
    sid = new(home)
    for cmd in (["pin", sid], ["unpin", sid], ["archive", sid], ["unarchive", sid], ["title", sid, "Renamed"],
                ["end", sid, "--reason", "done"]):
        code, out, err = cli(home, "sessions", *cmd)
        assert code == 0, (cmd, err)
    s = json.loads(cli(home, "sessions", "show", sid, "--json")[1])["session"]
    assert (s["title"], s["end_reason"], s["pinned"], s["archived"]) == ("Renamed", "done", False, False)
    assert cli(home, "sessions", "delete", sid)[0] == 0
    code, _, err = cli(home, "sessions", "show", sid)
    assert code == 1 and "not found" in err


def test_unknown_session_exits_1(home: Path) -> None:
    new(home)
    assert cli(home, "messages", "add", "nope", "--role", "user", "--content", "x")[0] == 1
    assert cli(home, "sessions", "pin", "nope")[0] == 1


def test_messages_add_errors_name_the_option_typed(home: Path, tmp_path: Path) -> None:
    """They named the event's fields (``messages[0].tool_name``), which the user never typed
    (found by an outside audit)."""
    sid = new(home)
    big = tmp_path / "big.txt"
    big.write_text("x" * (8 * 1024 * 1024 + 1))
    for args, option in ((["--tool-name", "t" * 1025, "--content", "x"], "--tool-name"),
                         (["--content-file", str(big)], "--content-file"),
                         (["--content", "x" * (8 * 1024 * 1024 + 1)], "--content")):
        code, out, err = cli(home, "messages", "add", sid, "--role", "tool", *args)
        assert code == 1 and out == "" and err.startswith(f"error: invalid {option}: "), err
    assert json.loads(cli(home, "sessions", "show", sid, "--json")[1])["session"]["message_count"] == 0


def test_messages_add_usage_errors_exit_2(home: Path, tmp_path: Path) -> None:
    sid = new(home)
    assert cli(home, "messages", "add", sid, "--role", "robot", "--content", "x")[0] == 2
    assert cli(home, "messages", "add", sid, "--role", "user")[0] == 2
    f = tmp_path / "c.txt"
    f.write_text("from a file")
    code, out, _ = cli(home, "messages", "add", sid, "--role", "tool", "--content-file", str(f), "--tool-name", "grep", "--json")
    assert code == 0 and set(json.loads(out)) == {"id", "session_id"}


def test_search_json_shape_and_hostile_queries(home: Path) -> None:
    sid = new(home)
    cli(home, "messages", "add", sid, "--role", "user", "--content", "the quick brown fox")
    cli(home, "messages", "add", sid, "--role", "assistant", "--content", "数据库 is locked again")
    code, out, _ = cli(home, "search", "quick", "--json")
    body = json.loads(out)
    assert code == 0 and set(body) == {"degraded", "results"} and body["degraded"] is False
    assert len(body["results"]) == 1
    assert set(body["results"][0]) == {"session_id", "message_id", "role", "snippet", "timestamp"}
    for q in ['"unbalanced', "a OR", "NOT", "(((", "*", "fox*", "col:umn", "^", "''", "AND AND"]:
        code, out, err = cli(home, "search", q, "--json")
        assert code == 0, (q, err)
        assert isinstance(json.loads(out)["results"], list)
    assert json.loads(cli(home, "search", "数据库", "--json")[1])["results"][0]["role"] == "assistant"
    assert json.loads(cli(home, "search", "fox", "--role", "assistant", "--json")[1])["results"] == []


def test_export_jsonl_import_round_trip_through_the_cli(home: Path, tmp_path: Path) -> None:
    sid = new(home, "--title", "Audit me")
    cli(home, "messages", "add", sid, "--role", "user", "--content", "hello")
    out = tmp_path / "log.jsonl"
    assert cli(home, "export", "--format", "jsonl", str(out))[0] == 0
    before = json.loads(cli(home, "log", "verify", "--json")[1])
    code, text, _ = cli(home, "import", "--format", "jsonl", str(out), "--json", profile="fresh")
    assert code == 0 and json.loads(text)["mode"] == "verbatim"
    after = json.loads(cli(home, "log", "verify", "--json", profile="fresh")[1])
    assert after["ok"] and after["head_hash"] == before["head_hash"]
    assert json.loads(cli(home, "sessions", "show", sid, "--json", profile="fresh")[1])["session"]["title"] == "Audit me"


def test_export_transcripts(home: Path, tmp_path: Path) -> None:
    sid = new(home, "--title", "Transcript")
    cli(home, "messages", "add", sid, "--role", "user", "--content", "<b>bold?</b>")
    for fmt in ("md", "html"):
        out = tmp_path / f"t.{fmt}"
        code, _, err = cli(home, "export", "--format", fmt, "--session", sid, str(out))
        assert code == 0, err
        assert "Transcript" in out.read_text()
    assert cli(home, "export", "--format", "md", str(tmp_path / "x.md"))[0] == 2


def test_hidden_sessions_are_listed_with_hidden(home: Path) -> None:
    """A session hidden through the Python API or Hermes could not be listed from the command
    line at all (found by an outside audit)."""
    from eventlog.sessions.store import SessionStore

    shown, hidden = new(home, "--title", "shown"), new(home, "--title", "hidden")
    with SessionStore.open(home, "p", follower=False) as store:
        store.hide(hidden)

    def listed(*args: str) -> dict[str, bool]:
        code, out, _ = cli(home, "sessions", "list", "--json", *args)
        assert code == 0
        return {r["id"]: r["hidden"] for r in json.loads(out)}

    assert listed() == {shown: False}
    assert listed("--hidden") == {shown: False, hidden: True}
    assert f"{hidden}  --H" in cli(home, "sessions", "list", "--hidden")[1]
    code, _, err = cli(home, "sessions", "show", "no-such")
    assert code == 1 and "`eventlog sessions list --archived --hidden`" in err


def test_text_output_never_passes_terminal_control_sequences(home: Path) -> None:
    """Stored titles, sources and content are shown with control characters escaped: an OSC
    sequence in a title set the terminal's window title, planted links or cleared the screen
    through `sessions list`/`show` and `search` (outside audit, helper-38). JSON keeps the text."""
    evil = "evil\x1b]0;pwned\x07\x1b[2J"
    sid = new(home, "--title", evil, "--source", "g\x1b]8;;http://x\x07w")
    assert cli(home, "messages", "add", sid, "--role", "user", "--content", f"zzq {evil}")[0] == 0
    for args in (["sessions", "list"], ["sessions", "show", sid], ["search", "zzq"], ["stats"]):
        code, out, err = cli(home, *args)
        assert code == 0, err
        assert "\x1b" not in out and "\x07" not in out, (args, out)
    assert "\\x1b]0;pwned\\x07" in cli(home, "sessions", "list")[1]
    code, out, err = cli(home, "messages", "add", sid, "--role", "user", "--content", "x\x9b2J \u202e \u2028 \x7f")
    assert code == 0, err
    code, out, _ = cli(home, "log", "tail")  # orjson escapes only C0 controls (helper-42)
    assert code == 0 and not any(ch in out for ch in "\x9b\u202e\u2028\x7f\x1b\x07"), out
    code, out, _ = cli(home, "sessions", "show", sid, "--json")
    assert json.loads(out)["session"]["title"] == evil


def test_search_role_is_one_of_the_catalogue_roles(home: Path) -> None:
    """`--role nosuch` silently found nothing (outside audit, helper-38): it is bad usage now,
    and the CLI's list is the catalogue's."""
    from eventlog.cli.search import search
    from eventlog.sessions.events import ROLES

    role = next(p for p in search.params if p.name == "role")
    assert set(role.type.choices) == ROLES  # type: ignore[attr-defined]
    new(home)
    code, _, err = cli(home, "search", "x", "--role", "nosuch")
    assert code == 2 and "nosuch" in err
    assert cli(home, "search", "x", "--role", "tool")[0] == 0


def test_a_relative_workspace_is_this_folder_s(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--workspace .` matched nothing (it was compared as the text '.'): a relative PATH is
    read from the current folder, as every path on a command line is (outside audit, helper-42)."""
    work = tmp_path / "work"
    (work / "app").mkdir(parents=True)
    here = new(home, "--cwd", str(work / "app"))
    new(home, "--cwd", "/elsewhere")
    monkeypatch.chdir(work)
    for arg in (".", "app", "./app/"):
        code, out, err = cli(home, "sessions", "list", "--workspace", arg, "--json")
        assert code == 0 and [s["id"] for s in json.loads(out)] == [here], (arg, out, err)


def test_a_relative_cwd_is_this_folder_s(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`sessions new --cwd .` stored the text '.', so `sessions list --workspace .` (read from the
    current folder since helper-42) could never find the session, nor could any other folder.
    A relative --cwd is now read from the current folder too; an absolute one is kept as given."""
    work = tmp_path / "work"
    (work / "app").mkdir(parents=True)
    monkeypatch.chdir(work)
    dot, sub = new(home, "--cwd", "."), new(home, "--cwd", "app")
    given = new(home, "--cwd", "/elsewhere/x")
    cwds = {s["id"]: s["cwd"] for s in json.loads(cli(home, "sessions", "list", "--json")[1])}
    assert cwds == {dot: str(work), sub: str(work / "app"), given: "/elsewhere/x"}
    code, out, err = cli(home, "sessions", "list", "--workspace", ".", "--json")
    assert code == 0 and {s["id"] for s in json.loads(out)} == {dot, sub}, (out, err)


def test_messages_add_content_file_refuses_bytes_that_are_not_utf8(home: Path, tmp_path: Path) -> None:
    """It stored them as U+FFFD, changing the message without a word (found by an outside audit)."""
    sid = new(home)
    f = tmp_path / "latin1.txt"
    f.write_bytes("caf\u00e9 ok".encode("latin-1"))
    code, out, err = cli(home, "messages", "add", sid, "--role", "user", "--content-file", str(f))
    assert code == 1 and out == ""
    assert err.startswith("error: invalid --content-file: ") and "0xe9 at offset 3" in err, err
    assert json.loads(cli(home, "sessions", "show", sid, "--json")[1])["session"]["message_count"] == 0
    f.write_bytes("caf\u00e9 \U0001f600".encode())
    assert cli(home, "messages", "add", sid, "--role", "user", "--content-file", str(f))[0] == 0
    shown = json.loads(cli(home, "sessions", "show", sid, "--json")[1])
    assert [m["content"] for m in shown["messages"]] == ["caf\u00e9 \U0001f600"]


def test_output_in_an_encoding_that_is_not_utf8_escapes_what_it_cannot_show(home: Path) -> None:
    """Under a Latin-1 locale every read command that met a character Latin-1 lacks ended in a
    UnicodeEncodeError traceback (found by an outside audit). Text is written with backslash
    escapes; JSON stays valid JSON with the same strings."""
    import os
    import subprocess
    import sys

    sid = new(home, "--title", "日本 notes")
    cli(home, "messages", "add", sid, "--role", "user", "--content", "thumbs 👍 é")
    exe = str(Path(sys.executable).with_name("eventlog"))
    env = {**os.environ, "PYTHONIOENCODING": "latin-1"}

    def run(*args: str) -> subprocess.CompletedProcess[bytes]:
        r = subprocess.run([exe, "--home", str(home), "--profile", "p", *args], capture_output=True, env=env,
                           timeout=60)
        assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr
        return r

    assert "\\u65e5\\u672c notes" in run("sessions", "list").stdout.decode("latin-1")
    assert "thumbs \\U0001f44d \u00e9" in run("sessions", "show", sid).stdout.decode("latin-1")
    listed = json.loads(run("sessions", "list", "--json").stdout)
    assert listed[0]["title"] == "日本 notes"
    found = json.loads(run("search", "thumbs", "--json").stdout)
    assert "👍 é" in found["results"][0]["snippet"]
    tail = [json.loads(line) for line in run("log", "tail", "--json").stdout.splitlines()]
    assert tail[-1]["data"]["content"] == "thumbs 👍 é"


def test_search_in_an_unknown_session_is_not_found(home: Path) -> None:
    """`search --session ID` with an id no session has exits 1 naming it, as `sessions show` and
    `export --session` do: a mistyped id used to answer exit 0 with no results, indistinguishable
    from a session holding no match. A known session without a match still answers exit 0."""
    sid = new(home, "--title", "t")
    code, out, err = cli(home, "search", "hi", "--session", "nope", "--json")
    assert code == 1 and out == "" and "session 'nope' not found" in err
    code, out, _ = cli(home, "search", "hi", "--session", sid, "--json")
    assert code == 0 and json.loads(out)["results"] == []


def test_an_empty_source_is_not_shown_as_cli(home: Path) -> None:
    """A session created with `--source ""` was listed and shown with source "cli", which
    `sessions list --source cli` does not find (a null source is the one that reads as "cli")."""
    empty = new(home, "--source", "")
    plain = new(home)
    listed = {line.split()[0]: line for line in cli(home, "sessions", "list")[1].splitlines()}
    assert ' "" ' in listed[empty] and " cli " not in listed[empty]
    assert " cli " in listed[plain]
    assert cli(home, "sessions", "show", empty)[1].splitlines()[1].startswith('source ""  model')
    assert [r["id"] for r in json.loads(cli(home, "sessions", "list", "--source", "cli", "--json")[1])] == [plain]
