"""Drop-in faces of eventlog for agent runtimes and frameworks.

Each adapter lives in its own subpackage and is imported only when asked for; the core
(``eventlog.log``, ``eventlog.sessions``, ``projections``) never imports an adapter.
"""
