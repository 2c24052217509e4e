"""``eventlog init`` and ``eventlog append``: the profile's log, written directly."""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

import click

from eventlog.cli.common import (
    Ctx,
    bounded_lines,
    free_title_hint,
    handled,
    json_option,
    need_stdin,
    pass_ctx,
    rename_field,
    report,
    report_json,
)
from eventlog.cli.isolate import isolated
from eventlog.errors import EventLogError, TitleConflictError, ValidationError


@click.command()
@pass_ctx
@handled
def init(c: Ctx) -> None:
    """Create the profile (its directory and log) if it does not exist.

    Prints where its log is: the profile's directory (which holds log/), the log directory
    --log-url names, or the server (without a password)."""
    with c.open_log(create=True) as log:
        log.head()  # the log answers: a profile whose tables were dropped on the server is not "created"
        if log.path is not None:  # the log directory --log-url names is no profile's: it is shown itself
            report(str(log.path if c.log_url is not None else log.path.parent))
        else:  # a log on a server (--log-url): its address, without a password, and the profile
            from eventlog.log.pg_schema import redact

            report(f"{redact(c.log_url or '')} profile {c.profile}")


def _read_events(stream: Any) -> Iterator[tuple[int, Any]]:
    import orjson

    from eventlog.log.codec import refuse_wide_ints
    from eventlog.sessions.inputs import refuse_duplicate_keys, with_lone_surrogates

    for n, line in enumerate(bounded_lines(stream), 1):
        if n == 1 and line[:1] == "\ufeff":  # a byte order mark some editors write (import takes it too)
            line = line[1:]
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            obj = with_lone_surrogates(line, e)
            if obj is None:
                bad = next((i for i, ch in enumerate(line) if "\udc80" <= ch <= "\udcff"), None)
                if bad is not None:  # stdin's undecodable bytes (surrogateescape): say so, not orjson's words
                    raise ValidationError(f"line {n}", f"not valid UTF-8 (byte 0x{ord(line[bad]) - 0xDC00:02x} "
                                                       f"at character {bad + 1})") from None
                raise ValidationError(f"line {n}", f"not valid JSON ({e})") from None
        refuse_duplicate_keys(line, f"line {n}")
        refuse_wide_ints(line.encode("utf-8", "surrogatepass") if isinstance(line, str) else line, f"line {n}")
        yield n, obj


def _titled(ev: dict[str, Any]) -> bool:
    return ev["type"] in ("session.created", "session.titled") and ev["data"].get("title") is not None


def _name_title_line(e: TitleConflictError, events: list[dict[str, Any]], numbers: list[int]) -> None:
    """Rename the title conflict's field ``title`` to ``line N.data.title``: the first line giving
    that title to a session other than its holder (the holder may be a session of the input)."""
    for n, ev in zip(numbers, events):
        if (_titled(ev) and ev.get("session") != e.holder and ev["data"]["title"] == e.title
                and e.message.startswith(f"{e.field}: ")):
            rename_field(e, f"line {n}.data.title")
            return


@click.command()
@click.option("--each", is_flag=True, help="Append every line as its own batch (default: one atomic batch).")
@json_option
@pass_ctx
@isolated(appends=True)
@handled
def append(c: Ctx, each: bool, as_json: bool) -> None:
    """Append JSONL events from stdin: one {"type", "session"?, "data", "id"?} per line.

    Every line is validated and normalized as SessionStore does before anything is appended;
    the whole input is one atomic batch unless --each. Prints the assigned seqs (with --each,
    as each line lands, so a later failure still shows what was appended).
    """
    from eventlog.sessions.inputs import check_sessions, prepare_input  # not at import: `append --help` stays light

    need_stdin("append reads the events from stdin")
    lines = list(_read_events(sys.stdin))
    batch = [prepare_input(obj, f"line {n}") for n, obj in lines]
    seqs: list[int] = []
    titled = any(_titled(ev) for ev in batch)
    # Titles are unique in a profile: the store checks them on its read model, under its rules lock.
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(c.open_store(create=True)) if titled else None
        log = store.log if store is not None else stack.enter_context(c.open_log(create=True))
        if store is not None:  # the store writes its catalogue's current versions: v is its to set
            def write(events: list[dict[str, Any]]) -> list[int]:
                assert store is not None
                return store.append_events([{k: v for k, v in e.items() if k != "v"} for e in events])
        else:
            write = log.append
        check_sessions(log, [f"line {n}" for n, _ in lines], batch)
        numbers = [n for n, _ in lines]
        unnamed = write

        def write(events: list[dict[str, Any]]) -> list[int]:  # a title conflict names its line, as every refusal
            try:
                return unnamed(events)
            except TitleConflictError as e:
                _name_title_line(e, events, numbers[len(seqs):] if each else numbers)
                raise
        if store is not None:  # a title another session holds: the hint names a free one, not a Python API
            stack.enter_context(free_title_hint(store, [ev["data"]["title"] for ev in batch if _titled(ev)]))
        if each:
            for ev in batch:
                try:
                    got = write([ev])
                except EventLogError:
                    if as_json and seqs:  # what landed before the failure, as the text form shows it
                        report_json({"seqs": seqs})
                    raise
                seqs.extend(got)
                if not as_json:
                    report(str(got[0]))
            if not as_json:
                return
        else:
            seqs = write(batch)
    if as_json:
        report_json({"seqs": seqs})
    elif seqs:
        report("\n".join(str(s) for s in seqs))


