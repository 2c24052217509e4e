"""An erase another process wrote (a Hermes facade, a store with no projector): the first
catch-up of this profile's projections that meets the erase record purges them — rows, index
segments, freed pages, WALs and old generations — so no file under the home keeps the words,
also when that purge is SIGKILLed half-way. The process that erased rebuilds only once."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from eventlog.sessions.store import SessionStore
from tests.test_erase import MARKER, traces

HERMES_DELETE = """
import sys
from eventlog.adapters.hermes import SessionDB
db = SessionDB(db_path=sys.argv[1])
db.delete_session(sys.argv[2])
db.close()
"""

FOLD_ERASE = """
import sys
from eventlog.sessions.store import SessionStore
with SessionStore.open(sys.argv[1], "p", read_model="fold") as store:
    print(store.erase_session(sys.argv[2], "forget")["seq"])
"""


def run(code: str, *args: str) -> str:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def generations(profile: Path) -> list[str]:
    return sorted(p.name for p in profile.iterdir() if p.name.endswith(".db") and not p.is_symlink())


def test_a_hermes_delete_leaves_no_word_in_eventlogs_own_projection_of_the_home(tmp_path: Path) -> None:
    from eventlog.adapters.hermes import SessionDB

    db_path = tmp_path / "state.db"
    db = SessionDB(db_path=str(db_path))
    db.create_session("secret", source="cli", model="m")
    db.create_session("kept", source="cli", model="m")
    for i in range(20):
        db.append_message("secret", "user", f"message {i} about {MARKER}")
        db.append_message("kept", "user", f"plain words {i}")
    db.close()
    home = Path(str(db_path) + ".eventlog")
    with SessionStore.open(home, "default", follower=False) as store:
        assert store.search(MARKER)["results"], "eventlog's own projection indexes the Hermes messages"
        assert any("fts" in t for t in traces(home / "profiles" / "default")), "the check can fail"
        run(HERMES_DELETE, str(db_path), "secret")
        assert store.search(MARKER)["results"] == []  # this open store's next read purges
        assert traces(tmp_path) == []
        assert [m["content"] for m in store.get_messages("kept")][:2] == ["plain words 0", "plain words 1"]
        assert generations(home / "profiles" / "default") == ["fts.2.v3.db", "state.2.v2.db"]


def _filled(home: Path, messages: int = 4000) -> str:
    with SessionStore.open(home, "p", follower=False, durability="nosync") as store:
        secret = store.create_session(source="cli", title="secret")
        kept = store.create_session(source="cli", title="kept")
        store.append_messages(secret, [{"role": "user", "content": f"{MARKER} {i}"} for i in range(20)])
        for start in range(0, messages, 500):
            store.append_messages(kept, [{"role": "user", "content": f"ordinary message {i} " + "words " * 40}
                                         for i in range(start, start + 500)])
        assert store.search(MARKER)["results"]
    return secret


PURGER = """
import sys
from eventlog.sessions.store import SessionStore
with SessionStore.open(sys.argv[1], "p", follower=False) as store:
    store.search("anything")
"""


def test_a_purge_killed_half_way_is_finished_by_the_next_catch_up(tmp_path: Path) -> None:
    secret = _filled(tmp_path)
    profile = tmp_path / "profiles" / "p"
    assert traces(profile)
    run(FOLD_ERASE, str(tmp_path), secret)  # no projector there: this profile's files keep the words
    assert traces(profile), "the erase left this profile's projections to their next catch-up"
    killed = 0
    for _ in range(5):  # SIGKILL the catch-up's purge while it writes the new generation
        before = set(generations(profile))
        proc = subprocess.Popen([sys.executable, "-c", PURGER, str(tmp_path)])
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            if set(generations(profile)) - before:
                os.kill(proc.pid, signal.SIGKILL)
                killed += 1
                break
            time.sleep(0.001)
        proc.wait(60)
        if proc.returncode == 0:
            break  # it finished before the new file was seen
        assert traces(profile), "a purge killed before its swap leaves the old files in place"
    assert killed >= 1, "no purge was caught under way"
    with SessionStore.open(tmp_path, "p", follower=False) as store:
        assert store.search(MARKER)["results"] == []
        assert store.get_session(secret) is None
        assert store.list_sessions()[0]["title"] == "kept"
    assert traces(tmp_path) == []
    left = generations(profile)
    assert len(left) == 2 and {n.split(".")[0] for n in left} == {"state", "fts"}, left
    assert not [p.name for p in profile.iterdir() if p.name.endswith(".tmp")]


def test_the_process_that_erases_builds_its_projections_once(tmp_path: Path) -> None:
    secret = _filled(tmp_path, messages=500)
    profile = tmp_path / "profiles" / "p"
    with SessionStore.open(tmp_path, "p") as store:  # its follower may meet the record first
        store.search(MARKER)
        before = generations(profile)
        store.erase_session(secret, "forget")
        assert store.search(MARKER)["results"] == []
    gens = {n.split(".")[0]: int(n.split(".")[1]) for n in before}
    assert generations(profile) == sorted(f"{k}.{g + 1}.v{2 if k == 'state' else 3}.db" for k, g in gens.items())
    assert traces(tmp_path) == []


def test_finishing_an_erase_a_catch_up_has_purged_builds_nothing_again(tmp_path: Path) -> None:
    secret = _filled(tmp_path, messages=500)
    profile = tmp_path / "profiles" / "p"
    seq = int(run(FOLD_ERASE, str(tmp_path), secret))  # no projector there: the erase stays pending
    with SessionStore.open(tmp_path, "p", follower=False) as store:
        assert store.search(MARKER)["results"] == []  # the catch-up purged
        purged = generations(profile)
        assert store.log.erase_pending() == seq
        assert store.finish_erase() == seq and store.log.erase_pending() == 0
        assert generations(profile) == purged  # state.db was built after the erase: kept
    assert traces(tmp_path) == []
