"""``python -m eventlog.cli ...``: the ``eventlog`` command without its console script (a venv
whose scripts are not on PATH, a checkout on PYTHONPATH)."""
from eventlog.cli import main

main(prog_name="eventlog")
