"""The log as JSONL: one stored envelope per line, hashes included (the audit format).

Export writes the stored bytes verbatim. Import reads such a file back:

* into an empty profile (or one whose log is a prefix of the file), the events are written
  verbatim, so seqs, timestamps and hashes are identical and ``log verify`` reports the same
  head hash (as their canonical bytes, which the hashes cover: an export re-serialised on the
  way — key order, spacing, escapes — is restored the same). They go in as one
  ``append_sealed`` call, one transaction under the log's writer lock: another process's events
  come before all of the file (refused, :class:`ConflictError`, nothing written) or after it. A
  file given with ``again`` (``eventlog import FILE``; not a pipe) is read twice, a line at a
  time, so a multi-GB export needs bounded memory;
* into a profile with other history, or when the file is not one whole chain from seq 1 (a
  session's export), the file's events are appended as new events (new seqs and hashes, same
  ids, types, sessions and data); ids already present with the same content are skipped, and
  an id present with different content refuses the whole import. A line that carries a hash
  must still match it (its own ``prev`` and content): a line changed after the export refuses
  the whole import (:class:`IntegrityError` naming the line), so tampering is never laundered
  into fresh hashes, and neither is a line of an export whose hash was removed (one with a
  seq or prev, or in a file whose other lines carry hashes). Seqs that events name (a
  rewind's or reaction's ``message_id``, a usage record's, the ``up_to`` of
  ``reactions.seen``) are renumbered to the new seqs of the events the file carried there, so
  the imported sessions read as they did at the source; so do their times (a message's
  ``timestamp``, a session's ``started_at`` and ``ended_at`` are written from the source
  event's time when the event left them to it). Such lines are checked as ``eventlog
  append`` checks input (catalogue types and fields, sessions that exist; a reaction or rewind
  must name a message the file carries): a line's hash vouches for its bytes, not that
  eventlog wrote them. A file of plain events (no seq, prev
  or hash on any line) claims nothing: it is checked as ``eventlog append`` checks its input
  (the catalogue, sessions that exist), and its seqs name the target log's own. Erased events
  (stubs, no data) and the log's own records are not appended anew: they belong to the chain
  they were written in (a verbatim import keeps them). A file given with ``again`` is read
  once for each of these checks and once more to append, a line at a time, each reading
  checked against a digest of the first's lines: bounded memory here too.
"""
from __future__ import annotations

import bisect
import hashlib
import heapq
import itertools
import os
from dataclasses import asdict, dataclass
from typing import IO, Any, Callable, Iterable, Iterator, Literal, Sequence, overload

from eventlog.errors import ConflictError, DuplicateEventError, EventLogError, IntegrityError, ValidationError
from eventlog.log import Log, codec
from eventlog.log.base import VerifyResult, verify_chain
from eventlog.log.damage import Damage, Verified
from eventlog.sessions.events import CURRENT_VERSIONS, EVENT_TIME_FIELDS, MESSAGE_REFERENCES, validate
from eventlog.sessions.inputs import check_sessions, prepare_input, refuse_duplicate_keys, with_lone_surrogates
from eventlog.sessions.rules import event_time
from sqlite_export.errors import converted

CHUNK = 2000
CHUNK_BYTES = 1 << 18  # events appended anew: at most this many bytes of the file per append
Progress = Callable[[int, int], None]
Item = tuple[int, bytes, dict[str, Any]]  # (line number, the line's bytes, its envelope)


def _note_parent(parents: dict[str, str | None], env: dict[str, Any] | None) -> None:
    """Record the parent of a session whose creation ``env`` is (an erased one says nothing)."""
    if env is not None and env.get("type") == "session.created" and isinstance(env.get("data"), dict):
        parent = env["data"].get("parent_session_id")
        if isinstance(env.get("session"), str):
            parents[env["session"]] = parent if isinstance(parent, str) else None


def _lineage(parents: dict[str, str | None], session: str) -> set[str]:
    """``session``'s lineage: its root (parent links followed up to a session created in the
    log) and every session under it. Flags are lineage properties, set by an event of whichever
    member they were set on, and a child's creation names its parent: one member's stream alone
    imports without them, or not at all."""
    root, seen = session, {session}
    while (up := parents.get(root)) is not None and up in parents and up not in seen:
        root = up
        seen.add(root)
    children: dict[str, list[str]] = {}
    for child, parent in parents.items():
        if parent is not None:
            children.setdefault(parent, []).append(child)
    members, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in members:
                members.add(child)
                todo.append(child)
    return members


@overload
def export_jsonl(log: Log, out: IO[bytes], *, session: str | None = None, progress: Progress | None = None,
                 verified: Literal[False] = False) -> int: ...


@overload
def export_jsonl(log: Log, out: IO[bytes], *, session: str | None = None, progress: Progress | None = None,
                 verified: Literal[True]) -> tuple[int, Damage | None]: ...


def export_jsonl(log: Log, out: IO[bytes], *, session: str | None = None, progress: Progress | None = None,
                 verified: bool = False) -> int | tuple[int, Damage | None]:
    """Write the log (or one session's events: those of its lineage, the root and every session
    under it, so that the flags set through another member and the parents come along) to
    ``out``; returns the number of events.

    ``verified``: check the whole log's chain as it is written and stop before the first
    event that fails (a salvageable prefix); returns ``(events written, the damage or None)``.
    A session's events are written when the whole log verifies."""
    total = log.head()[0]
    n = 0
    damage: Damage | None = None
    try:
        if session is None and verified:
            checked = Verified(log, 1, total)
            for seq, raw, _env in checked:
                out.write(raw + b"\n")
                n += 1
                if progress and n % CHUNK == 0:
                    progress(seq, total)
            damage = checked.damage
        elif session is None:
            for seq, raw in log.read(1, raw=True):
                out.write(bytes(raw) + b"\n")
                n += 1
                if progress and n % CHUNK == 0:
                    progress(seq, total)
        else:
            parents: dict[str, str | None] = {}
            if verified:
                checked = Verified(log, 1, total)
                for _seq, _raw, env in checked:
                    _note_parent(parents, env)
                damage = checked.damage
            else:
                for env in log.read(1):
                    _note_parent(parents, env)
            if damage is None:
                members = _lineage(parents, session)
                streams = [log.read_session(s) for s in sorted(members)]
                for env in heapq.merge(*streams, key=lambda e: e["seq"]):
                    out.write(codec.sealed_bytes(env) + b"\n")
                    n += 1
    except (EventLogError, BrokenPipeError):
        raise  # a reader that went away (`export - | head`) is the caller's to judge: the CLI exits 0
    except (OSError, ValueError) as e:  # the output failed (disk full, closed)
        raise converted(e, "writing the export") from e
    if progress:
        progress(total, total)
    return (n, damage) if verified else n


@dataclass
class ImportResult:
    """What an import did. ``mode`` is ``verbatim`` (same seqs and hashes) or ``appended``."""

    mode: str
    read: int
    imported: int
    already_present: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _parse(lines: Iterable[bytes | str]) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
    for n, raw in _nonblank(lines):
        yield n, raw, _decoded(n, raw)


def _nonblank(lines: Iterable[bytes | str]) -> Iterator[tuple[int, bytes]]:
    """(line number, the line's bytes stripped) of each line that holds something. A UTF-8 byte
    order mark opening the file (as Windows editors save it) is not part of line 1: RFC 8259 lets
    a JSON reader ignore it, and refused it read as "line 1: not a JSON object"."""
    for n, line in enumerate(lines, 1):
        try:
            raw = line.encode() if isinstance(line, str) else bytes(line)
        except UnicodeEncodeError:
            raise ValidationError(f"line {n}", "holds text that is not valid Unicode (a lone surrogate)") from None
        if n == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        raw = raw.strip()
        if raw:
            yield n, raw


def _decoded(n: int, raw: bytes, *, checked: bool = False) -> dict[str, Any]:
    """Line ``n``'s envelope. ``checked``: these bytes passed once already (no wide ints to look for)."""
    try:
        env = codec.decode(raw)
    except ValueError as e:
        env = with_lone_surrogates(raw, e)  # read as `eventlog append` reads it (stored as U+FFFD)
        if not isinstance(env, dict):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as u:  # named as `eventlog append` names it, not orjson's "surrogates"
                raise ValidationError(f"line {n}", f"not valid UTF-8 (byte 0x{raw[u.start]:02x} at character "
                                                   f"{len(raw[:u.start].decode('utf-8')) + 1})") from None
            raise ValidationError(f"line {n}", f"not a JSON object ({e})") from None
    if not checked:
        codec.refuse_wide_ints(raw, f"line {n}")  # orjson read it as a float: refused, not imported changed
    return env


def _stored_form(raw: bytes, env: dict[str, Any]) -> bytes:
    """The bytes the log would store for a line's envelope (its canonical encoding), or the line
    as it is when it has none (a lone surrogate: no chain holds one)."""
    try:
        return codec.sealed_bytes(env)
    except TypeError:  # orjson.JSONEncodeError
        return raw


def _chain(items: list[tuple[int, bytes, dict[str, Any]]]) -> VerifyResult:
    """The file judged as a whole log would be by ``log verify``: seqs gapless from 1, each line
    checked against the chain, and every erased event named by a later ``log.erased`` record
    (a stub forged from a line, hash kept, is caught here)."""
    last = items[-1][2].get("hash") if items else codec.ZERO_HASH
    seqs = ((seq if type(seq := env.get("seq")) is int else -1, raw) for _, raw, env in items)
    return verify_chain(seqs, lambda: (len(items), str(last)))


def _check_chain(items: list[tuple[int, bytes, dict[str, Any]]]) -> bool:
    """True when the file is one intact chain from seq 1 (a whole-log export)."""
    return _chain(items).ok


def _first_break(items: list[tuple[int, bytes, dict[str, Any]]]) -> str:
    """Where the file stops being one intact chain from seq 1 (for :func:`_check_chain`'s False)."""
    return _break_at(_chain(items), items)


def _break_at(res: VerifyResult, items: Iterable[tuple[int, bytes, dict[str, Any]]]) -> str:
    """Where the file whose lines ``items`` are stops being one chain, as ``res`` judged it."""
    seq = res.first_bad_seq or 1
    for k, (n, _, env) in enumerate(items, 1):
        if k == seq:
            if env.get("seq") != seq:
                return f"line {n} holds seq {env.get('seq')!r} where seq {seq} belongs (lines missing or out of order)"
            return f"line {n} (seq {seq}): {res.reason}"
    return str(res.reason)


def _tampered(env: dict[str, Any]) -> str | None:
    """Why a line's own hash does not vouch for it, or None (also for a line that claims no hash,
    and for an erased event, whose content is gone)."""
    claimed = env.get("hash")
    if claimed is None and ("prev" in env or "seq" in env):
        return "it has a place in a chain (seq, prev) but no hash: an exported line whose hash was removed"
    if claimed is None or codec.is_stub(env):
        return None
    prev = env.get("prev")
    if not isinstance(claimed, str) or not isinstance(prev, str):
        return "its hash or prev is not a string"
    try:
        actual = codec.hash_without(codec.sealed_bytes(env), claimed, prev)
    except (ValueError, TypeError):
        return "its prev is not a sha256 hex digest, or it does not re-encode"
    return None if actual == claimed else "its hash does not match its content"


def import_jsonl(log: Log, lines: Iterable[bytes | str], *, progress: Progress | None = None,
                 onto_other_history: bool = True, whole: bool = False,
                 again: Callable[[], Iterable[bytes | str]] | None = None) -> ImportResult:
    """Import exported envelopes into ``log`` (see the module docstring for the two modes).

    ``onto_other_history=False`` refuses the second mode (:class:`ConflictError`, nothing
    written) unless every event of the file is already here (a file imported twice, or the start
    of this log, is a no-op): appending the file's events after other history gives them new seqs and times,
    and the final state can then differ from the exported one (what the CLI does). ``whole``:
    refuse a file that is not one whole, intact chain from seq 1 (:class:`IntegrityError` naming
    the first line out of place, nothing written) — a restore from a whole-log export, where a
    missing line must not pass as a session's export. (A file cut after a whole line is still one
    whole chain: nothing in an export records the head it was taken at; compare the head hash
    that ``log verify`` reports at the source.)

    ``again``: the same lines read anew from the start (a file, not a pipe). The import then
    holds one line at a time, not the file: a whole-log export is checked on one reading and
    written from a second (in one ``append_sealed`` call); a file appended as new events is
    read once for each of its checks and once more to write it, and each reading must find the
    lines the first found (else :class:`IntegrityError`: the file changed). What it keeps of
    the file is a few dozen bytes an event (ids, seqs, a digest of each line)."""
    if again is not None:
        streamed = _verbatim_streamed(log, lines, again, progress)
        if streamed is not None:
            return streamed
        reading = _Rereading(again)  # not a whole chain this log can take verbatim: judged below
        count, res, missing = _scan(reading())
        if count == 0:
            return ImportResult("appended", 0, 0, 0)
        if missing is not None:
            raise missing
        if whole and not res.ok:
            _refuse_not_whole(_break_at(res, reading()))
        return _append_anew(log, reading, count, onto_other_history, progress)
    try:
        items = list(_parse(lines))
    except EventLogError:
        raise
    except (OSError, ValueError) as e:  # the input failed to read
        raise converted(e, "reading the import") from e
    if not items:
        return ImportResult("appended", 0, 0, 0)
    for n, _, env in items:
        _refuse_missing_keys(n, env)
    head, head_hash = log.head()
    # The log stores each envelope's canonical bytes, and a line's hash vouches for exactly
    # those: an export re-serialised on the way (another key order, spacing, escapes) is
    # judged, and restored, in that form.
    canon = [(n, _stored_form(raw, env), env) for n, raw, env in items]
    chain = _check_chain(canon)
    if chain and (head == 0 or (head <= len(items) and items[head - 1][2]["hash"] == head_hash)):
        rest = [raw for _, raw, _ in canon[head:]]
        if rest:
            try:  # one call, one transaction under the log's writer lock: all of the file lands or none
                log.append_sealed(rest)
            except IntegrityError:
                _refuse_if_raced(log, head, str(items[head - 1][2]["hash"]) if head else codec.ZERO_HASH, len(items))
                raise
        if progress:
            progress(len(items), len(items))
        return ImportResult("verbatim", len(items), len(rest), head)
    if chain and head > len(items) and (log.get(len(items)) or {}).get("hash") == items[-1][2]["hash"]:
        return ImportResult("verbatim", len(items), 0, len(items))  # the start of this log: all there
    if whole and not chain:
        _refuse_not_whole(_first_break(canon))
    del canon
    return _append_anew(log, lambda: items, len(items), onto_other_history, progress)


def _refuse_not_whole(where: str) -> None:
    raise IntegrityError(f"the file is not one whole chain from seq 1: {where}; nothing was imported",
                         hint="import an untouched whole-log export (`eventlog export`), or drop --whole "
                              "to append a session's export as new events")


def _append_anew(log: Log, read: Callable[[], Iterable[Item]], count: int, onto_other_history: bool,
                 progress: Progress | None) -> ImportResult:
    """The second mode (new seqs and hashes) for a file of ``count`` lines that ``read`` gives,
    afresh at each call: each check reads the file through, keeping what later ones need of it
    (its ids, the seqs it carries, which lines are new here), and a last reading appends."""
    head = log.head()[0]
    # Another history: check every line's own hash and every id first, so a conflict imports nothing.
    hashed, plain = False, True
    tampered: tuple[int, Any, str] | None = None  # the first line whose own hash does not vouch for it
    unhashed: tuple[int, Any] | None = None  # the first line without a hash
    disorder: IntegrityError | None = None
    last: tuple[int, int] | None = None  # (line, seq) of the last line that carried a seq
    refs = _References(log)
    for n, _, env in read():
        if "hash" in env:
            hashed = True
        elif unhashed is None:
            unhashed = (n, env.get("seq"))
        plain = plain and not any(k in env for k in ("seq", "prev", "hash"))
        if tampered is None and (why := _tampered(env)) is not None:
            tampered = (n, env.get("seq"), why)
        seq = env.get("seq")
        if type(seq) is int:  # an export writes its events in seq order, and appending keeps the file's order
            if disorder is None and last is not None and seq <= last[1]:
                disorder = IntegrityError(
                    f"line {n} holds seq {seq} after seq {last[1]} (line {last[0]}): the lines are out of order; "
                    "nothing was imported",
                    hint="an export's lines are in seq order: import an untouched export, each export on its own")
            last = (n, seq)
        refs.note(env)
    refs.noted()
    if hashed and unhashed is not None and (tampered is None or unhashed[0] < tampered[0]):
        tampered = (*unhashed, "it has no hash where the file's other lines have theirs")  # an export's lines all carry theirs
    if tampered is not None:
        raise IntegrityError(f"line {tampered[0]} (seq {tampered[1]!r}): {tampered[2]}; nothing was imported",
                             hint="the file was changed after it was exported: import an untouched export")
    if disorder is not None:
        raise disorder

    def event_of(n: int, env: dict[str, Any]) -> dict[str, Any]:
        return _plain_event(n, env) if plain else _exported_event(n, env, refs)

    fresh = bytearray(count)  # 1 for each line (by its place in the file) whose event is appended anew
    appended = present = 0
    seen: set[str] = set()
    for k, (n, raw, env) in enumerate(read()):
        if codec.is_stub(env) or str(env["type"]).startswith("log."):
            continue  # an erased event (its content is gone) and the log's own records are not appended anew
        if plain:
            refuse_duplicate_keys(raw, f"line {n}")
        event = event_of(n, env)
        try:
            prepared = codec.prepare(event, n)
        except ValidationError as e:
            raise ValidationError(f"line {n}", e.problem) from None
        if prepared.id in seen:
            raise ValidationError(f"line {n}.id", f"event id {prepared.id!r} appears twice in the file")
        seen.add(prepared.id)
        seq = log.event_seq(prepared.id)
        if seq is None:
            fresh[k] = 1
            appended += 1
            continue
        stored = log.get(seq) or {}
        renumbered = refs.renumbered(event)
        if not prepared.same_content(stored) and not any(  # or as an earlier import appended it
                codec.prepare(form, n).same_content(stored) for form in (renumbered, _source_time(renumbered, env))):
            raise DuplicateEventError(prepared.id, seq)
        present += 1
    del seen
    # A file whose events are all here is a no-op; a log that holds only this file's events is an
    # import of it that stopped part way (killed between chunks), and goes on.
    if appended and not onto_other_history and head > 0 and present < head:
        raise ConflictError("profile", f"already holds {head} events that are not the start of this export",
                            hint="import into a new profile (--profile NEW); appended after other history the "
                                 "events would get new seqs and times")

    def new_events() -> Iterator[tuple[int, dict[str, Any], int]]:
        """(line, event, the line's size) of each line appended anew, as it is appended (before
        renumbering)."""
        for k, (n, raw, env) in enumerate(read()):
            if fresh[k]:
                event = event_of(n, env)
                yield n, event if plain else _source_time(event, env), len(raw)

    # Sessions that exist, as `eventlog append` checks them (the messages an export's events
    # name are the file's own, renumbered: _exported_event checked they are carried).
    # An extension's events (and the log layer's own test types) are left to their extension.
    wheres, ours = itertools.tee((f"line {n}", ev) for n, ev, _ in new_events() if ev["type"] in CURRENT_VERSIONS)
    check_sessions(log, (where for where, _ in wheres), (ev for _, ev in ours), references=plain)
    done = size = 0
    chunk: list[dict[str, Any]] = []

    def flush() -> None:
        nonlocal done, size
        if not chunk:
            return
        seqs = log.append(chunk)
        if len(seqs) != len(chunk):  # pragma: no cover - append returns one seq per event
            raise IntegrityError("import appended a different number of events than it read")
        refs.landed(chunk, seqs)
        done += len(chunk)
        chunk.clear()
        size = 0
        if progress:
            progress(done, appended)

    try:
        for _, event, length in new_events():
            if refs.waits_on(event, chunk):
                flush()  # the event names an event of this chunk by seq: that seq must be known first
            chunk.append(refs.renumbered(event))
            size += length
            if len(chunk) >= CHUNK or size >= CHUNK_BYTES:  # an append holds several copies of its events
                flush()
    except _FileChanged as e:  # the lines read before the change were appended, as by an import killed there
        raise IntegrityError(f"{e.what}; {done} of the {appended} events it appends anew were appended before",
                             hint="import the file again once no other process writes it: the events already "
                                  "appended are found and skipped") from None
    flush()
    return ImportResult("appended", count, appended, present)


class _FileChanged(IntegrityError):
    """A reading of the file found other lines than its first reading (see :class:`_Rereading`)."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what}; nothing was imported", hint="import a file no other process writes")
        self.what = what


class _Rereading:
    """A file's parsed lines, read anew at each call. The first reading keeps a keyed digest of
    each line (8 bytes); every later one checks its lines against them before it gives them, so
    each check of the import, and its write, sees the lines that the first reading found, or
    raises :class:`_FileChanged` at the first that differs (or at its end, when lines are
    missing)."""

    def __init__(self, again: Callable[[], Iterable[bytes | str]]) -> None:
        self.again = again
        self.key = os.urandom(16)
        self.digests: bytearray | None = None

    def _digest(self, n: int, raw: bytes) -> bytes:
        return hashlib.blake2b(raw, digest_size=8, key=self.key, salt=n.to_bytes(16, "big")).digest()

    def __call__(self) -> Iterator[Item]:
        if self.digests is None:
            self.digests = bytearray()
            for n, raw, env in _read(self.again()):
                self.digests += self._digest(n, raw)
                yield n, raw, env
            return
        k = 0
        try:
            for n, raw in _nonblank(self.again()):
                if 8 * k >= len(self.digests):
                    raise _FileChanged(f"the file changed while it was imported (it grew: line {n} is past the "
                                       f"{k} lines its first reading found)")
                if self.digests[8 * k:8 * k + 8] != self._digest(n, raw):
                    raise _FileChanged(f"the file changed while it was imported (line {n} is not what its first "
                                       "reading found)")
                k += 1
                yield n, raw, _decoded(n, raw, checked=True)
        except EventLogError:
            raise
        except (OSError, ValueError) as e:  # the input failed to read
            raise converted(e, "reading the import") from e
        if 8 * k != len(self.digests):
            raise _FileChanged(f"the file changed while it was imported ({k} lines where the first reading found "
                               f"{len(self.digests) // 8})")


def _scan(items: Iterable[Item]) -> tuple[int, VerifyResult, ValidationError | None]:
    """Of a file read through: its number of lines, the file judged as a whole log (see
    :func:`_chain`), and the first line's missing key (:func:`_refuse_missing_keys`), if any."""
    count, last = 0, codec.ZERO_HASH
    missing: ValidationError | None = None

    def stored() -> Iterator[tuple[int, bytes]]:
        nonlocal count, last, missing
        for n, raw, env in items:
            if missing is None:
                try:
                    _refuse_missing_keys(n, env)
                except ValidationError as e:
                    missing = e
            count += 1
            last = str(env.get("hash"))
            seq = env.get("seq")
            yield (seq if type(seq) is int else -1), _stored_form(raw, env)

    lines = stored()
    res = verify_chain(lines, lambda: (count, last))
    for _ in lines:  # the rest of the file, after the first break
        pass
    return count, res, missing


def _refuse_missing_keys(n: int, env: dict[str, Any]) -> None:
    for key in ("type", "id") if codec.is_stub(env) else ("type", "data", "id"):  # an erased event has no data
        if key not in env:
            raise ValidationError(f"line {n}.{key}", "missing from the envelope",
                                  hint="an import needs each event's id, so that importing the file again "
                                       "finds what it wrote; `eventlog append` takes events without one"
                                  if key == "id" else None)


def _read(lines: Iterable[bytes | str]) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
    """:func:`_parse`, with a failed read (an OSError) as the import's error."""
    try:
        yield from _parse(lines)
    except EventLogError:
        raise
    except (OSError, ValueError) as e:  # the input failed to read
        raise converted(e, "reading the import") from e


def _verbatim_streamed(log: Log, lines: Iterable[bytes | str], again: Callable[[], Iterable[bytes | str]],
                       progress: Progress | None) -> ImportResult | None:
    """A verbatim import of a file read twice (see :func:`import_jsonl`'s ``again``), or None
    when the file is not one whole chain that continues this log (nothing written: the caller
    judges it whole). Holds one line at a time."""
    head, head_hash = log.head()
    count, last, at_head = 0, codec.ZERO_HASH, codec.ZERO_HASH

    def chain() -> Iterator[tuple[int, bytes]]:
        nonlocal count, last, at_head
        for n, raw, env in _read(lines):
            _refuse_missing_keys(n, env)
            count += 1
            last = str(env.get("hash"))
            if count == head:
                at_head = last
            seq = env.get("seq")
            yield (seq if type(seq) is int else -1), _stored_form(raw, env)

    if not verify_chain(chain(), lambda: (count, last)).ok:
        return None
    if count == 0:
        return ImportResult("appended", 0, 0, 0)
    if head > count:
        if (log.get(count) or {}).get("hash") == last:
            return ImportResult("verbatim", count, 0, count)  # the start of this log: all there
        return None
    if head and at_head != head_hash:
        return None
    rest = _SealedLines(again, head, count - head, last)
    if len(rest):
        try:  # one call, one transaction under the log's writer lock: all of the file lands or none
            log.append_sealed(rest)
        except IntegrityError:
            _refuse_if_raced(log, head, at_head, count)
            raise
    if progress:
        progress(count, count)
    return ImportResult("verbatim", count, len(rest), head)


class _SealedLines(Sequence[bytes]):
    """The stored form of a file's lines after its first ``skip``, read anew from the file each
    time it is iterated (a log's ``append_sealed`` may retry): one line in memory at a time. A
    file that no longer holds the ``count`` lines ending in ``last`` that its first reading
    checked raises :class:`IntegrityError` at its end, so the write it feeds is not committed."""

    def __init__(self, again: Callable[[], Iterable[bytes | str]], skip: int, count: int, last: str) -> None:
        self.again, self.skip, self.total, self.last = again, skip, count, last

    def __len__(self) -> int:
        return self.total

    @overload
    def __getitem__(self, i: int) -> bytes: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[bytes]: ...

    def __getitem__(self, i: int | slice) -> bytes | Sequence[bytes]:
        return list(self)[i]  # not used by the logs (they iterate); here for the Sequence protocol

    def __iter__(self) -> Iterator[bytes]:
        n, last = 0, None
        for i, (_, raw, env) in enumerate(_read(self.again())):
            if i < self.skip:
                continue
            n, last = n + 1, env.get("hash")
            yield _stored_form(raw, env)
        if n != self.total or last != self.last:
            raise IntegrityError(f"the file changed while it was imported ({self.skip + n} lines where the first "
                                 f"reading found {self.skip + self.total}); nothing was imported",
                                 hint="import a file no other process writes")


def _refuse_if_raced(log: Log, written: int, last_hash: str, total: int) -> None:
    """Raise :class:`ConflictError` when a verbatim import's chunk did not continue the log because
    another process appended to it since the import's last chunk (the log's head is no longer the
    file's event at seq ``written``, whose hash is ``last_hash``): the log is whole, the file
    cannot continue it."""
    seq, head_hash = log.head()
    if seq == written and head_hash == last_hash:
        return  # the head is where the import left it: the chunk itself did not fit
    done = f"the log held the file's first {written} events before it, and nothing more of the file was " \
        "imported" if written else "nothing was imported"
    raise ConflictError("profile", f"another process appended to the profile during the import ({seq} events now); "
                        f"the file's {total} events cannot continue its log: {done}",
                        hint="import into a new profile that no other process writes (--profile NEW)")


def _plain_event(n: int, env: dict[str, Any]) -> dict[str, Any]:
    """A line of a plain-events file (no seq, prev or hash: it claims nothing), validated and
    normalised against the catalogue as `eventlog append` does (errors name ``line n``)."""
    v, etype = env.get("v"), env.get("type")
    if v is not None and type(etype) is str and (type(v) is not int or v != CURRENT_VERSIONS.get(etype)):
        raise ValidationError(f"line {n}.v", f"version {v!r} is not the version this program writes for "
                              f"{env.get('type')!r}", hint="leave v out: a plain event is written at the current version")
    return prepare_input({k: val for k, val in env.items() if k != "v"}, f"line {n}")


_CATALOGUE_NAMESPACES = frozenset(t.split(".", 1)[0] for t in CURRENT_VERSIONS)


def _exported_event(n: int, env: dict[str, Any], refs: "_References") -> dict[str, Any]:
    """A line of an export appended as a new event: its own hash vouches only for its bytes, not
    that eventlog wrote it, so it is checked as `eventlog append` checks input — a catalogue
    type at the current version against its fields, an unknown type of the catalogue's
    namespaces refused (an extension's events pass: their checks belong to the extension) —
    and a reaction or rewind must name a message the file carries (it is renumbered to it)."""
    etype, data, v = env["type"], env["data"], env.get("v", 1)
    if type(etype) is not str:
        raise ValidationError(f"line {n}.type", "must be a text")
    if etype in CURRENT_VERSIONS:
        if v == CURRENT_VERSIONS[etype]:
            try:
                validate(etype, data, env.get("session"))
            except ValidationError as e:
                raise ValidationError(f"line {n}.{e.field}", e.problem, hint=e.hint) from None
    elif etype.split(".", 1)[0] in _CATALOGUE_NAMESPACES:
        raise ValidationError(f"line {n}.type", f"unknown event type {etype!r}", hint="see docs/EVENTS.md for the catalogue")
    if etype in MESSAGE_REFERENCES and refs.ids and isinstance(data, dict) and data.get("message_id") not in refs.ids:
        raise ValidationError(f"line {n}.data.message_id", f"names seq {data.get('message_id')!r}, which the file "
                              "does not carry: it would name another event here",
                              hint="export the whole session (or the whole log)")
    return {"type": etype, "session": env.get("session"), "data": data, "id": env["id"], "v": v}


def _source_time(event: dict[str, Any], env: dict[str, Any]) -> dict[str, Any]:
    """``event`` with its source's time written into the field that would otherwise read as the
    new event's own (:data:`EVENT_TIME_FIELDS`): appended anew, a message keeps its timestamp
    and a session its start and end, though the envelopes get new times."""
    field = EVENT_TIME_FIELDS.get(event["type"])
    data = event["data"]
    if field is None or event["v"] != CURRENT_VERSIONS[event["type"]] or not isinstance(data, dict) \
            or data.get(field) is not None:
        return event
    at = event_time(env.get("ts"))
    return event if at is None else {**event, "data": {**data, field: at}}


class _References:
    """Appended events get new seqs, so the seqs that events name — a reaction's or rewind's
    ``message_id``, a usage record's ``message_id``, the ``up_to`` of ``reactions.seen`` —
    are renumbered to the new seqs of the events the file carried at those seqs (an export's
    lines carry their seq). A seq the file does not carry is left as it is; a plain-events file
    names the target log's own seqs."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.ids: dict[int, str] = {}  # file seq -> event id, of the events appended or present
        self.order: list[int] = []
        self.new: dict[str, int] = {}  # event id -> its seq in this log

    def note(self, env: dict[str, Any]) -> None:
        """Take in one line of the file (each, in order, then :meth:`noted`)."""
        seq = env.get("seq")
        if type(seq) is int and not codec.is_stub(env) and not str(env.get("type")).startswith("log.") \
                and isinstance(env.get("id"), str):
            self.ids[seq] = env["id"]

    def noted(self) -> None:
        self.order = sorted(self.ids)

    def _target(self, event: dict[str, Any]) -> tuple[str, int] | None:
        """The field of ``event`` that names a seq, and the file seq it names (None: none)."""
        data = event.get("data")
        if not isinstance(data, dict) or not self.ids:
            return None
        key = "up_to" if event.get("type") == "reactions.seen" else "message_id" \
            if event.get("type") in _SEQ_NAMING else None
        value = data.get(key) if key else None
        return (key, value) if key and type(value) is int else None

    def _id_at(self, key: str, seq: int) -> str | None:
        if key == "up_to":  # the last event the file carried at or before it
            at = bisect.bisect_right(self.order, seq)
            return self.ids[self.order[at - 1]] if at else None
        return self.ids.get(seq)

    def _seq_of(self, eid: str) -> int | None:
        if eid not in self.new:
            seq = self.log.event_seq(eid)
            if seq is None:
                return None
            self.new[eid] = seq
        return self.new[eid]

    def waits_on(self, event: dict[str, Any], chunk: list[dict[str, Any]]) -> bool:
        """Whether ``event`` names an event of ``chunk`` (not appended yet)."""
        target = self._target(event)
        eid = self._id_at(*target) if target else None
        return eid is not None and eid not in self.new and any(e.get("id") == eid for e in chunk)

    def renumbered(self, event: dict[str, Any]) -> dict[str, Any]:
        target = self._target(event)
        eid = self._id_at(*target) if target else None
        seq = self._seq_of(eid) if eid is not None else None
        if target is None:
            return event
        if seq is None:  # up_to before every carried event: nothing of the file is seen
            if target[0] == "message_id" and eid is None and event.get("type") == "usage.recorded":
                # a usage record's message the file does not carry (another session's): the
                # seq would name another event here, so the record keeps no message
                return {**event, "data": {k: val for k, val in event["data"].items() if k != "message_id"}}
            if target[0] != "up_to" or eid is not None:
                return event
            seq = 0
        return {**event, "data": {**event["data"], target[0]: seq}}

    def landed(self, chunk: list[dict[str, Any]], seqs: list[int]) -> None:
        for event, seq in zip(chunk, seqs):
            self.new[event["id"]] = seq


_SEQ_NAMING = MESSAGE_REFERENCES | {"usage.recorded"}
