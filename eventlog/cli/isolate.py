"""Commands that read an LMDB log run where liblmdb cannot take them down.

liblmdb aborts the process whose cursor steps onto a damaged page of ``data.mdb`` (a zeroed or
garbage page: an assertion, SIGABRT). A command that walks the log — ``rebuild``, ``export``,
``replay``, ``log copy``, ``compact``, ``doctor``, a read that rebuilds a projection — therefore
does its work in a forked child and waits for it: the child is the command (its output, exit
status and errors are the command's own), and when a signal kills it instead, the parent,
which never opened the log, removes what the child was writing, finds the first event whose
read kills a child (halving ranges: about 2 log2(events) short-lived children), records it as
the log's damage and fails with one typed line. Undamaged, the only cost is one ``fork()``.

Only where a fork is safe and the child's output reaches the caller: a process of one thread
(a child forked beside other threads could inherit a lock one of them held), stdout and stderr
real file descriptors (not a test runner's in-memory streams), ``fork`` available, and an
LMDB log. Anything else runs the command in-process as before.
"""
from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import click

from eventlog.errors import IntegrityError

if TYPE_CHECKING:
    from eventlog.cli.common import Ctx
    from eventlog.log.base import VerifyResult

CRASH_SIGNALS = frozenset({signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE})
"""A child killed by one of these died inside liblmdb (or another C library), not by request."""

_LIBLMDB_ASSERTION = re.compile(rb"^[^\n]*Assertion '[^\n]*' failed in mdb_[^\n]*\n?", re.MULTILINE)

_PR_SET_PDEATHSIG = 1


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def in_child(work: Callable[[], Any]) -> tuple[str, Any]:
    """Run ``work`` in a forked child: ``("ok", its JSON result)``, ``("signal", number)`` when
    the child was killed by a signal, ``("error", None)`` when it raised (the caller then does
    the work itself, so that the error comes out as usual). The child's stderr is discarded."""
    import orjson  # not at the top: `eventlog log --help` imports only what help needs

    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 3
        try:
            os.close(r)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            view = memoryview(orjson.dumps(work()))
            while view:
                view = view[os.write(w, view):]
            code = 0
        except BaseException:
            pass
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return "signal", os.WTERMSIG(status)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return "ok", orjson.loads(data)
    return "error", None


def first_unreadable(c: Ctx, how: str, open_log: Callable[[], Any] | None = None) -> VerifyResult:
    """After a process reading the log was killed (``how``: the signal's name): the first event
    whose read kills a child, found by halving ranges, each read by another child, as a failed
    :class:`VerifyResult` (``first_bad_seq`` None when the head cannot be read, or when every
    event reads well: then the damage is outside the events, in an index). Call only in a
    process that has not opened the log (py-lmdb cannot open it again in a child that inherited
    it). ``open_log``: opens the log to search (default: the profile's)."""
    from eventlog.log.base import VerifyResult

    opener = open_log if open_log is not None else c.open_log

    def head() -> Any:
        with opener() as lg:
            return list(lg.head())

    kind, top = in_child(head)
    if kind != "ok":
        return VerifyResult(False, 0, 0, "", 1, f"data.mdb is damaged: liblmdb stopped the process reading its head "
                                                  f"({how})", 0)

    def readable(lo: int, hi: int) -> bool:
        def read() -> Any:
            with opener() as lg:
                return sum(1 for _ in lg.read(lo, hi, raw=True))
        return in_child(read)[0] == "ok"

    head_seq, head_hash = int(top[0]), str(top[1])
    lo, hi = 1, head_seq
    if head_seq == 0 or readable(lo, hi):
        return VerifyResult(False, head_seq, head_seq, head_hash, None,
                            f"data.mdb is damaged outside the events (an index): liblmdb stopped the process ({how})",
                            0)
    while lo < hi:  # reading lo..hi stops the process; lo - 1 and before read well
        mid = (lo + hi) // 2
        if readable(lo, mid):
            lo = mid + 1
        else:
            hi = mid
    return VerifyResult(False, lo - 1, head_seq, head_hash, lo,
                        f"data.mdb is damaged: reading event {lo} stops the process (liblmdb: {how})", 0)


def _real_fd(stream: Any, fd: int) -> bool:
    try:
        return stream is not None and stream.fileno() == fd
    except (AttributeError, OSError, ValueError):
        return False


def can_fork(c: Ctx) -> bool:
    """Whether a child forked now is safe and has a liblmdb to be killed by: ``fork`` exists, this
    process has one thread (a child forked beside others could inherit a lock one of them held:
    the CLI has none, a program calling main() may), and ``c``'s log is not on a server."""
    if not hasattr(os, "fork") or threading.active_count() != 1:
        return False
    return c.log_url is None or "://" not in c.log_url


def can_isolate(c: Ctx) -> bool:
    """Whether a command of ``c`` can run in a forked child (see the module's docstring)."""
    if not can_fork(c):
        return False
    if os.environ.get("EVENTLOG_NO_ISOLATION"):
        return False
    return _real_fd(sys.stdout, 1) and _real_fd(sys.stderr, 2)


def _log_dir(c: Ctx) -> Path:
    if c.log_url is not None:
        return Path(c.log_url).expanduser().absolute()
    return c.home / "profiles" / c.profile / "log"


def _listing(d: Path) -> set[str]:
    try:
        return set(os.listdir(d))
    except OSError:
        return set()


def isolated(*, outputs: tuple[str, ...] = (), source: str | None = None,
             appends: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Run the command (``fn(c, ...)``, already wrapped in :func:`~eventlog.cli.common.handled`)
    in a forked child when :func:`can_isolate`. ``outputs``: the names of its parameters that
    are paths it writes (a file, or a log directory it may create): what the child left there
    is removed when it is killed, and so is a profile it created. ``source``: the parameter
    naming another log the command reads (``log copy --from``): when it is given, that log is
    the one searched for the damage (and named; nothing is recorded in it). ``appends``: the
    command appends to the log, so the error does not claim that nothing of it was written."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(c: Ctx, *args: Any, **kwargs: Any) -> Any:
            if not can_isolate(c):
                return fn(c, *args, **kwargs)
            paths = [Path(str(kwargs[name])).expanduser().absolute() for name in outputs
                     if isinstance(kwargs.get(name), str) and kwargs[name] not in ("", "-") and "://" not in kwargs[name]]
            new_dirs = [p for p in paths if not os.path.lexists(p)]
            profile_dir = c.home / "profiles" / c.profile
            if c.log_url is None and not os.path.lexists(profile_dir):
                new_dirs.append(profile_dir)
            other = kwargs.get(source) if source is not None else None
            other = other if isinstance(other, str) and other and "://" not in other else None
            log_before = _listing(_log_dir(c))
            ran = _run_child(lambda: fn(c, *args, **kwargs))
            if ran is None:  # no fork now (no memory, no process left): as before, in-process
                return fn(c, *args, **kwargs)
            pid, status = ran
            if os.WIFEXITED(status):
                sys.exit(os.WEXITSTATUS(status))
            sig = os.WTERMSIG(status)
            if sig not in CRASH_SIGNALS:  # killed on purpose (SIGKILL, an unhandled SIGINT): die the same way
                with contextlib.suppress(OSError, ValueError):
                    signal.signal(sig, signal.SIG_DFL)
                os.kill(os.getpid(), sig)
                sys.exit(128 + sig)
            _clean_after(c, pid, paths, new_dirs, log_before)
            _fail_damaged(c, sig, other, appends)
        return wrapper

    return decorate


def _run_child(work: Callable[[], Any]) -> tuple[int, int] | None:
    """Fork; the child runs ``work`` as the command and exits with its status (never returns).
    The parent waits, passing a SIGTERM, SIGHUP or SIGINT on to the child (not a SIGINT while
    the command runs in a terminal's foreground: its Ctrl-C reaches the child too), and returns
    the child's pid and wait status (None: no fork was possible). When stderr is not a terminal
    the child's goes through a pipe and is relayed as it comes, liblmdb's assertion line left
    out (the parent says what happened); on a terminal the child keeps it (its progress bar)."""
    sys.stdout.flush()
    sys.stderr.flush()
    relay = not os.isatty(2)
    r, w = os.pipe() if relay else (-1, -1)
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        if relay:
            os.close(r)
            os.close(w)
        return None
    if pid == 0:
        _as_child(parent, w, r, work)
    if relay:
        os.close(w)
    forward = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}

    def pass_on(signum: int, frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    def interrupted(signum: int, frame: Any) -> None:
        if not _terminal_foreground():  # a Ctrl-C there reaches the child too: once is enough
            pass_on(signum, frame)

    try:
        signal.signal(signal.SIGTERM, pass_on)
        signal.signal(signal.SIGHUP, pass_on)
        signal.signal(signal.SIGINT, interrupted)
        if relay:
            _relay(r)
        _, status = os.waitpid(pid, 0)
    finally:
        for s, handler in forward.items():
            signal.signal(s, handler)
    return pid, status


def _terminal_foreground() -> bool:
    """Whether this process's group is the foreground of its controlling terminal."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


def _relay(r: int) -> None:
    """Copy the child's stderr to ours, line by line, until it closes, leaving out liblmdb's
    assertion line."""
    pending = b""
    with os.fdopen(r, "rb", buffering=0) as f:
        while True:
            chunk = f.read(65536)
            if not chunk:
                break
            pending += chunk
            cut = pending.rfind(b"\n") + 1
            if cut:
                _write_err(_LIBLMDB_ASSERTION.sub(b"", pending[:cut]))
                pending = pending[cut:]
    if pending:
        _write_err(_LIBLMDB_ASSERTION.sub(b"", pending))


def _write_err(data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(2, view):]
        except InterruptedError:
            continue
        except OSError:
            return


def _as_child(parent: int, w: int, r: int, work: Callable[[], Any]) -> None:
    """The child: dies with the parent (a SIGKILLed command must not leave its work running),
    runs the command as click's standalone mode would, and exits with its status."""
    code = 1
    try:
        _die_with(parent)
        if w >= 0:
            os.close(r)
            os.dup2(w, 2)
            os.close(w)
        try:
            work()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if e.code is not None and not isinstance(e.code, int):
                click.echo(str(e.code), err=True)
        except click.exceptions.Exit as e:
            code = e.exit_code
        except click.ClickException as e:
            e.show()
            code = e.exit_code
        except (click.Abort, KeyboardInterrupt):
            click.echo("Aborted!", err=True)
            code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def _die_with(parent: int) -> None:
    """Linux: the kernel sends SIGKILL to this process when its parent dies."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(137)


def _clean_after(c: Ctx, pid: int, paths: list[Path], new_dirs: list[Path], log_before: set[str]) -> None:
    """Remove what the killed child ``pid`` was writing: its temporary files (named with its
    pid, :func:`eventlog.profiles.temp_path`) beside the outputs and the projections,
    projection generations no pointer names and nobody holds (a rebuild that did not reach its
    swap), a log directory it created for a copy, and a compaction's copy of the log it began
    (under the log's writer lock)."""
    import shutil

    from projections import files
    from projections.site import SCHEMAS

    for p in new_dirs:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        elif p.is_file() and not p.is_symlink():
            with contextlib.suppress(OSError):
                p.unlink()
    profile_dir = c.home / "profiles" / c.profile
    ours = re.compile(rf"\..+\.{pid}\.[0-9]+\.tmp")
    for d in {p.parent for p in paths} | {profile_dir, _log_dir(c)}:
        for name in _listing(d):
            if ours.fullmatch(name) and (d / name).is_file():
                with contextlib.suppress(OSError):
                    (d / name).unlink()
    if profile_dir.is_dir():
        with contextlib.suppress(OSError):
            files.collect(profile_dir, SCHEMAS)
    _remove_compaction_copy(_log_dir(c), log_before)


def _remove_compaction_copy(log_dir: Path, before: set[str]) -> None:
    import fcntl
    import shutil

    made = [n for n in _listing(log_dir) - before if re.fullmatch(r"g[0-9]+\.tmp", n)]
    if not made:
        return
    try:
        fd = os.open(log_dir / "writer.lock", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # a writer or a compaction runs: its first write removes the copy
        for name in made:
            shutil.rmtree(log_dir / name, ignore_errors=True)
    finally:
        os.close(fd)


def _fail_damaged(c: Ctx, sig: int, other: str | None = None, appends: bool = False) -> None:
    """Name the damage that killed the child, then exit 1: in the profile's log (recorded like
    any damage), or in the log ``other`` the command read (named only)."""
    from eventlog.cli.common import fail
    from eventlog.log import damage

    how = signal_name(sig)
    command = click.get_current_context().command_path.split(" ", 1)[-1]
    left = ("what it appended before it stopped, if anything, is in the log (`eventlog log tail`)" if appends
            else "what the command was writing was removed (the projections serve as before)")
    if other is not None:
        from eventlog.log import open_log

        res = first_unreadable(c, how, lambda: open_log(other, profile=c.profile, create=False))
        if res.first_bad_seq is not None:
            fail(str(IntegrityError(
                f"`eventlog {command}` stopped: the log {other} is damaged at seq {res.first_bad_seq} ({res.reason}); "
                "what the command was writing was removed",
                hint=f"`eventlog --log-url {other} export FILE` writes the events before it; restore that log from "
                     "a backup for the rest")))
            return
    res = first_unreadable(c, how)
    if res.first_bad_seq is not None:
        with contextlib.suppress(Exception), c.open_log() as lg:
            damage.record(lg, damage.Damage(res.first_bad_seq, res.reason or "fails the chain check",
                                            damage.file_stamp(lg)))
        err = IntegrityError(
            f"`eventlog {command}` stopped: the log is damaged at seq {res.first_bad_seq} ({res.reason}); "
            f"{left}, and the damage is recorded: reads stop before it and appends are refused",
            hint=damage.REPAIR_HINT)
    else:  # every event reads: an index of the log, or a file other than the profile's log
        err = IntegrityError(f"`eventlog {command}` stopped: {res.reason}; {left}",
                             hint="run `eventlog log verify`; " + damage.REPAIR_HINT)
    fail(str(err))
