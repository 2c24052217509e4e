"""Child of the crash campaign: a realistic agent workload through SessionStore until it is killed.

usage: python -m campaign.agent_child HOME PROFILE SEED READ_MODEL

Lines on stdout, each flushed as soon as it is true:
  READY                                  the store is open
  ACK <event type> <session> <seq>       one per acknowledged write (seq "-" for session.created,
                                         whose call returns the session id, not a seq)
  BEGIN sync|rebuild / END sync|rebuild  around explicit projector work (projection read model)
Any exception is a failure: traceback on stderr, exit status 3. The child also stops (exit 0)
when its parent goes away.
"""
from __future__ import annotations

import os
import random
import sys
import traceback
from typing import Any, Callable

import orjson

SOURCES = ["cli", "telegram", "discord", "cron", None]
MODELS = ["claude-sonnet-4", "gpt-4.1", "qwen3-32b", "llama-4-scout"]
PROVIDERS = ["anthropic", "openai", "openrouter", None]
TOOLS = ["terminal", "read_file", "web_search", "patch", "browser"]
WORDS = ["kernel", "gateway", "deploy", "migration", "flaky", "latency", "rollback", "schema", "cron",
         "webhook", "terminal", "payments", "refund", "cache", "retry"]
TITLES = ["Fix flaky payments test", "Deploy the gateway", "Refactor schema", "Investigate latency",
          "Write the release notes", "Debug webhook retries"]
EMOJI = ["👍", "🎉", "👀"]
AUTHORS = ["alice", "bob"]


class Agent:
    """Drives one store like an agent runtime would. ``say`` receives one output line per call."""

    def __init__(self, store: Any, rng: random.Random, say: Callable[[str], None]) -> None:
        self.store = store
        self.rng = rng
        self.say = say
        self.live: list[str] = []
        self.msgs: dict[str, list[int]] = {}
        self.can_rebuild = True
        self.refresh()

    def refresh(self) -> None:
        rows = self.store.list_sessions(archived=None, pinned=None, hidden=None, limit=None)
        self.live = sorted(r["id"] for r in rows)
        self.msgs = {sid: ids for sid, ids in self.msgs.items() if sid in set(self.live)}

    def ack(self, etype: str, sid: str, seq: int | None) -> None:
        if seq is not None:
            self.say(f"ACK {etype} {sid} {seq}")

    def messages_of(self, sid: str) -> list[int]:
        if sid not in self.msgs:
            self.msgs[sid] = [m["id"] for m in self.store.get_messages(sid, include_inactive=True)]
        return self.msgs[sid]

    def text(self, n: int = 8) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(n))

    # ---------------------------------------------------------------- operations

    def new_session(self) -> None:
        rng, store = self.rng, self.store
        parent = rng.choice(self.live) if self.live and rng.random() < 0.3 else None
        fields: dict[str, Any] = {
            "source": rng.choice(SOURCES), "model": rng.choice(MODELS),
            "model_config": {"temperature": rng.choice([0, 0.2, 0.7]), "max_tokens": 4096},
            "user_id": rng.randint(1, 5), "chat_type": rng.choice(["dm", "group", None]),
        }
        if parent is None:
            project = rng.choice(["payments", "gateway", "infra"])
            fields.update(cwd=f"/home/dev/src/{project}", git_repo_root=f"/home/dev/src/{project}",
                          git_branch=rng.choice(["main", "fix/flaky", "feat/retry"]))
        else:
            fields["parent_session_id"] = parent
        if rng.random() < 0.6:
            fields["title"] = store.next_title(rng.choice(TITLES))
            fields["title_source"] = rng.choice(["derived", "llm", "user"])
        sid = store.create_session(**fields)
        self.say(f"ACK session.created {sid} -")
        self.live.append(sid)
        self.msgs[sid] = []

    def turn(self) -> None:
        rng = self.rng
        sid = rng.choice(self.live)
        call_id = f"call_{rng.getrandbits(40):x}"
        tool = rng.choice(TOOLS)
        batch: list[dict[str, Any]] = [
            {"role": "user", "content": f"please {self.text(6)}"},
            {"role": "assistant", "content": f"I will check the {self.text(3)} first.",
             "reasoning": f"The user wants {self.text(10)}; start with the {tool} tool.",
             "tool_calls": [{"id": call_id, "type": "function",
                             "function": {"name": tool, "arguments": orjson.dumps({"q": self.text(2)}).decode()}}],
             "token_count": rng.randint(20, 400)},
        ]
        if rng.random() < 0.5:
            output: Any = f"{tool} output: {self.text(12)}"
        else:
            output = [{"type": "text", "text": f"{tool} says {self.text(5)}"},
                      {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]
        batch.append({"role": "tool", "tool_name": tool, "tool_call_id": call_id, "content": output})
        batch.append({"role": "assistant", "content": f"Done: {self.text(7)}", "finish_reason": "stop",
                      "display_metadata": {"elapsed_ms": rng.randint(100, 9000)}})
        if rng.random() < 0.5:
            seqs = self.store.append_messages(sid, batch)
        else:
            seqs = []
            for m in batch:
                m = dict(m)
                seqs.append(self.store.append_message(sid, m.pop("role"), m.pop("content", None), **m))
                self.ack("message.appended", sid, seqs[-1])
            self.messages_of(sid).extend(seqs)
            return
        for seq in seqs:
            self.ack("message.appended", sid, seq)
        self.messages_of(sid).extend(seqs)

    def usage(self) -> None:
        rng = self.rng
        sid = rng.choice(self.live)
        seq = self.store.record_usage(
            sid, model=rng.choice(MODELS), provider=rng.choice(PROVIDERS), task=rng.choice(["chat", "title", None]),
            input_tokens=rng.randint(0, 5000), output_tokens=rng.randint(0, 2000),
            cache_read_tokens=rng.randint(0, 1000), reasoning_tokens=rng.randint(0, 500),
            estimated_cost_usd=rng.choice([None, round(rng.random() / 10, 6)]),
            actual_cost_usd=rng.choice([None, None, round(rng.random() / 10, 6)]))
        self.ack("usage.recorded", sid, seq)

    def react(self) -> None:
        sid = self.rng.choice(self.live)
        ids = self.messages_of(sid)
        if ids:
            seq = self.store.react(self.rng.choice(ids), self.rng.choice(AUTHORS), self.rng.choice(EMOJI))
            self.ack("message.reaction_set", sid, seq)

    def rewind(self) -> None:
        sid = self.rng.choice(self.live)
        ids = self.messages_of(sid)
        if ids:
            self.ack("messages.rewound", sid, self.store.rewind(sid, self.rng.choice(ids[-4:])))

    def delete(self) -> None:
        if len(self.live) > 3:
            sid = self.rng.choice(self.live)
            self.ack("session.deleted", sid, self.store.delete_session(sid))
            self.refresh()  # the tombstone takes the session's descendants with it

    def flag(self) -> None:
        sid = self.rng.choice(self.live)
        which = self.rng.choice(["pin", "unpin", "archive", "unarchive", "hide", "unhide", "pin"])
        etype = {"pin": "session.pinned", "unpin": "session.unpinned", "archive": "session.archived",
                 "unarchive": "session.unarchived", "hide": "session.hidden", "unhide": "session.unhidden"}[which]
        self.ack(etype, sid, getattr(self.store, which)(sid))

    def title(self) -> None:
        sid = self.rng.choice(self.live)
        title = self.store.next_title(self.rng.choice(TITLES))
        self.ack("session.titled", sid, self.store.set_title(sid, title, self.rng.choice(["derived", "llm", "user"])))

    def end(self) -> None:
        sid = self.rng.choice(self.live)
        if self.rng.random() < 0.7:
            self.ack("session.ended", sid, self.store.end_session(sid, self.rng.choice(["user_exit", "compressed", "idle"])))
        else:
            self.ack("session.reopened", sid, self.store.reopen(sid))

    def project(self) -> None:
        if self.rng.random() < 0.8 or not self.can_rebuild:
            self.say("BEGIN sync")
            self.store.sync()
            self.say("END sync")
        else:
            from campaign import rebuild

            self.say("BEGIN rebuild")
            self.can_rebuild = rebuild(self.store)
            self.say("END rebuild" if self.can_rebuild else "END rebuild unavailable")

    def step(self, projection: bool = False) -> None:
        if len(self.live) < 2:
            self.new_session()
            return
        ops = [(self.new_session, 10), (self.turn, 40), (self.usage, 12), (self.react, 8), (self.rewind, 3),
               (self.delete, 3), (self.flag, 8), (self.title, 5), (self.end, 4)]
        if projection:
            ops.append((self.project, 6))
        fns, weights = zip(*ops)
        self.rng.choices(fns, weights)[0]()


def main() -> int:
    home, profile, seed, model = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    from eventlog.sessions.store import SessionStore

    parent = os.getppid()

    def say(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    try:
        with SessionStore.open(home, profile, read_model=model) as store:
            agent = Agent(store, random.Random(seed), say)
            say("READY")
            while os.getppid() == parent:
                agent.step(projection=model == "projection")
    except Exception:
        traceback.print_exc()
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
