"""Every command that walks an LMDB log, on a data.mdb with damaged pages inside it. liblmdb
asserts on a cursor that steps onto a page of the wrong kind and aborts the process (SIGABRT):
`rebuild`, `export`, `replay`, `log copy`, `compact`, `doctor`, and a read that rebuilds a
projection died so ("Aborted", exit 134), leaving their temporary files, half-built projection
generations, a compaction's copy of the log or a half-copied log behind (measured by helper-80 on
a 10,001-event log with two zeroed pages at several places). They now do their work in a forked
child: when it is killed, the first event whose read kills a child is found, recorded as the
log's damage and named in one line (exit 1); what the child was writing is removed, and the
projections serve as before. Once recorded, the same commands stop before the damage without
reading it again (that read would kill them), as for any damage."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eventlog.log import damage
from eventlog.sessions.store import SessionStore

sys.path.insert(0, str(Path(__file__).parent))
from test_log_verify_damaged_pages import fill, zeroed_copy  # noqa: E402

ROOT = Path(__file__).parent.parent
EVENTLOG = [sys.executable, "-c", "import sys; from eventlog.cli import main; sys.exit(main())"]
IN_PROCESS = "import sys; from eventlog.log.lmdb import EventLog; EventLog.open(sys.argv[1]).verify()"
EVENTS = 10_001


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    home = tmp_path_factory.mktemp("pages") / "home"
    sid = fill(home)
    with SessionStore.open(home, "p", follower=False) as store:
        store.list_sessions()  # the projections hold every event
    return home, sid


@pytest.fixture(scope="module")
def damaged(built: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the profile (projection pointers kept as links) with two zeroed pages in the
    middle of data.mdb that make liblmdb abort an in-process verify."""
    home, _ = built
    where = tmp_path_factory.mktemp("damaged")
    data = home / "profiles" / "p" / "log" / "data.mdb"
    pages = data.stat().st_size // 4096
    for page in range(pages // 2, pages - 2, 7):
        copy = where / f"p{page}"
        zeroed_copy(home, copy, page)
        r = subprocess.run([sys.executable, "-c", IN_PROCESS, str(copy / "profiles" / "p" / "log")],
                           capture_output=True, cwd=ROOT, timeout=120)
        if r.returncode == -signal.SIGABRT:
            return copy
        shutil.rmtree(copy)
    pytest.fail("no zeroed page made liblmdb abort a verify: this test's premise no longer holds")


def run(home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EVENTLOG, "--home", str(home), "--profile", "p", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout)


def files_of(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*")}


def sidecars(names: set[str]) -> set[str]:
    """SQLite's -wal/-shm of a projection a reader had open: the database's own, not leftovers."""
    return {n for n in names if n.endswith(("-wal", "-shm"))}


COMMANDS = {
    "rebuild": ["rebuild"],
    "export jsonl": ["export", "{out}/x.jsonl"],
    "export sqlite": ["export", "--format", "sqlite", "{out}/x.db"],
    "replay": ["replay", "--until", str(EVENTS), "--out", "{out}/r.db"],
    "log copy": ["log", "copy", "--to", "{out}/copy"],
    "compact": ["compact"],
    "doctor": ["doctor"],
    "sessions list, no state.db": ["sessions", "list"],
    "search, no projections": ["search", "message"],
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_command_on_a_page_that_makes_liblmdb_abort_names_the_damage(damaged: Path, tmp_path: Path,
                                                                        name: str) -> None:
    home = tmp_path / "home"
    shutil.copytree(damaged, home, symlinks=True)
    profile = home / "profiles" / "p"
    if "no state.db" in name or "no projections" in name:
        for pattern in ("state.*", ".state.*") + (("fts.*", ".fts.*") if "projections" in name else ()):
            for f in profile.glob(pattern):
                f.unlink()
    out = tmp_path / "out"
    out.mkdir()
    before = files_of(profile)
    pointer = os.readlink(profile / "state.db") if (profile / "state.db").is_symlink() else None

    r = run(home, *[a.format(out=out) for a in COMMANDS[name]])

    assert r.returncode == 1, (r.returncode, r.stderr[-800:])  # was -6 (SIGABRT), "Aborted"
    found = damage.recorded(profile / "log")
    assert found is not None and 1 < found.seq < EVENTS, found
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"the log is damaged at seq {found.seq}" in errors[0], r.stderr
    assert "SIGABRT" in errors[0] and "restore the profile's log/ from a backup" in errors[0]
    assert "Assertion" not in r.stderr and "Traceback" not in r.stderr
    # nothing half-written is left: no temporary file, no generation no pointer names, no
    # compaction copy, no half-copied log
    left = files_of(profile) - before - sidecars(files_of(profile))
    assert left <= {"log/damaged.json", ".state.generation", "state.v2.lock", ".fts.generation", "fts.v3.lock"}, left
    assert os.listdir(out) == []
    if pointer is not None:  # the old projection still serves reads, whole
        assert os.readlink(profile / "state.db") == pointer
        listed = run(home, "sessions", "list", "--json")
        assert listed.returncode == 0 and json.loads(listed.stdout)[0]["message_count"] == EVENTS - 1, listed.stderr


def test_once_recorded_the_commands_stop_before_the_damage(damaged: Path, tmp_path: Path) -> None:
    """The recorded damage is not read again while data.mdb is the same file: a rebuild builds the
    verified prefix, export salvages it (exit 1 naming the damage, as for any damage), doctor
    reports it; none of them dies."""
    home = tmp_path / "home"
    shutil.copytree(damaged, home, symlinks=True)
    r = run(home, "rebuild")
    assert r.returncode == 1, r.stderr[-500:]
    seq = damage.recorded(home / "profiles" / "p" / "log")
    assert seq is not None
    r = run(home, "rebuild")
    assert r.returncode == 0 and f"rebuilt all: {seq.seq - 1} events" in r.stdout, (r.returncode, r.stderr[-500:])
    out = tmp_path / "prefix.jsonl"
    r = run(home, "export", str(out))
    assert r.returncode == 1 and f"the log is damaged at seq {seq.seq}" in r.stderr, (r.returncode, r.stderr[-500:])
    assert len(out.read_bytes().splitlines()) == seq.seq - 1
    r = run(home, "doctor", "--json")
    assert r.returncode == 1, (r.returncode, r.stderr[-500:])
    report = json.loads(r.stdout)
    assert report["log"]["ok"] is False and report["log"]["first_bad_seq"] == seq.seq, report["log"]
    r = run(home, "--profile", "new", "import", str(out))  # the salvage the hint names
    assert r.returncode == 0, r.stderr[-500:]


def test_a_restored_log_is_read_again(built: tuple[Path, str], damaged: Path, tmp_path: Path) -> None:
    """The record of a damage found by a killed read stands while data.mdb is the same file; a
    data.mdb restored from a backup is checked again, and appends are accepted."""
    home = tmp_path / "home"
    shutil.copytree(damaged, home, symlinks=True)
    assert run(home, "rebuild").returncode == 1
    log_dir = home / "profiles" / "p" / "log"
    assert damage.recorded(log_dir) is not None
    shutil.copyfile(built[0] / "profiles" / "p" / "log" / "data.mdb", log_dir / "data.mdb.restored")
    os.replace(log_dir / "data.mdb.restored", log_dir / "data.mdb")
    r = run(home, "messages", "add", built[1], "--role", "user", "--content", "after the restore")
    assert r.returncode == 0, r.stderr[-500:]
    assert damage.recorded(log_dir) is None


def test_an_undamaged_command_keeps_its_output_and_exit_status(built: tuple[Path, str], tmp_path: Path) -> None:
    home = tmp_path / "home"
    shutil.copytree(built[0], home, symlinks=True)
    r = run(home, "export", "-", "--session", built[1])
    assert r.returncode == 0 and len(r.stdout.splitlines()) == EVENTS and r.stderr == f"exported {EVENTS} events\n"
    r = run(home, "sessions", "show", "no-such-session")
    assert r.returncode == 1 and r.stderr.startswith("error: session 'no-such-session' not found"), r.stderr
    r = run(home, "log", "copy")
    assert r.returncode == 2 and "give exactly one of --to and --from" in r.stderr, r.stderr


EMBEDDED = """
import sys, threading
from eventlog.sessions.store import SessionStore
stop = threading.Event()
beside = threading.Thread(target=stop.wait, daemon=True)  # a gateway's threads: no fork is safe here
beside.start()
with SessionStore.open(sys.argv[1], "p", follower=False) as store:
    listed = store.list_sessions()
    print(listed[0]["message_count"], store.health(full=False)["damage"]["seq"])
stop.set()
"""


def test_a_multithreaded_embedding_stops_before_a_recorded_page_damage(damaged: Path, tmp_path: Path) -> None:
    """A process of several threads (a gateway) is never forked: once a command recorded the page
    damage, the library's rebuild stops before it without reading it (docs/RELIABILITY.md)."""
    home = tmp_path / "home"
    shutil.copytree(damaged, home, symlinks=True)
    r = run(home, "log", "verify")
    assert r.returncode == 1, r.stderr[-500:]
    found = damage.recorded(home / "profiles" / "p" / "log")
    assert found is not None
    profile = home / "profiles" / "p"
    for pattern in ("state.*", ".state.*", "fts.*", ".fts.*"):  # a rebuild from the log, in the embedding
        for f in profile.glob(pattern):
            f.unlink()
    r = subprocess.run([sys.executable, "-c", EMBEDDED, str(home)], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-500:])  # was -6: the rebuild read the damaged page
    assert r.stdout.split() == [str(found.seq - 2), str(found.seq)]  # the session's created event is seq 1


def test_a_record_an_earlier_release_wrote_gains_the_file_stamp(damaged: Path, tmp_path: Path) -> None:
    """A marker naming the seq without a stamp (`log verify` before this change) made every later
    command read the page again; the next command that is killed there adds the stamp."""
    home = tmp_path / "home"
    shutil.copytree(damaged, home, symlinks=True)
    log_dir = home / "profiles" / "p" / "log"
    assert run(home, "log", "verify").returncode == 1
    found = damage.recorded(log_dir)
    assert found is not None
    (log_dir / damage.MARKER).write_text(json.dumps({"seq": found.seq, "reason": found.reason}))
    assert run(home, "rebuild").returncode == 1
    assert damage.recorded(log_dir) == found
    r = run(home, "rebuild")
    assert r.returncode == 0, r.stderr[-500:]


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except OSError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; the child's death signal is Linux's")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_command_stopped_from_outside_takes_its_child_with_it(built: tuple[Path, str], sig: int) -> None:
    """The forked child does the work: a SIGTERM sent to the command reaches it (exit 143 as
    before), and a SIGKILLed command leaves no child running on (holding the log and the leases)."""
    proc = subprocess.Popen([*EVENTLOG, "--home", str(built[0]), "--profile", "p", "log", "tail", "--follow"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None and proc.stdout.readline()  # the child is following
        children = _children(proc.pid)
        assert len(children) == 1, children
        proc.send_signal(sig)
        assert proc.wait(30) == (-signal.SIGKILL if sig == signal.SIGKILL else 143)
        for _ in range(300):
            if _gone(children[0]):
                break
            time.sleep(0.01)
        assert _gone(children[0]), f"child {children[0]} still runs after its command got {sig}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_log_copy_from_a_damaged_log_names_that_log_and_leaves_no_profile(damaged: Path, tmp_path: Path) -> None:
    """The damage is in the log copied from, not in the profile's: that log is searched and named
    (nothing is recorded in it), and the profile the copy was creating is removed."""
    source = damaged / "profiles" / "p" / "log"
    r = run(tmp_path / "home", "--profile", "q", "log", "copy", "--from", str(source))
    assert r.returncode == 1, (r.returncode, r.stderr[-500:])  # was -6
    assert f"the log {source} is damaged at seq " in r.stderr and "SIGABRT" in r.stderr, r.stderr
    assert "Assertion" not in r.stderr
    assert not (tmp_path / "home" / "profiles" / "q").exists()
    assert damage.recorded(source) is None


ADD = ["messages", "add", "{sid}", "--role", "user", "--content", "after the damage"]


def append_aborts(built: tuple[Path, str], where: Path) -> tuple[Path, list[str]]:
    """A copy of the profile with two zeroed pages where an append, made in-process, dies of
    SIGABRT: it reads the session's stream before it writes (skipped when no page does so)."""
    home, sid = built
    add = [a.format(sid=sid) for a in ADD]
    pages = (home / "profiles" / "p" / "log" / "data.mdb").stat().st_size // 4096
    for page in range(pages // 2, pages - 2, 7):
        copy = where / f"p{page}"
        zeroed_copy(home, copy, page)
        r = subprocess.run([*EVENTLOG, "--home", str(copy), "--profile", "p", *add], capture_output=True,
                           cwd=ROOT, timeout=120, env={**os.environ, "EVENTLOG_NO_ISOLATION": "1"})
        if r.returncode == -signal.SIGABRT:
            return copy, add
        shutil.rmtree(copy)
    pytest.skip("no zeroed page made liblmdb abort an append on this build")


def test_an_append_that_meets_a_damaged_page_names_it(built: tuple[Path, str], tmp_path: Path) -> None:
    """An append reads the log before it writes (its session's stream); where that read aborts,
    the command names the damage instead of dying, and says what may have been appended."""
    copy, add = append_aborts(built, tmp_path)
    r = run(copy, *add)
    assert r.returncode == 1, (r.returncode, r.stderr[-500:])  # was -6
    found = damage.recorded(copy / "profiles" / "p" / "log")
    assert found is not None and f"the log is damaged at seq {found.seq}" in r.stderr
    assert "what it appended before it stopped, if anything, is in the log" in r.stderr and "Assertion" not in r.stderr


def test_an_append_on_a_recorded_page_damage_is_refused_before_any_read(built: tuple[Path, str],
                                                                         tmp_path: Path) -> None:
    """Once the damage is recorded, an append is refused ("nothing was written") before the
    session's stream is read: in a process that cannot fork (EVENTLOG_NO_ISOLATION here, a
    gateway's library call alike) that read crossed the damaged page and aborted it."""
    copy, add = append_aborts(built, tmp_path)
    assert run(copy, "log", "verify").returncode == 1
    r = subprocess.run([*EVENTLOG, "--home", str(copy), "--profile", "p", *add], capture_output=True, text=True,
                       cwd=ROOT, timeout=120, env={**os.environ, "EVENTLOG_NO_ISOLATION": "1"})
    assert r.returncode == 1 and "append refused" in r.stderr and "nothing was written" in r.stderr, \
        (r.returncode, r.stderr[-500:])  # was -6


def test_a_compaction_of_a_log_with_a_recorded_page_damage_is_refused(damaged: Path, tmp_path: Path) -> None:
    """A compaction copies every event: on a log whose page damage is recorded it is refused at
    once, nothing changed, instead of reading across the page (which aborted a process that
    cannot fork, and cost every isolated attempt the search again)."""
    home = tmp_path / "home"
    shutil.copytree(damaged, home, symlinks=True)
    assert run(home, "log", "verify").returncode == 1
    log_dir = home / "profiles" / "p" / "log"
    before = files_of(log_dir)
    r = subprocess.run([*EVENTLOG, "--home", str(home), "--profile", "p", "compact"], capture_output=True, text=True,
                       cwd=ROOT, timeout=120, env={**os.environ, "EVENTLOG_NO_ISOLATION": "1"})
    assert r.returncode == 1 and "compaction refused" in r.stderr and "nothing was written" in r.stderr, \
        (r.returncode, r.stderr[-500:])  # was -6
    assert files_of(log_dir) == before
