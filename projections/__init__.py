"""Read models derived from the event log: state.db, the FTS index, the projector."""
