"""Child of the fault tests: appends single events to an EventLog until told to stop.

usage: python -m campaign.log_writer LOG_DIR NAME STOP_FILE

Prints ``READY``, then ``ACK test.written <NAME> <seq>`` per acknowledged append. An
:class:`EventLogError` is a *detected* fault: it prints ``REFUSED <error type> <message>`` and
stops appending. Anything else is a failure: traceback on stderr, exit 3.
"""
from __future__ import annotations

import os
import sys
import traceback


def main() -> int:
    path, name, stop = sys.argv[1], sys.argv[2], sys.argv[3]
    from eventlog.errors import EventLogError
    from eventlog.log import EventLog

    try:
        with EventLog.open(path) as lg:
            print("READY", flush=True)
            i = 0
            while not os.path.exists(stop):
                try:
                    seq = lg.append([{"type": "test.written", "session": name, "id": f"{name}-{i}",
                                      "data": {"i": i, "pad": "p" * (i * 37 % 700)}}])[0]
                except EventLogError as e:
                    print(f"REFUSED {type(e).__name__} {e}".replace("\n", " "), flush=True)
                    break
                print(f"ACK test.written {name} {seq}", flush=True)
                i += 1
    except EventLogError as e:
        print(f"REFUSED {type(e).__name__} {e}".replace("\n", " "), flush=True)
    except Exception:
        traceback.print_exc()
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
