"""`koordbus calc <kind>`: the offline calculators of ../shared/design/CALC-CONTRACT.md (filled in with nodemetric)."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("calc", help="run one calculator on a JSON document")
    p.add_argument("kind")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return 2
