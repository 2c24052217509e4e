"""Child process for the log's crash and concurrency tests (not collected by pytest).

usage: proc_log_writer.py LOG NAME THREADS COUNT [BATCH [PROFILE]]
LOG is an LMDB log directory or a postgresql:// URL (then PROFILE names the profile).
Appends COUNT batches per thread, each event with a unique id ``NAME-t-i-k``, and prints one
line ``ACK <id> <seq>`` per acknowledged event (flushed), so a parent that kills this process
knows exactly which appends were acknowledged.
"""
from __future__ import annotations

import sys
import threading

from eventlog.log import open_log


def main() -> None:
    path, name, threads, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    batch = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    profile = sys.argv[6] if len(sys.argv) > 6 else None
    out_lock = threading.Lock()
    log = open_log(path, profile=profile)

    def work(t: int) -> None:
        for i in range(count):
            evs = [
                {"type": "test.happened", "session": f"{name}-{t}", "id": f"{name}-{t}-{i}-{k}",
                 "data": {"i": i, "k": k, "pad": "p" * ((i * 37) % 900)}}
                for k in range(batch)
            ]
            seqs = log.append(evs)
            with out_lock:
                sys.stdout.write("".join(f"ACK {e['id']} {s}\n" for e, s in zip(evs, seqs)))
                sys.stdout.flush()

    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    log.close()


if __name__ == "__main__":
    main()
