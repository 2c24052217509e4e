"""A damaged event in the log: one policy, held by every command and the library.

Projections are built only from the verified prefix: a build or a catch-up checks each event
against the chain as it reads, stops at the first bad seq and serves the profile as of the
last good one; every read says so (``degraded`` and ``first_bad_seq`` in JSON, a warning line
on stderr), and so does ``doctor``. Appends on a known broken chain refuse with
IntegrityError naming the seq; the damage is recorded once found (by a read, ``log verify``
or ``doctor``) and forgotten once the chain checks out again (the log restored).

Three kinds of damage, made with raw LMDB on real files: data bytes that are no longer JSON, a
flipped content character that is still valid JSON (tampering), and a deleted event.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from campaign.faults import DAMAGE_KINDS, damage_event, put_value, stored_value
from campaign.summary import record

from eventlog.errors import IntegrityError
from eventlog.log import EventLog, codec
from eventlog.log.damage import check_event
from eventlog.sessions.store import SessionStore

pytest_plugins = ["campaign.summary"]

EXE = str(Path(sys.executable).with_name("eventlog"))
PROFILE = "p"
BAD = 6  # the damaged seq: the second message of s1


def cli(home: Path, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, "--home", str(home), "--profile", PROFILE, *args], input=input, capture_output=True,
                          text=True, timeout=120)


def no_traceback(r: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """s1: created (1), messages 2..4; s2: created (5), messages 6..9 (6 is the one damaged);
    s3: created (10), message 11. Projections built up to seq 11."""
    home = tmp_path_factory.mktemp("pristine")
    with SessionStore.open(home, PROFILE, follower=False) as store:
        store.create_session("s1", title="one")
        for i in range(3):
            store.append_message("s1", "user", f"alpha message {i}")
        store.create_session("s2", title="two")
        for i in range(4):
            store.append_message("s2", "user", f"bravo message {i}")
        store.create_session("s3", title="three")
        store.append_message("s3", "user", "charlie after the damage")
        assert store.log.head()[0] == 11
    return home


def copy(pristine: Path, to: Path) -> Path:
    shutil.copytree(pristine, to, symlinks=True)
    return to


def log_dir(home: Path) -> Path:
    return home / "profiles" / PROFILE / "log"


@pytest.mark.parametrize("kind", DAMAGE_KINDS)
def test_every_command_serves_the_verified_prefix_and_says_where_it_stops(pristine: Path, tmp_path: Path,
                                                                          kind: str) -> None:
    home = copy(pristine, tmp_path / "home")
    before = damage_event(log_dir(home), BAD, kind)
    tampered = "X" + before["data"]["content"][1:]

    r = cli(home, "log", "verify", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["first_bad_seq"] == BAD, r.stdout

    r = cli(home, "rebuild")  # the projections are rebuilt from the verified prefix only
    no_traceback(r)
    assert r.returncode == 0 and "rebuilt all: 5 events" in r.stdout, (r.stdout, r.stderr)
    assert f"damaged at seq {BAD}" in r.stderr

    r = cli(home, "sessions", "show", "s2", "--json")
    no_traceback(r)
    body = json.loads(r.stdout)
    assert body["degraded"] is True and body["first_bad_seq"] == BAD
    assert body["messages"] == [], "nothing at or after the damaged seq is served"
    assert f"warning: the log is damaged at seq {BAD}" in r.stderr

    r = cli(home, "sessions", "list", "--json")
    assert r.returncode == 0 and {s["id"] for s in json.loads(r.stdout)} == {"s1", "s2"}  # s3 comes after
    assert f"damaged at seq {BAD}" in r.stderr

    for word in ("bravo", tampered.split()[0].lower(), "charlie"):
        r = cli(home, "search", word, "--json")
        no_traceback(r)
        body = json.loads(r.stdout)
        assert body["degraded"] is True and body["first_bad_seq"] == BAD and body["results"] == [], (word, body)

    r = cli(home, "stats", "--json")
    no_traceback(r)
    body = json.loads(r.stdout)
    assert body["projection"]["degraded"] is True and body["projection"]["first_bad_seq"] == BAD
    assert body["messages"] == 3

    r = cli(home, "log", "tail", "--from", "1", "--json")
    no_traceback(r)
    assert r.returncode == 1 and [json.loads(x)["seq"] for x in r.stdout.splitlines()] == list(range(1, BAD))
    assert r.stderr.startswith(f"error: the log is damaged at seq {BAD}") and r.stderr.count("\n") == 1

    for fix in ([], ["--fix"], ["--deep"]):
        r = cli(home, "doctor", *fix, "--json")
        no_traceback(r)
        report = json.loads(r.stdout)
        assert r.returncode == 1 and report["log"]["first_bad_seq"] == BAD and not report["ok"], (fix, report)
        assert report["state"]["last_seq"] == BAD - 1
    with SessionStore.open(home, PROFILE, follower=False) as store:  # the library: opens, serves, says
        assert store.get_messages("s2") == [] and store.get_session("s3") is None
        assert store.health(full=False)["damage"]["seq"] == BAD
        with pytest.raises(IntegrityError, match=f"damaged at seq {BAD}"):
            store.append_message("s1", "user", "on top of a broken chain")
    record("damaged event: commands over it", runs=1, passed=1)


@pytest.mark.parametrize("kind", DAMAGE_KINDS)
def test_appends_on_a_broken_chain_refuse_until_it_is_restored(pristine: Path, tmp_path: Path, kind: str) -> None:
    home = copy(pristine, tmp_path / "home")
    good = stored_value(log_dir(home), BAD)
    assert good is not None
    damage_event(log_dir(home), BAD, kind)
    # Below the projections' cursor nothing reads event 6 until something checks the chain: here
    # a rebuild (a catch-up, `log verify`, `doctor`, `log tail`, `export` find it the same way).
    assert cli(home, "rebuild").returncode == 0
    with EventLog.open(log_dir(home)) as lg:
        head_before = lg.head()
    for attempt in (["messages", "add", "s1", "--role", "user", "--content", "x"],
                    ["append"]):
        r = cli(home, *attempt, input='{"type": "session.created", "session": "s9", "data": {}}')
        no_traceback(r)
        assert r.returncode == 1 and f"damaged at seq {BAD}" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    with EventLog.open(log_dir(home)) as lg:
        assert lg.head() == head_before, "nothing was appended"
        with pytest.raises(IntegrityError):
            lg.append([{"type": "test.x", "data": {}}])
    put_value(log_dir(home), BAD, good)  # restored from a backup of that event
    assert cli(home, "log", "verify").returncode == 0
    r = cli(home, "messages", "add", "s3", "--role", "user", "--content", "after the restore")
    assert r.returncode == 0, r.stderr
    r = cli(home, "sessions", "show", "s2", "--json")
    body = json.loads(r.stdout)
    assert "degraded" not in body and [m["content"] for m in body["messages"]][:1] == ["bravo message 0"]
    assert cli(home, "doctor").returncode == 0


def test_a_projection_built_before_the_damage_keeps_its_verified_rows_and_says_so(pristine: Path,
                                                                                   tmp_path: Path) -> None:
    """Damage below the cursor: the rows built when the event was sound stay (the tampered text
    is never served), and once the damage is known every read reports it."""
    home = copy(pristine, tmp_path / "home")
    damage_event(log_dir(home), BAD, "content_flip")
    r = cli(home, "search", "xravo", "--json")
    assert json.loads(r.stdout)["results"] == []
    assert cli(home, "log", "verify").returncode == 1  # found: recorded for every process
    r = cli(home, "sessions", "show", "s2", "--json")
    body = json.loads(r.stdout)
    assert body["first_bad_seq"] == BAD and body["messages"][0]["content"] == "bravo message 0"


def test_export_stops_at_the_damage_and_the_prefix_starts_a_new_profile(pristine: Path, tmp_path: Path) -> None:
    home = copy(pristine, tmp_path / "home")
    damage_event(log_dir(home), BAD, "content_flip")
    out = tmp_path / "prefix.jsonl"
    r = cli(home, "export", str(out))
    no_traceback(r)
    assert r.returncode == 1 and f"damaged at seq {BAD}" in r.stderr
    assert len(out.read_text().splitlines()) == BAD - 1
    r = subprocess.run([EXE, "--home", str(home), "--profile", "salvaged", "import", str(out)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "mode=verbatim" in r.stdout, r.stderr
    r = subprocess.run([EXE, "--home", str(home), "--profile", "salvaged", "messages", "add", "s1", "--role", "user",
                        "--content", "life goes on"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_the_chain_check_of_a_read_agrees_with_verify_byte_for_byte(pristine: Path) -> None:
    """check_event (what builds use) and codec.check_stored (what verify uses) judge alike: every
    stored event passes both, and every single-bit flip of one fails both."""
    import random

    rng = random.Random(5)
    with EventLog.open(log_dir(pristine)) as lg:
        prev = codec.ZERO_HASH
        for seq, raw in lg.read(1, raw=True):
            raw = bytes(raw)
            assert check_event(raw, seq, prev)[1] is None and codec.check_stored(raw, seq, prev)[1] is None
            for _ in range(40):
                flipped = bytearray(raw)
                flipped[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
                a, b = check_event(bytes(flipped), seq, prev)[1], codec.check_stored(bytes(flipped), seq, prev)[1]
                assert (a is None) == (b is None), (seq, bytes(flipped), a, b)
            prev = codec.decode(raw)["hash"]


def test_a_gateway_store_meets_damage_appended_under_it_without_crashing(pristine: Path, tmp_path: Path) -> None:
    """A long-lived store (follower on) while another process damages the log past the
    projections' cursor: its catch-up meets the damage and records it, its reads keep answering
    the verified prefix, its next append refuses with IntegrityError, closing raises nothing."""
    home = copy(pristine, tmp_path / "home")
    code = (
        "import sys, time\nfrom eventlog import SessionStore\nfrom eventlog.errors import IntegrityError\n"
        "s = SessionStore.open(sys.argv[1], 'p')\n"
        "s.append_message('s3', 'user', 'before')\nprint('READY', flush=True)\nsys.stdin.readline()\n"
        "s.append_message('s3', 'user', 'after the damage landed')\ntime.sleep(0.3)\n"
        "print('SEEN', len(s.get_messages('s3')), s.health(full=False)['damage'], flush=True)\n"
        "try:\n    s.append_message('s3', 'user', 'refused')\n    print('APPENDED', flush=True)\n"
        "except IntegrityError as e:\n    print('REFUSED', e.message[:60], flush=True)\n"
        "s.close()\nprint('CLOSED', flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(home)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "READY"
    # A bit-rot of event 13 (the store's next append is 14): the store's follower meets it.
    damage_event(log_dir(home), 12, "invalid_json")
    proc.stdin.write("go\n")
    proc.stdin.flush()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err, err
    lines = out.splitlines()
    assert lines[0].startswith("SEEN") and "'seq': 12" in lines[0], lines
    assert lines[1].startswith("REFUSED append refused: the log is damaged at seq 12"), lines
    assert lines[2] == "CLOSED"


def test_appends_check_the_record_and_forget_it_once_the_chain_is_sound(tmp_path: Path) -> None:
    from eventlog.log import damage

    with EventLog.open(tmp_path / "log") as lg:
        lg.append([{"type": "test.x", "data": {"n": n}} for n in range(3)])
        damage.record(lg, damage.Damage(2, "a stale record (the log was restored)"))
        assert lg.append([{"type": "test.x", "data": {}}]) == [4]  # the chain is sound: the record goes
        assert damage.recorded(lg) is None
    good = stored_value(tmp_path / "log", 3)
    assert good is not None
    damage_event(tmp_path / "log", 3, "invalid_json")
    with EventLog.open(tmp_path / "log") as lg:
        assert not lg.verify().ok
        damage.record(lg, damage.Damage(3, "found by verify"))
        with pytest.raises(IntegrityError) as info:
            lg.append([{"type": "test.x", "data": {}}])
        assert "damaged at seq 3" in str(info.value) and info.value.hint
        assert lg.head()[0] == 4
    put_value(tmp_path / "log", 3, good)
    with EventLog.open(tmp_path / "log") as lg:
        assert lg.append([{"type": "test.x", "data": {}}]) == [5] and lg.verify().ok


@pytest.mark.parametrize("kind", ["state", "fts"])
def test_a_superseded_projection_file_that_cannot_be_deleted_stops_nothing(tmp_path: Path, kind: str) -> None:
    """An old generation that cannot be removed (here a directory in its place) is left with a
    warning; it stopped every command, writes included, and no repair got past it (found by an
    outside audit)."""
    with SessionStore.open(tmp_path, PROFILE) as store:
        sid = store.create_session(source="cli")
        store.append_message(sid, "user", "hello there")
    d = tmp_path / "profiles" / PROFILE
    old = d / os.readlink(d / f"{kind}.db")
    old.unlink()
    old.mkdir()  # the next open finds it unreadable, builds a new generation, cannot delete this one
    (old / "keep").write_text("x")
    added = cli(tmp_path, "messages", "add", sid, "--role", "user", "--content", "more")
    assert added.returncode == 0, added.stderr
    shown = cli(tmp_path, "sessions", "show", sid, "--json")
    assert shown.returncode == 0, shown.stderr
    assert [m["content"] for m in json.loads(shown.stdout)["messages"]] == ["hello there", "more"]
    found = cli(tmp_path, "search", "hello", "--json")
    assert found.returncode == 0 and json.loads(found.stdout)["results"], found.stderr
    assert "cannot delete the superseded projection file" in added.stderr + shown.stderr
    assert (old / "keep").exists() and os.readlink(d / f"{kind}.db") != old.name


def test_a_replay_past_the_damage_fails_and_writes_nothing(pristine: Path, tmp_path: Path) -> None:
    """`replay --until N` promises the profile as it was at N: past a damaged event it cannot,
    and it wrote the part before the damage with exit 0 and no word of it (found by an outside
    audit). Up to the event before the damage it still works."""
    home = copy(pristine, tmp_path / "home")
    damage_event(log_dir(home), BAD, DAMAGE_KINDS[0])
    out = tmp_path / "then.db"
    r = cli(home, "replay", "--until", str(BAD + 2), "--out", str(out))
    no_traceback(r)
    assert r.returncode == 1 and f"damaged at seq {BAD}" in r.stderr and f"--until {BAD - 1}" in r.stderr, r.stderr
    assert not out.exists() and not list(tmp_path.glob("then.db*"))
    r = cli(home, "replay", "--until", str(BAD - 1), "--out", str(out))
    assert r.returncode == 0 and f"up to seq {BAD - 1}" in r.stdout, r.stderr
    import sqlite3

    with sqlite3.connect(out) as db:
        assert db.execute("SELECT count(*) FROM messages").fetchone()[0] == 3


def test_a_read_that_starts_past_a_recorded_damage_does_not_pass_it_as_intact(pristine: Path, tmp_path: Path) -> None:
    """Once `log verify` recorded the damage, `log tail` (its last 3 events, or --from past the
    damage) showed the events after it with exit 0: read from a later seq they chain onto each
    other, but onto an event that fails (outside audit)."""
    home = copy(pristine, tmp_path / "home")
    damage_event(log_dir(home), BAD, DAMAGE_KINDS[0])
    assert cli(home, "log", "verify").returncode == 1  # records it
    for args in (["--limit", "3"], ["--from", str(BAD + 2), "--limit", "1"]):
        r = cli(home, "log", "tail", *args)
        no_traceback(r)
        assert r.returncode == 1 and f"seq {BAD}" in r.stderr and r.stdout == "", (args, r.stdout, r.stderr)
    r = cli(home, "log", "tail", "--from", "1", "--limit", str(BAD + 3), "--json")
    assert r.returncode == 1 and [json.loads(x)["seq"] for x in r.stdout.splitlines()] == list(range(1, BAD))
    r = cli(home, "export", str(tmp_path / "e.jsonl"), "--session", "s3")  # s3 lies wholly past the damage
    assert r.returncode == 1 and f"seq {BAD}" in r.stderr, r.stderr
