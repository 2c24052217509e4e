"""Isolation and permissions: two profiles in one home never see each other's data, hostile
profile names never touch the disk, everything created is private (dirs 0700, files 0600),
and — once the projections exist — no inspection path cancels a live writer's SQLite locks.

The two profiles are built so that guessed ids really collide: both have a session called
``shared``, and the message ids (seqs) of one profile are seqs of non-message events in the other.
"""
from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
from campaign import child_env, search_ids
from campaign.summary import record
from click.testing import CliRunner

from eventlog.cli import main
from eventlog.errors import NotFoundError, ProfileNameError
from eventlog.sessions.store import SessionStore

pytest_plugins = ["campaign.summary"]

MARK = {"alpha": "alphasecret", "beta": "betasecret"}
OTHER = {"alpha": "beta", "beta": "alpha"}


def build(home: Path) -> dict[str, dict[str, Any]]:
    """alpha: seqs 1-2 sessions, 3-10 messages, 11 usage, 12 reaction.
    beta: seqs 1-12 sessions, 13-20 messages, then usage and a reaction."""
    facts: dict[str, dict[str, Any]] = {}
    with SessionStore.open(home, "alpha", read_model="projection") as a:
        a.create_session(id="shared", source="cli", title="alpha plans", cwd="/srv/alpha")
        a.create_session(id="alpha-only", source="telegram", title="alpha private")
        msgs = [a.append_message("shared" if i % 2 else "alpha-only", "user", f"{MARK['alpha']} note {i}") for i in range(8)]
        a.record_usage("shared", model="m", input_tokens=111, output_tokens=11, estimated_cost_usd=0.5)
        a.react(msgs[0], "alice", "👍")
        a.sync()
        facts["alpha"] = {"sessions": {"shared", "alpha-only"}, "messages": msgs, "head": a.log.head()}
    with SessionStore.open(home, "beta", read_model="projection") as b:
        b.create_session(id="shared", source="discord", title="beta plans", cwd="/srv/beta")
        b.create_session(id="beta-only", source="cli", title="beta private")
        for i in range(10):
            b.create_session(id=f"beta-filler-{i}")
        msgs = [b.append_message("shared" if i % 2 else "beta-only", "assistant", f"{MARK['beta']} reply {i}") for i in range(8)]
        b.record_usage("beta-only", model="m", input_tokens=222, output_tokens=22)
        b.react(msgs[1], "bob", "🎉")
        b.sync()
        facts["beta"] = {"sessions": {"shared", "beta-only", *(f"beta-filler-{i}" for i in range(10))},
                         "messages": msgs, "head": b.log.head()}
    assert set(facts["alpha"]["messages"]).isdisjoint(facts["beta"]["messages"])
    return facts


def leaks(text: str, me: str) -> bool:
    return MARK[OTHER[me]] in text


def test_two_profiles_never_see_each_other(tmp_path: Path) -> None:
    home = tmp_path / "home"
    facts = build(home)
    problems: list[str] = []
    for me, other in OTHER.items():
        mine, theirs = facts[me], facts[other]
        only_theirs = f"{other}-only"
        with SessionStore.open(home, me, read_model="projection") as s:
            listed = s.list_sessions(archived=None, pinned=None, hidden=None, limit=None)
            if {x["id"] for x in listed} != mine["sessions"]:
                problems.append(f"{me}: list_sessions shows {sorted(x['id'] for x in listed)}")
            if s.get_session(only_theirs) is not None:
                problems.append(f"{me}: get_session({only_theirs!r}) answered")
            shared = s.get_session("shared") or {}
            if shared.get("title") != f"{me} plans" or shared.get("cwd") != f"/srv/{me}":
                problems.append(f"{me}: the shared id shows {shared.get('title')!r} {shared.get('cwd')!r}")
            if s.get_messages(only_theirs, include_inactive=True):
                problems.append(f"{me}: get_messages({only_theirs!r}) answered")
            for sid in ("shared", f"{me}-only"):
                if any(leaks(json.dumps(m, ensure_ascii=False), me) for m in s.get_messages(sid, include_inactive=True)):
                    problems.append(f"{me}: messages of {sid!r} leak the other profile")
            for kw in ({}, {"session_id": "shared"}, {"session_id": only_theirs}):
                if search_ids(s.search(MARK[other], limit=None, **kw)):
                    problems.append(f"{me}: search for the other profile's word found something ({kw})")
            if len(search_ids(s.search(MARK[me], limit=None))) != 8:
                problems.append(f"{me}: search for its own word does not find its 8 messages")
            st = s.stats()
            if st.get("messages") != 8 or st.get("input_tokens") != (111 if me == "alpha" else 222):
                problems.append(f"{me}: stats count the other profile: {st}")
            for mid in theirs["messages"]:
                if s.get_reactions(mid):
                    problems.append(f"{me}: get_reactions({mid}) answered")
            guessed: list[tuple[str, Callable[[], Any]]] = [
                ("react", lambda: s.react(theirs["messages"][0], "mallory", "👀")),
                ("rewind other session", lambda: s.rewind(only_theirs, theirs["messages"][0])),
                ("rewind shared id", lambda: s.rewind("shared", theirs["messages"][1])),
                ("append_message", lambda: s.append_message(only_theirs, "user", "hi")),
                ("delete_session", lambda: s.delete_session(only_theirs)),
                ("set_title", lambda: s.set_title(only_theirs, "mine now")),
                ("record_usage", lambda: s.record_usage(only_theirs, input_tokens=1)),
                ("pin", lambda: s.pin(only_theirs)),
                ("end_session", lambda: s.end_session(only_theirs, "stolen")),
            ]
            for name, call in guessed:
                try:
                    call()
                    problems.append(f"{me}: {name} with the other profile's ids succeeded")
                except NotFoundError:
                    pass
            if s.log.head() != mine["head"]:
                problems.append(f"{me}: the refused calls wrote to the log")
        with SessionStore.open(home, other, read_model="projection") as s:
            if s.log.head() != theirs["head"]:
                problems.append(f"{other}: changed by calls made in {me}")
        problems += cli_leaks(home, me, other)
    record("profile isolation", runs=1, passed=int(not problems))
    assert not problems, "\n".join(problems)


def cli_leaks(home: Path, me: str, other: str) -> list[str]:
    """Every read command of the CLI, run for ``me``, with ``other``'s ids and words."""
    problems = []
    out_dir = home.parent / f"out-{me}"
    out_dir.mkdir(exist_ok=True)
    runs: list[tuple[list[str], tuple[int, ...]]] = [
        (["log", "tail", "--from", "1", "--json"], (0,)),
        (["log", "verify", "--json"], (0,)),
        (["sessions", "list", "--json", "--archived"], (0,)),
        (["sessions", "show", "shared", "--json", "--all"], (0,)),
        (["sessions", "show", f"{other}-only", "--json"], (1,)),
        (["search", MARK[other], "--json"], (0,)),
        (["search", MARK[other], "--session", "shared", "--json"], (0,)),
        (["stats", "--json"], (0,)),
        (["export", "--format", "jsonl", str(out_dir / "all.jsonl")], (0,)),
        (["export", "--format", "md", "--session", "shared", str(out_dir / "shared.md")], (0,)),
        (["export", "--format", "md", "--session", f"{other}-only", str(out_dir / "theirs.md")], (1,)),
    ]
    for args, codes in runs:
        if args[0] not in main.commands:
            continue
        r = CliRunner().invoke(main, ["--home", str(home), "--profile", me, *args])
        written = "".join(p.read_text(errors="replace") for p in out_dir.iterdir())
        if r.exit_code not in codes:
            problems.append(f"{me}: `{' '.join(args)}` exited {r.exit_code}: {r.stderr.strip()[:200]}")
        if leaks(r.stdout + r.stderr + written, me):
            problems.append(f"{me}: `{' '.join(args)}` shows the other profile's data")
        for p in out_dir.iterdir():
            p.unlink()
    return problems


# ------------------------------------------------------------------ hostile names

HOSTILE = ["../x", "/abs", "a/b", "", "x" * 65, "nul\x00", ".", "..", "-lead", ".hidden", "a b", "new\nline",
           "é", "a\\b", "~root", "x/../../etc"]


@pytest.mark.parametrize("name", HOSTILE + [7, None])
def test_hostile_profile_names_are_refused_by_the_library(tmp_path: Path, name: Any) -> None:
    home = tmp_path / "home"
    with pytest.raises(ProfileNameError):
        SessionStore.open(home, name, read_model="projection")
    assert not home.exists(), "nothing may touch the disk"


CLI_COMMANDS = [["init"], ["append"], ["log", "verify"], ["log", "tail"], ["sessions", "list"], ["stats"],
                ["search", "x"], ["doctor"], ["rebuild"]]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_profile_names_are_refused_by_the_cli(tmp_path: Path, name: str) -> None:
    home = tmp_path / "home"
    for args in CLI_COMMANDS:
        if args[0] not in main.commands:
            continue
        r = CliRunner().invoke(main, ["--home", str(home), "--profile", name, *args], input="")
        assert r.exit_code == 2, (args, r.exit_code, r.stderr)
        assert not home.exists(), f"`{' '.join(args)}` touched the disk"


# ------------------------------------------------------------------ permissions

def test_everything_created_is_private(tmp_path: Path) -> None:
    home = tmp_path / "home"
    old = os.umask(0o022)
    try:
        with SessionStore.open(home, "alpha", read_model="projection") as s:
            sid = s.create_session(title="private")
            s.append_message(sid, "user", "secret")
            s.sync()
            s.search("secret")
        r = CliRunner().invoke(main, ["--home", str(home), "--profile", "beta", "init"])
        assert r.exit_code == 0, r.stderr
    finally:
        os.umask(old)
    wrong = []
    checked = 0
    for root, dirs, files in os.walk(home):
        for d in dirs:
            p = Path(root, d)
            if not p.is_symlink() and stat.S_IMODE(p.stat().st_mode) != 0o700:
                wrong.append(f"{p} is {oct(stat.S_IMODE(p.stat().st_mode))}")
        for f in files:
            p = Path(root, f)
            if p.is_symlink():
                continue  # a projection pointer: its target is a file of this walk
            checked += 1
            if stat.S_IMODE(p.stat().st_mode) != 0o600:
                wrong.append(f"{p} is {oct(stat.S_IMODE(p.stat().st_mode))}")
    if stat.S_IMODE(home.stat().st_mode) != 0o700:
        wrong.append(f"{home} is {oct(stat.S_IMODE(home.stat().st_mode))}")
    record("permissions (0700 dirs, 0600 files)", runs=checked, passed=checked - len(wrong))
    assert not wrong, wrong
    names = {p.name for p in home.rglob("*")}
    assert {"data.mdb", "lock.mdb"} <= names
    assert any(n.startswith("state") for n in names), "the projection files were created and checked"


# ------------------------------------------------------------------ lock survival

def probe(db: Path) -> str:
    r = subprocess.run([sys.executable, "-m", "campaign.sqlite_lock_probe", str(db)], capture_output=True, text=True,
                       env=child_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def hold_write(db: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(db), timeout=0, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    return conn


def test_the_lock_probe_sees_a_cancelled_lock(tmp_path: Path) -> None:
    """The harness itself: the probe reports a held write lock, and reports it gone after a plain
    open/close of the database file in the holder's process (the hazard the next test hunts)."""
    db = tmp_path / "live.db"
    setup = sqlite3.connect(str(db), isolation_level=None)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute("CREATE TABLE t (x)")
    setup.close()
    conn = hold_write(db)
    conn.execute("INSERT INTO t VALUES (1)")
    assert probe(db) == "HELD BUSY"
    with open(db, "rb") as f:
        f.read(100)
    assert probe(db).startswith("FREE"), "a plain close() cancels the holder's fcntl locks"
    conn.execute("ROLLBACK")
    conn.close()


def inspection_paths(home: Path, profile: str, sid: str, out: Path) -> list[tuple[str, Callable[[], Any]]]:
    """Every read-only way into a profile that exists now: CLI commands (in this process) and
    library calls."""
    def cli(*args: str) -> Callable[[], Any]:
        def run() -> Any:
            r = CliRunner().invoke(main, ["--home", str(home), "--profile", profile, *args])
            if r.exception is not None and not isinstance(r.exception, SystemExit):
                raise r.exception
            return r.exit_code, (r.stdout + r.stderr).strip()[-300:]
        return run

    paths: list[tuple[str, Callable[[], Any]]] = []
    cli_paths = [
        ("doctor", ["doctor", "--json"]),
        ("stats", ["stats", "--json"]),
        ("log verify", ["log", "verify", "--json"]),
        ("log tail", ["log", "tail", "--json"]),
        ("sessions list", ["sessions", "list", "--json"]),
        ("sessions show", ["sessions", "show", sid, "--json"]),
        ("search", ["search", "kernel", "--json"]),
        ("export jsonl", ["export", "--format", "jsonl", str(out / "x.jsonl")]),
        ("export sqlite", ["export", "--format", "sqlite", str(out / "x.db")]),
        ("export md", ["export", "--format", "md", "--session", sid, str(out / "x.md")]),
        ("export html", ["export", "--format", "html", "--session", sid, str(out / "x.html")]),
        ("replay", ["replay", "--until", "2", "--out", str(out / "replay.db")]),
    ]
    for name, args in cli_paths:
        if args[0] in main.commands:
            paths.append((f"cli {name}", cli(*args)))

    def library() -> Any:
        with SessionStore.open(home, profile, read_model="projection") as s:
            answers = [s.stats(), s.list_sessions(), s.get_messages(sid), s.search("kernel")]
            for owner in (s, getattr(s, "_projector", None)):
                if callable(getattr(owner, "health", None)):
                    answers.append(owner.health())
            return len(answers)

    paths.append(("library stats/list/messages/search/health", library))
    return paths


@pytest.mark.parametrize("pointer", ["state.db", "fts.db"])
def test_no_inspection_path_cancels_a_live_writer_lock(tmp_path: Path, pointer: str) -> None:
    home = tmp_path / "home"
    with SessionStore.open(home, "p", read_model="projection") as s:
        sid = s.create_session(title="lock survival")
        for i in range(5):
            s.append_message(sid, "user", f"kernel panic number {i}")
        s.sync()
        s.search("kernel")
    link = home / "profiles" / "p" / pointer
    assert link.exists(), f"the projection keeps {pointer}"
    db = Path(os.path.realpath(link))
    out = tmp_path / "out"
    out.mkdir()
    conn = hold_write(db)
    results, broken = [], []
    try:
        assert probe(db) == "HELD BUSY"
        for name, run in inspection_paths(home, "p", sid, out):
            try:
                outcome = run()
            except Exception as e:  # a path that fails is reported, but what matters is the lock
                outcome = f"raised {e!r}"[:300]
            state = probe(db)
            results.append(f"{name}: {outcome} -> {state}")
            if not (isinstance(outcome, int) or (isinstance(outcome, tuple) and outcome[0] == 0)):
                broken.append(f"{name} did not work while another connection held the write lock: {outcome}")
            if state != "HELD BUSY":
                broken.append(f"{name} cancelled the lock ({state})")
                break
    finally:
        conn.execute("ROLLBACK")
        conn.close()
    record(f"lock survival ({pointer})", runs=len(results), passed=len(results) - len(broken))
    assert not broken, "\n".join(broken + results)
