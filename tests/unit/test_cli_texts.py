"""Issue 59, item 6: ``qualify --help`` without hard line breaks in its boxes, and
``qualify up --tools`` naming every tool it gives (``lookup_customer`` too)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys


def _help(*args: str, columns: int = 200) -> str:
    return subprocess.run([sys.executable, "-m", "qualify.cli", *args, "--help"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "COLUMNS": str(columns), "TERM": "dumb"}).stdout


def test_help_boxes_wrap_only_where_the_terminal_ends() -> None:
    for columns in (200, 120):
        lines = _help(columns=columns).splitlines()
        start = next(i for i, line in enumerate(lines) if "Commands" in line)
        end = next(i for i in range(start, len(lines)) if lines[i].startswith("╰"))
        box = [line[1:-1].rstrip() for line in lines[start + 1:end]]
        inner = len(lines[start]) - 2
        assert len(box) >= 7 and all(line.startswith(" ") for line in box), box
        for line, nxt in itertools.pairwise(box):
            if nxt.startswith("   "):   # a continuation: the line before must have been full
                word = nxt.split()[0]
                assert len(line) + 1 + len(word) > inner - 12, (columns, line, nxt)


def test_tools_help_and_banner_name_every_tool() -> None:
    from qualify.fakes.tools import sink_tools
    from qualify.up import TOOLS_SAID

    names = [t.name for t in sink_tools({"sink_url": "http://127.0.0.1:1"})]
    assert "lookup_customer" in names
    shown = " ".join(_help("up", columns=400).split())
    for name in names:
        assert name in TOOLS_SAID and name in shown, name
