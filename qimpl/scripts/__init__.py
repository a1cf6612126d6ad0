"""Operator command-line tools. Usage errors exit 64 (EX_USAGE) in all of them:
``UsageParser``; exit code 2 is kept for "the database cannot be reached". A reader that
closes their output early (``… | head``) ends them quietly, exit 1 (``piped``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

__all__ = ["EXIT_BROKEN_PIPE", "EXIT_USAGE", "UsageParser", "not_utf8", "piped"]

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


def not_utf8(text: str) -> bool:
    """True for a string that holds bytes that were not valid UTF-8 (Python decodes such a
    command-line argument to lone surrogates, which nothing downstream can encode)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


class UsageParser(argparse.ArgumentParser):
    """argparse whose usage errors exit ``EXIT_USAGE`` instead of argparse's 2; an
    argument that is not valid UTF-8 is one too."""

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        given = sys.argv[1:] if args is None else list(args)
        if bad := [a for a in given if not_utf8(a)]:
            shown = os.fsencode(bad[0]).decode("utf-8", "backslashreplace")
            self.error(f"argument '{shown}' is not valid UTF-8")
        return super().parse_known_args(given, namespace)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")
