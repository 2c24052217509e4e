"""Deterministic, seeded generator of realistic agent traffic.

The stream imitates what a gateway serving many conversations writes: a pool of
concurrently active sessions, each producing turns of

    user -> (assistant with tool_calls -> tool result per call)* -> assistant

interleaved message by message across the active sessions.  Content sizes follow
a clipped log-normal per role (100 B .. 8 KiB, most messages small, a long tail
of large tool outputs), about a quarter of all messages are assistant messages
carrying tool calls, some assistant messages carry reasoning text, and tool
messages carry ``tool_name``/``tool_call_id`` matching the call they answer.

Everything is a pure function of ``(n_messages, seed)``: two runs (or two
contender subprocesses) see byte-identical traffic.  Messages are produced
lazily (``messages()``, ``chunks()``, ``batch_chunks()``) so a benchmark can
materialise one bounded chunk at a time, outside its clock, and peak RSS stays
a property of the store under test rather than of the workload.
"""
from __future__ import annotations

import json
import math
import random
from itertools import islice
from typing import Any, Iterator

DEFAULT_SEED = 20251202

MIN_CONTENT = 100
MAX_CONTENT = 8192

# (median bytes, sigma) of the log-normal size per kind of message.
SIZE_PARAMS = {
    "user": (260, 0.9),
    "assistant_final": (900, 0.85),
    "assistant_tool": (160, 0.5),
    "tool": (1100, 1.05),
    "reasoning": (600, 0.7),
}

ACTIVE_SESSIONS = 24          # conversations in flight at once
MEAN_SESSION_LEN = 50         # messages; so sessions ~= messages / 50
REASONING_SHARE = 0.3         # of assistant messages

TOOLS = (
    "terminal", "read_file", "write_file", "patch", "search_files",
    "web_search", "web_extract", "browser_navigate", "execute_code", "todo",
)

_SYLLABLES = (
    "ka", "lo", "mi", "ren", "sto", "va", "qui", "tor", "el", "an", "us", "is",
    "pra", "de", "zu", "nor", "bel", "cha", "fi", "gro", "hex", "jo", "ly", "mar",
)
_TECH_WORDS = (
    "the", "a", "to", "of", "and", "in", "is", "that", "for", "it", "with", "as",
    "file", "error", "function", "return", "config", "test", "build", "deploy",
    "python", "docker", "kubernetes", "database", "index", "query", "session",
    "token", "agent", "model", "request", "response", "timeout", "retry", "lock",
    "commit", "branch", "merge", "import", "module", "class", "method", "string",
    "value", "list", "dict", "json", "yaml", "http", "server", "client", "cache",
    "memory", "thread", "process", "signal", "kernel", "latency", "throughput",
    "sqlite", "lmdb", "fsync", "journal", "schema", "migration", "rollback",
    "café", "naïve", "résumé", "日本語", "データ", "emoji🙂",
)


def _lognormal_size(rng: random.Random, kind: str, lo: int = MIN_CONTENT, hi: int = MAX_CONTENT) -> int:
    median, sigma = SIZE_PARAMS[kind]
    size = int(rng.lognormvariate(math.log(median), sigma))
    return max(lo, min(hi, size))


class _Corpus:
    """A few MiB of Zipf-distributed words; contents are slices of it."""

    def __init__(self, seed: int, n_chars: int = 3 * 1024 * 1024, vocab_size: int = 6000) -> None:
        rng = random.Random(seed ^ 0x5EED)
        words = list(_TECH_WORDS)
        seen = set(words)
        while len(words) < vocab_size:
            w = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4)))
            if w not in seen:
                seen.add(w)
                words.append(w)
        self.vocab = words
        # Zipf weights: rank r has weight 1/r.
        cum = []
        total = 0.0
        for r in range(1, len(words) + 1):
            total += 1.0 / r
            cum.append(total)
        parts: list[str] = []
        length = 0
        while length < n_chars:
            sentence = rng.choices(words, cum_weights=cum, k=rng.randint(6, 22))
            s = " ".join(sentence)
            roll = rng.random()
            if roll < 0.04:
                s = "```\n" + s.replace(" ", "\n    ", 3) + "\n```\n"
            elif roll < 0.10:
                s = "- " + s + "\n"
            else:
                s = s[0].upper() + s[1:] + ". "
            parts.append(s)
            length += len(s)
        self.text = "".join(parts)

    def take(self, rng: random.Random, size: int) -> str:
        text = self.text
        start = rng.randrange(0, len(text) - size - 1)
        # Start on a word boundary when one is near, like real prose.
        sp = text.find(" ", start, start + 24)
        if sp != -1:
            start = sp + 1
        return text[start:start + size]


class _Session:
    __slots__ = ("sid", "target", "emitted", "pending")

    def __init__(self, sid: str, target: int) -> None:
        self.sid = sid
        self.target = target
        self.emitted = 0
        self.pending: list[dict[str, Any]] = []


class Workload:
    """``n_messages`` messages of realistic agent traffic, reproducible from ``seed``."""

    def __init__(self, n_messages: int, seed: int = DEFAULT_SEED) -> None:
        if n_messages < 1:
            raise ValueError("n_messages must be >= 1")
        self.n_messages = int(n_messages)
        self.seed = int(seed)
        self._corpus: _Corpus | None = None

    # -- public streams -----------------------------------------------------------------

    def messages(self, start: int = 0, stop: int | None = None) -> Iterator[dict[str, Any]]:
        """Messages ``start`` .. ``stop`` (default: all) of the stream."""
        gen = (m for m, _last in self._stream())
        return islice(gen, start, self.n_messages if stop is None else min(stop, self.n_messages))

    def chunks(self, size: int = 5000, start: int = 0, stop: int | None = None) -> Iterator[list[dict[str, Any]]]:
        """The stream as lists of at most ``size`` messages."""
        it = self.messages(start, stop)
        while True:
            chunk = list(islice(it, size))
            if not chunk:
                return
            yield chunk

    def batches(self, max_batch: int = 100, stop: int | None = None) -> Iterator[tuple[str, list[dict[str, Any]]]]:
        """``(session_id, messages)``: consecutive messages of ONE session, at most
        ``max_batch`` of them, emitted when the batch is full or the session ends (or
        the stream, cut at ``stop`` messages, ends).  Every message appears once."""
        buffers: dict[str, list[dict[str, Any]]] = {}
        for msg, last in islice(self._stream(), self.n_messages if stop is None else stop):
            sid = msg["session_id"]
            buf = buffers.setdefault(sid, [])
            buf.append(msg)
            if len(buf) >= max_batch or last:
                yield sid, buf
                del buffers[sid]
        for sid, buf in buffers.items():
            if buf:
                yield sid, buf

    def batch_chunks(
        self, max_batch: int = 100, messages_per_chunk: int = 5000, stop: int | None = None
    ) -> Iterator[list[tuple[str, list[dict[str, Any]]]]]:
        """``batches()`` grouped into lists holding about ``messages_per_chunk`` messages."""
        chunk: list[tuple[str, list[dict[str, Any]]]] = []
        count = 0
        for b in self.batches(max_batch, stop):
            chunk.append(b)
            count += len(b[1])
            if count >= messages_per_chunk:
                yield chunk
                chunk, count = [], 0
        if chunk:
            yield chunk

    def search_terms(self, k: int = 100) -> list[str]:
        """``k`` deterministic FTS queries: frequent, mid-frequency and rare words, and
        a few two-word AND queries, all drawn from the corpus vocabulary."""
        corpus = self._get_corpus()
        rng = random.Random(self.seed ^ 0x5EA4C4)
        ascii_vocab = [w for w in corpus.vocab if w.isascii() and w.isalpha() and len(w) > 2]
        out: list[str] = []
        for i in range(k):
            band = i % 4
            if band == 0:
                w = rng.choice(ascii_vocab[:60])
            elif band == 1:
                w = rng.choice(ascii_vocab[60:600])
            elif band == 2:
                w = rng.choice(ascii_vocab[600:])
            else:
                w = rng.choice(ascii_vocab[:300]) + " " + rng.choice(ascii_vocab[60:1500])
            out.append(w)
        return out

    # -- helpers for contenders ---------------------------------------------------------

    @staticmethod
    def encoded_size(msg: dict[str, Any]) -> int:
        return len(json.dumps(msg, ensure_ascii=False).encode("utf-8"))

    def describe(self) -> dict[str, Any]:
        """Summary statistics of the stream (walks it once)."""
        n = sessions = tool_call_msgs = reasoning = 0
        roles: dict[str, int] = {}
        sizes: list[int] = []
        seen: set[str] = set()
        for m in self.messages():
            n += 1
            roles[m["role"]] = roles.get(m["role"], 0) + 1
            sizes.append(len(m["content"].encode("utf-8")))
            if m["tool_calls"]:
                tool_call_msgs += 1
            if m["reasoning"]:
                reasoning += 1
            if m["session_id"] not in seen:
                seen.add(m["session_id"])
                sessions += 1
        sizes.sort()
        return {
            "messages": n,
            "sessions": sessions,
            "roles": roles,
            "assistant_with_tool_calls_share": round(tool_call_msgs / n, 3),
            "with_reasoning_share": round(reasoning / n, 3),
            "content_bytes": {
                "min": sizes[0], "p50": sizes[len(sizes) // 2],
                "p90": sizes[int(len(sizes) * 0.9)], "max": sizes[-1],
                "mean": round(sum(sizes) / n, 1),
            },
            "seed": self.seed,
        }

    # -- generation ---------------------------------------------------------------------

    def _get_corpus(self) -> _Corpus:
        if self._corpus is None:
            self._corpus = _Corpus(self.seed)
        return self._corpus

    def _stream(self) -> Iterator[tuple[dict[str, Any], bool]]:
        """Yields ``(message, is_last_message_of_its_session)`` forever-ish (n_messages)."""
        corpus = self._get_corpus()
        rng = random.Random(self.seed)
        next_session = 0

        def new_session() -> _Session:
            nonlocal next_session
            next_session += 1
            sid = f"s{next_session:07d}-{rng.getrandbits(32):08x}"
            # Log-normal length with mean ~MEAN_SESSION_LEN (median ~ mean * e^{-s^2/2}).
            sigma = 0.8
            mu = math.log(MEAN_SESSION_LEN) - sigma * sigma / 2
            target = max(3, min(600, int(rng.lognormvariate(mu, sigma))))
            return _Session(sid, target)

        active = [new_session() for _ in range(ACTIVE_SESSIONS)]
        produced = 0
        while produced < self.n_messages:
            idx = rng.randrange(len(active))
            sess = active[idx]
            if not sess.pending:
                sess.pending = self._turn(rng, corpus, sess.sid)
                sess.pending.reverse()  # pop() from the end in order
            msg = sess.pending.pop()
            sess.emitted += 1
            produced += 1
            # A session ends at a turn boundary once it has reached its target length.
            last = (not sess.pending and sess.emitted >= sess.target) or produced == self.n_messages
            if last and produced < self.n_messages:
                active[idx] = new_session()
            yield msg, last

    def _turn(self, rng: random.Random, corpus: _Corpus, sid: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []

        def msg(role: str, content: str, **kw: Any) -> dict[str, Any]:
            reasoning = kw.get("reasoning")
            tool_calls = kw.get("tool_calls")
            tokens = len(content) // 4 + (len(reasoning) // 4 if reasoning else 0)
            if tool_calls:
                tokens += sum(len(c["function"]["arguments"]) for c in tool_calls) // 4 + 8 * len(tool_calls)
            return {
                "session_id": sid,
                "role": role,
                "content": content,
                "tool_calls": tool_calls,
                "tool_name": kw.get("tool_name"),
                "tool_call_id": kw.get("tool_call_id"),
                "reasoning": reasoning,
                "token_count": tokens,
            }

        out.append(msg("user", corpus.take(rng, _lognormal_size(rng, "user"))))
        # Rounds of tool use: 0..5, mean ~1.6.
        rounds = min(5, int(rng.expovariate(1 / 2.1)))
        for _ in range(rounds):
            calls: list[dict[str, Any]] = []
            for _c in range(1 + (rng.random() < 0.25) + (rng.random() < 0.08)):
                name = rng.choice(TOOLS)
                calls.append({
                    "id": f"call_{rng.getrandbits(96):024x}",
                    "type": "function",
                    "function": {"name": name, "arguments": self._arguments(rng, corpus, name)},
                })
            reasoning = (corpus.take(rng, _lognormal_size(rng, "reasoning", hi=4096))
                         if rng.random() < REASONING_SHARE else None)
            out.append(msg("assistant", corpus.take(rng, _lognormal_size(rng, "assistant_tool", hi=1024)),
                           tool_calls=calls, reasoning=reasoning))
            for call in calls:
                out.append(msg("tool", corpus.take(rng, _lognormal_size(rng, "tool")),
                               tool_name=call["function"]["name"], tool_call_id=call["id"]))
        reasoning = (corpus.take(rng, _lognormal_size(rng, "reasoning", hi=4096))
                     if rng.random() < REASONING_SHARE else None)
        out.append(msg("assistant", corpus.take(rng, _lognormal_size(rng, "assistant_final")),
                       reasoning=reasoning))
        return out

    @staticmethod
    def _arguments(rng: random.Random, corpus: _Corpus, name: str) -> str:
        if name in ("read_file", "write_file", "patch"):
            args: dict[str, Any] = {"path": f"src/{corpus.take(rng, 12).strip().replace(' ', '_')}.py"}
            if name != "read_file":
                args["content"] = corpus.take(rng, rng.randint(40, 600))
        elif name == "terminal":
            args = {"command": "cd repo && " + corpus.take(rng, rng.randint(10, 120)), "timeout": 120}
        elif name in ("web_search", "search_files"):
            args = {"query": corpus.take(rng, rng.randint(8, 60)), "limit": 10}
        elif name in ("web_extract", "browser_navigate"):
            args = {"url": f"https://docs.example.org/{rng.getrandbits(40):x}"}
        else:
            args = {"code": corpus.take(rng, rng.randint(30, 400))}
        return json.dumps(args, ensure_ascii=False)
