"""A damaged log, once found, is known to every process: the damage marker.

The chain is checked by ``verify`` (every event) and by the projections as they read (each
event they apply, see ``projections.verified``). What they find — the first seq whose bytes,
order or presence do not match — is recorded in ``damaged.json`` beside the log's files, never
inside the log (no repair ever writes the log). While the marker names a seq that is still
bad, appends refuse with :class:`~eventlog.errors.IntegrityError` (new events on a broken
chain would only hide it), every read says the projections stop before that seq, and
``doctor`` reports it. The marker is removed once the chain at that seq checks out again (the
log restored from a backup): by the next append, ``log verify`` or ``doctor``.

Only logs with a local directory (LMDB) keep a marker; for the others the projections still
stop at the bad seq and say so, in the process that found it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import orjson

from eventlog.errors import EventLogError, IntegrityError
from eventlog.log import codec

MARKER = "damaged.json"
REPAIR_HINT = ("the events before it are intact: restore the profile's log/ from a backup, or copy its "
               "verified prefix into a new profile (`eventlog export` stops at the damage; "
               "`eventlog --profile NEW import FILE`)")
SERVER_REPAIR_HINT = ("stop the writers, then restore the profile's schema from a backup of the database, or copy "
                      "its verified prefix into a new profile (`eventlog export` stops at the damage; "
                      "`eventlog --profile NEW import FILE`)")
"""For a log on a server (PostgreSQL): no marker refuses appends meanwhile (docs/POSTGRES.md)."""


@dataclass(frozen=True)
class Damage:
    """The first seq of a log that fails the chain check, and why."""

    seq: int
    reason: str
    file: tuple[int, ...] | None = None
    """For a damage found by a read that killed the process (liblmdb aborts on a damaged page):
    the data file as it was then (:func:`file_stamp`). While the file is the same, the damage is
    taken as still there without reading it again: that read would kill the reader."""

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "reason": self.reason}

    def error_reading(self) -> IntegrityError:
        """The error a reader that met this damage raises (after what came before it)."""
        return IntegrityError(f"the log is damaged at seq {self.seq}: {self.reason}",
                              hint="run `eventlog log verify`; " + REPAIR_HINT)

    def error(self, action: str = "") -> IntegrityError:
        """The error an append (``action``) on this log raises."""
        what = f"{action}: " if action else ""
        return IntegrityError(f"{what}the log is damaged at seq {self.seq} ({self.reason}); nothing was written",
                              hint=REPAIR_HINT)


def is_damage(log: Any, error: BaseException) -> bool:
    """Whether ``error``, raised reading ``log``'s events, says the stored events are damaged:
    an :class:`IntegrityError` (an event that does not decode), or any storage error of a log
    in local files (a corrupted LMDB page reads as one). A log on a server (no local path)
    raises :class:`~eventlog.errors.StorageError` when the server is out of reach or refuses
    the read (a revoked privilege, a statement timeout): the events may be intact, so that is
    an error to report, never a damage to stop at (it made a read answer with an empty
    projection, rebuilt as if it belonged to another log)."""
    if isinstance(error, IntegrityError):
        return True
    return isinstance(error, EventLogError) and getattr(log, "path", None) is not None


def check_event(raw: bytes | None, seq: int, prev: str) -> tuple[dict[str, Any] | None, str | None]:
    """``(envelope, None)`` when the stored bytes ``raw`` (canonical, as ``read(raw=True)``
    gives them) are event ``seq`` chained after ``prev``; else ``(envelope or None, reason)``.
    The same judgement as ``verify``'s, without re-encoding the envelope twice."""
    if raw is None:
        return None, f"event {seq} is missing"
    env, reason = codec.decode_in_place(raw, seq, prev)
    if env is None or reason is not None:
        return env, reason
    if codec.is_stub(env):  # an erased event: its place and form only (verify checks the erase names it)
        return codec.check_stored(raw, seq, prev)
    claimed = env.get("hash")
    try:
        if not codec.same_canonical(codec.canonical(env), raw):
            return env, "stored bytes are not the canonical encoding of the event"
    except orjson.JSONEncodeError as e:
        return env, f"event does not re-encode ({e})"
    if not isinstance(claimed, str):
        return env, "hash is missing"
    try:
        actual = codec.hash_without(bytes(raw), claimed, prev)
    except ValueError:
        return env, "prev is not a hex sha256"
    if actual != claimed:
        return env, "hash does not match the event's bytes"
    return env, None


def _checked(stored: Iterator[tuple[int, bytes]], prev: str
             ) -> Iterator[tuple[int, bytes, dict[str, Any] | None, str | None]]:
    """``(seq, canonical bytes, envelope, reason)`` of ``read(raw=True)``'s events checked
    against the chain from ``prev``, ending after the first that fails (the caller checks
    that the seqs follow each other)."""
    for seq, raw in stored:
        raw = bytes(raw)
        env, reason = check_event(raw, seq, prev)
        yield seq, raw, env, reason
        if reason is not None or env is None:
            return
        prev = env["hash"]


class Verified:
    """The stored events ``from_seq..to_seq`` of ``log`` (``(seq, canonical bytes, envelope)``),
    each checked against the chain as it is read: its seq follows the previous one (a deleted
    event is a gap), its bytes decode and are canonical, its ``prev`` is the previous event's
    hash and its hash is recomputed from its bytes. Iteration stops at the first event that
    fails; then :attr:`damage` says where and why, and (``record``) the damage is recorded for
    every process. ``to_seq``: the log head as of the first read when None. ``prev``: the hash
    of event ``from_seq - 1`` (read from the log when None). ``raw=False``: the caller uses the
    envelopes only; a log with ``read_checked`` (LMDB) then checks each event as it decodes it,
    without building its canonical bytes, and the bytes yielded are empty. A damage recorded
    earlier (:func:`recorded`, still there) ends the range before its seq: the events after it
    chain onto one that fails, so a read starting past it does not pass them as intact."""

    def __init__(self, log: Any, from_seq: int = 1, to_seq: int | None = None, prev: str | None = None, *,
                 record: bool = True, raw: bool = True) -> None:
        self.log = log
        self.from_seq = max(1, from_seq)
        self.to_seq = to_seq
        self.prev = prev
        self.record = record
        self.raw = raw
        self.damage: Damage | None = None

    def __iter__(self) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
        to_seq = self.log.head()[0] if self.to_seq is None else self.to_seq
        expect = self.from_seq
        if expect > to_seq:
            return
        # A damage recorded at or before the range: what follows it chains onto an event that
        # fails, so none of it is verified (read from a later seq it would look intact).
        known = recorded(self.log)
        if known is not None and 1 <= known.seq <= to_seq and still_damaged(self.log, known):
            if expect >= known.seq:
                self.damage = known
                return
            to_seq = known.seq - 1
        else:
            known = None
        try:
            prev = self.prev if self.prev is not None else self._hash_before(expect)
            if prev is None:
                self._stop(expect - 1, f"event {expect - 1} is missing or damaged")
                return
            read_checked = None if self.raw else getattr(self.log, "read_checked", None)
            checked = (read_checked(expect, to_seq, prev) if read_checked is not None  # the log checks as it decodes
                       else _checked(self.log.read(expect, to_seq, raw=True), prev))
            for seq, raw, env, reason in checked:
                if seq != expect:
                    self._stop(expect, f"event {expect} is missing (next stored seq is {seq})")
                    return
                if reason is not None or env is None:
                    self._stop(seq, reason or "unreadable event")
                    return
                expect += 1
                yield seq, raw, env
        except EventLogError as e:  # a backend that refuses to hand out a damaged event
            if not is_damage(self.log, e):
                raise
            self._stop(expect, str(e))
            return
        if known is not None and expect > to_seq:
            self.damage = known
            return
        if expect <= to_seq:
            self._stop(expect, f"event {expect} is missing (the log's head is {to_seq})")

    def _hash_before(self, seq: int) -> str | None:
        if seq <= 1:
            return codec.ZERO_HASH
        found = list(self.log.read(seq - 1, seq - 1, raw=True))
        if not found or found[0][0] != seq - 1:
            return None
        try:
            h = codec.decode(found[0][1]).get("hash")
        except ValueError:
            return None
        return h if isinstance(h, str) else None

    def _stop(self, seq: int, reason: str) -> None:
        self.damage = Damage(seq, reason)
        if self.record:
            record(self.log, self.damage)


def marker_path(log: Any) -> Path | None:
    path = getattr(log, "path", None)
    return Path(path) / MARKER if path is not None else None


def recorded(log: Any) -> Damage | None:
    """The damage recorded for ``log`` (a :class:`Log` with a local ``path``, or that path)."""
    marker = getattr(log, "_damage_marker", None)  # a log caches where its marker would be
    if marker is None:
        where = log if isinstance(log, (str, os.PathLike)) else getattr(log, "path", None)
        if where is None:
            return None
        marker = os.path.join(os.fspath(where), MARKER)
    # Every append asks (there is almost never a marker): a plain os.open, no Path objects.
    try:
        fd = os.open(marker, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.read(fd, 1 << 16)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        obj = orjson.loads(raw)
        stamp = obj.get("file")
        file = tuple(int(x) for x in stamp) if isinstance(stamp, list) else None
        return Damage(int(obj["seq"]), str(obj["reason"]), file)
    except (ValueError, KeyError, TypeError, AttributeError):
        return Damage(0, "the damage marker itself is unreadable")


def record(log: Any, damage: Damage) -> None:
    """Record ``damage`` for ``log`` (an earlier seq wins, and at the same seq the record that
    keeps a data file's stamp; nothing happens without a local path, or when the directory
    cannot be written — the finder still reports it)."""
    marker = marker_path(log)
    if marker is None:
        return
    old = recorded(log)
    if old is not None and 0 < old.seq <= damage.seq and not (old.seq == damage.seq and old.file is None
                                                               and damage.file is not None):
        return
    from eventlog.profiles import atomic_write

    content = damage.to_dict()
    if damage.file is not None:
        content["file"] = list(damage.file)
    try:
        with atomic_write(marker) as fp:
            fp.write(orjson.dumps(content))
    except OSError:
        pass


def clear(log: Any) -> None:
    marker = marker_path(log)
    if marker is not None:
        try:
            os.unlink(marker)
        except OSError:
            pass


def file_stamp(log: Any) -> tuple[int, ...] | None:
    """What tells one data file of ``log`` from another (device, inode, size, modification time
    of an LMDB log's ``data.mdb``); None for a log without one."""
    where = getattr(log, "env_dir", None)
    return None if where is None else data_stamp(where)


def data_stamp(env_dir: Any) -> tuple[int, ...] | None:
    """(device, inode, size, modification time) of ``env_dir/data.mdb`` (a stat: never an open of
    the live file), None when there is none."""
    try:
        st = os.stat(os.path.join(os.fspath(env_dir), "data.mdb"))
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def still_damaged(log: Any, damage: Damage) -> bool:
    """Whether the recorded damage is still there: event ``seq`` checked against event
    ``seq - 1`` (two reads). A marker naming no seq is kept (``verify`` decides); so is one
    whose read killed the process while the data file is the one it was found in (it is read
    again only once the file was replaced, e.g. restored from a backup)."""
    if damage.seq < 1:
        return True
    if damage.file is not None and file_stamp(log) in (damage.file, None):
        return True
    prev = codec.ZERO_HASH
    if damage.seq > 1:
        before = list(log.read(damage.seq - 1, damage.seq - 1, raw=True))
        if not before:
            return True
        try:
            prev = codec.decode(before[0][1])["hash"]
        except (ValueError, KeyError):
            return True
    found = list(log.read(damage.seq, damage.seq, raw=True))
    if not found or found[0][0] != damage.seq:
        return bool(damage.seq <= log.head()[0])
    _, reason = check_event(bytes(found[0][1]), damage.seq, str(prev))
    return reason is not None


def refuse_if_damaged(log: Any, action: str) -> None:
    """Raise the recorded damage's :class:`IntegrityError` if it is still there; forget it if
    the chain at that seq checks out again."""
    damage = recorded(log)
    if damage is None:
        return
    if still_damaged(log, damage):
        raise damage.error(action)
    clear(log)
