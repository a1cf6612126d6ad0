"""Operator command-line tools. Usage errors exit 64 (EX_USAGE) in all of them:
``UsageParser``; exit code 2 is kept for "the database cannot be reached"."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

__all__ = ["EXIT_USAGE", "UsageParser"]

EXIT_USAGE = 64


class UsageParser(argparse.ArgumentParser):
    """argparse whose usage errors exit ``EXIT_USAGE`` instead of argparse's 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")
