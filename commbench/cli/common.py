"""What every command shares: the usage error, and argparse with its errors on one line."""

from __future__ import annotations

import argparse
import sys

__all__ = ["Parser", "UsageError"]


class UsageError(Exception):
    """A bad argument, found before any rank starts: one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line like every other error of commbench."""

    def error(self, message: str):
        print(f"commbench: error: {message} ({self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)
