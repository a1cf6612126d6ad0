"""Operator command-line tools. Usage errors exit 64 (EX_USAGE) in all of them:
``UsageParser``; exit code 2 is kept for "the database cannot be reached". A reader that
closes their output early (``… | head``) ends them quietly, exit 1 (``piped``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import NoReturn

__all__ = ["EXIT_BROKEN_PIPE", "EXIT_USAGE", "UsageParser", "piped"]

EXIT_USAGE = 64
#: The reader of stdout went away before all was written.
EXIT_BROKEN_PIPE = 1


def piped(main: Callable[[], int]) -> int:
    """Run ``main`` and flush stdout; returns its exit code, or ``EXIT_BROKEN_PIPE`` without
    a traceback when the reader closed stdout early (Python's documented handling of
    SIGPIPE: the rest of the output goes to /dev/null, so the flush at exit cannot fail)."""
    try:
        code = main()
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


class UsageParser(argparse.ArgumentParser):
    """argparse whose usage errors exit ``EXIT_USAGE`` instead of argparse's 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")
