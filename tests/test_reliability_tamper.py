"""Tampering: random single-event edits of a closed log, made with raw LMDB, found by
``eventlog log verify``, which must exit 1 naming exactly the first bad seq.

Edits (each on a fresh copy of one realistic agent log):
- flip:    one bit of one byte of a stored event            -> that seq (a flip inside a zstd frame
           that decodes to the same event changes nothing: verify must pass; a few in a thousand)
- delete:  one event removed                                -> that seq
- insert:  a forged event slid in, later events moved up    -> that seq; if the forger chained it
           properly (right seq, prev and hash)               -> the next seq, where the chain breaks
- extend:  a properly chained forged event after the head   -> head + 1 (the recorded head disagrees)
- reorder: two events swapped                               -> the lower seq
- rewrite: an event's data changed and its own hash fixed    -> the next seq (the last one: itself)
"""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import lmdb
import pytest
from campaign import PROFILE, log_dir, size
from campaign.agent_child import Agent
from campaign.summary import note, record
from click.testing import CliRunner

from eventlog.cli import main
from eventlog.log import codec, stored
from eventlog.log.lmdb import seq_key
from eventlog.sessions.store import SessionStore

pytest_plugins = ["campaign.summary"]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    home = tmp_path_factory.mktemp("pristine")
    with SessionStore.open(home, PROFILE, read_model="fold", durability="nosync") as store:
        agent = Agent(store, random.Random(7), lambda line: None)
        while store.log.head()[0] < 150:
            agent.step()
        n = store.log.head()[0]
        assert store.log.verify().ok
    return home, n


class Raw:
    """A raw LMDB view of a closed log, for a forger who knows the storage format (only the
    format's own encoder and decoder, eventlog.log.stored, no log code)."""

    def __init__(self, path: Path) -> None:
        self.env = lmdb.open(str(path), max_dbs=8)
        self.db = self.env.open_db(b"events")
        self.meta = self.env.open_db(b"meta")
        self.compression = stored.Compression(self._dict)

    def _dict(self, dict_id: int) -> bytes | None:
        with self.env.begin() as txn:
            found = txn.get(b"zdict:%d" % dict_id, db=self.meta)
        return None if found is None else bytes(found)

    def envelope(self, seq: int) -> dict[str, Any]:
        return stored.envelope(seq, self.get(seq), self.compression)

    def encode(self, env: dict[str, Any]) -> bytes:
        """``env`` as the log stores it (format 2), whatever its hash says."""
        return stored.pack_envelope(env, self.compression)

    def __enter__(self) -> "Raw":
        self.txn = self.env.begin(write=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.txn.commit() if exc[0] is None else self.txn.abort()
        self.env.close()

    @staticmethod
    def in_zstd_blocks(value: bytes, at: int) -> bool:
        """Whether offset ``at`` of a format-2 value lies in its zstd frame past the frame
        header's first byte (its blocks): only there may a changed bit leave the event as it
        was. Everything before -- the header, the codec, the dictionary id -- must be checked."""
        if value[:1] != b"\x02":
            return False
        tail = stored.tail_at(value)
        return value[tail] in (stored.CODEC_ZSTD, stored.CODEC_ZSTD_DICT) and at >= tail + 3 + 5

    def same_event(self, seq: int, before: bytes, after: bytes) -> bool:
        """Whether stored value ``after`` decodes to the same canonical event bytes as ``before``."""
        try:
            return stored.canonical_bytes(seq, after, self.compression) == stored.canonical_bytes(
                seq, before, self.compression)
        except ValueError:
            return False

    def get(self, seq: int) -> bytes:
        value = self.txn.get(seq_key(seq), db=self.db)
        assert value is not None, seq
        return bytes(value)

    def put(self, seq: int, value: bytes) -> None:
        assert self.txn.put(seq_key(seq), value, db=self.db)

    def delete(self, seq: int) -> None:
        assert self.txn.delete(seq_key(seq), db=self.db)

    def slide_up(self, from_seq: int, n: int) -> None:
        """Move events from_seq..n one key up (to make room for an inserted one)."""
        for s in range(n, from_seq - 1, -1):
            self.put(s + 1, self.get(s))


def forged(after: dict[str, Any], seq: int, data: dict[str, Any]) -> dict[str, Any]:
    """A properly chained event at ``seq`` following envelope ``after`` (the forger knows the format)."""
    prep = codec.prepare({"type": "message.appended", "session": after.get("session"), "data": data,
                          "id": f"forged-{seq}", "v": 2})
    raw, _ = codec.seal(prep, seq, after["ts"] + 1, after["hash"])
    return codec.decode(raw)


def edit(rng: random.Random, raw: Raw, n: int) -> tuple[str, int]:
    """Apply one random edit; returns ``(kind, expected first bad seq)``."""
    kind = rng.choice(["flip", "delete", "insert", "insert-chained", "extend", "reorder", "rewrite"])
    k = rng.randint(1, n)
    if kind == "flip":
        before = raw.get(k)
        value = bytearray(before)
        at = rng.randrange(len(value))
        value[at] ^= 1 << rng.randrange(8)
        raw.put(k, bytes(value))
        if raw.in_zstd_blocks(before, at) and raw.same_event(k, before, bytes(value)):
            # Inside a zstd frame a few bits are not read by the decoder or give the same bytes
            # (a Huffman or FSE table written another way): the event, every byte of it the
            # chain covers and a read gives, is unchanged, so verify has nothing to name.
            return "flip (same event)", 0
        return kind, k
    if kind == "delete":
        raw.delete(k)
        return kind, k
    if kind == "insert":
        j = rng.choice([s for s in range(1, n + 1) if s != k])
        copy = raw.envelope(j)
        copy["data"] = dict(copy.get("data") or {}, forged=True)
        raw.slide_up(k, n)
        raw.put(k, raw.encode(copy))
        return kind, k
    if kind == "insert-chained":
        before = raw.envelope(k - 1) if k > 1 else {"ts": 0, "hash": codec.ZERO_HASH, "session": "s"}
        value = raw.encode(forged(before, k, {"role": "user", "content": "transfer the funds"}))
        raw.slide_up(k, n)
        raw.put(k, value)
        return kind, k + 1
    if kind == "extend":
        raw.put(n + 1, raw.encode(forged(raw.envelope(n), n + 1, {"role": "assistant", "content": "approved"})))
        return kind, n + 1
    if kind == "reorder":
        j = rng.choice([s for s in range(1, n + 1) if s != k])
        a, b = raw.get(k), raw.get(j)
        raw.put(k, b)
        raw.put(j, a)
        return kind, min(k, j)
    # rewrite: change the data and recompute this event's own hash (but not the rest of the chain)
    env = raw.envelope(k)
    data = dict(env.get("data") or {}, tampered=True)
    prep = codec.prepare({"type": env["type"], "session": env["session"], "data": data, "id": env["id"], "v": env["v"]})
    value, _ = codec.seal(prep, k, env["ts"], env["prev"])
    raw.put(k, raw.encode(codec.decode(value)))
    return kind, (k + 1 if k < n else k)


def verify(home: Path, as_json: bool) -> tuple[int, int | None, str]:
    args = ["--home", str(home), "--profile", PROFILE, "log", "verify"] + (["--json"] if as_json else [])
    r = CliRunner().invoke(main, args)
    if as_json:
        body = json.loads(r.stdout)
        return r.exit_code, body["first_bad_seq"], r.stderr
    bad = None
    if r.stderr.startswith("BROKEN at seq "):
        bad = int(r.stderr.split()[3].rstrip(":"))
    return r.exit_code, bad, r.stderr


def tamper_campaign(pristine: tuple[Path, int], tmp_path: Path, edits: int, seed: int, case: str) -> None:
    home, n = pristine
    rng = random.Random(seed)
    detected = undetected = misnamed = same = 0
    by_kind: dict[str, int] = {}
    wrong: list[str] = []
    for i in range(edits):
        work = tmp_path / f"edit{i}"
        dst = log_dir(work)
        dst.mkdir(parents=True)
        shutil.copy2(log_dir(home) / "data.mdb", dst / "data.mdb")
        with Raw(dst) as raw:
            kind, expect = edit(rng, raw, n)
        by_kind[kind] = by_kind.get(kind, 0) + 1
        code, bad, err = verify(work, as_json=i % 2 == 0)
        if expect == 0:  # the edit changed no event: a broken verdict would be a false alarm
            same += 1
            if code != 0:
                wrong.append(f"edit {i} ({kind}): exit {code} on a log whose events are unchanged: {err.strip()[:200]}")
        elif code == 0:
            undetected += 1
            wrong.append(f"edit {i} ({kind}) not detected")
        elif code == 1 and bad == expect:
            detected += 1
        else:
            misnamed += 1
            wrong.append(f"edit {i} ({kind}): exit {code}, named seq {bad}, expected {expect}: {err.strip()[:200]}")
        shutil.rmtree(work)
    record(case, runs=edits - same, passed=detected, undetected=undetected)
    note(f"{case}: seed {seed}, {edits} edits {by_kind}: {detected} detected at the exact seq, "
         f"{misnamed} detected at another seq, {undetected} undetected; {same} flips left every event "
         f"as it was (verify rightly passed)")
    assert not wrong, "\n".join(wrong[:10])


def test_tampering_default(pristine: tuple[Path, int], tmp_path: Path) -> None:
    tamper_campaign(pristine, tmp_path, size(30, 30), seed=99, case="tampering (single-event edits)")


@pytest.mark.campaign
def test_tampering_campaign(pristine: tuple[Path, int], tmp_path: Path) -> None:
    import time

    tamper_campaign(pristine, tmp_path, size(300, 300), seed=int(time.time()), case="tampering campaign")


def test_pristine_copy_verifies(pristine: tuple[Path, int], tmp_path: Path) -> None:
    """The harness itself: an untouched copy passes, so every failure above comes from the edit."""
    home, n = pristine
    dst = log_dir(tmp_path)
    dst.mkdir(parents=True)
    shutil.copy2(log_dir(home) / "data.mdb", dst / "data.mdb")
    assert verify(tmp_path, as_json=True)[:2] == (0, None)
    assert verify(tmp_path, as_json=False)[:2] == (0, None)


def test_a_chained_forgery_with_a_rewritten_head_needs_an_anchor(pristine: tuple[Path, int], tmp_path: Path) -> None:
    """A forger who appends a properly chained event *and* rewrites the recorded head makes a log
    that verifies: a hash chain alone cannot tell. The head hash changes, so an auditor who kept
    the head hash (``log verify --json`` → ``head_hash``) finds it."""
    home, n = pristine
    dst = log_dir(tmp_path)
    dst.mkdir(parents=True)
    shutil.copy2(log_dir(home) / "data.mdb", dst / "data.mdb")
    verify_args = ["--home", str(tmp_path), "--profile", PROFILE, "log", "verify", "--json"]
    before = json.loads(CliRunner().invoke(main, verify_args).stdout)
    with Raw(dst) as raw:
        env = forged(raw.envelope(n), n + 1, {"role": "assistant", "content": "approved"})
        raw.put(n + 1, raw.encode(env))
        raw.txn.put(b"head", seq_key(n + 1) + bytes.fromhex(env["hash"]), db=raw.meta)
    after = json.loads(CliRunner().invoke(main, verify_args).stdout)
    assert after["ok"] and after["head_seq"] == n + 1
    assert after["head_hash"] != before["head_hash"]
