"""Probe, from another process, whether a SQLite database file is still locked by its writer.

usage: python -m campaign.sqlite_lock_probe DB_FILE

Prints two words:
  HELD / FREE  whether any process still holds SQLite's shared lock on the database file
               (an fcntl lock on the SHARED range at 0x40000002; a plain ``open()``/``close()``
               of the file in the holder's process cancels it)
  BUSY / FREE  whether ``BEGIN IMMEDIATE`` from here fails with SQLITE_BUSY (``-``: not tried)
The shared-lock test comes first and the write test is skipped when it says FREE: a SQLite
connection that closes while nobody holds the shared lock believes it is the last one and
checkpoints and deletes the WAL — the very damage the probe looks for.
"""
from __future__ import annotations

import fcntl
import os
import sqlite3
import sys

SHARED_FIRST, SHARED_SIZE = 0x40000002, 510


def main() -> int:
    path = sys.argv[1]
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, SHARED_SIZE, SHARED_FIRST)
    except OSError:
        shared = "HELD"
    else:
        shared = "FREE"
        fcntl.lockf(fd, fcntl.LOCK_UN, SHARED_SIZE, SHARED_FIRST)
    finally:
        os.close(fd)
    if shared == "FREE":
        print("FREE -")
        return 0
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        write = "FREE"
    except sqlite3.OperationalError:
        write = "BUSY"
    finally:
        conn.close()
    print(shared, write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
