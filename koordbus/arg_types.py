"""Argument types for the command line's numbers: a TCP port and a bounded integer or float, checked where argparse
reads them, so `--port 1832767` is a usage error naming the flag (exit 2) and never an OverflowError from a socket
call deep inside a subcommand.

Used by the subcommands' parsers (koordbus.up, koordbus.api, koordbus.agent, koordbus.service).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

MAX_PORT = 65_535


def port(text: str) -> int:
    """A TCP port, 0 (a free one, or off, as the flag's help says) to 65535."""
    return integer(0, MAX_PORT)(text)


def integer(least: int, most: int | None = None) -> Callable[[str], int]:
    """An integer from `least` to `most` (None: no upper bound)."""

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least or (most is not None and value > most):
            raise argparse.ArgumentTypeError(f"{value} is out of range ({_range(least, most)})")
        return value

    return parse


def number(least: float, most: float | None = None) -> Callable[[str], float]:
    """A finite number from `least` to `most` (None: no upper bound)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value < least or (most is not None and value > most):
            raise argparse.ArgumentTypeError(f"{text} is out of range ({_range(least, most)})")
        return value

    return parse


def _range(least: float, most: float | None) -> str:
    return f"at least {least}" if most is None else f"{least} to {most}"
