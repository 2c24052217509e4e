"""Child of the reader-table tests: opens a log with a small reader table and holds readers.

usage: python -m campaign.lmdb_holder LOG_DIR MAX_READERS HOLD

Opens the log with ``max_readers=MAX_READERS``, begins HOLD read transactions (HOLD=0: none)
and prints ``HELD <n>``. Then it serves commands on stdin, one per line: ``append`` prints
``OK <seq>`` or ``ERR <error type> <message>``; ``quit`` exits. Killing it with SIGKILL while it
holds readers leaves their slots taken in the lock file.
"""
from __future__ import annotations

import sys


def main() -> int:
    path, max_readers, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    from eventlog.log import EventLog

    lg = EventLog.open(path, max_readers=max_readers)
    txns = [lg._env.begin() for _ in range(hold)]  # the public API never holds a reader open
    print(f"HELD {len(txns)}", flush=True)
    for line in sys.stdin:
        if line.strip() == "append":
            try:
                seq = lg.append([{"type": "test.written", "session": "holder", "data": {}}])[0]
                head = lg.head()[0]
                print(f"OK {seq} {head}", flush=True)
            except Exception as e:
                print(f"ERR {type(e).__name__} {e}".replace("\n", " "), flush=True)
        elif line.strip() == "quit":
            break
    for t in txns:
        t.abort()
    lg.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
