"""``eventlog export``, ``import`` and ``replay``: a profile's data out to files and in from them.

Outputs are checked before any work (:func:`eventlog.cli.common.output_path`: the folder must
exist; nothing creates missing folders) and written all or nothing, 0600 like every file of
eventlog: exports hold private transcripts.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import os
import shutil
import sys
from pathlib import Path
from typing import IO, Any, Callable, Iterator

import click

from eventlog.cli.common import (
    Ctx,
    bounded_lines,
    handled,
    json_option,
    need_stdin,
    output_path,
    pass_ctx,
    progress_bar,
    report_json,
)
from eventlog.cli.common import report as say
from eventlog.cli.isolate import isolated
from eventlog.errors import DiskFullError, EventLogError, IntegrityError, NotFoundError, StorageError, ValidationError

INT64_MAX = 2**63 - 1
SQLITE_MAGIC = b"SQLite format 3\x00"


def _parse_time_ns(text: str) -> int:
    from eventlog.sessions.events import parse_time

    try:
        return int(round(parse_time(text, "--as-of") * 1e9))
    except ValidationError as e:
        raise click.BadParameter(e.problem, param_hint="--as-of") from None


@click.command()
@click.option("--until", "until_seq", type=click.IntRange(min=0, max=INT64_MAX), default=None,
              help="Last seq to include.")
@click.option("--as-of", "as_of", default=None,
              help="ISO-8601 time: include events appended up to then (UTC unless it names a zone, "
                   "e.g. 2026-12-01T09:00:00+01:00).")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="The state.db file to write.")
@pass_ctx
@isolated(outputs=("out",))
@handled
def replay(c: Ctx, until_seq: int | None, as_of: str | None, out: str) -> None:
    """Write a standalone state.db (with its FTS index) of the profile as it was at a point."""
    if (until_seq is None) == (as_of is None):
        raise click.UsageError("give exactly one of --until and --as-of")
    if out == "-":  # a SQLite file is written in place and renamed: it cannot go down a pipe
        raise click.UsageError("--out needs a file name: replay writes a SQLite file")
    as_of_ns = _parse_time_ns(as_of) if as_of is not None else None
    path = output_path(out, "--out", c, stream=False)
    with c.open_store() as store, progress_bar("replaying") as update, _writing(out):
        res = store.snapshot(path, until_seq=until_seq, as_of_ns=as_of_ns, progress=update)
    damage = res.get("damage")
    if damage:  # the verified prefix ends before the point asked for: not the profile as it was then
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{path}{suffix}")
        raise IntegrityError(f"the log is damaged at seq {damage['seq']} ({damage['reason']}): the profile as it "
                             f"was then cannot be replayed past seq {res['last_seq']}; nothing was written",
                             hint=f"`eventlog replay --until {max(res['last_seq'], 1)}` replays the part before "
                                  "the damage; docs/RELIABILITY.md says how to restore the log")
    if until_seq is not None and until_seq > res["last_seq"]:  # a mistyped seq or profile, most likely
        click.echo(f"warning: the log ends at seq {res['last_seq']}, before --until {until_seq}: the replay "
                   "is the profile as it is now", err=True)
    say(f"wrote {out}: {res['events']} events, up to seq {res['last_seq']}")


@click.command("export")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "sqlite", "md", "html"]), default="jsonl",
              show_default=True, help="jsonl: the log itself; sqlite: a state.db snapshot; md/html: a transcript.")
@click.option("--session", "session_id", default=None,
              help="Only this session (jsonl: its lineage, the root and all under it; required for md and html).")
@click.argument("out", type=click.Path(dir_okay=False, allow_dash=True))
@pass_ctx
@isolated(outputs=("out",))
@handled
def export_cmd(c: Ctx, fmt: str, session_id: str | None, out: str) -> None:
    """Export the profile to OUT ('-' for stdout with jsonl, md and html)."""
    if fmt in ("md", "html") and session_id is None:
        raise click.UsageError(f"--format {fmt} needs --session ID")
    if fmt == "sqlite" and out == "-":
        raise click.UsageError("--format sqlite needs a file name")
    if fmt == "sqlite" and session_id is not None:
        raise click.UsageError("--format sqlite snapshots the whole profile; drop --session")
    if out != "-":
        output_path(out, "OUT", c, stream=fmt != "sqlite")
    if fmt == "jsonl":
        from sqlite_export.jsonl import export_jsonl

        with c.open_log() as lg:
            if session_id is not None and not lg.stream_version(session_id):
                raise NotFoundError("session", session_id)  # as md and html say: not an empty export
            with _Output(out) as fp, progress_bar("exporting") as update:
                n, damage = export_jsonl(lg, fp, session=session_id, progress=update, verified=True)
        click.echo(f"exported {n} events", err=True)
        if damage is not None:
            raise damage.error_reading()
        return
    with c.open_store() as store:
        if fmt == "sqlite":
            with progress_bar("snapshot") as update, _writing(out):
                info = store.snapshot(out, progress=update)
            click.echo(f"wrote {out} ({info['events']} events, up to seq {info['last_seq']})", err=True)
            return
        from sqlite_export.transcript import html_pieces, markdown_pieces

        assert session_id is not None
        session = store.get_session(session_id)
        if session is None:
            raise NotFoundError("session", session_id)
        msgs = store.get_messages(session_id)
    with _Output(out) as fp:
        for piece in (markdown_pieces if fmt == "md" else html_pieces)(session, msgs):
            fp.write(piece.encode("utf-8"))
    where = "stdout" if out == "-" else out
    click.echo(f"wrote the {fmt} transcript of session {session_id} ({len(msgs)} messages) to {where}", err=True)


@contextlib.contextmanager
def _writing(name: str) -> Iterator[None]:
    """An OSError while writing ``name`` (a read-only or special file system) as one line naming
    it (rather than the temporary file beside it)."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):  # room, not the kind of file system
            raise DiskFullError(f"cannot write {name}: {e.strerror or e}",
                                hint="free some disk space there (or write it elsewhere) and retry; nothing was "
                                     "written to it and the log is not affected") from e
        raise StorageError(f"cannot write {name}: {e.strerror or e}",
                           hint="write to a folder of a regular, writable file system") from e


@contextlib.contextmanager
def _Output(name: str) -> Iterator[IO[bytes]]:
    """A binary output: stdout for '-', else the file written atomically, 0600
    (profiles.atomic_write)."""
    if name == "-":
        try:
            yield sys.stdout.buffer
        finally:
            sys.stdout.flush()
        return
    from eventlog import profiles

    with _writing(name), profiles.atomic_write(name, mode=profiles.FILE_MODE) as fp:
        yield fp


@click.command("import")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "hermes"]), default="jsonl", show_default=True,
              help="jsonl: an eventlog export; hermes: an existing agent state.db (read-only).")
@click.option("--whole", is_flag=True, help="jsonl: refuse a file that is not one whole chain from seq 1 "
                                              "(a restore: no line may be missing; a file cut after a whole "
                                              "line still is one: compare the head hash `log verify` gives at "
                                              "the source).")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@json_option
@pass_ctx
@handled
def import_cmd(c: Ctx, fmt: str, whole: bool, file: str, as_json: bool) -> None:
    """Import FILE into the profile (created if it does not exist).

    A jsonl import goes into a new or empty profile, or one whose log the file continues (same
    seqs and hashes); into other history it is refused. A file that is not one whole chain from
    seq 1 (a session's export, or lines missing) is appended as new events, with a warning;
    --whole refuses it instead. A hermes import reads the whole file before writing, refuses a
    session whose id the profile uses for another session, and, run again on a later copy,
    brings titles and ends to what Hermes shows (docs/HERMES.md). A failed import into a profile
    it created leaves no profile behind.
    """
    if whole and fmt != "jsonl":
        raise click.UsageError("--whole applies to --format jsonl")
    if fmt == "hermes" and file == "-":  # SQLite opens a file by its name: a state.db cannot come down a pipe
        raise click.UsageError("--format hermes needs a file name: a state.db is read with SQLite, not from stdin")
    source: IO[bytes] | None = None  # a jsonl file, opened once: a pipe (`<(...)`, a FIFO) cannot be read twice
    if file != "-":
        import stat

        mode = os.stat(file).st_mode
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):  # /dev/zero, /dev/full: a read that never ends
            raise ValidationError("FILE", f"{file} is a device, not a file", hint="give an export file or a state.db")
        if fmt == "hermes" and not stat.S_ISREG(mode):
            raise ValidationError("FILE", f"{file} is not a regular file (a pipe?)",
                                  hint="a state.db is opened by name with SQLite: give the file itself")
        if fmt == "hermes":
            with open(file, "rb") as fp:
                if fp.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
                    raise ValidationError("FILE", f"{file} is not a SQLite database (a Hermes state.db)",
                                          hint="to import an export of eventlog, leave out --format hermes "
                                               "(jsonl is the default)")
        else:
            opened = open(file, "rb")  # closed below, whatever happens
            if opened.peek(len(SQLITE_MAGIC))[:len(SQLITE_MAGIC)] == SQLITE_MAGIC:  # peeked: nothing consumed
                opened.close()
                raise ValidationError("FILE", f"{file} is a SQLite database, not a JSONL export",
                                      hint="to import an agent state.db, use --format hermes")
            source = opened
    elif fmt == "jsonl":
        need_stdin("FILE '-' reads the export from stdin")
        source = sys.stdin.buffer
    with contextlib.ExitStack() as stack:
        if source is not None and file != "-":
            stack.callback(source.close)
        _import_into(c, fmt, file, source, whole, as_json)


def _import_into(c: Ctx, fmt: str, file: str, source: IO[bytes] | None, whole: bool, as_json: bool) -> None:
    from eventlog import profiles

    d = profiles.profile_dir(c.home, c.profile, create=False)
    created = not d.exists()
    created_on_server = c.log_url is not None and not _on_server(c)
    try:
        report = _import(c, fmt, file, source, whole)
    except BaseException:
        if created_on_server:
            from eventlog.log.postgres import drop_empty_profile

            assert c.log_url is not None
            drop_empty_profile(c.log_url, c.profile)
        if created:
            _remove_if_empty(c, d, ours="hi:" if fmt == "hermes" else None)
        raise
    if as_json:
        report_json(report)
    else:
        say(" ".join(f"{k}={v}" for k, v in report.items() if not isinstance(v, list)))


def _import(c: Ctx, fmt: str, file: str, source: IO[bytes] | None, whole: bool = False) -> dict[str, Any]:
    if fmt == "jsonl":
        from sqlite_export.jsonl import import_jsonl

        assert source is not None
        again: Callable[[], Iterator[bytes]] | None = None
        if file != "-" and source.seekable():  # a file, not a pipe: read anew for each pass, in bounded memory
            again = functools.partial(_reread, source, source.tell())

        with c.open_log(create=True) as lg, progress_bar("importing") as update:
            res = import_jsonl(lg, bounded_lines(source), progress=update, onto_other_history=False, whole=whole,
                               again=again)
            erased = c.erased_on_import(lg)
        if erased:  # the file's erase records stubbed events the profile held whole: clean its files
            c.clean_after_import()
        if res.mode == "appended" and res.imported:
            click.echo("warning: the file is not one whole chain from seq 1 (a session's export, or lines missing): "
                       "its events were appended as new events, with new seqs, event times and hashes (sessions and "
                       "messages keep the times they had)", err=True)
        return res.to_dict()
    from sqlite_export.hermes import hermes_upgrade, import_hermes

    with c.open_store(create=True) as store, progress_bar("importing") as update:
        rep = import_hermes(store, Path(file), progress=update, upgrade=hermes_upgrade)
    for w in rep.warnings[:50]:
        click.echo(f"warning: {w}", err=True)
    if len(rep.warnings) > 50:
        click.echo(f"warning: ... and {len(rep.warnings) - 50} more", err=True)
    return rep.to_dict()


def _reread(source: IO[bytes], start: int) -> Iterator[bytes]:
    """The lines of ``source`` from offset ``start`` on, read anew."""
    source.seek(start)
    return bounded_lines(source)


def _on_server(c: Ctx) -> bool:
    """Whether the profile exists on the --log-url server (and this login may use it)."""
    try:
        c.open_log().close()
    except EventLogError:
        return False
    return True


def _remove_if_empty(c: Ctx, d: Path, ours: str | None = None) -> None:
    """Remove the profile directory ``d`` a failed import created, unless some event reached its
    log meanwhile -- other than the import's own (event ids starting with ``ours``: a Hermes
    import that failed part way, after its source was read whole, e.g. on a full disk) -- or
    another process has the log open (:func:`_alone`): two imports of one file into a new
    profile at once, the second giving up on the first's long write, removed the profile under
    the first, whose 'imported=N' was then lost with it."""
    log_dir = d / "log"
    for _ in range(3):  # until a look at the log is not crossed by a write (the first may be its own)
        before = _data_stamp(log_dir)
        try:
            with c.open_log() as lg:
                if lg.head()[0] != 0 and (ours is None or not all(
                        str(env.get("id")).startswith(ours) for env in lg.read())):
                    return
        except EventLogError:
            pass
        after = _data_stamp(log_dir)
        if after == before:
            break
    else:
        return
    with _alone(log_dir) as alone:
        if alone and _data_stamp(log_dir) == after:  # nothing written since the log was read
            shutil.rmtree(d, ignore_errors=True)


def _data_stamp(log_dir: Path) -> tuple[int, ...] | None:
    """The stamp of the log's data file (:func:`eventlog.log.damage.data_stamp`), None when there is none."""
    from eventlog.log.damage import data_stamp
    from eventlog.log.lmdb import generation_dir

    try:
        return data_stamp(generation_dir(log_dir))
    except EventLogError:
        return None


@contextlib.contextmanager
def _alone(log_dir: Path) -> Iterator[bool]:
    """Whether no other process has the LMDB log at ``log_dir`` open, kept so for the block:
    every process with it open holds a shared lock on the first byte of its ``lock.mdb`` (LMDB's
    own), and a new one waits for the exclusive lock taken here. For a command that is ending:
    a handle of this process on that log (one an interrupt left open) must not be used after,
    since closing this descriptor cancels its lock."""
    from eventlog.log.lmdb import generation_dir

    try:
        env_dir = generation_dir(log_dir)
    except EventLogError:
        yield False
        return
    try:
        fd = os.open(env_dir / "lock.mdb", os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        yield True  # no log was ever opened there
        return
    except OSError:
        yield False
        return
    try:
        import fcntl

        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
