"""Snapshots out of the log (state.db, JSONL, transcripts) and migrations into it."""
