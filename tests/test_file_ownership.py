"""Files of a profile this user cannot use: a command run with sudo on the user's profile, a backup
restored (or a profile copied) as another user, a ``chmod`` that kept the owner out. Run as a real
unprivileged user ('nobody'), since root ignores permission bits. Each case either repairs itself
(a file of the user's own whose mode keeps the user out gets its 0600 back) or names the file that
refuses and the ``chown``/``chmod`` that gives it back -- never a bare "Permission denied", never a
deletion -- and nothing acknowledged is lost.
"""
from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
from fixtures_users import EVENTLOG, nobody_folder


@dataclass
class User:
    base: Path
    home: Path
    uid: int
    gid: int
    drop: list[str]

    @property
    def profile(self) -> Path:
        return self.home / "profiles" / "default"

    def cli(self, *args: str, root: bool = False) -> subprocess.CompletedProcess[str]:
        """``eventlog --home HOME ARGS`` as this user (``root``: as root, a `sudo` run)."""
        return subprocess.run([*([] if root else self.drop), sys.executable, "-c", EVENTLOG,
                               "--home", str(self.home), *args], capture_output=True, text=True, timeout=120,
                              cwd=self.base)

    def py(self, code: str, root: bool = False) -> subprocess.CompletedProcess[str]:
        """Python ``code`` as this user, with ``HOME`` (the eventlog home) and ``BASE`` set."""
        return subprocess.run([*([] if root else self.drop), sys.executable, "-c", code], capture_output=True,
                              text=True, timeout=120, cwd=self.base,
                              env={**os.environ, "HOME": str(self.home), "BASE": str(self.base)})

    def restore_as_root(self, path: Path) -> None:
        """``path`` copied away and back by root, as `sudo cp -r` or `sudo tar x` of a backup does:
        the same files, root's now."""
        backup = self.base / "backup"
        shutil.copytree(path, backup, symlinks=True)
        shutil.rmtree(path)
        shutil.move(backup, path)

    def give_back(self, path: Path) -> None:
        """``sudo chown -R user: path``, as the hint says."""
        for p in [path, *path.rglob("*")]:
            os.lchown(p, self.uid, self.gid)


@pytest.fixture
def user() -> Iterator[User]:
    """The user 'nobody', in a folder of its own (``fixtures_users.nobody_folder``: skipped, saying
    why, where another user cannot be had)."""
    with nobody_folder("eventlog-owner-") as (base, nobody, drop):
        yield User(base, base / "h", nobody.pw_uid, nobody.pw_gid, drop)


def one_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    return r.stderr


def test_a_log_restored_as_root_names_the_folder_and_the_chown(user: User) -> None:
    """A log folder of root's in a user's profile (a backup restored with `sudo`; before the
    next commit, also what `sudo eventlog compact` or an erase made): every command of the user
    failed "cannot use .../log/data.mdb: Permission denied" (no hint), and SessionStore.open
    raised a bare PermissionError. Now it is PermissionDeniedError naming the folder, its owner
    and the `chown -R` that gives it back; after that chown everything acknowledged is there."""
    assert user.cli("sessions", "new", "--id", "s1").returncode == 0
    assert user.cli("messages", "add", "s1", "--role", "user", "--content", "hello").returncode == 0
    assert user.cli("compact").returncode == 0  # the log in log/g1, named by log/current
    user.restore_as_root(user.profile / "log")
    err = one_line(user.cli("sessions", "list"))
    assert f"{user.profile}/log belongs to root (uid 0), not to this user, nobody (uid {user.uid})" in err, err
    assert f"sudo chown -R nobody: {user.profile} (delete nothing" in err, err
    r = user.py("import os\nfrom eventlog import SessionStore\nfrom eventlog.errors import PermissionDeniedError\n"
                "try:\n    SessionStore.open(os.environ['HOME'])\n"
                "except PermissionDeniedError as e:\n    print(e.path)\n")
    assert r.stdout == f"{user.profile}/log\n", r.stderr
    user.give_back(user.profile)
    r = user.cli("sessions", "show", "s1", "--json")
    assert r.returncode == 0 and [m["content"] for m in json.loads(r.stdout)["messages"]] == ["hello"], r.stderr
    assert user.cli("messages", "add", "s1", "--role", "user", "--content", "again").returncode == 0


def test_a_home_made_by_root_names_itself_and_the_chown(user: User) -> None:
    """A home folder of root's (`sudo mkdir`, or before the next commit `sudo eventlog init`
    before the user's first run): the user's commands said "cannot use
    .../profiles/default/log: Permission denied"."""
    user.home.mkdir(mode=0o700)
    for args in (("sessions", "list"), ("sessions", "new", "--id", "s1")):
        err = one_line(user.cli(*args))
        assert f"{user.home} belongs to root (uid 0), not to this user, nobody (uid {user.uid})" in err, err
        assert f"sudo chown -R nobody: {user.home} (delete nothing" in err, err
    user.give_back(user.home)
    assert user.cli("sessions", "new", "--id", "s1").returncode == 0


HERMES = ("import os, sys\nfrom pathlib import Path\nfrom eventlog.adapters.hermes import SessionDB\n"
          "from eventlog.errors import PermissionDeniedError\n"
          "try:\n    db = SessionDB(db_path=Path(os.environ['BASE']) / 'hermes' / 'state.db')\n"
          "except PermissionDeniedError as e:\n    print('refused', e.path, e.hint)\n    sys.exit(0)\n"
          "if db.get_session('s1') is None:\n    db.create_session('s1', source='cli')\n"
          "db.append_message('s1', role='user', content='from ' + str(os.geteuid()))\n"
          "print([m['content'] for m in db.get_messages('s1')])\ndb.close()\n")


def test_a_hermes_store_restored_as_root_names_the_folder(user: User) -> None:
    """A Hermes store of root's (restored with sudo; before the next commit, also one a `hermes`
    command run with sudo made first): the user's SessionDB() raised a bare PermissionError. Now
    PermissionDeniedError names the folder and the chown; after it, nothing is lost."""
    (user.base / "hermes").mkdir()
    os.chown(user.base / "hermes", user.uid, user.gid)
    r = user.py(HERMES)
    assert r.stdout == f"['from {user.uid}']\n", r.stderr
    where = user.base / "hermes" / "state.db.eventlog"
    user.restore_as_root(where)
    r = user.py(HERMES)
    assert r.stdout.startswith(f"refused {where} ") and f"sudo chown -R nobody: {where} " in r.stdout, (r.stdout,
                                                                                                        r.stderr)
    user.give_back(where)
    r = user.py(HERMES)
    assert r.stdout == f"['from {user.uid}', 'from {user.uid}']\n", r.stderr


@pytest.mark.parametrize("name", ["log/data.mdb", "log/lock.mdb", "log/writer.lock", "projector.lock"])
def test_a_file_of_the_users_own_that_keeps_the_user_out_is_given_back(user: User, name: str) -> None:
    """`chmod 000` (or 0444) on a file of the user's own: the log's data file or lock table failed
    every command ("the log directory or its lock file is not writable"), the writer lock every
    append, the projector lock every search and doctor. Only the owner's bits come back (0600),
    said once on stderr; the file is never replaced, and nothing acknowledged is lost."""
    assert user.cli("sessions", "new", "--id", "s1").returncode == 0
    assert user.cli("messages", "add", "s1", "--role", "user", "--content", "hello").returncode == 0
    assert user.cli("search", "hello").returncode == 0
    path = user.profile / name
    inode = path.stat().st_ino
    path.chmod(0o000)
    r = user.cli("messages", "add", "s1", "--role", "user", "--content", "hello again")
    assert r.returncode == 0 and r.stdout == "added message 3 to session s1\n", r.stderr
    r2 = user.cli("search", "hello", "--json")
    assert r2.returncode == 0 and len(json.loads(r2.stdout)["results"]) == 2, r2.stderr
    assert f"{path} was mode 0, which kept its owner (this user) out; made 600" in r.stderr + r2.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_ino == inode


def test_doctor_names_a_file_that_keeps_its_owner_out_and_files_of_another_user(user: User) -> None:
    """Doctor judged only modes more open than 0600: a writer lock at 0000 (every append refused)
    passed as 'permissions ok', and so did projection files of root's (a `sudo eventlog rebuild`
    made them before the next commit; a restore with sudo still does). Both
    are named now; --fix gives the owner's bits back, and another user's files get the chown."""
    assert user.cli("sessions", "new", "--id", "s1").returncode == 0
    writer_lock = user.profile / "log" / "writer.lock"
    writer_lock.chmod(0o000)
    r = user.cli("doctor")
    assert r.returncode == 1 and f"{writer_lock} is 0o0, expected 0o600" in r.stdout, r.stdout
    r = user.cli("doctor", "--fix")
    assert r.returncode == 0 and f"fixed: chmod {writer_lock}" in r.stdout, (r.stdout, r.stderr)
    assert stat.S_IMODE(writer_lock.stat().st_mode) == 0o600
    assert user.cli("search", "x").returncode == 0
    for p in user.profile.glob("*.1.v*"):  # projection files copied back with sudo (a partial restore)
        os.lchown(p, 0, 0)
    assert user.cli("sessions", "list").returncode == 0  # rebuilt again, as the user's: root's files stay
    r = user.cli("doctor", "--json")
    problems = json.loads(r.stdout)["permissions"]["problems"]
    assert r.returncode == 1 and problems, r.stdout
    assert all(p.endswith(f"belongs to root (uid 0), not to the profile's owner, nobody (uid {user.uid})")
               for p in problems), problems
    r = user.cli("doctor", "--fix")
    assert r.returncode == 1 and f"sudo chown -R nobody: {user.profile} (delete nothing" in r.stderr, r.stderr
    user.give_back(user.profile)
    r = user.cli("doctor")
    assert r.returncode == 0, (r.stdout, r.stderr)


def roots(path: Path) -> list[str]:
    """Files and folders under ``path`` (itself included) that are root's; links do not count."""
    return sorted(str(p) for p in [path, *path.rglob("*")] if not p.is_symlink() and p.lstat().st_uid == 0)


def test_what_a_sudo_run_makes_in_a_users_profile_is_the_users(user: User) -> None:
    """A command run with sudo on a user's profile made its new files root's: after `sudo
    eventlog compact` (or an erase, or a retention, which compact) the user's every command
    failed on the new log/g1; after `sudo eventlog init` before the user's first run, the home
    itself was root's; a `sudo` rebuild, title or doctor --fix left root's files for the user's
    doctor to report. What root makes in a folder of another user is now that user's, as if the
    user had made it (links excepted: their owner means nothing)."""
    assert user.cli("init", root=True).returncode == 0
    assert roots(user.home) == []
    assert user.cli("sessions", "new", "--id", "s1").returncode == 0
    assert user.cli("messages", "add", "s1", "--role", "user", "--content", "hello").returncode == 0
    assert user.cli("sessions", "new", "--id", "s2").returncode == 0
    for args in (("messages", "add", "s1", "--role", "user", "--content", "by root"), ("sessions", "title", "s1", "T"),
                 ("rebuild",), ("compact",), ("sessions", "erase", "s2", "--reason", "test"), ("doctor", "--fix")):
        r = user.cli(*args, root=True)
        assert r.returncode == 0, (args, r.stderr)
        assert roots(user.home) == [], args
        r = user.cli("messages", "add", "s1", "--role", "user", "--content", f"after {args[0]}")
        assert r.returncode == 0, (args, r.stderr)
    r = user.cli("sessions", "show", "s1", "--json")
    assert r.returncode == 0 and len(json.loads(r.stdout)["messages"]) == 8, r.stderr
    r = user.cli("doctor")
    assert r.returncode == 0, r.stdout


def test_a_hermes_store_a_sudo_run_made_first_is_the_users(user: User) -> None:
    """A `hermes` command run once with sudo before the user's first made state.db.eventlog
    root's, and the user's SessionDB() failed on it. Now it is the user's, with root's write in it."""
    (user.base / "hermes").mkdir()
    os.chown(user.base / "hermes", user.uid, user.gid)
    r = user.py(HERMES, root=True)
    assert r.stdout == "['from 0']\n", r.stderr
    assert roots(user.base / "hermes") == []
    r = user.py(HERMES)
    assert r.stdout == f"['from 0', 'from {user.uid}']\n", r.stderr


def test_a_reader_of_another_users_profile_is_told_whose_it_is(user: User) -> None:
    """A second user who may read a profile but not write it (a group- or world-readable copy)
    cannot read the log -- LMDB's readers write lock.mdb -- and was told "the log directory or its
    lock file is not writable" with "check the owner and permissions". It is now told whose file
    refuses and to run as that user (or read an export); the chown comes only as the remedy for
    a profile that should be this user's."""
    try:
        other = pwd.getpwnam("daemon")
    except KeyError:
        pytest.skip("no user 'daemon' to own the profile")
    assert user.cli("sessions", "new", "--id", "s1").returncode == 0
    for p in [user.home, *user.home.rglob("*")]:
        os.lchown(p, other.pw_uid, other.pw_gid)
        if not p.is_symlink():
            p.chmod(0o755 if p.is_dir() else 0o644)
    for args in (("sessions", "list"), ("search", "x")):
        err = one_line(user.cli(*args))
        assert (f"{user.profile}/log/lock.mdb belongs to daemon (uid {other.pw_uid}), not to this user, nobody "
                f"(uid {user.uid}) (LMDB's reader table") in err, err
        assert "run eventlog as its owner (sudo -u daemon ...) or read a copy its owner exports" in err, err


@pytest.mark.parametrize("how", ["chmod 444", "root's, 644"])
def test_a_hermes_projection_the_user_cannot_write_is_repaired(user: User, how: str) -> None:
    """The failure Hermes' own log describes: a read-only state.db (chmod 444, a copied dotfile,
    a restore as root) failed every write with the opaque "attempt to write a readonly database".
    Here SQLite then made the -shm 0444 as well, so writes kept failing after the database was
    made writable again -- the state in which users delete the -wal. Now a file of the user's own
    gets its 0600 back, and one of another user is rebuilt from the log as a file of the user's;
    every write is kept."""
    (user.base / "hermes").mkdir()
    os.chown(user.base / "hermes", user.uid, user.gid)
    r = user.py(HERMES)
    assert r.stdout == f"['from {user.uid}']\n", r.stderr
    target = (user.base / "hermes" / "state.db").resolve()
    if how == "chmod 444":
        target.chmod(0o444)
    else:
        os.chown(target, 0, 0)
        target.chmod(0o644)
    r = user.py(HERMES)
    assert r.stdout == f"['from {user.uid}', 'from {user.uid}']\n", r.stderr
    r = user.py(HERMES)
    assert r.stdout == f"['from {user.uid}', 'from {user.uid}', 'from {user.uid}']\n", r.stderr


def test_doctor_fix_run_with_sudo_gives_roots_files_back(user: User) -> None:
    """A log restored as root leaves the user locked out; `sudo eventlog doctor --fix` (what a
    user tries first) reported root's files (owners are compared with the profile folder's) but
    changed nothing. Run as root, --fix now gives root's files back to the profile's owner."""
    assert user.cli("sessions", "new", "--id", "s1").returncode == 0
    assert user.cli("messages", "add", "s1", "--role", "user", "--content", "hello").returncode == 0
    user.restore_as_root(user.profile / "log")
    one_line(user.cli("sessions", "list"))
    r = user.cli("doctor", root=True)
    assert r.returncode == 1 and f"{user.profile}/log belongs to root (uid 0)" in r.stdout, r.stdout
    lock = user.profile / "log" / "writer.lock"
    os.chmod(lock, 0o644)  # root's, and with a mode the check reports too
    r = user.cli("doctor", "--fix", root=True)
    assert r.returncode == 0 and f"fixed: chown {user.profile}/log\n" in r.stdout, (r.stdout, r.stderr)
    # one run fixes both: the mode of a file it gave back too (it took a second run)
    assert f"fixed: chmod {lock}\n" in r.stdout and stat.S_IMODE(lock.stat().st_mode) == 0o600, r.stdout
    r = user.cli("doctor")
    assert r.returncode == 0, r.stdout
    r = user.cli("sessions", "show", "s1", "--json")
    assert r.returncode == 0 and [m["content"] for m in json.loads(r.stdout)["messages"]] == ["hello"], r.stderr


def test_a_home_in_a_folder_of_roots_is_not_an_occasion_to_chown_that_folder(user: User) -> None:
    """A home asked for where this user may not make it (`--home /usr/local/eventlog`,
    `SessionStore.open('/etc/x')`): the folder that refuses is the system's, not eventlog's,
    and the hint said `sudo chown -R nobody: /usr/local` -- a command that would hand a system
    folder to the user. Its owner is still named; the hint says to choose a folder this user
    may write, and names no chown."""
    system = user.base / "system"
    system.mkdir(mode=0o755)  # root's, as /usr/local or /etc
    for args in (("init",), ("sessions", "new", "--id", "s1")):
        r = subprocess.run([*user.drop, sys.executable, "-c", EVENTLOG, "--home", str(system / "eventlog"), *args],
                           capture_output=True, text=True, timeout=120, cwd=user.base)
        err = one_line(r)
        assert f"{system} belongs to root (uid 0), not to this user, nobody (uid {user.uid})" in err, err
        assert "chown" not in err and "choose a folder this user may write" in err, err
    r = user.py(f"from eventlog import SessionStore\nSessionStore.open({str(system / 'eventlog')!r})")
    assert "PermissionDeniedError" in r.stderr and "chown" not in r.stderr.splitlines()[-1], r.stderr
    assert not (system / "eventlog").exists()
