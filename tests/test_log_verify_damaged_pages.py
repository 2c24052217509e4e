"""`eventlog log verify` on an LMDB file with damaged pages inside it. liblmdb asserts on a cursor
that steps onto a page of the wrong kind and aborts the process (SIGABRT, exit 134, "Assertion
'IS_LEAF(mp)' failed" on stderr): 64 of 68 places where two zeroed pages were written into a
10,000-event log did so to `log verify` itself, the command an operator runs to find damage
(outside audit, helper-76). The walk now runs in a child process; when it is killed, the first
event whose read kills a child is found by halving ranges and reported as the first bad seq,
and recorded like any damage."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from eventlog.log import damage
from eventlog.sessions.store import SessionStore

ROOT = Path(__file__).parent.parent
EVENTLOG = [sys.executable, "-c", "import sys; from eventlog.cli import main; sys.exit(main())"]
IN_PROCESS = "import sys; from eventlog.log.lmdb import EventLog; EventLog.open(sys.argv[1]).verify()"


def fill(home: Path) -> str:
    """A profile ``p`` of one session with 10,000 messages (10,001 events); its id."""
    with SessionStore.open(home, "p", follower=False) as store:
        sid = store.create_session(source="cli")
        for b in range(40):
            store.append_messages(sid, [{"role": "user", "content": f"message {b}-{i} " + "x" * (i % 300)}
                                        for i in range(250)])
    return sid


def zeroed_copy(home: Path, copy: Path, page: int) -> Path:
    """A copy of the home ``home`` at ``copy`` (links kept as links) with pages ``page`` and
    ``page + 1`` of profile p's data.mdb zeroed; the copy's data.mdb."""
    shutil.copytree(home, copy, symlinks=True)
    data = copy / "profiles" / "p" / "log" / "data.mdb"
    with open(data, "r+b") as f:
        f.seek(page * 4096)
        f.write(bytes(2 * 4096))
    return data


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("pages") / "home"
    fill(home)
    return home


def damaged_copy(built: Path, where: Path) -> Path:
    """A copy of the profile with two zeroed pages that make liblmdb abort an in-process verify."""
    for page in range(2, 40):
        home = where / f"p{page}"
        data = zeroed_copy(built, home, page)
        r = subprocess.run([sys.executable, "-c", IN_PROCESS, str(data.parent)], capture_output=True, cwd=ROOT,
                           timeout=120)
        if r.returncode == -signal.SIGABRT:
            return home
        shutil.rmtree(home)
    pytest.fail("no zeroed page made liblmdb abort a verify: this test's premise no longer holds")


def test_verify_reports_a_page_that_makes_liblmdb_abort_as_damage(built: Path, tmp_path: Path) -> None:
    home = damaged_copy(built, tmp_path)
    base = [*EVENTLOG, "--home", str(home), "--profile", "p", "log", "verify"]
    r = subprocess.run([*base, "--json"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 1, (r.returncode, r.stderr[-500:])  # was -6 (SIGABRT), no output
    out = json.loads(r.stdout)
    assert out["ok"] is False and out["head_seq"] == 10_001
    assert isinstance(out["first_bad_seq"], int) and 1 <= out["first_bad_seq"] <= 10_001
    assert "stops the process" in out["reason"] and "SIGABRT" in out["reason"]
    assert "Assertion" not in r.stderr
    found = damage.recorded(home / "profiles" / "p" / "log")  # appends refused, reads degraded, as for any damage
    assert found is not None and found.seq == out["first_bad_seq"]
    text = subprocess.run(base, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert text.returncode == 1 and f"BROKEN at seq {out['first_bad_seq']}: data.mdb is damaged" in text.stderr


def test_an_undamaged_log_verifies_as_before(built: Path) -> None:
    r = subprocess.run([*EVENTLOG, "--home", str(built), "--profile", "p", "log", "verify", "--json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and json.loads(r.stdout)["ok"] is True and json.loads(r.stdout)["events"] == 10_001
