"""What every command shares: the usage error, and argparse with its errors on one line and
every option's default in its help."""

from __future__ import annotations

import argparse
import sys

__all__ = ["Parser", "UsageError"]


class UsageError(Exception):
    """A bad argument, found before any rank starts: one line, exit code 2."""


class _Help(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; each option's help ends with its default unless it names one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("default" in text or not action.option_strings or isinstance(default, bool)
                or default == argparse.SUPPRESS):
            return text
        shown = "none" if default in (None, "") else "%(default)s"
        return f"{text} (default: {shown})" if text else f"default: {shown}"


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line like every other error of commbench."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        print(f"commbench: error: {message} ({self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)
