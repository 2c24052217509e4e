"""Child process: follow a PostgreSQL log from seq 1 and print ``F <seq>`` per event (not collected).

usage: proc_pg_follower.py URL PROFILE IDLE_S
Prints ``READY`` once following, and exits at the first event of type ``test.end`` (not
printed), or after IDLE_S seconds without a new event.
"""
from __future__ import annotations

import sys

from eventlog.log.postgres import PostgresLog


def main() -> None:
    url, profile, idle = sys.argv[1], sys.argv[2], float(sys.argv[3])
    with PostgresLog.open(url, profile=profile) as log:
        print("READY", flush=True)
        out = []
        for env in log.follow(1, timeout=idle):
            if env["type"] == "test.end":
                break
            out.append(f"F {env['seq']}\n")
            if len(out) >= 50:
                sys.stdout.write("".join(out))
                sys.stdout.flush()
                out = []
        sys.stdout.write("".join(out))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
