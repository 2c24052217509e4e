"""The floor: what the hardware and LMDB cost with nothing of ours on top.

* ``lmdb_single``  - a bare loop of synced LMDB puts, one put + commit per event.
* ``lmdb_threads8`` - the same from 8 threads (LMDB's writer mutex serialises them;
  there is no group commit here, so this is what naive concurrency gets).
* ``lmdb_batch100`` - one commit per batch (same batches as the batch contenders).
* ``lmdb_group8``  - one thread, one synced commit per 8 consecutive events: the ceiling of
  any group commit that serves 8 callers with one event each (8 events per sync, no thread
  hand-offs, no Python of ours). Eight callers that each wait for their own event to be
  durable can never exceed it, so ``lmdb_group8 / eventlog.log_bare`` bounds the 8-thread
  speed-up any implementation could show on this machine.
* ``lmdb4_group8`` - the same on eventlog's four B-trees (events, ids, streams, meta).
* ``lmdb4_single`` - one event per synced commit on those four B-trees: the layout's own
  cost for a single append, beside ``lmdb_single``.
* ``file_fsync``   - append a length-prefixed record to a plain file + fsync, per event.

Each value is the orjson encoding of an envelope-shaped event built from the
workload message (seq, id, ts, type, v, session, data, 64-hex prev and hash), so
the bytes per event match what eventlog stores; the encoding happens before the
clock starts.  Keys are 8-byte big-endian sequence numbers put with
``append=True`` (whose result is checked).
"""
from __future__ import annotations

import os
import struct
import time
from pathlib import Path
from typing import Any, Iterator

import lmdb
import orjson

from bench.common import drive_single, drive_threads, make_result, perf, scale_record

MAP_SIZE = 32 << 30  # address space only; the file is sparse
_KEY = struct.Struct(">Q")
_FAKE_HASH = "9f" * 32


def envelope_bytes(seq: int, m: dict[str, Any]) -> bytes:
    data = {k: v for k, v in m.items() if k != "session_id" and v is not None}
    return orjson.dumps({
        "seq": seq,
        "id": f"{seq:026d}",
        "ts": time.time_ns(),
        "type": "message.appended",
        "v": 2,
        "session": m["session_id"],
        "data": data,
        "prev": _FAKE_HASH,
        "hash": _FAKE_HASH,
    })


def _encoded_chunks(workload: Any, chunk: int, start: int = 0, stop: int | None = None) -> Iterator[list[tuple[str, bytes]]]:
    seq = start
    for msgs in workload.chunks(chunk, start, stop):
        out = []
        for m in msgs:
            seq += 1
            out.append((m["session_id"], envelope_bytes(seq, m)))
        yield out


def open_env(dir: str) -> lmdb.Environment:
    return lmdb.open(str(Path(dir) / "log"), map_size=MAP_SIZE, sync=True, metasync=True,
                     subdir=True, max_dbs=0, readahead=False)


class _Putter:
    def __init__(self, env: lmdb.Environment) -> None:
        self.env = env
        self.seq = 0  # only touched inside a write txn, which LMDB serialises

    def put(self, item: tuple[str, bytes]) -> None:
        with self.env.begin(write=True) as txn:
            s = self.seq + 1
            if not txn.put(_KEY.pack(s), item[1], append=True):
                raise RuntimeError(f"append put refused for seq {s}")
            self.seq = s

    def put_batch(self, batch: tuple[str, list[bytes]]) -> None:
        with self.env.begin(write=True) as txn:
            s = self.seq
            for val in batch[1]:
                s += 1
                if not txn.put(_KEY.pack(s), val, append=True):
                    raise RuntimeError(f"append put refused for seq {s}")
            self.seq = s


def lmdb_single(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    env = open_env(dir)
    p = _Putter(env)
    st = drive_single(_encoded_chunks(workload, opts.get("chunk", 5000)), p.put, budget=opts.get("budget"))
    env.close()
    return make_result("floor.lmdb_single", st, dir, extra={"sync": True})


def lmdb_threads8(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    n = opts.get("threads", 8)
    env = open_env(dir)
    p = _Putter(env)
    # drive_threads partitions by session; items are (session_id, bytes)
    st = drive_threads(_encoded_chunks(workload, opts.get("chunk", 5000)), lambda i: p.put, threads=n,
                       budget=opts.get("budget"))
    env.close()
    return make_result(f"floor.lmdb_threads{n}", st, dir, extra={"sync": True, "threads": n})


def lmdb_batch100(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    env = open_env(dir)
    p = _Putter(env)

    def encoded_batches() -> Iterator[list[tuple[str, list[bytes]]]]:
        seq = 0
        for chunk in workload.batch_chunks(100, opts.get("chunk", 5000)):
            out = []
            for sid, msgs in chunk:
                vals = []
                for m in msgs:
                    seq += 1
                    vals.append(envelope_bytes(seq, m))
                out.append((sid, vals))
            yield out

    st = drive_single(encoded_batches(), p.put_batch, count=lambda b: len(b[1]), budget=opts.get("budget"))
    env.close()
    return make_result("floor.lmdb_batch100", st, dir, unit="batch",
                       extra={"sync": True, "mean_batch": round(st.messages / max(1, st.items), 1)})


def lmdb_group8(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    env = open_env(dir)
    p = _Putter(env)

    def groups() -> Iterator[list[tuple[str, list[bytes]]]]:
        for chunk in _encoded_chunks(workload, opts.get("chunk", 5000)):
            yield [("", [v for _sid, v in chunk[i:i + 8]]) for i in range(0, len(chunk), 8)]

    st = drive_single(groups(), p.put_batch, count=lambda b: len(b[1]), budget=opts.get("budget"))
    env.close()
    return make_result("floor.lmdb_group8", st, dir, unit="commit",
                       extra={"sync": True, "events_per_commit": round(st.messages / max(1, st.items), 2)})


def lmdb4_group8(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    """``lmdb_group8`` on eventlog's layout: per event a put in ``events``, its id in ``ids``, its
    seq under its session in ``streams`` (dupsort), and the head in ``meta`` -- the four B-trees
    issue 2 asks for. The ceiling of eventlog's 8-caller group commit, without its Python."""
    return _lmdb4(workload, dir, 8, "floor.lmdb4_group8", **opts)


def lmdb4_single(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    """One event per synced commit on eventlog's four B-trees: what the layout alone costs a
    single append, beside ``lmdb_single`` (one B-tree) in the same run."""
    return _lmdb4(workload, dir, 1, "floor.lmdb4_single", **opts)


class Four:
    """eventlog's four B-trees on bare LMDB: per event a put in ``events``, its id in ``ids``, its
    seq under its session in ``streams`` (dupsort), and the head in ``meta``; one synced commit
    per :meth:`commit` call. No Python of eventlog's on the path."""

    def __init__(self, path: Path) -> None:
        self.env = lmdb.open(str(path), map_size=MAP_SIZE, sync=True, metasync=True, subdir=True,
                             max_dbs=4, readahead=False)
        env = self.env
        self.events, self.ids = env.open_db(b"events"), env.open_db(b"ids")
        self.streams, self.meta = env.open_db(b"streams", dupsort=True, dupfixed=True), env.open_db(b"meta")
        self.seq = 0

    def commit(self, group: tuple[str, list[tuple[str, bytes]]]) -> None:
        with self.env.begin(write=True) as txn:
            s = self.seq
            for sid, val in group[1]:
                s += 1
                key = _KEY.pack(s)
                if not txn.put(key, val, append=True, db=self.events):
                    raise RuntimeError(f"append put refused for seq {s}")
                txn.put(f"{time.time_ns():016x}{s:016x}".encode(), key, db=self.ids)  # time-ordered, as eventlog's
                txn.put(sid.encode(), key, db=self.streams)
            txn.put(b"head", key + bytes.fromhex(_FAKE_HASH), db=self.meta)
            self.seq = s

    def close(self) -> None:
        self.env.close()


def _lmdb4(workload: Any, dir: str, per_commit: int, name: str, **opts: Any) -> dict[str, Any]:
    four = Four(Path(dir) / "log")

    def groups() -> Iterator[list[tuple[str, list[tuple[str, bytes]]]]]:
        for chunk in _encoded_chunks(workload, opts.get("chunk", 5000)):
            yield [("", chunk[i:i + per_commit]) for i in range(0, len(chunk), per_commit)]

    st = drive_single(groups(), four.commit, count=lambda b: len(b[1]), budget=opts.get("budget"))
    four.close()
    return make_result(name, st, dir, unit="commit",
                       extra={"sync": True, "events_per_commit": round(st.messages / max(1, st.items), 2)})


def file_fsync(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    path = Path(dir) / "append.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    hdr = struct.Struct(">I")

    def write(item: tuple[str, bytes]) -> None:
        val = item[1]
        os.write(fd, hdr.pack(len(val)) + val)
        os.fsync(fd)

    try:
        st = drive_single(_encoded_chunks(workload, opts.get("chunk", 5000)), write, budget=opts.get("budget"))
    finally:
        os.close(fd)
    return make_result("floor.file_fsync", st, dir, extra={"sync": "fsync per record"})


def scale_point(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    """Prefill in 10k-put transactions, then ``probe`` single synced puts (latency),
    then a full scan that decodes every value in bounded read transactions (the
    floor of any rebuild)."""
    probe = opts.get("probe", 2000)
    size = workload.n_messages - probe
    env = open_env(dir)
    p = _Putter(env)
    t0 = perf()
    for chunk in _encoded_chunks(workload, 10000, 0, size):
        p.put_batch(("", [v for _sid, v in chunk]))
    prefill_s = perf() - t0
    st = drive_single(_encoded_chunks(workload, probe, size, size + probe), p.put)
    t0 = perf()
    n = 0
    last = b""
    while True:
        with env.begin() as txn:
            cur = txn.cursor()
            ok = cur.set_range(last) if last else cur.first()
            if ok and last and cur.key() == last:
                ok = cur.next()
            got = 0
            while ok and got < 10000:
                orjson.loads(cur.value())
                last = cur.key()
                got += 1
                ok = cur.next()
        n += got
        if got == 0:
            break
    rebuild_s = perf() - t0
    env.close()
    lat = st.rec.summary()
    res = make_result("floor.scale", st, dir, extra={"size": size})
    total = size + st.messages
    res["scale"] = scale_record(size, prefill_s, lat, rebuild_s, n, f"scan + orjson.loads of all {n:,} values", None,
                                res["disk_bytes"], total)
    return res

