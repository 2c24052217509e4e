"""Copy a log to another log, of any backend, keeping every seq and hash (moving in and out of
PostgreSQL, or back to LMDB)."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

from eventlog.errors import IntegrityError
from eventlog.log.base import Log, VerifyResult

COPY_BATCH_EVENTS = 1000
COPY_BATCH_BYTES = 8 << 20


@dataclass(frozen=True)
class CopyResult:
    """What :func:`copy_log` did: ``copied`` events appended to the target after ``skipped`` it
    already held; the target's head afterwards, and its verification."""

    copied: int
    skipped: int
    head_seq: int
    head_hash: str
    verify: VerifyResult

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["verify"] = self.verify.to_dict()
        return out


def copy_log(source: Log, target: Log, *, progress: Callable[[int, int], None] | None = None) -> CopyResult:
    """Append ``source``'s events to ``target`` verbatim (``append_sealed``: same seqs, ids,
    timestamps and hashes) up to the source head as of the call, then verify the target.

    The target must be empty or hold a prefix of the source (an interrupted copy resumes where
    it stopped). Raises :class:`IntegrityError` when it holds anything else, when the source
    does not verify while being copied, or when the target does not verify afterwards; what
    was appended before such a failure stays (it is a verified prefix of the source).
    ``progress(done, total)`` is called after each batch.
    """
    end_seq, end_hash = source.head()
    start, start_hash = target.head()
    if start > end_seq:
        raise IntegrityError(f"the target holds {start} events, more than the source's {end_seq}",
                             hint="copy into an empty log")
    if start:
        env = source.get(start)
        if env is None or env.get("hash") != start_hash:
            raise IntegrityError(f"the target's event {start} is not the source's: it holds another log",
                                 hint="copy into an empty log")
    done = 0
    batch: list[bytes] = []
    size = 0

    def flush() -> None:
        nonlocal done, batch, size
        if batch:
            try:
                target.append_sealed(batch)  # checks that each event continues the chain
            except IntegrityError as e:
                moved = _moved(target, start + done)
                if moved is None:
                    raise
                raise IntegrityError(
                    f"the target log moved during the copy: it holds {moved} events where the copy had brought it "
                    f"to {start + done}; another process appended to it, so this batch was not written",
                    hint="stop every writer of the target profile and copy into an empty log (what was copied before "
                         "stays: a verified prefix of the source)") from e
            done += len(batch)
            batch, size = [], 0
            if progress is not None:
                progress(done, end_seq - start)

    for _seq, raw in source.read(start + 1, end_seq, raw=True):
        batch.append(bytes(raw))
        size += len(raw)
        if len(batch) >= COPY_BATCH_EVENTS or size >= COPY_BATCH_BYTES:
            flush()
    flush()
    res = target.verify()
    head = target.head()
    if not res.ok or head[0] < end_seq or (head[0] == end_seq and head[1] != end_hash):
        raise IntegrityError(f"the copy does not verify: {res.reason or 'head differs from the source'} "
                             f"(first bad seq {res.first_bad_seq})")
    return CopyResult(done, start, head[0], head[1], res)


def _moved(target: Log, expected: int) -> int | None:
    """The target's head seq when it is not ``expected`` (another writer appended to the target
    since the copy read it: an import then fails the chain check, which is no damage), else None."""
    try:
        now = target.head()[0]
    except Exception:  # noqa: BLE001 -- the chain-check error is the one to report then
        return None
    return now if now != expected else None
