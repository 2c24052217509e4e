"""Markdown and HTML transcripts (sqlite_export.transcript)."""
from __future__ import annotations

import html
import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from eventlog.sessions.store import SessionStore
from sqlite_export.transcript import iso_time, render_html, render_markdown

T0 = 1_735_725_600.0  # 2025-01-01T10:00:00Z
XSS = "<script>document.documentElement.setAttribute('data-pwned','1')</script>"


def build(home: Path) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """A session written through the store; returns (session, active messages, all messages)."""
    with SessionStore.open(home, "t", read_model="fold", durability="nosync") as store:
        sid = store.create_session("sess-1", title="Trip <b>planning</b> & more", source="telegram",
                                   model="claude-x", started_at=T0, cwd="/home/u")
        store.append_message(sid, "user", "Where should I go? " + XSS, timestamp=T0 + 1)
        store.append_message(sid, "assistant", None, timestamp=T0 + 2, reasoning="The user wants ideas",
                             tool_calls=[{"id": "c1", "type": "function",
                                          "function": {"name": "web_search", "arguments": '{"q": "lisbon ```x```"}'}},
                                         {"id": "c2", "name": "<img src=x onerror=alert(1)>", "input": {"a": 1}}])
        store.append_message(sid, "tool", "Lisbon is sunny", tool_name="web_search", tool_call_id="c1", timestamp=T0 + 3)
        store.append_message(sid, "user", [{"type": "text", "text": "and this photo?"},
                                           {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}],
                             timestamp=T0 + 4)
        gone = store.append_message(sid, "assistant", "a reply that was rewound", timestamp=T0 + 5)
        store.rewind(sid, gone)
        store.append_message(sid, "assistant", "Go to Lisbon in spring")  # event time
        store.end_session(sid, "user_exit")
        store.sync()
        return store.get_session(sid), store.get_messages(sid), store.get_messages(sid, include_inactive=True)


@pytest.fixture
def transcript(home: Path) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    return build(home)


def test_iso_time() -> None:
    assert iso_time(T0) == "2025-01-01T10:00:00Z"
    assert iso_time(T0 + 0.25) == "2025-01-01T10:00:00.250Z"
    assert iso_time(0) == "1970-01-01T00:00:00Z"
    for odd in (None, "2025-01-01", True, -1, 1e30, math.nan, math.inf, [1]):
        assert iso_time(odd) == "unknown"


def test_markdown(transcript: Any) -> None:
    session, active, everything = transcript
    md = render_markdown(session, active)
    assert md.startswith("# Trip &lt;b&gt;planning&lt;/b&gt; &amp; more\n")
    assert "`sess-1`" in md and "**Source:** telegram" in md and "**Model:** claude-x" in md
    assert "**Started:** 2025-01-01T10:00:00Z" in md and "(user_exit)" in md
    assert "## 1. user · 2025-01-01T10:00:01Z" in md
    assert "## 2. assistant · 2025-01-01T10:00:02Z" in md
    assert "<details><summary>tool call: web_search</summary>" in md
    assert '"q": "lisbon ```x```"' in md and "\n````json\n" in md  # the fence outgrows the backticks inside
    assert "<details><summary>tool call: &lt;img src=x onerror=alert(1)&gt;</summary>" in md
    assert "<details><summary>reasoning</summary>" in md and "The user wants ideas" in md
    assert "<details><summary>tool result: web_search</summary>" in md and "Lisbon is sunny" in md
    assert "and this photo?\n\n[image]" in md and "https://example.com" not in md
    assert "rewound" not in md and "a reply that was rewound" not in md
    assert "Go to Lisbon in spring" in md

    full = render_markdown(session, everything)
    assert "a reply that was rewound" in full
    assert re.search(r"## 5\. assistant · 2025-01-01T10:00:05Z · message \d+ · rewound", full)


def test_markdown_unknown_values() -> None:
    md = render_markdown({"id": "x", "started_at": "yesterday"},
                         [{"role": None, "content": {"weird": True}, "timestamp": 1e30}, "not a message"])
    assert "**Started:** unknown" in md
    assert "## 1. unknown · unknown" in md
    assert render_markdown({}, []).startswith("# Session unknown")


def test_html_is_self_contained_and_escaped(transcript: Any) -> None:
    session, active, everything = transcript
    page = render_html(session, active)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<script" not in page.lower()
    assert "&lt;script&gt;document.documentElement.setAttribute(&#x27;data-pwned&#x27;,&#x27;1&#x27;)&lt;/script&gt;" in page
    assert "<title>Trip &lt;b&gt;planning&lt;/b&gt; &amp; more</title>" in page
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page, re.I)
    assert "<link" not in page and "@import" not in page and "url(" not in page
    assert "default-src 'none'" in page
    assert '<details class="tool-call"><summary>tool call: web_search</summary><pre>' in page
    assert '<details class="reasoning"><summary>reasoning</summary><pre>The user wants ideas</pre></details>' in page
    assert "tool result: web_search" in page
    assert '<time datetime="2025-01-01T10:00:01Z">2025-01-01T10:00:01Z</time>' in page
    assert "[image]" in page and "a reply that was rewound" not in page and "badge\">rewound" not in page
    full = render_html(session, everything)
    assert 'class="msg assistant rewound"' in full and "a reply that was rewound" in full


def test_html_unknown_values() -> None:
    page = render_html({"id": "x", "title": 42}, [{"role": "<b>", "content": 7, "timestamp": "soon"}])
    assert "Session x" in page and "<time>unknown</time>" in page and "&lt;b&gt;" in page


def _chromium() -> str | None:
    for name in ("/usr/bin/chromium", "chromium", "chromium-browser"):
        found = shutil.which(name) or (name if Path(name).is_file() else None)
        if found:
            return found
    return None


def test_html_renders_in_headless_chromium(transcript: Any, tmp_path: Path) -> None:
    browser = _chromium()
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium); the HTML render check needs it")
    session, active, _ = transcript
    page = tmp_path / "t.html"
    page.write_text(render_html(session, active), encoding="utf-8")
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    try:
        done = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
             "--dump-dom", page.as_uri()],
            capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        pytest.skip("chromium did not finish rendering within 90 s")
    if done.returncode != 0 or "<html" not in done.stdout:
        pytest.skip(f"chromium could not run here (exit {done.returncode}): {done.stderr.strip()[-200:]}")
    dom = done.stdout
    assert "data-pwned" not in dom.split("<body", 1)[0]  # the escaped script never ran
    assert "<script" not in dom.lower()
    text = html.unescape(re.sub(r"<[^>]+>", " ", dom.split("<body", 1)[1]))
    text = " ".join(text.split())
    for visible in ("Trip <b>planning</b> & more", "user", "assistant", "tool",
                    "Where should I go? " + XSS, "tool call: web_search", "tool result: web_search",
                    "and this photo?", "[image]", "Go to Lisbon in spring", "2025-01-01T10:00:01Z"):
        assert visible in text, visible
