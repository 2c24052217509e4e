"""Shared machinery: latency recording, drivers, result dicts, RSS and disk
accounting, the side-by-side table, ratios, targets, JSON and the scale plot.

Conventions every contender follows
-----------------------------------
* A contender is a function ``fn(workload, dir, **opts) -> dict`` run in a fresh
  subprocess (``python -m bench.run_one NAME ...``), so peak RSS is its own.
* Workload messages are materialised one chunk at a time *outside* the clock.
  Single-threaded throughput is ``events / sum(call latencies)``; threaded
  throughput is ``events / wall time`` of the chunks (threads released together
  per chunk, the clock stops when the last one finishes).
* A latency sample is one call as a caller sees it (for baseline A that includes
  busy retries and their sleeps).
* ``opts["budget"]`` (seconds, 0 = none) lets a slow contender stop after the
  chunk that crosses the budget; the result then says ``truncated`` and all rates
  are over the messages actually written.
"""
from __future__ import annotations

import json
import math
import os
import platform
import queue
import threading
import time
import zlib
from array import array
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

perf = time.perf_counter

# ---------------------------------------------------------------------------------------
# latency


class Recorder:
    """Per-call latencies in seconds (compact array), summarised in milliseconds."""

    def __init__(self) -> None:
        self.samples = array("d")

    def add(self, seconds: float) -> None:
        self.samples.append(seconds)

    def extend(self, other: "Recorder") -> None:
        self.samples.extend(other.samples)

    def __len__(self) -> int:
        return len(self.samples)

    def total(self) -> float:
        return math.fsum(self.samples)

    def summary(self) -> dict[str, Any]:
        s = sorted(self.samples)
        n = len(s)
        if n == 0:
            return {"calls": 0}

        def q(p: float) -> float:
            # nearest-rank percentile
            i = max(0, min(n - 1, math.ceil(p * n) - 1))
            return round(s[i] * 1e3, 4)

        return {
            "calls": n,
            "p50": q(0.50),
            "p90": q(0.90),
            "p99": q(0.99),
            "p999": q(0.999),
            "max": round(s[-1] * 1e3, 4),
            "mean": round(math.fsum(s) / n * 1e3, 4),
        }


def timed(call: Callable[[Any], Any], item: Any, rec: Recorder) -> Any:
    t0 = perf()
    r = call(item)
    rec.add(perf() - t0)
    return r


# ---------------------------------------------------------------------------------------
# drivers


class RunStats:
    """What a driver measured: latencies, seconds on the clock, items and events done."""

    def __init__(self) -> None:
        self.rec = Recorder()
        self.seconds = 0.0
        self.items = 0        # workload items consumed (messages, or batches)
        self.messages = 0     # messages written
        self.truncated = False


def _deadline(budget: float | None) -> float | None:
    return perf() + budget if budget else None


def drive_single(
    chunks: Iterable[Sequence[Any]],
    call: Callable[[Any], Any],
    *,
    prepare: Callable[[Sequence[Any]], None] | None = None,
    count: Callable[[Any], int] = lambda item: 1,
    budget: float | None = None,
) -> RunStats:
    """Call ``call(item)`` for each item, one thread, timing each call.

    ``prepare(chunk)`` (optional) runs untimed before each chunk, e.g. to create
    the sessions first seen in it."""
    st = RunStats()
    rec = st.rec
    deadline = _deadline(budget)
    for chunk in chunks:
        if prepare is not None:
            prepare(chunk)
        for item in chunk:
            t0 = perf()
            call(item)
            rec.add(perf() - t0)
        st.items += len(chunk)
        st.messages += sum(count(i) for i in chunk)
        if deadline is not None and perf() > deadline:
            st.truncated = True
            break
    st.seconds = rec.total()
    return st


def session_of(item: Any) -> str:
    """Session id of a message dict or of a ``(session_id, messages)`` batch."""
    return item[0] if isinstance(item, tuple) else item["session_id"]


def partition(chunk: Sequence[Any], n: int) -> list[list[Any]]:
    """Split a chunk by session so that each session has exactly one writer thread
    within the chunk, balancing messages across threads (largest sessions first onto
    the least-loaded thread), so all ``n`` writers stay busy until the chunk's end.
    The stream's order is kept within each thread.  (Threads hand over between chunks only after
    the chunk barrier, so a session changing thread is safe.)"""
    by_session: dict[str, list[Any]] = {}
    for item in chunk:
        by_session.setdefault(session_of(item), []).append(item)
    def weight(items: list[Any]) -> int:
        return sum(len(i[1]) if isinstance(i, tuple) else 1 for i in items)

    order = sorted(by_session.items(), key=lambda kv: (-weight(kv[1]), zlib.crc32(kv[0].encode())))
    owner: dict[str, int] = {}
    loads = [0] * n
    for sid, items in order:
        i = min(range(n), key=loads.__getitem__)
        owner[sid] = i
        loads[i] += weight(items)
    parts: list[list[Any]] = [[] for _ in range(n)]
    for item in chunk:  # keep the stream's interleaving within each thread
        parts[owner[session_of(item)]].append(item)
    return parts


def drive_threads(
    chunks: Iterable[Sequence[Any]],
    make_worker: Callable[[int], Callable[[Any], Any]],
    *,
    threads: int = 8,
    prepare: Callable[[Sequence[Any]], None] | None = None,
    finish_worker: Callable[[int], None] | None = None,
    count: Callable[[Any], int] = lambda item: 1,
    budget: float | None = None,
) -> RunStats:
    """``threads`` persistent worker threads; ``make_worker(i)`` runs on thread i
    (untimed, e.g. to open its own connection) and returns its per-item call.

    Each chunk is partitioned by session, handed to all threads at once, and the
    wall clock runs until the last thread has finished its share."""
    st = RunStats()
    inboxes: list[queue.SimpleQueue[Any]] = [queue.SimpleQueue() for _ in range(threads)]
    done: queue.SimpleQueue[tuple[int, BaseException | None]] = queue.SimpleQueue()
    recs = [Recorder() for _ in range(threads)]
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        rec = recs[i]
        try:
            call = make_worker(i)
        except BaseException as e:  # noqa: BLE001 - reported to the main thread
            done.put((i, e))
            return
        done.put((i, None))  # ready
        try:
            while True:
                items = inboxes[i].get()
                if items is None:
                    break
                err: BaseException | None = None
                try:
                    for item in items:
                        t0 = perf()
                        call(item)
                        rec.add(perf() - t0)
                except BaseException as e:  # noqa: BLE001
                    err = e
                done.put((i, err))
                if err is not None:
                    return
        finally:
            if finish_worker is not None:
                try:
                    finish_worker(i)
                except BaseException as e:  # noqa: BLE001
                    errors.append(e)

    ts = [threading.Thread(target=worker, args=(i,), name=f"bench-w{i}", daemon=True) for i in range(threads)]
    for t in ts:
        t.start()
    for _ in range(threads):
        _i, e = done.get()
        if e is not None:
            errors.append(e)
    deadline = _deadline(budget)
    try:
        if not errors:
            for chunk in chunks:
                if prepare is not None:
                    prepare(chunk)
                parts = partition(chunk, threads)
                t0 = perf()
                for i, part in enumerate(parts):
                    inboxes[i].put(part)
                for _ in range(threads):
                    _i, e = done.get()
                    if e is not None:
                        errors.append(e)
                st.seconds += perf() - t0
                if errors:
                    break
                st.items += len(chunk)
                st.messages += sum(count(i) for i in chunk)
                if deadline is not None and perf() > deadline:
                    st.truncated = True
                    break
    finally:
        for q in inboxes:
            q.put(None)
        for t in ts:
            t.join()
    if errors:
        raise errors[0]
    for r in recs:
        st.rec.extend(r)
    return st


# ---------------------------------------------------------------------------------------
# resources


def compile_bytecode(packages: Iterable[Any]) -> dict[str, str]:
    """Compile the packages' bytecode, so that timed child processes import them as an installed
    program does (pip compiles at install). This sandbox sets PYTHONDONTWRITEBYTECODE, which
    would make every child compile every module from source: 60-80 ms of a one-shot's open.
    Returns the environment without that variable, for the children."""
    import subprocess
    import sys

    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-m", "compileall", "-q", *sorted({str(Path(m.__file__).parent) for m in packages})],
                   env=env, stdout=subprocess.DEVNULL, check=False)
    return env


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_mb() -> float | None:
    kb = _status_kb("VmRSS")
    return round(kb / 1024, 1) if kb is not None else None


def peak_rss_mb() -> float:
    kb = _status_kb("VmHWM")
    if kb is None:
        import resource

        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return round(kb / 1024, 1)


def dir_size(path: str | os.PathLike[str]) -> dict[str, int]:
    """Allocated (du-like) and apparent bytes of every file under ``path``."""
    alloc = apparent = files = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            files += 1
            apparent += st.st_size
            alloc += getattr(st, "st_blocks", 0) * 512 or st.st_size
    return {"allocated": alloc, "apparent": apparent, "files": files}


# ---------------------------------------------------------------------------------------
# results


def make_result(
    name: str,
    st: RunStats,
    dir: str | os.PathLike[str],
    *,
    events: int | None = None,
    extra: dict[str, Any] | None = None,
    unit: str = "message",
) -> dict[str, Any]:
    """The common result dict.  Call it after the store is closed (so WAL files are
    checkpointed and the on-disk size is final).

    ``events`` defaults to messages written; ``calls`` are timed calls (messages, or
    batches for batch contenders).  Latencies are per call."""
    events = st.messages if events is None else events
    size = dir_size(dir)
    secs = st.seconds
    lat = st.rec.summary()
    return {
        "name": name,
        "ok": True,
        "error": None,
        "unit": unit,
        "messages": st.messages,
        "events": events,
        "calls": len(st.rec),
        "seconds": round(secs, 4),
        "events_per_s": round(events / secs, 1) if secs > 0 else None,
        "messages_per_s": round(st.messages / secs, 1) if secs > 0 else None,
        "calls_per_s": round(len(st.rec) / secs, 1) if secs > 0 else None,
        "latency_ms": lat,
        "disk_bytes": size["allocated"],
        "disk_apparent_bytes": size["apparent"],
        "disk_bytes_per_message": round(size["allocated"] / st.messages, 1) if st.messages else None,
        "truncated": st.truncated,
        "extra": extra or {},
    }


def failed_result(name: str, error: str) -> dict[str, Any]:
    return {"name": name, "ok": False, "error": error}


def environment() -> dict[str, Any]:
    """The machine and library versions the figures came from."""
    import sqlite3

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "sqlite": sqlite3.sqlite_version,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    info["mem_gib"] = round(int(line.split()[1]) / 1024 / 1024, 1)
                    break
    except OSError:
        pass
    from importlib import metadata

    for dist in ("lmdb", "orjson", "eventsourcing", "matplotlib", "eventlog"):
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            info[dist] = None
    try:
        import lmdb

        info["liblmdb"] = ".".join(map(str, lmdb.version()))
    except Exception:  # noqa: BLE001
        pass
    return info


def fs_type(path: str) -> str | None:
    """Filesystem type of ``path`` from /proc/mounts (longest matching mount point)."""
    try:
        best, kind = "", None
        real = os.path.realpath(path)
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                mnt, typ = parts[1], parts[2]
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                    best, kind = mnt, typ
        return kind
    except OSError:
        return None


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False, ensure_ascii=False) + "\n")
    os.replace(tmp, p)


# ---------------------------------------------------------------------------------------
# printing


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 100:
            return f"{v:.1f}"
        return f"{v:.{digits}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def render_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    cells = [[_fmt(c) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in cells:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))
    align = align or ("l" + "r" * (len(headers) - 1))

    def line(vals: Sequence[str]) -> str:
        out = []
        for i, v in enumerate(vals):
            out.append(v.ljust(widths[i]) if align[i] == "l" else v.rjust(widths[i]))
        return "  ".join(out).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep, *(line(r) for r in cells)])


def render_markdown(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r in rows:
        out.append("| " + " | ".join(_fmt(c) for c in r) + " |")
    return "\n".join(out)


def note_of(r: dict[str, Any]) -> str:
    """Short free-text notes for a result row."""
    ex = r.get("extra", {})
    notes = []
    if r.get("truncated"):
        notes.append(f"budget hit after {r['messages']:,} msgs")
    if "busy_retries" in ex:
        notes.append(f"{ex['busy_retries']:,} busy retries")
    if "mean_batch" in ex:
        notes.append(f"mean batch {ex['mean_batch']}")
    if "rebuild_events_per_s" in ex:
        notes.append(f"rebuild {ex['rebuild_events_per_s']:,.0f} ev/s")
    if "catchup_events_per_s" in ex:
        notes.append(f"catch-up {ex['catchup_events_per_s']:,.0f} ev/s")
    if "search_ms" in ex and ex["search_ms"].get("p50") is not None:
        notes.append(f"search p50 {ex['search_ms']['p50']} ms")
    if ex.get("note"):
        notes.append(str(ex["note"]))
    return "; ".join(notes)


RESULT_HEADERS = ("contender", "msgs/s", "calls/s", "p50 ms", "p99 ms", "max ms", "peak RSS MB", "disk B/msg", "notes")


def result_rows(results: dict[str, dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for name, r in results.items():
        if not r.get("ok"):
            err = str(r.get("error"))
            note = ("not available yet: " + err.split(": ", 1)[-1]) if r.get("unavailable") else "FAILED: " + err
            rows.append([name, None, None, None, None, None, None, None, note[:100]])
            continue
        lat = r.get("latency_ms", {})
        rows.append([
            name, r.get("messages_per_s"), r.get("calls_per_s"), lat.get("p50"), lat.get("p99"), lat.get("max"),
            r.get("peak_rss_mb"), r.get("disk_bytes_per_message"), note_of(r),
        ])
    return rows


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)


def x(v: float | None) -> str:
    return "-" if v is None else (f"{v:,.0f}x" if v >= 100 else f"{v:.2f}x")


def compare(results: dict[str, dict[str, Any]], pairs: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """Ratios ``a / b`` for each pair present and ok: throughput (higher is better for
    a), p50/p99 latency, peak RSS and disk per message (lower is better for a)."""
    out = []
    for a, b in pairs:
        ra, rb = results.get(a), results.get(b)
        if not (ra and rb and ra.get("ok") and rb.get("ok")):
            continue
        out.append({
            "a": a,
            "b": b,
            "throughput": ratio(ra.get("messages_per_s"), rb.get("messages_per_s")),
            "p50": ratio(ra["latency_ms"].get("p50"), rb["latency_ms"].get("p50")),
            "p99": ratio(ra["latency_ms"].get("p99"), rb["latency_ms"].get("p99")),
            "peak_rss": ratio(ra.get("peak_rss_mb"), rb.get("peak_rss_mb")),
            "disk_per_message": ratio(ra.get("disk_bytes_per_message"), rb.get("disk_bytes_per_message")),
        })
    return out


RATIO_HEADERS = ("A", "/ B", "msgs/s", "p50", "p99", "peak RSS", "disk/msg")


def ratio_rows(ratios: Sequence[dict[str, Any]]) -> list[list[Any]]:
    return [[r["a"], r["b"], x(r["throughput"]), x(r["p50"]), x(r["p99"]), x(r["peak_rss"]), x(r["disk_per_message"])]
            for r in ratios]


# ---------------------------------------------------------------------------------------
# scale curve


SCALE_COLORS = {"eventlog": "#d62728", "baseline_sqlite": "#1f77b4", "baseline_es": "#2ca02c", "floor": "#7f7f7f",
                "baseline_bare_rebuild": "#9467bd"}


def plot_scale(scale: dict[str, list[dict[str, Any]]], path: str | os.PathLike[str], title: str = "") -> str | None:
    """Three panels (append p50/p99, rebuild seconds, search p50/p99) against the
    number of events in the store.  Returns the path written, or None (with a
    message on stdout) if matplotlib is not installed or there is nothing to plot."""
    if not any(scale.values()):
        print("scale: nothing to plot")
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, NullFormatter
    except ImportError:
        print("scale: matplotlib is not installed; skipping the PNG (pip install '.[bench]')")
        return None
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    panels = (
        ("append_p50_ms", "append_p99_ms", "single synced append latency (ms)"),
        ("rebuild_s", None, "full rebuild (s)*"),
        ("search_p50_ms", "search_p99_ms", "full-text search latency (ms)"),
    )
    plain = FuncFormatter(lambda v, _p: f"{v:,.0f}" if v >= 10 else f"{v:.2g}")
    for ax, (key, key2, ptitle) in zip(axes, panels):
        drawn = False
        for name, points in sorted(scale.items()):
            group = name.split(".", 1)[0]
            color = SCALE_COLORS.get(group)
            pts = sorted((p for p in points if p.get(key) is not None), key=lambda p: p["size"])
            if not pts:
                continue
            drawn = True
            ax.plot([p["size"] for p in pts], [p[key] for p in pts], marker="o", color=color,
                    label=group + (" p50" if key2 else ""))
            if key2:
                pts2 = [p for p in pts if p.get(key2) is not None]
                ax.plot([p["size"] for p in pts2], [p[key2] for p in pts2], marker="x", linestyle="--",
                        color=color, alpha=0.55, label=f"{group} p99")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(plain)
        ax.yaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_minor_formatter(plain)
        sizes = sorted({p["size"] for pts in scale.values() for p in pts})
        if sizes:
            ax.set_xticks(sizes)
        ax.set_xlabel("events in the store")
        ax.set_title(ptitle)
        ax.grid(True, which="both", alpha=0.3)
        if drawn:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    fig.text(0.01, 0.01, "* eventlog: SessionStore.rebuild(); baseline_sqlite: FTS5 'rebuild'; "
             "baseline_es: read + decode every event; floor: LMDB scan + orjson.loads; "
             "baseline_bare_rebuild: same rows into eventlog's schema + FTS5 'rebuild'", fontsize=7, alpha=0.8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.04, 1, 0.95 if title else 1))
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return str(p)


def scale_record(size: int, prefill_s: float, append: dict[str, Any], rebuild_s: float, rebuilt: int, what: str,
                 search: dict[str, Any] | None, disk_bytes: float, messages: int, **extra: Any) -> dict[str, Any]:
    """The ``res["scale"]`` entry every contender's scale point reports (one shape for the table
    and the plot): append latency at ``size`` events, the rebuild of ``rebuilt`` events, search."""
    rec: dict[str, Any] = {
        "size": size,
        "prefill_s": round(prefill_s, 3),
        "append_p50_ms": append.get("p50"),
        "append_p99_ms": append.get("p99"),
        "rebuild_s": round(rebuild_s, 4),
        "rebuild_events_per_s": round(rebuilt / rebuild_s, 1) if rebuild_s else None,
        "rebuild_what": what,
        "search_p50_ms": search.get("p50") if search else None,
        "search_p99_ms": search.get("p99") if search else None,
        "disk_bytes_per_message": round(disk_bytes / messages, 1),
    }
    rec.update(extra)
    return rec
