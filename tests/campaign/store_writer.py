"""Child of the concurrency test: THREADS threads appending to their own sessions through one SessionStore.

usage: python -m campaign.store_writer HOME PROFILE NAME THREADS COUNT READ_MODEL

Thread t creates session ``NAME-t<t>`` and appends COUNT messages whose content starts with the
tag ``NAME-t<t>-<i>``, recording usage every tenth message. Prints ``ACK <type> <session> <seq>``
per acknowledged write. Every error is printed on stderr (the parent fails on any stderr
output) and the child exits 1 after finishing the others.
"""
from __future__ import annotations

import sys
import threading
import traceback


def main() -> int:
    home, profile, name = sys.argv[1], sys.argv[2], sys.argv[3]
    threads, count, model = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
    from eventlog.sessions.store import SessionStore

    out = threading.Lock()
    errors: list[str] = []

    def say(line: str) -> None:
        with out:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def fail(what: str) -> None:
        with out:
            errors.append(what)
            sys.stderr.write(f"ERROR {what}\n{traceback.format_exc()}\n")
            sys.stderr.flush()

    with SessionStore.open(home, profile, read_model=model) as store:
        def work(t: int) -> None:
            sid = f"{name}-t{t}"
            try:
                store.create_session(id=sid, source="gateway" if t % 2 else "cli", model="m", title=f"load {sid}")
                say(f"ACK session.created {sid} -")
            except Exception:
                fail(f"create {sid}")
                return
            for i in range(count):
                try:
                    role = "user" if i % 2 == 0 else "assistant"
                    seq = store.append_message(sid, role, f"{sid}-{i} gateway latency probe {i}")
                    say(f"ACK message.appended {sid} {seq}")
                    if i % 10 == 9:
                        say(f"ACK usage.recorded {sid} {store.record_usage(sid, model='m', input_tokens=i, output_tokens=1)}")
                except Exception:
                    fail(f"append {sid} #{i}")

        ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
