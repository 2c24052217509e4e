"""Writes tests/data/format1-log.tgz's log with the first release (commit dcf2959), whose API this uses:

    git worktree add /tmp/rel dcf2959
    PYTHONPATH=/tmp/rel python tests/data/make_format1_log.py /tmp/home
    (cd /tmp/home/profiles/legacy && tar czf - log/data.mdb) > tests/data/format1-log.tgz
"""
import random
import sys

from eventlog.store import SessionStore

home = sys.argv[1]
rng = random.Random(1)
with SessionStore.open(home, "legacy", read_model="fold", durability="nosync") as s:
    sids = []
    for i in range(6):
        sid = s.create_session(id=f"legacy-{i}", source=rng.choice(["cli", "gateway"]), model="gpt-x",
                               title=f"Legacy session {i}", cwd=f"/work/app{i % 2}")
        sids.append(sid)
        for j in range(20):
            role = ["user", "assistant", "tool"][j % 3]
            mid = s.append_message(sid, role, f"message {j} of session {i}: " + " ".join(
                rng.choice(["alpha", "beta", "gamma", "delta", "kernel", "webhook", "naïve", "日本語", "🙂"]) for _ in range(30)),
                **({"tool_name": "grep", "tool_call_id": f"c{j}"} if role == "tool" else {}))
        s.record_usage(sid, model="gpt-x", provider="acme", input_tokens=100 * i, output_tokens=7, estimated_cost_usd=0.001 * i)
        s.react(mid, author="alice", emoji="👍")
    s.set_title(sids[1], "Renamed legacy", source="user")
    s.archive(sids[2])
    s.pin(sids[3])
    s.rewind(sids[4], s.get_messages(sids[4])[10]["id"])
    s.delete_session(sids[5])
    s.end_session(sids[0], "done")
    print(s.log.head())
