"""Hermes-shaped workload through Hermes' own ``SessionDB`` and eventlog's, side by side.

    <hermes venv>/bin/python -m bench.hermes [--seconds 60] [--messages 100000] [--quick]

Needs the real ``hermes_state`` (the venv of ``python3 run compat``). Three parts, each run for
both classes in the same invocation, on the same machine, in fresh directories:

1. single-threaded: the gateway's per-turn calls one after another, the two classes
   interleaved in blocks (so a slow minute of the machine hits both);
2. contention: a gateway process (4 threads, each per turn: ``append_message`` x2,
   ``update_token_counts``, ``update_system_prompt``, ``get_messages_as_conversation``) and two
   loops of one-shot processes (each a fresh interpreter that opens the database and runs one of
   ``list_sessions_rich``, ``search_messages``, ``get_session``, ``append_message``), for
   ``--seconds`` per class; every error is counted;
3. search at ``--messages`` messages: the same corpus in both (written through Hermes, then
   switched to eventlog by the one-time import), the same queries.

Prints p50/p99/max per operation with the ratio eventlog/Hermes and the issue's targets; writes
``bench/results/hermes-latest.json`` and ``.md``.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
CLASSES = {"hermes": ("hermes_state", "SessionDB"), "eventlog": ("eventlog.adapters.hermes", "SessionDB")}
WORDS = ("deploy docker kubernetes parser tokenizer giraffe lighthouse invoice budget migration walrus "
         "gateway telegram compression summary refactor latency benchmark").split()
QUERIES = ("docker", "giraffe lighthouse", "parser OR tokenizer", "migration", "walrus", "latency benchmark")


def load(kind: str) -> Any:
    import importlib

    module, name = CLASSES[kind]
    if kind == "hermes":
        import hermes_state

        return getattr(hermes_state, "HermesSessionDB", hermes_state.SessionDB)
    return getattr(importlib.import_module(module), name)


def stats(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {"n": 0, "p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    s = sorted(samples)
    pick = lambda q: s[min(len(s) - 1, int(q * len(s)))] * 1000  # noqa: E731
    return {"n": len(s), "p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": s[-1] * 1000}


def text(rng: random.Random, n: int = 30) -> str:
    return " ".join(rng.choice(WORDS) if rng.random() < 0.3 else f"w{rng.randrange(5000)}" for _ in range(n))


# ---- 1. single-threaded -------------------------------------------------------------------------

def turn_ops(db: Any, sid: str, rng: random.Random) -> list[tuple[str, Callable[[], Any]]]:
    prompt = "You are Hermes. " + "Rules. " * 400
    return [
        ("append_message", lambda: db.append_message(sid, "user", text(rng))),
        ("update_token_counts", lambda: db.update_token_counts(sid, 120, 40, model="gpt", billing_provider="openai",
                                                                api_call_count=1, estimated_cost_usd=0.001)),
        ("update_system_prompt", lambda: db.update_system_prompt(sid, prompt)),
        ("append_message", lambda: db.append_message(sid, "assistant", text(rng),
                                                     tool_calls=[{"id": "c", "type": "function",
                                                                  "function": {"name": "terminal",
                                                                               "arguments": "{}"}}])),
        ("get_messages_as_conversation", lambda: db.get_messages_as_conversation(sid)),
        ("get_session", lambda: db.get_session(sid)),
        ("get_session_title", lambda: db.get_session_title(sid)),
        ("has_platform_message_id", lambda: db.has_platform_message_id(sid, "p")),
    ]


def single(turns: int, blocks: int) -> dict[str, Any]:
    out: dict[str, dict[str, list[float]]] = {k: {} for k in CLASSES}
    dirs = {k: Path(tempfile.mkdtemp(prefix=f"bench-hermes-{k}-")) for k in CLASSES}
    dbs = {k: load(k)(dirs[k] / "state.db") for k in CLASSES}
    rng = {k: random.Random(7) for k in CLASSES}
    try:
        for b in range(blocks):
            for k in (CLASSES if b % 2 == 0 else reversed(list(CLASSES))):
                db = dbs[k]
                sid = f"s{b}"
                db.create_session(sid, "telegram", model="gpt")
                for _ in range(turns):
                    for name, op in turn_ops(db, sid, rng[k]):
                        t = time.perf_counter()
                        op()
                        out[k].setdefault(name, []).append(time.perf_counter() - t)
    finally:
        for k in CLASSES:
            dbs[k].close()
            shutil.rmtree(dirs[k], ignore_errors=True)
    return {k: {name: stats(v) for name, v in ops.items()} for k, ops in out.items()}


# ---- 2. contention ------------------------------------------------------------------------------

GATEWAY = """
import json, random, sys, threading, time
from pathlib import Path
sys.path.insert(0, {root!r})
from bench.hermes import load, turn_ops
cls = load({kind!r})
path, seconds = {path!r}, {seconds!r}
lat, errors = {{}}, []
lock = threading.Lock()
def worker(n):
    db = cls(Path(path))
    rng = random.Random(n)
    deadline = time.monotonic() + seconds
    turn = 0
    while time.monotonic() < deadline:
        sid = f"gw{{n}}-{{turn // 40}}"
        if turn % 40 == 0:
            db.create_session(sid, "telegram", model="gpt")
        for name, op in turn_ops(db, sid, rng)[:5]:
            t = time.perf_counter()
            try:
                op()
            except Exception as e:
                with lock:
                    errors.append(f"{{name}}: {{type(e).__name__}}: {{e}}")
                continue
            with lock:
                lat.setdefault(name, []).append(time.perf_counter() - t)
        turn += 1
    db.close()
ts = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
[t.start() for t in ts]
[t.join() for t in ts]
print(json.dumps({{"lat": lat, "errors": errors}}))
"""

ONESHOT = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from bench.hermes import load, text
import random
op = sys.argv[1]
t0 = time.perf_counter()
try:
    db = load({kind!r})(Path({path!r}))
    t = time.perf_counter()
    if op == "list_sessions_rich":
        db.list_sessions_rich(limit=50)
    elif op == "search_messages":
        db.search_messages("docker")
    elif op == "get_session":
        db.get_session("gw0-0")
    else:
        db.create_session("oneshot", "cli")
        db.append_message("oneshot", "user", text(random.Random()))
    done = time.perf_counter()
    db.close()
    print(json.dumps({{"op": op, "s": done - t, "open_s": t - t0}}))
except Exception as e:
    print(json.dumps({{"op": op, "error": f"{{type(e).__name__}}: {{e}}"}}))
"""


def contention(kind: str, seconds: float) -> dict[str, Any]:
    d = Path(tempfile.mkdtemp(prefix=f"bench-hermes-cont-{kind}-"))
    path = str(d / "state.db")
    db = load(kind)(Path(path))
    db.create_session("gw0-0", "telegram")
    db.close()
    gateway = subprocess.Popen([sys.executable, "-c", GATEWAY.format(root=str(ROOT), kind=kind, path=path,
                                                                     seconds=seconds)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lat: dict[str, list[float]] = {}
    errors: list[str] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def loop(ops: list[str]) -> None:
        i = 0
        while time.monotonic() < deadline:
            op = ops[i % len(ops)]
            i += 1
            res = subprocess.run([sys.executable, "-c", ONESHOT.format(root=str(ROOT), kind=kind, path=path), op],
                                 capture_output=True, text=True)
            try:
                r = json.loads(res.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                r = {"op": op, "error": f"crashed: {res.stderr.strip()[-300:]}"}
            with lock:
                if "error" in r:
                    errors.append(f"oneshot {op}: {r['error']}")
                else:
                    lat.setdefault(f"oneshot {op}", []).append(r["s"])
                    lat.setdefault("oneshot open", []).append(r["open_s"])

    loops = [threading.Thread(target=loop, args=(ops,)) for ops in
             (["list_sessions_rich", "search_messages"], ["get_session", "append_message"])]
    for t in loops:
        t.start()
    for t in loops:
        t.join()
    out, err = gateway.communicate()
    try:
        g = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        g = {"lat": {}, "errors": [f"gateway crashed: {err.strip()[-500:]}"]}
    for name, v in g["lat"].items():
        lat.setdefault(f"gateway {name}", []).extend(v)
    errors += g["errors"]
    shutil.rmtree(d, ignore_errors=True)
    return {"ops": {name: stats(v) for name, v in sorted(lat.items())}, "errors": len(errors),
            "error_samples": errors[:10]}


# ---- 3. search at scale --------------------------------------------------------------------------

def search(messages: int, rounds: int) -> dict[str, Any]:
    d = Path(tempfile.mkdtemp(prefix="bench-hermes-search-"))
    rng = random.Random(11)
    real = load("hermes")(d / "hermes" / "state.db")
    per = 1000
    t = time.perf_counter()
    for s in range(max(1, messages // per)):
        sid = f"corpus{s}"
        real.create_session(sid, "cli")
        real.replace_messages(sid, [{"role": "user" if i % 2 == 0 else "assistant", "content": text(rng)}
                                    for i in range(per)])
    build_s = time.perf_counter() - t
    real.close()
    shutil.copytree(d / "hermes", d / "eventlog")
    t = time.perf_counter()
    ours = load("eventlog")(d / "eventlog" / "state.db")  # the one-time import of the same file
    switch_s = time.perf_counter() - t
    real = load("hermes")(d / "hermes" / "state.db")
    lat: dict[str, dict[str, list[float]]] = {"hermes": {}, "eventlog": {}}
    for _ in range(rounds):
        for q in QUERIES:
            for k, db in (("hermes", real), ("eventlog", ours)):
                t = time.perf_counter()
                db.search_messages(q)
                lat[k].setdefault("search_messages", []).append(time.perf_counter() - t)
    real.close()
    ours.close()
    shutil.rmtree(d, ignore_errors=True)
    return {"messages": messages, "corpus_build_s": build_s, "switch_import_s": switch_s,
            **{k: {n: stats(v) for n, v in ops.items()} for k, ops in lat.items()}}


# ---- report --------------------------------------------------------------------------------------

def table(title: str, rows: list[list[str]]) -> str:
    head = ["operation", "Hermes p50", "eventlog p50", "ratio", "Hermes p99", "eventlog p99", "ratio",
            "Hermes max", "eventlog max", "ratio"]
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([f"\n### {title}\n", line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|",
                      *(line(r) for r in rows)])


def rows_for(real: dict[str, Any], ours: dict[str, Any]) -> list[list[str]]:
    out = []
    for name in sorted(set(real) | set(ours)):
        a, b = real.get(name, {}), ours.get(name, {})
        row = [name]
        for key in ("p50_ms", "p99_ms", "max_ms"):
            x, y = a.get(key, float("nan")), b.get(key, float("nan"))
            row += [f"{x:.3f} ms", f"{y:.3f} ms", f"{y / x:.2f}x" if x else "n/a"]
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run of every part")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "hermes-latest.json"))
    args = ap.parse_args(argv)
    seconds, messages = (5.0, 4000) if args.quick else (args.seconds, args.messages)
    result: dict[str, Any] = {"python": sys.version.split()[0], "seconds": seconds, "messages": messages,
                              "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    result["single"] = single(turns=20 if args.quick else 60, blocks=4 if args.quick else 10)
    # One-shot processes import the classes as installed programs do: with bytecode (pip
    # compiles Hermes' at install; the source tree's is compiled here).
    import eventlog
    import sqlite_export
    from bench.common import compile_bytecode

    compile_bytecode([eventlog, sqlite_export])
    result["contention"] = {k: contention(k, seconds) for k in CLASSES}
    result["search"] = search(messages, rounds=3 if args.quick else 10)

    md = [f"## Hermes SessionDB: Hermes 0.19.0 vs eventlog ({result['started']})"]
    md.append(table("single-threaded (interleaved blocks)", rows_for(result["single"]["hermes"],
                                                                     result["single"]["eventlog"])))
    c = result["contention"]
    md.append(table(f"contention: gateway (4 threads) + 2 one-shot loops, {seconds:.0f} s each",
                    rows_for(c["hermes"]["ops"], c["eventlog"]["ops"])))
    md.append(f"\nerrors: Hermes {c['hermes']['errors']}, eventlog {c['eventlog']['errors']}")
    for k in CLASSES:
        for e in c[k]["error_samples"]:
            md.append(f"- {k}: {e}")
    s = result["search"]
    md.append(table(f"search at {s['messages']} messages", rows_for(s["hermes"], s["eventlog"])))
    md.append(f"\ncorpus written through Hermes in {s['corpus_build_s']:.1f} s; switched to eventlog "
              f"(one-time import) in {s['switch_import_s']:.1f} s")
    single_append = result["single"]
    checks = [
        ("single-threaded append_message p50 <= 1.5x",
         single_append["eventlog"]["append_message"]["p50_ms"] <= 1.5 * single_append["hermes"]["append_message"]["p50_ms"]),
        ("contention: zero errors (eventlog)", c["eventlog"]["errors"] == 0),
        ("contention: every p99 <= Hermes'", all(c["eventlog"]["ops"][n]["p99_ms"] <= c["hermes"]["ops"][n]["p99_ms"]
                                                 for n in c["eventlog"]["ops"] if n in c["hermes"]["ops"])),
        ("contention: every max <= 1/10 of Hermes'", all(
            c["eventlog"]["ops"][n]["max_ms"] <= c["hermes"]["ops"][n]["max_ms"] / 10
            for n in c["eventlog"]["ops"] if n in c["hermes"]["ops"])),
        ("search p50 <= Hermes'", s["eventlog"]["search_messages"]["p50_ms"] <= s["hermes"]["search_messages"]["p50_ms"]),
    ]
    md.append("\n### targets\n")
    md += [f"- {'PASS' if ok else 'MISS'}  {name}" for name, ok in checks]
    result["targets"] = {name: ok for name, ok in checks}
    text_out = "\n".join(md)
    print(text_out)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    out.with_suffix(".md").write_text(text_out + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
