"""The contract as a new user meets it from outside: the ``eventlog`` console script run as a
separate process on a fresh home, its words, exit codes and JSON compared with what the README
and the issues write (outside audit, helper-58)."""
from __future__ import annotations

import json
import os
import resource
import sqlite3
import subprocess
import sys
from pathlib import Path

EXE = str(Path(sys.executable).with_name("eventlog"))


def run(home: Path, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("EVENTLOG_LOG_URL", None)
    return subprocess.run([EXE, "--home", str(home), "--profile", "p", *args], input=input,
                          capture_output=True, text=True, timeout=60, env=env)


def test_a_taken_session_id_is_refused_naming_the_option(tmp_path: Path) -> None:
    """`sessions new --id ID` with an id already in use: one line naming `--id` (as every other
    `--id` error does), a hint in command-line words, exit 1, nothing appended. It said
    "id: ... (hint: omit id to get a fresh one)", the Python call's words."""
    home = tmp_path / "home"
    first = run(home, "sessions", "new", "--id", "s1")
    assert first.returncode == 0 and first.stdout == "s1\n", first
    head = run(home, "log", "verify", "--json")

    again = run(home, "sessions", "new", "--id", "s1", "--source", "cron")
    assert again.returncode == 1 and again.stdout == "", again
    assert again.stderr == ("error: --id: session id 's1' is already used "
                            "(hint: omit --id to get a fresh one)\n"), again.stderr
    assert run(home, "log", "verify", "--json").stdout == head.stdout  # nothing appended


def test_sessions_list_names_the_option_it_refuses(tmp_path: Path) -> None:
    """`sessions list --workspace ''` is refused (an empty path would match every folder) naming
    `--workspace`, as `search --session ''` names `--session`; it said "invalid workspace", the
    Python parameter's name."""
    home = tmp_path / "home"
    assert run(home, "init").returncode == 0
    r = run(home, "sessions", "list", "--workspace", "")
    assert r.returncode == 1 and r.stdout == "", r
    assert r.stderr.startswith("error: invalid --workspace: must be a path") and r.stderr.count("\n") == 1, r.stderr


def test_a_hermes_import_from_stdin_is_a_usage_error(tmp_path: Path) -> None:
    """`import --format hermes -`: FILE takes '-' (stdin) for a jsonl export, but a Hermes
    state.db is opened by name. It said "invalid source: - does not exist or is not a file",
    naming a parameter the command line does not have; now a usage error saying why (exit 2),
    and no profile is created."""
    home = tmp_path / "home"
    db = tmp_path / "state.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT, started_at REAL)")
    con.execute("INSERT INTO sessions VALUES ('s1', 'cli', 1700000000.0)")
    con.commit()
    con.close()
    r = run(home, "import", "--format", "hermes", "-", input=db.read_bytes().decode("latin-1"))
    assert r.returncode == 2 and r.stdout == "", r
    assert "Error: --format hermes needs a file name" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (home / "profiles" / "p").exists()
    assert run(home, "import", "--format", "hermes", str(db)).returncode == 0  # by name it is read


def _data_limit() -> None:
    # The guard for this test's own machine: without the bound the command read /dev/zero until
    # the kernel's OOM killer ended it (24 GB here, taking other processes' memory with it).
    # RLIMIT_DATA caps the heap, not the log's shared file mapping.
    resource.setrlimit(resource.RLIMIT_DATA, (2 << 30, 2 << 30))


def test_messages_add_refuses_a_content_file_that_never_ends(tmp_path: Path) -> None:
    """`messages add --content-file /dev/zero` (or an endless pipe) is refused once more than an
    event may hold has been read: one line naming --content-file, exit 1, nothing appended.
    It read the whole file into memory first and was killed by the OOM killer."""
    home = tmp_path / "home"
    assert run(home, "sessions", "new", "--id", "s1").returncode == 0
    head = run(home, "log", "verify", "--json").stdout
    env = dict(os.environ)
    env.pop("EVENTLOG_LOG_URL", None)
    r = subprocess.run([EXE, "--home", str(home), "--profile", "p", "messages", "add", "s1", "--role", "user",
                        "--content-file", "/dev/zero"], capture_output=True, text=True, timeout=120, env=env,
                       preexec_fn=_data_limit)
    assert r.returncode == 1 and r.stdout == "", (r.returncode, r.stderr[-2000:])
    assert r.stderr.startswith("error: invalid --content-file: more than 16777216 bytes") \
        and r.stderr.count("\n") == 1, r.stderr
    assert run(home, "log", "verify", "--json").stdout == head  # nothing appended
    ok = run(home, "messages", "add", "s1", "--role", "user", "--content-file", "-", input="x" * 100_000)
    assert ok.returncode == 0, ok  # a file within the limit is read whole
    shown = run(home, "sessions", "show", "s1", "--json")
    assert '"content": "' + "x" * 100_000 + '"' in shown.stdout


def _zero_into(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("EVENTLOG_LOG_URL", None)
    with open("/dev/zero", "rb") as zero:
        return subprocess.run([EXE, "--home", str(home), "--profile", "p", *args], stdin=zero, capture_output=True,
                              text=True, timeout=300, env=env, preexec_fn=_data_limit)


def test_append_and_import_refuse_a_line_that_never_ends(tmp_path: Path) -> None:
    """`eventlog append` and `eventlog import -` read stdin line by line; a line that never ends
    (stdin from /dev/zero, an endless pipe) was read whole into memory until the process died
    (a MemoryError traceback under this test's 2 GB limit, the OOM killer without one). Now the
    line is refused past the longest one an event can need: one line naming it, exit 1, nothing
    written and no profile left behind by the import."""
    home = tmp_path / "home"
    assert run(home, "sessions", "new", "--id", "s1").returncode == 0
    head = run(home, "log", "verify", "--json").stdout

    r = _zero_into(home, "append")
    assert r.returncode == 1 and r.stdout == "", (r.returncode, r.stderr[-2000:])
    assert r.stderr.startswith("error: invalid line 1: longer than ") and r.stderr.count("\n") == 1, r.stderr
    assert run(home, "log", "verify", "--json").stdout == head

    r = _zero_into(home, "import", "-")
    assert r.returncode == 1 and r.stdout == "", (r.returncode, r.stderr[-2000:])
    assert r.stderr.startswith("error: invalid line 1: longer than ") and r.stderr.count("\n") == 1, r.stderr
    assert run(home, "log", "verify", "--json").stdout == head

    fresh = tmp_path / "fresh"
    r = _zero_into(fresh, "import", "-")
    assert r.returncode == 1 and r.stderr.startswith("error: invalid line 1: longer than "), r.stderr[-2000:]
    assert not (fresh / "profiles" / "p").exists()

    ok = run(home, "append", input='{"type":"message.appended","session":"s1","data":{"role":"user","content":"'
                                   + "y" * 200_000 + '"}}\n')
    assert ok.returncode == 0 and ok.stdout.strip().isdigit(), ok  # an ordinary long line still goes in


def test_import_reads_an_export_from_a_pipe_once(tmp_path: Path) -> None:
    """`eventlog import <(cat export.jsonl)` or a named pipe: the file was opened twice, once for
    its first 16 bytes (is it SQLite?) and again for the import. A pipe does not give its bytes
    twice: the import said `read=0 imported=0`, exit 0, and left an empty profile (from
    `<(...)`), or waited forever for a second writer (a FIFO). Now the file is opened once."""
    src = tmp_path / "src"
    assert run(src, "sessions", "new", "--id", "s1", "--title", "From a pipe").returncode == 0
    assert run(src, "messages", "add", "s1", "--role", "user", "--content", "piped words").returncode == 0
    export = tmp_path / "export.jsonl"
    assert run(src, "export", str(export)).returncode == 0
    head = run(src, "log", "verify", "--json").stdout

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    dest = tmp_path / "dest"
    env = dict(os.environ)
    env.pop("EVENTLOG_LOG_URL", None)
    reader = subprocess.Popen([EXE, "--home", str(dest), "--profile", "p", "import", str(fifo), "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    with open(fifo, "wb") as w:  # blocks until the import opens its end
        w.write(export.read_bytes())
    try:
        out, err = reader.communicate(timeout=60)
    finally:
        reader.kill()
    assert reader.returncode == 0, err
    assert json.loads(out) == {"already_present": 0, "imported": 2, "mode": "verbatim", "read": 2}
    assert run(dest, "log", "verify", "--json").stdout == head
    shown = run(dest, "sessions", "show", "s1", "--json")
    assert json.loads(shown.stdout)["messages"][0]["content"] == "piped words"

    db = tmp_path / "state.db"
    sqlite3.connect(db).close()
    db.write_bytes(b"SQLite format 3\x00" + b"\x00" * 4080)
    os.unlink(fifo)
    os.mkfifo(fifo)
    reader = subprocess.Popen([EXE, "--home", str(tmp_path / "other"), "--profile", "p", "import", str(fifo)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    with open(fifo, "wb") as w:
        w.write(db.read_bytes())
    try:
        out, err = reader.communicate(timeout=60)
    finally:
        reader.kill()
    assert reader.returncode == 1 and "is a SQLite database, not a JSONL export" in err, err  # still told


def test_append_each_json_says_what_landed_before_a_refusal(tmp_path: Path) -> None:
    """`append --each` appends line by line; when a later line is refused (a title another
    session holds), the text form has already printed the earlier seqs, but `--json` printed
    nothing, so a script could not tell that line 1 was stored. Now `--json` prints
    `{"seqs": [...]}` of what landed before the one-line error (exit 1), and the title
    conflict's hint names a free title, not a Python API (SessionStore.next_title())."""
    home = tmp_path / "home"
    lines = ('{"type":"session.created","session":"e1","data":{"title":"Dup"}}\n'
             '{"type":"session.created","session":"e2","data":{"title":"Dup"}}\n')
    r = run(home, "append", "--each", "--json", input=lines)
    assert r.returncode == 1, r
    assert json.loads(r.stdout) == {"seqs": [1]}
    assert r.stderr == ("error: line 2.data.title: 'Dup' is already used by session 'e1' "
                        "(hint: choose another title, e.g. 'Dup #2')\n"), r.stderr
    tail = run(home, "log", "tail", "--json")
    assert [json.loads(x)["session"] for x in tail.stdout.splitlines()] == ["e1"]

    r = run(home, "append", input='{"type":"session.created","session":"e3","data":{"title":"Dup"}}\n')
    assert r.returncode == 1 and r.stdout == "" and "e.g. 'Dup #2'" in r.stderr, r


def test_a_taken_title_is_refused_naming_the_option(tmp_path: Path) -> None:
    """A title another session holds, given as `sessions new --title` or `sessions title ID
    TITLE`: the one line names `--title` / `TITLE`, as the other refusals of those values do
    ("invalid --title: ...", "invalid TITLE: ..."). It said "title: ...", the Python field, while
    `--id` already named its option; exit 1, nothing appended."""
    home = tmp_path / "home"
    assert run(home, "sessions", "new", "--id", "s1", "--title", "Dup").returncode == 0
    assert run(home, "sessions", "new", "--id", "s2").returncode == 0
    head = run(home, "log", "verify", "--json").stdout

    r = run(home, "sessions", "new", "--id", "s3", "--title", "Dup")
    assert r.returncode == 1 and r.stdout == "", r
    assert r.stderr == ("error: --title: 'Dup' is already used by session 's1' "
                        "(hint: choose another title, e.g. 'Dup #2')\n"), r.stderr
    r = run(home, "sessions", "title", "s2", "Dup")
    assert r.returncode == 1 and r.stdout == "", r
    assert r.stderr == ("error: TITLE: 'Dup' is already used by session 's1' "
                        "(hint: choose another title, e.g. 'Dup #2')\n"), r.stderr
    r = run(home, "sessions", "title", "s2", "   ")  # the other refusal of the same argument, for comparison
    assert r.returncode == 1 and r.stderr.startswith("error: invalid TITLE: "), r.stderr
    assert run(home, "log", "verify", "--json").stdout == head  # nothing appended


def test_a_malformed_session_id_is_refused_naming_the_argument(tmp_path: Path) -> None:
    """`eventlog sessions archive 'bad id'` (and every command taking a session id argument):
    the line named "session", the event envelope's key, where `--help` shows SESSION_ID and
    the other arguments and options are named as given (TITLE, --reason). Now "invalid
    SESSION_ID: ...", exit 1, nothing appended."""
    home = tmp_path / "home"
    assert run(home, "sessions", "new", "--id", "s1").returncode == 0
    head = run(home, "log", "verify", "--json").stdout
    for args in (["sessions", "archive"], ["sessions", "unarchive"], ["sessions", "pin"], ["sessions", "unpin"],
                 ["sessions", "delete"], ["sessions", "end"], ["sessions", "erase", "--reason", "r"],
                 ["messages", "add", "--role", "user", "--content", "x"]):
        r = run(home, *args[:2], "bad id", *args[2:])
        assert r.returncode == 1 and r.stdout == "", (args, r)
        assert r.stderr.startswith("error: invalid SESSION_ID: must be 1-128 characters"), (args, r.stderr)
        assert r.stderr.count("\n") == 1, r.stderr
    r = run(home, "sessions", "title", "bad id", "T")
    assert r.returncode == 1 and r.stderr.startswith("error: invalid SESSION_ID: "), r.stderr
    assert run(home, "log", "verify", "--json").stdout == head  # nothing appended


def test_a_busy_writer_hint_gives_no_python_option(tmp_path: Path) -> None:
    """Another process holds the log's writer lock past the lock timeout: a command's one line
    named that process (as before) but its hint said "raise the lock timeout for long waits", a
    SessionStore/EventLog option no command has. Now the hint says how long a command waits;
    exit 1, nothing written."""
    import fcntl

    home = tmp_path / "home"
    assert run(home, "sessions", "new", "--id", "s1").returncode == 0
    head = run(home, "log", "verify", "--json").stdout
    fd = os.open(home / "profiles" / "p" / "log" / "writer.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # this test's process is the writer the command waits for
        r = run(home, "messages", "add", "s1", "--role", "user", "--content", "x")
    finally:
        os.close(fd)
    assert r.returncode == 1 and r.stdout == "", r
    assert f"is being written by process {os.getpid()} (running)" in r.stderr, r.stderr
    assert r.stderr.endswith("(hint: retry once that process's write is done "
                             "(a command waits for it at most 10 s))\n"), r.stderr
    assert "lock timeout" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert run(home, "log", "verify", "--json").stdout == head  # nothing written


def test_a_command_reading_a_closed_stdin_is_a_usage_error(tmp_path: Path) -> None:
    """Started with stdin closed (`<&-`, a supervisor that closes it), `append`, `import -` and
    `messages add --content-file -` ended in an AttributeError / RuntimeError traceback (Python
    sets sys.stdin to None). Each is now click's usage error naming the closed stdin (exit 2),
    with nothing appended and no profile created."""
    home = tmp_path / "home"

    def closed_stdin(*args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "EVENTLOG_LOG_URL"}
        return subprocess.run(["sh", "-c", 'exec "$@" <&-', "sh", EXE, "--home", str(home), "--profile", "p", *args],
                              capture_output=True, text=True, timeout=60, env=env)

    for args, said in ((["append"], "Error: append reads the events from stdin, but stdin is closed"),
                       (["import", "-"], "Error: FILE '-' reads the export from stdin, but stdin is closed")):
        r = closed_stdin(*args)
        assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr, r
        assert said in r.stderr, r.stderr
    assert not (home / "profiles" / "p").exists()  # neither created the profile

    assert run(home, "sessions", "new", "--id", "s1").returncode == 0
    head = run(home, "log", "verify", "--json").stdout
    r = closed_stdin("messages", "add", "s1", "--role", "user", "--content-file", "-")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r
    assert "Invalid value for '--content-file': '-' reads stdin, but stdin is closed" in r.stderr, r.stderr
    assert run(home, "log", "verify", "--json").stdout == head  # nothing appended
    r = run(home, "messages", "add", "s1", "--role", "user", "--content-file", "-", input="from stdin\n")
    assert r.returncode == 0, r  # an open stdin is read as before


def test_a_command_started_with_stdout_closed_is_a_usage_error_before_any_work(tmp_path: Path) -> None:
    """`eventlog export -` (and `--format md|html --session ID -`) started with stdout closed
    (`>&-`) ended in an AttributeError traceback ('NoneType' object has no attribute 'buffer',
    then 'flush'); `sessions new` and `append` did their work and exited 0 with the new id / seqs
    lost. Now click's usage error naming the closed stdout, exit 2, before anything is written."""
    home = tmp_path / "home"
    assert run(home, "sessions", "new", "--id", "s1").returncode == 0
    head = run(home, "log", "verify", "--json").stdout
    env = {k: v for k, v in os.environ.items() if k != "EVENTLOG_LOG_URL"}

    def closed_stdout(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", EXE, "--home", str(home), "--profile", "p", *args],
                              input=input, capture_output=True, text=True, timeout=60, env=env)

    for fmt in ("jsonl", "md", "html"):
        args = ["export", "--format", fmt, *(["--session", "s1"] if fmt != "jsonl" else []), "-"]
        r = closed_stdout(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r
        assert "Error: stdout is closed" in r.stderr, r.stderr
        assert run(home, *args).returncode == 0  # an open stdout gets it as before
    for args, stdin in ((["sessions", "new"], None), (["append"], '{"type":"session.created","session":"s2","data":{}}\n'),
                        (["messages", "add", "s1", "--role", "user", "--content", "hi"], None)):
        r = closed_stdout(*args, input=stdin)
        assert r.returncode == 2 and "Error: stdout is closed" in r.stderr and "Traceback" not in r.stderr, r
    assert run(home, "log", "verify", "--json").stdout == head  # nothing was written


def test_append_names_the_line_whose_title_is_taken(tmp_path: Path) -> None:
    """`eventlog append` names every refused value by its line ("line 2.data.role: ..."), but a
    title another session holds said "title: 'Dup' is already used ...", leaving the user to find
    the line. Now "line N.data.title: ...": with --each the line that was refused, in one batch
    the first line giving the title to a session other than its holder (which may be a session
    of the same input). Exit 1, nothing of the batch appended."""
    home = tmp_path / "home"
    assert run(home, "append", input='{"type":"session.created","session":"e1","data":{"title":"Dup"}}\n').returncode == 0
    head = run(home, "log", "verify", "--json").stdout
    lines = ('{"type":"session.created","session":"e2","data":{}}\n'
             '{"type":"session.created","session":"e3","data":{"title":"Fresh"}}\n'
             '{"type":"session.titled","session":"e2","data":{"title":"Dup"}}\n')
    r = run(home, "append", input=lines)
    assert r.returncode == 1 and r.stdout == "", r
    assert r.stderr.startswith("error: line 3.data.title: 'Dup' is already used by session 'e1' "), r.stderr
    lines = ('{"type":"session.created","session":"e4","data":{"title":"Twin"}}\n'
             '{"type":"session.created","session":"e5","data":{"title":"Twin"}}\n')
    r = run(home, "append", input=lines)
    assert r.returncode == 1 and r.stderr.startswith("error: line 2.data.title: 'Twin' is already used by "
                                                     "session 'e4' "), r.stderr
    # The hint's free title counts the batch's own holder: it suggested the refused 'Twin' itself.
    assert "e.g. 'Twin #2'" in r.stderr, r.stderr
    assert "e.g. 'Dup #2'" in run(home, "append", input=lines.replace("Twin", "Dup")).stderr  # held in the log
    assert run(home, "log", "verify", "--json").stdout == head  # nothing appended


def test_append_hints_a_title_no_line_of_its_input_gives(tmp_path: Path) -> None:
    """A title refused because an earlier line holds it was hinted as a title another line of
    the same input gives: 'Twin' refused got 'Twin #2' (line 2's), 'Twin #2' refused got 'Twin'
    (line 1's), and the input the hint led to was refused again. Every title of the input now
    counts as taken: 'Twin #3', which the input then takes."""
    home = tmp_path / "home"
    for third in ("Twin", "Twin #2"):
        lines = ['{"type":"session.created","session":"a","data":{"title":"Twin"}}\n',
                 '{"type":"session.created","session":"b","data":{"title":"Twin #2"}}\n',
                 '{"type":"session.created","session":"c","data":{"title":"%s"}}\n']
        r = run(home, "append", input="".join(lines) % third)
        assert r.returncode == 1 and r.stderr.startswith(f"error: line 3.data.title: '{third}' is already used"), r
        assert "e.g. 'Twin #3'" in r.stderr, r.stderr
    assert run(home, "append", input="".join(lines) % "Twin #3").returncode == 0


def test_a_command_started_with_a_read_only_stdout_is_a_usage_error_before_any_work(tmp_path: Path) -> None:
    """`eventlog sessions new 1</dev/null` created the session, then failed to print its id with
    "error: cannot use: Bad file descriptor", exit 1: read as nothing done, and a retry made a
    second session. A stdout open for reading only is now refused as a closed one is (exit 2,
    before any work)."""
    home = tmp_path / "home"
    assert run(home, "sessions", "new", "--id", "s1").returncode == 0
    head = run(home, "log", "verify", "--json").stdout
    env = {k: v for k, v in os.environ.items() if k != "EVENTLOG_LOG_URL"}
    for args in (["sessions", "new"], ["messages", "add", "s1", "--role", "user", "--content", "hi"]):
        r = subprocess.run(["sh", "-c", 'exec "$@" 1</dev/null', "sh", EXE, "--home", str(home), "--profile", "p",
                            *args], capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 2 and "stdout is open for reading only" in r.stderr and "Traceback" not in r.stderr, r
    assert run(home, "log", "verify", "--json").stdout == head  # nothing was written
