"""The `koordbus` command line (composition root). Subcommands are added as the parts land."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="koordbus", description=__doc__)
    parser.parse_args(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
