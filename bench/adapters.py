"""The framework adapters beside each framework's own SQLite backend, in one run.

    .venv/bin/python -m bench.adapters                 # 1,000 turns, and 8 concurrent sessions
    .venv/bin/python -m bench.adapters --turns 200 --only oa
    .venv/bin/python -m bench.adapters --one oa.eventlog.single --turns 100 --dir /tmp/x   # one contender

OpenAI Agents (``oa``): ``EventlogSession`` vs the SDK's ``SQLiteSession`` (a file, WAL). One turn
is what ``Runner.run`` does with a session: ``get_items()`` (the whole history, the SDK's default,
or the latest 20 with ``--limit 20``), then ``add_items([user, assistant])``.

LangGraph (``lg``): ``EventlogSaver`` vs ``langgraph-checkpoint-sqlite``'s ``SqliteSaver`` (WAL).
One turn is ``graph.invoke`` of a compiled ``MessagesState`` graph (one echo node that keeps the
last 20 messages, so checkpoints stay the same size) -- two checkpoints and their writes -- then
``get_tuple`` of the thread's latest checkpoint.

``single``: one conversation of ``--turns`` turns. ``concurrent8``: ``--sessions`` conversations of
``--turns`` turns each at once (OA: tasks on one event loop; LG: one thread each). Each backend is opened before the
clock starts (one untimed read). Every contender runs in a fresh process in an empty directory on the same disk; all backends are
durable (eventlog synced, SQLite ``synchronous=FULL``). Reported per contender: turns/s (wall),
write and read latency p50/p99 (ms); for ``EventlogSaver``, which runs no background follower,
also the time the reads after the run need to bring state.db up to the log (``catch-up s``:
messages, search, the checkpoint read model) and turns/s with that time included.
Targets (issue 16): under concurrency eventlog's p99 <= the SQLite backend's and its throughput >= it.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable

from bench.common import Recorder, dir_size, render_table

perf = time.perf_counter
CONTENDERS = [f"{fw}.{backend}.{mode}" for fw in ("oa", "lg") for mode in ("single", "concurrent8")
              for backend in ("eventlog", "sqlite")]


def _text(i: int, who: str) -> str:
    words = ("aurora", "fjord", "glacier", "tundra", "harbour", "lantern", "meridian", "saga")
    return f"{who} {i}: " + " ".join(words[(i * 7 + k) % len(words)] for k in range(30))


# ---------------------------------------------------------------- OpenAI Agents

def _oa_session(backend: str, sid: str, d: str) -> Any:
    if backend == "eventlog":
        from eventlog.adapters.openai_agents import EventlogSession

        return EventlogSession(sid, home=d)
    from agents.memory.sqlite_session import SQLiteSession

    return SQLiteSession(sid, os.path.join(d, "sessions.db"))


async def _oa_conversation(session: Any, turns: int, limit: int | None, writes: Recorder, reads: Recorder) -> None:
    for i in range(turns):
        t0 = perf()
        await session.get_items(limit)
        t1 = perf()
        await session.add_items([
            {"role": "user", "content": _text(i, "user")},
            {"type": "message", "role": "assistant", "id": f"msg_{i}", "status": "completed",
             "content": [{"type": "output_text", "text": _text(i, "assistant"), "annotations": []}]},
        ])
        t2 = perf()
        reads.add(t1 - t0)
        writes.add(t2 - t1)


def run_oa(backend: str, sessions: int, turns: int, limit: int | None, d: str) -> dict[str, Any]:
    writes, reads = Recorder(), Recorder()
    objs = [_oa_session(backend, f"conversation-{k}", d) for k in range(sessions)]

    async def go() -> float:
        for s in objs:  # open the store / the file before the clock, for both backends
            await s.get_items(1)
        t0 = perf()
        await asyncio.gather(*[_oa_conversation(s, turns, limit, writes, reads) for s in objs])
        return perf() - t0

    seconds = asyncio.run(go())
    check = asyncio.run(objs[0].get_items())
    assert len(check) == 2 * turns, (len(check), turns)
    for s in objs:
        s.close()
    return {"seconds": seconds, "turns": sessions * turns, "write": writes.summary(), "read": reads.summary()}


# ---------------------------------------------------------------- LangGraph

def _lg_graph(checkpointer: Any) -> Any:
    from langchain_core.messages import AIMessage, RemoveMessage
    from langgraph.graph import START, MessagesState, StateGraph

    def bot(state: MessagesState) -> dict[str, Any]:
        history = state["messages"]
        reply = AIMessage(content="echo " + str(history[-1].content))
        drop = [RemoveMessage(id=m.id) for m in history[:-19] if m.id]  # keep the latest 20
        return {"messages": [*drop, reply]}

    builder = StateGraph(MessagesState)
    builder.add_node("bot", bot)
    builder.add_edge(START, "bot")
    return builder.compile(checkpointer=checkpointer)


def _lg_saver(backend: str, d: str) -> tuple[Any, Callable[[], None]]:
    if backend == "eventlog":
        from eventlog.adapters.langgraph import EventlogSaver

        saver = EventlogSaver(home=d)
        return saver, saver.close
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(os.path.join(d, "checkpoints.db"), check_same_thread=False)
    return SqliteSaver(conn), conn.close


def run_lg(backend: str, sessions: int, turns: int, d: str) -> dict[str, Any]:
    saver, close = _lg_saver(backend, d)
    graph = _lg_graph(saver)
    saver.get_tuple({"configurable": {"thread_id": "warm-up"}})  # open the store / the file before the clock
    writes, reads = Recorder(), Recorder()
    lock = threading.Lock()

    def conversation(k: int) -> None:
        config = {"configurable": {"thread_id": f"thread-{k}"}}
        w, r = Recorder(), Recorder()
        for i in range(turns):
            t0 = perf()
            graph.invoke({"messages": [("user", _text(i, "user"))]}, config)
            t1 = perf()
            saver.get_tuple(config)
            t2 = perf()
            w.add(t1 - t0)
            r.add(t2 - t1)
        with lock:
            writes.extend(w)
            reads.extend(r)

    threads = [threading.Thread(target=conversation, args=(k,)) for k in range(sessions)]
    t0 = perf()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = perf() - t0
    catchup = 0.0
    if backend == "eventlog":
        # The saver runs no follower: state.db (messages, search, the checkpoint read model) is
        # brought up to the log by the reads that need it. What the run left for them to do is
        # timed here and reported beside the figures (turns/s with it included).
        t1 = perf()
        store = saver._open()
        store.sync(timeout=600)
        with store.read_model("langgraph", wait=600) as conn:
            conn.execute("SELECT 1 FROM langgraph_checkpoints LIMIT 1").fetchall()
        catchup = perf() - t1
    last = saver.get_tuple({"configurable": {"thread_id": "thread-0"}})
    assert last is not None and len(last.checkpoint["channel_values"]["messages"]) == min(20, 2 * turns)
    close()
    return {"seconds": seconds, "turns": sessions * turns, "write": writes.summary(), "read": reads.summary(),
            "catchup_s": catchup}


# ---------------------------------------------------------------- driver

def run_one(name: str, turns: int, sessions: int, limit: int | None, d: str) -> dict[str, Any]:
    fw, backend, mode = name.split(".")
    k = sessions if mode == "concurrent8" else 1
    res = run_oa(backend, k, turns, limit, d) if fw == "oa" else run_lg(backend, k, turns, d)
    res.update(name=name, sessions=k, turns_per_session=turns, turns_per_s=res["turns"] / res["seconds"],
               turns_per_s_with_catchup=res["turns"] / (res["seconds"] + res.get("catchup_s", 0.0)),
               disk_bytes=dir_size(d).get("allocated"), limit=limit if fw == "oa" else None)
    return res


def _spawn(name: str, args: Any) -> dict[str, Any]:
    d = tempfile.mkdtemp(prefix=name.replace(".", "_") + "-", dir=args.tmpdir)
    cmd = [sys.executable, "-m", "bench.adapters", "--one", name, "--turns", str(args.turns),
           "--sessions", str(args.sessions), "--dir", d]
    if args.limit is not None:
        cmd += ["--limit", str(args.limit)]
    print(f"running {name} ...", file=sys.stderr, flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    if not args.keep:
        shutil.rmtree(d, ignore_errors=True)
    if done.returncode != 0:
        return {"name": name, "error": done.stderr.strip().splitlines()[-1:] or ["failed"]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _median(rs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure, the median over the rounds (an error in any round is reported as such)."""
    bad = [r for r in rs if "error" in r]
    if bad or not rs:
        return bad[0] if bad else {"error": ["no run"]}

    def med(values: list[float]) -> float:
        return statistics.median(values)

    out = dict(rs[0])
    out["turns_per_s"] = med([r["turns_per_s"] for r in rs])
    for key in ("turns_per_s_with_catchup", "catchup_s"):
        if all(key in r for r in rs):
            out[key] = med([r[key] for r in rs])
    for side in ("write", "read"):
        out[side] = {k: med([r[side][k] for r in rs]) for k in ("p50", "p99")}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.adapters")
    ap.add_argument("--turns", type=int, default=1000)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--limit", type=int, default=None, help="OA: get_items(limit) (default: the whole history)")
    ap.add_argument("--only", default=None, help="comma-separated prefixes: oa, lg, oa.eventlog, ...")
    ap.add_argument("--one", default=None, choices=CONTENDERS)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--tmpdir", default=None, help="parent of the contenders' directories (a real disk)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each contender, pairs interleaved; medians")
    ap.add_argument("--keep", action="store_true", help="keep the contenders' directories")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "adapters.json"))
    args = ap.parse_args(argv)
    if args.one:
        out = sys.stdout
        sys.stdout = sys.stderr
        res = run_one(args.one, args.turns, args.sessions, args.limit, args.dir or tempfile.mkdtemp())
        print(json.dumps(res), file=out)
        return 0
    names = [n for n in CONTENDERS if not args.only or any(n.startswith(p.strip()) for p in args.only.split(","))]
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(args.rounds):
        # Pairs side by side, the order alternating by round: the machine's drift hits both.
        pairs = sorted({n.replace(".eventlog.", ".X.").replace(".sqlite.", ".X.") for n in names})
        for pair in pairs:
            members = [n for n in (pair.replace(".X.", ".eventlog."), pair.replace(".X.", ".sqlite.")) if n in runs]
            for name in (members if r % 2 == 0 else members[::-1]):
                runs[name].append(_spawn(name, args))
    results = {name: _median(rs) for name, rs in runs.items()}
    rows = []
    for name, r in results.items():
        if "error" in r:
            rows.append([name, "error", r["error"][0], "", "", "", "", "", ""])
            continue
        rows.append([name, r["turns"], round(r["turns_per_s"], 1),
                     round(r.get("turns_per_s_with_catchup", r["turns_per_s"]), 1), round(r.get("catchup_s", 0.0), 2),
                     r["write"]["p50"], r["write"]["p99"], r["read"]["p50"], r["read"]["p99"]])
    print(f"medians of {args.rounds} round(s), pairs interleaved")
    print(render_table(["contender", "turns", "turns/s", "incl. catch-up", "catch-up s", "write p50 ms", "write p99 ms",
                        "read p50 ms", "read p99 ms"], rows))
    for fw in ("oa", "lg"):
        for mode in ("single", "concurrent8"):
            a, b = results.get(f"{fw}.eventlog.{mode}"), results.get(f"{fw}.sqlite.{mode}")
            if a and b and "error" not in a and "error" not in b:
                w99, r99 = a["write"]["p99"] / b["write"]["p99"], a["read"]["p99"] / b["read"]["p99"]
                with_c = a.get("turns_per_s_with_catchup", a["turns_per_s"]) / b["turns_per_s"]
                print(f"{fw}.{mode}: throughput {a['turns_per_s'] / b['turns_per_s']:.2f}x sqlite "
                      f"({with_c:.2f}x with the deferred catch-up); write p99 {w99:.2f}x; "
                      f"read p99 {r99:.2f}x (eventlog/sqlite; throughput >= 1 and p99 <= 1 meet the target)")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"turns": args.turns, "sessions": args.sessions, "limit": args.limit, "rounds": args.rounds,
                   "results": results, "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
