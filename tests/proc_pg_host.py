"""Child process: one "host" serving a PostgreSQL profile from its own home (not collected).

usage: proc_pg_host.py HOME URL PROFILE NAME SESSIONS MESSAGES TOTAL
Opens a SessionStore on the shared log with a follower, writes SESSIONS sessions of MESSAGES
messages (plus a title and a usage record each) while the other host writes its own, waits
until the log holds TOTAL events and its projections have applied them, then prints
``DIGEST <sha256 of every query answer> <head seq> <sessions seen>``.
"""
from __future__ import annotations

import hashlib
import sys
import time

import orjson

from eventlog import SessionStore
from projections.testing import answers


def digest(store: SessionStore) -> tuple[str, int]:
    reader = store._reads.reader  # type: ignore[attr-defined]
    sids = [s["id"] for s in store.list_sessions(limit=None)]
    mids = [m["id"] for sid in sids for m in store.get_messages(sid)]
    got = answers(reader, sids, mids)
    blob = orjson.dumps({repr(k): v for k, v in got.items()}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(blob).hexdigest(), len(sids)


def main() -> None:
    home, url, profile, name = sys.argv[1:5]
    sessions, messages, total = (int(a) for a in sys.argv[5:8])
    with SessionStore.open(home, profile, log=url, follower=True) as store:
        for s in range(sessions):
            sid = f"{name}-{s}"
            store.create_session(sid, source=name, model="m")
            for i in range(messages):
                store.append_message(sid, "user" if i % 2 == 0 else "assistant", f"{name} says alpha {s}.{i}")
            store.set_title(sid, f"{name} title {s}")
            store.record_usage(sid, model="m", input_tokens=10 * s, output_tokens=i)
        print("WROTE", flush=True)
        deadline = time.monotonic() + 60
        while store.log.head()[0] < total and time.monotonic() < deadline:
            time.sleep(0.05)
        store.sync()
        d, seen = digest(store)
        print(f"DIGEST {d} {store.log.head()[0]} {seen}", flush=True)


if __name__ == "__main__":
    main()
