"""The log's storage formats: format 2 (compact header, zstd with a trained dictionary) for new
logs, format 1 (canonical JSON) read and written unchanged in logs of the first release."""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import lmdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog.log import codec, stored
from eventlog.log import lmdb as lmdb_module
from eventlog.log.contract import JSON_VALUES, ODD_ENVELOPES, sealed_chain
from eventlog.log.lmdb import EventLog, generation_dir
from eventlog.sessions.store import SessionStore

DATA = Path(__file__).parent / "data"
WORDS = ("gateway", "rollback", "latency", "webhook", "terminal", "kernel", "deploy", "config", "naïve", "日本語",
         "retry", "session", "token", "the", "a", "of", "and", "to", "in", "is", "🙂", "index", "query")


def message(rng: random.Random, i: int) -> dict[str, Any]:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 300)))
    return {"type": "message.appended", "session": f"s{i % 7}", "v": 2,
            "data": {"role": rng.choice(["user", "assistant", "tool"]), "content": f"{i}: {words}"}}


def stored_values(path: Path) -> dict[int, bytes]:
    env = lmdb.open(str(path), max_dbs=8, readonly=True, lock=False)
    db = env.open_db(b"events")
    with env.begin() as txn:
        out = {int.from_bytes(k, "big"): bytes(v) for k, v in txn.cursor(db=db)}
    env.close()
    return out


def codec_of(value: bytes) -> int:
    """The data codec byte of a format-2 value."""
    return value[stored.tail_at(value)]


def test_new_logs_are_format_2_and_read_back_canonical_bytes(tmp_path: Path) -> None:
    rng = random.Random(1)
    with EventLog.open(tmp_path / "log", durability="nosync") as lg:
        lg.append([message(rng, i) for i in range(200)])
        canonical = dict(lg.read(raw=True))
        assert lg._core.format == stored.FORMAT_2 and lg.verify().ok
    values = stored_values(tmp_path / "log")
    assert all(v[0] == stored.KIND_EVENT for v in values.values())
    for seq, raw in canonical.items():
        assert codec.canonical(codec.decode(raw)) == raw
    ratio = sum(map(len, canonical.values())) / sum(map(len, values.values()))
    assert ratio > 1.5, f"format 2 stored {ratio:.2f}x smaller than canonical JSON"


def test_a_trained_dictionary_serves_this_and_other_processes(tmp_path: Path) -> None:
    rng = random.Random(2)
    p = tmp_path / "log"
    with EventLog.open(p, durability="nosync") as lg:
        lg.append([message(rng, i) for i in range(600)])
        assert lg._core.train_dictionary() == 1
        lg.append([message(rng, i) for i in range(600, 700)])
        mine = dict(lg.read(raw=True))
        assert lg.verify().ok
    values = stored_values(p)
    assert {codec_of(values[s]) for s in range(601, 701)} == {stored.CODEC_ZSTD_DICT}
    assert stored.CODEC_ZSTD in {codec_of(values[s]) for s in range(1, 601)}
    code = ("import sys, hashlib\nfrom eventlog.log.lmdb import EventLog\n"
            "with EventLog.open(sys.argv[1]) as lg:\n"
            "    h = hashlib.sha256(b''.join(raw for _, raw in lg.read(raw=True))).hexdigest()\n"
            "    print(lg.verify().ok, h)")
    out = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, check=True).stdout.split()
    import hashlib
    assert out == ["True", hashlib.sha256(b"".join(mine[s] for s in sorted(mine))).hexdigest()]


def test_a_dictionary_is_trained_in_the_background(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lmdb_module, "DICT_TRAIN_AFTER", 300)
    rng = random.Random(3)
    with EventLog.open(tmp_path / "log", durability="nosync") as lg:
        for b in range(4):
            lg.append([message(rng, b * 100 + i) for i in range(100)])
        deadline = time.monotonic() + 30
        while not lg._core.compression.current and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lg._core.compression.current == 1
        seq = lg.append([message(rng, 999)])[0]
        assert lg.verify().ok
    assert codec_of(stored_values(tmp_path / "log")[seq]) == stored.CODEC_ZSTD_DICT


def test_damaged_bytes_of_format_2_events_in_the_file_are_found_at_their_seq(tmp_path: Path) -> None:
    rng = random.Random(4)
    p = tmp_path / "log"
    with EventLog.open(p, durability="nosync") as lg:
        lg.append([message(rng, i) for i in range(400)])
        lg._core.train_dictionary()
        lg.append([message(rng, i) for i in range(400, 460)])
    values = stored_values(p)
    pristine = (p / "data.mdb").read_bytes()
    trial = tmp_path / "trial"
    for attempt in range(40):
        seq = rng.choice([s for s in values if len(values[s]) < 1800])  # not on overflow pages split oddly
        data = bytearray(pristine)
        offset, bit = rng.randrange(len(values[seq])), 1 << rng.randrange(8)
        at = pristine.find(values[seq])
        assert at >= 0
        while at >= 0:  # the live page, and any stale copy LMDB's copy-on-write left behind
            data[at + offset] ^= bit
            at = pristine.find(values[seq], at + 1)
        shutil.rmtree(trial, ignore_errors=True)
        trial.mkdir()
        (trial / "data.mdb").write_bytes(bytes(data))
        with EventLog.open(trial, readonly=True) as lg:
            res = lg.verify()
        assert not res.ok and res.first_bad_seq == seq, (attempt, seq, offset, res)


@settings(max_examples=150, deadline=None)
@given(data=st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=5), big=st.booleans(),
       session=st.none() | st.from_regex(codec.ID_RE, fullmatch=True),
       eid=st.none() | st.from_regex(codec.ID_RE, fullmatch=True) | st.binary(min_size=16, max_size=16).map(bytes.hex),
       seq=st.integers(1, 2**40), ts=st.integers(0, 2**63 - 1), v=st.integers(1, 1000))
def test_format_2_gives_back_the_canonical_bytes(data: dict[str, Any], big: bool, session: str | None, eid: str | None,
                                                   seq: int, ts: int, v: int) -> None:
    if big:
        data = dict(data, pad="lorem ipsum " * 40)
    event: dict[str, Any] = {"type": "a.b", "session": session, "data": data, "v": v}
    if eid is not None:
        event["id"] = eid
    p = codec.prepare(event)
    prev = "ab" * 32
    raw, digest = codec.seal(p, seq, ts, prev)
    compression = stored.Compression(lambda _id: None)
    value = stored.pack(p, ts, prev, digest, compression)
    assert stored.canonical_bytes(seq, value, compression) == raw
    assert stored.envelope(seq, value, compression) == codec.decode(raw)


def test_a_log_of_the_first_release_opens_verifies_and_serves_unchanged(tmp_path: Path) -> None:
    """tests/data/format1-log.tgz was written by the first release (commit dcf2959) running
    tests/data/make_format1_log.py: 144 events of 6 sessions."""
    log_dir = tmp_path / "profiles" / "legacy"
    log_dir.mkdir(parents=True)
    with tarfile.open(DATA / "format1-log.tgz") as tar:
        tar.extractall(log_dir)
    p = log_dir / "log"
    with EventLog.open(p) as lg:
        assert lg._core.format == stored.FORMAT_1
        res = lg.verify()
        assert res.ok and res.head_seq == 144
        assert res.head_hash == "3bfb99759e40e39b8c2c6f2f185447259acc3acd977129792e738e01c82ad743"
    with SessionStore.open(tmp_path, "legacy", follower=False) as store:
        assert store.get_session("legacy-1")["title"] == "Renamed legacy"
        assert store.get_session("legacy-5") is None  # deleted
        assert {s["id"] for s in store.list_sessions(archived=True)} >= {"legacy-2"}
        assert len(store.get_messages("legacy-4")) == 10  # rewound at its 11th message
        assert store.search("naïve")["results"]
        seq = store.append_message("legacy-0", "user", "written after the upgrade")
    values = stored_values(p)
    assert values[seq][:1] == b"{", "a format-1 log keeps being written in format 1 (older processes may share it)"
    with EventLog.open(p) as lg:
        assert lg.verify().ok and lg.head()[0] == seq


def _judged_by_canonical_bytes(seq: int, value: bytes, prev: str, compression: stored.Compression) -> str | None:
    """What ``check_event`` says of the canonical bytes ``read(raw=True)`` gives for ``value``
    (an undecodable value is passed through as stored, as the log does)."""
    from eventlog.log.damage import check_event

    try:
        raw = stored.canonical_bytes(seq, value, compression)
    except ValueError:
        raw = value
    return check_event(raw, seq, prev)[1]


def test_the_fast_chain_check_of_format_2_judges_like_the_canonical_bytes(tmp_path: Path) -> None:
    """Builds check format-2 events without building their canonical bytes
    (``stored.checked_envelope``); every stored event passes both checks with the same envelope,
    and every damage — a bit flipped anywhere in the stored value, or data re-encoded
    non-canonically with a hash a forger recomputed — fails both."""
    rng = random.Random(11)
    p = tmp_path / "log"
    with EventLog.open(p, durability="nosync") as lg:
        lg.append([message(rng, i) for i in range(300)])
        lg._core.train_dictionary()
        lg.append([message(rng, i) for i in range(300, 360)] + [
            {"type": "note.added", "session": None, "data": {"b": [1, 2.5, None, True], "a": "x"}},
            {"type": "note.added", "session": "s1", "id": "a" * 32, "data": {}}])
        compression = lg._core.compression  # it loads dictionaries from the open log
        expected = list(lg.read(1))
        values = dict(lg._core._stored(1, None))  # the stored values, as a build reads them
        _check_fast_against_canonical(rng, expected, values, compression)


def _check_fast_against_canonical(rng: random.Random, expected: list[dict[str, Any]], values: dict[int, bytes],
                                  compression: stored.Compression) -> None:
    import orjson

    prev = codec.ZERO_HASH
    checked = 0
    for env in expected:
        seq, value = env["seq"], values[env["seq"]]
        assert stored.checked_envelope(seq, value, prev, compression) == (env, None)
        for _ in range(25):
            flipped = bytearray(value)
            flipped[rng.randrange(len(value))] ^= 1 << rng.randrange(8)
            fast = stored.checked_envelope(seq, bytes(flipped), prev, compression)
            slow = _judged_by_canonical_bytes(seq, bytes(flipped), prev, compression)
            if fast is None:  # no longer a format-2 event (the kind byte): the slow path judges it
                assert flipped[0] != value[0]
                continue
            assert (fast[1] is None) == (slow is None), (seq, fast, slow)
            checked += 1
        # A forger re-encodes the data non-canonically and recomputes the hash over those bytes.
        data = orjson.dumps(env["data"], option=orjson.OPT_INDENT_2) if env["data"] else b"{ }"
        body = b"".join((b'{"data":', data, b',"id":', orjson.dumps(env["id"]), b',"prev":"', prev.encode(),
                         b'","seq":', str(seq).encode(), b',"session":', orjson.dumps(env["session"]),
                         b',"ts":', str(env["ts"]).encode(), b',"type":', orjson.dumps(env["type"]), b',"v":',
                         str(env["v"]).encode(), b"}"))
        digest = codec._sha256(bytes.fromhex(prev) + body).hexdigest()
        forged = stored.pack_parts(env["type"], env["v"], env["session"], env["id"], env["ts"], prev, digest,
                                   stored.CODEC_RAW, 0, data)
        fast = stored.checked_envelope(seq, forged, prev, compression)
        assert fast is not None and fast[1] == "stored bytes are not the canonical encoding of the event"
        assert _judged_by_canonical_bytes(seq, forged, prev, compression) is not None
        # The same event after another prev is out of the chain.
        assert stored.checked_envelope(seq, value, "f" * 64, compression) == (
            None, "prev does not match the hash of the previous event")
        prev = env["hash"]
    assert checked > 5000


def test_zstd_codecs_are_pooled_per_log_and_safe_across_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Frameworks write from short-lived threads: the log lends its (de)compressors out one call
    at a time instead of building a zstd context per thread; many threads at once still each get
    their own and every payload round-trips."""
    import threading

    import zstandard

    made = {"c": 0, "d": 0}
    real_c, real_d = zstandard.ZstdCompressor, zstandard.ZstdDecompressor

    def counting(kind: str, real: Any) -> Any:
        def make(*args: Any, **kwargs: Any) -> Any:
            made[kind] += 1
            return real(*args, **kwargs)
        return make

    monkeypatch.setattr(zstandard, "ZstdCompressor", counting("c", real_c))
    monkeypatch.setattr(zstandard, "ZstdDecompressor", counting("d", real_d))
    comp = stored.Compression(lambda _id: None)
    data = b'{"text":"' + b"agent tool call result " * 20 + b'"}'

    def one() -> None:
        c, d, payload = comp.compress(data)
        assert c == stored.CODEC_ZSTD and comp.decompress(c, d, payload) == data

    for _ in range(20):  # one short-lived thread after another
        t = threading.Thread(target=one)
        t.start()
        t.join()
    assert made == {"c": 1, "d": 1}

    failures: list[BaseException] = []

    def many(k: int) -> None:
        try:
            for i in range(200):
                mine = b'{"k":%d,"i":%d,"text":"' % (k, i) + b"x%d " % k * 40 + b'"}'
                c, d, payload = comp.compress(mine)
                assert comp.decompress(c, d, payload) == mine
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)

    threads = [threading.Thread(target=many, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    assert made["c"] <= 1 + 8 and made["d"] <= 1 + 8


def _raw_events(lg: EventLog) -> list[bytes]:
    return [bytes(b) for _, b in lg.read(raw=True)]


def test_sealed_events_format_2_cannot_hold_keep_their_bytes(tmp_path: Path) -> None:
    """An import of a valid chain whose envelopes format 2's header cannot hold (an extra key,
    a negative or float ts, a version over 65535) stores those events' canonical bytes as they
    are. An extra key was dropped (the log then failed its own verify and refused every append)
    and the others ended in a traceback (found by an outside audit)."""
    raws = sealed_chain(ODD_ENVELOPES)
    with EventLog.open(tmp_path / "log") as lg:
        assert lg._core.format == stored.FORMAT_2
        assert lg.append_sealed(raws) == len(raws)
        assert _raw_events(lg) == raws and lg.verify().ok
        lg.append([{"type": "x.y", "session": "s1", "data": {}}])
        assert lg.verify().ok
        lg.compact()
        assert _raw_events(lg)[: len(raws)] == raws and lg.verify().ok
    values = stored_values(generation_dir(tmp_path / "log"))
    assert [values[q][:1] == b"{" for q in sorted(values)] == [True, True, True, True, False, True, False], \
        "only what format 2 cannot hold keeps its JSON"


def test_a_first_format_log_with_events_format_2_cannot_hold_migrates(tmp_path: Path) -> None:
    """The compaction that migrates a first-format log to format 2 keeps such events' bytes;
    it failed ('int too large to convert', the copy not verifying) and left g1.tmp behind on
    every try (found by an outside audit)."""
    log_dir = tmp_path / "profiles" / "legacy"
    log_dir.mkdir(parents=True)
    with tarfile.open(DATA / "format1-log.tgz") as tar:
        tar.extractall(log_dir)
    p = log_dir / "log"
    with EventLog.open(p) as lg:  # the first release's chain, continued by the odd events
        assert lg._core.format == stored.FORMAT_1
        head_seq, head_hash = lg.head()
        assert lg.append_sealed(sealed_chain(ODD_ENVELOPES, head_hash, head_seq + 1)) == len(ODD_ENVELOPES)
        assert lg.verify().ok
        before = _raw_events(lg)
        lg.compact()
        assert lg._core.format == stored.FORMAT_2
        assert _raw_events(lg) == before and lg.verify().ok
    assert not [n for n in os.listdir(p) if n.endswith(".tmp")]


def test_a_dictionary_id_that_names_other_bytes_is_loaded_again() -> None:
    """Logs written before dictionary ids were kept unique could give a retired dictionary's id
    to new bytes: a process that had the old ones must take the new ones when told to use the id
    (``use``), and compress and read with them from then on."""
    def corpus(word: str) -> list[bytes]:
        return [codec.canonical({"text": f"{word} {i} " + f"{word} and more {word} " * 12}) for i in range(900)]

    old, new = stored.train(corpus("alpha")), stored.train(corpus("omega"))
    assert old is not None and new is not None and old != new
    stored_dicts = {1: old}
    comp = stored.Compression(lambda i: stored_dicts.get(i))
    comp.use(1, old)
    sample = corpus("omega")[7]
    with_old = comp.compress(sample)
    assert comp.decompress(with_old[0], 1, with_old[2]) == sample
    stored_dicts[1] = new  # the log now holds other bytes under id 1
    comp.use(1, new)
    codec_id, dict_id, payload = comp.compress(sample)
    reader = stored.Compression(lambda i: stored_dicts.get(i))  # a process that only knows the new ones
    assert (dict_id, reader.decompress(codec_id, 1, payload)) == (1, sample)
    assert comp.decompress(codec_id, 1, payload) == sample


LEGACY_ORJSON = r'''
import re, sys
import orjson

real = orjson.dumps
NUMBER_EXPONENT = re.compile(rb'"(?:[^"\\]|\\.)*"|(?<=[0-9])e\+(?=[0-9])', re.S)


def dumps(obj, default=None, option=None):  # what orjson before 3.11 writes: 1e30, not 1e+30
    out = real(obj, default=default, option=option)
    return NUMBER_EXPONENT.sub(lambda m: m.group(0) if m.group(0)[:1] == b'"' else b"e", out)


orjson.dumps = dumps
assert orjson.dumps([1e30, "1e+30"]) == b'[1e30,"1e+30"]'
from eventlog.log.lmdb import EventLog

with EventLog.open(sys.argv[1]) as log:
    assert log.verify().ok, log.verify()
    log.append([{"type": "metric.seen", "session": "s1", "data": {"n": float(sys.argv[2]), "when": "e+1"}}])
    assert log.verify().ok
'''


def test_a_log_sealed_under_either_orjson_float_spelling_stays_intact(tmp_path: Path) -> None:
    """orjson spells 1e30 as ``1e30`` before 3.11 and ``1e+30`` since, and the chain covers the
    bytes as sealed: a log written under orjson 3.10 read as damaged under 3.13 (every append
    refused, its export refused by import), and the other way round (found by an outside audit).
    An older orjson is stood in for by one whose output is respelled the way it wrote it."""
    from sqlite_export.jsonl import export_jsonl, import_jsonl

    p = tmp_path / "log"
    old = subprocess.run([sys.executable, "-c", LEGACY_ORJSON, str(p), "1e30"], capture_output=True, text=True,
                         timeout=120)
    assert old.returncode == 0, old.stderr
    with EventLog.open(p) as lg:
        raw = dict(lg.read(1, raw=True))[1]
        assert b'"n":1e30' in raw and b'"when":"e+1"' in raw
        assert lg.verify().ok
        lg.append([{"type": "metric.seen", "session": "s1", "data": {"n": 2.5e17}}])
        lg.append([{"type": "metric.seen", "session": "s2", "data": {"n": -3e300}}])
        assert lg.verify().ok and [e["data"]["n"] for e in lg.read(1)] == [1e30, 2.5e17, -3e300]
        assert [r for *_, r in lg.read_checked(1, 3, codec.ZERO_HASH)] == [None] * 3  # what catch-ups read
        whole, one = tmp_path / "whole.jsonl", tmp_path / "s1.jsonl"
        with whole.open("wb") as out:
            export_jsonl(lg, out)
        with one.open("wb") as out:
            export_jsonl(lg, out, session="s1")
        head = lg.head()
    for name, file, mode in (("restored", whole, True), ("appended", one, False)):
        with EventLog.open(tmp_path / name) as other, file.open("rb") as lines:
            import_jsonl(other, lines, whole=mode)
            assert other.verify().ok, name
            assert [e["data"]["n"] for e in other.read(1)] == ([1e30, 2.5e17, -3e300] if mode else [1e30, 2.5e17])
            if mode:
                assert other.head() == head
    with EventLog.open(p) as lg:
        lg.compact()
        assert lg.verify().ok and lg.head() == head
    again = subprocess.run([sys.executable, "-c", LEGACY_ORJSON, str(p), "4e20"], capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0, again.stderr  # the older orjson reads what the newer one sealed
    with EventLog.open(p) as lg:
        assert lg.verify().ok and lg.head()[0] == 4


def test_respelling_touches_numbers_only() -> None:
    """Any orjson this project allows writes one of the two spellings (a third would fail here)."""
    plus = b'{"a":[1e+30,-2.5e+17,1e-7,3.0],"e+1":"1e+30 and 2e5","n":12}'
    plain = b'{"a":[1e30,-2.5e17,1e-7,3.0],"e+1":"1e+30 and 2e5","n":12}'
    encoded = codec.canonical({"a": [1e30, -2.5e+17, 1e-7, 3.0], "e+1": "1e+30 and 2e5", "n": 12})
    assert encoded in (plus, plain)
    assert codec.respelled(encoded) == (plain if encoded == plus else plus)
    assert codec.respelled(codec.respelled(encoded) or b"") == encoded
    assert codec.respelled(b'{"a":"1e+30","b":[1e-5,"\\"2e+3"]}') is None
    assert codec.same_canonical(encoded, codec.respelled(encoded) or b"")
    assert not codec.same_canonical(encoded, encoded.replace(b"3.0", b"4.0"))


def test_a_first_format_log_written_under_the_older_float_spelling_stays_intact(tmp_path: Path) -> None:
    """The same in a format-1 log (canonical JSON stored as it is), as catch-ups read it."""
    log_dir = tmp_path / "profiles" / "legacy"
    log_dir.mkdir(parents=True)
    with tarfile.open(DATA / "format1-log.tgz") as tar:
        tar.extractall(log_dir)
    p = log_dir / "log"
    old = subprocess.run([sys.executable, "-c", LEGACY_ORJSON, str(p), "1e30"], capture_output=True, text=True,
                         timeout=120)
    assert old.returncode == 0, old.stderr
    assert stored_values(p)[145].startswith(b'{"data":{"n":1e30,')
    with EventLog.open(p) as lg:
        assert lg.verify().ok
        checked = list(lg.read_checked(140, 145, lg.hash_at(139) or ""))
        assert [r for *_, r in checked] == [None] * 6 and checked[-1][2]["data"]["n"] == 1e30


def test_every_bit_of_a_stored_header_and_its_codec_fields_is_checked(tmp_path: Path) -> None:
    """A changed bit anywhere in a format-2 value's header, its codec byte, its dictionary id or
    its zstd frame header is damage at that seq. The dictionary id of data stored raw or with
    plain zstd was read and ignored, and so was the frame header's unused bit: 2,400 and 107 of
    346,744 single-bit flips of a 150-event agent log passed verify (found by the tampering
    campaign). Walked exhaustively for one event of each codec; one such flip also end to end,
    in the file."""
    rng = random.Random(6)
    p = tmp_path / "log"
    with EventLog.open(p, durability="nosync") as lg:
        lg.append([{"type": "message.appended", "session": "s0", "v": 2, "data": {"role": "user", "content": "hi"}}])
        lg.append([message(rng, i) for i in range(400)])
        lg._core.train_dictionary()
        lg.append([message(rng, i) for i in range(400, 410)])
        hashes = {seq: env["hash"] for seq, env in ((e["seq"], e) for e in lg.read())}
    values = stored_values(p)
    env = lmdb.open(str(p), max_dbs=8, readonly=True, lock=False)
    meta = env.open_db(b"meta", create=False)
    with env.begin() as txn:
        zdict = bytes(txn.get(b"zdict:1", db=meta))
    env.close()
    compression = stored.Compression(lambda dict_id: zdict if dict_id == 1 else None)
    picked = {}
    for seq in sorted(values):
        picked.setdefault(codec_of(values[seq]), seq)
    assert set(picked) == {stored.CODEC_RAW, stored.CODEC_ZSTD, stored.CODEC_ZSTD_DICT}
    for codec_id, seq in picked.items():
        value, prev = values[seq], hashes.get(seq - 1, codec.ZERO_HASH)
        assert stored.checked_envelope(seq, value, prev, compression) == (stored.envelope(seq, value, compression), None)
        tail = stored.tail_at(value)
        end = tail + 3 + (5 if codec_id != stored.CODEC_RAW else 0)  # codec, dictionary id, frame magic + header byte
        for at in range(end):
            for bit in range(8):
                flipped = bytearray(value)
                flipped[at] ^= 1 << bit
                found = stored.checked_envelope(seq, bytes(flipped), prev, compression)
                reason = (found[1] if found is not None  # else no format-2 event: as verify, by its canonical bytes
                          else _judged_by_canonical_bytes(seq, bytes(flipped), prev, compression))
                assert reason is not None, (codec_id, at - tail, bit)
    # End to end: the dictionary id of the raw event, changed in the file, is named by verify.
    seq = picked[stored.CODEC_RAW]
    value = values[seq]
    data = bytearray((p / "data.mdb").read_bytes())
    at = bytes(data).find(value)
    tail = len(value) - len(b'{"content":"hi","role":"user"}') - 3
    assert value[tail:tail + 3] == b"\x00\x00\x00"
    data[at + tail + 2] ^= 1
    trial = tmp_path / "trial"
    trial.mkdir()
    (trial / "data.mdb").write_bytes(bytes(data))
    with EventLog.open(trial, readonly=True) as lg:
        res = lg.verify()
    assert not res.ok and res.first_bad_seq == seq
