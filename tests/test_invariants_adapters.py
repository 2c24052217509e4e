"""The adapters' own read models, written against mutations no other test caught (the mutation
audit): the LangGraph read model is a function of the log that ignores a deleted thread's later
events, whoever appended them (an earlier program, another host), rebuilt or caught up."""
from __future__ import annotations

from pathlib import Path

from test_adapter_langgraph import cfg, checkpoint

from eventlog import SessionStore
from eventlog.adapters.langgraph import EventlogSaver


def _late_rows(s: EventlogSaver) -> int:
    with s._open().read_model("langgraph") as conn:
        return int(conn.execute("SELECT count(*) FROM langgraph_checkpoints WHERE thread_id = 't'").fetchone()[0])


def test_a_checkpoint_appended_after_its_threads_deletion_is_not_in_the_read_model(tmp_path: Path) -> None:
    with EventlogSaver(home=tmp_path) as s:
        c = checkpoint({"x": "t"}, {"x": 1})
        c["id"] = "c1"
        s.put(cfg("t"), c, {"run_id": "run-1"}, {"x": 1})
        store = s._open()
        put = next(e for e in store.log.read_session("lg:t") if e["type"] == "langgraph.checkpoint_put")
        with SessionStore.open(tmp_path) as other:
            other.delete_session("lg:t")
        # What a process that did not know of the deletion could still append to the stream.
        store.log.append([{"type": put["type"], "session": "lg:t", "v": put["v"],
                           "data": {**put["data"], "checkpoint_id": "c2"}}])
        assert _late_rows(s) == 0
        assert s.get_tuple(cfg("t")) is None
    with EventlogSaver(home=tmp_path) as s:
        s._open().rebuild()
        assert _late_rows(s) == 0
        assert s.get_tuple(cfg("t")) is None
