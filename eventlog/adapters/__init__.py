"""Drop-in faces of eventlog for agent runtimes and frameworks (imported only when asked for)."""
