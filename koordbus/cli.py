"""The `koordbus` command line (composition root): `up`, `agent`, `service`, `api`, `quota`, `migration`, `calc`,
`crds`.

Each subcommand builds its settings at the edge, wires the bus, stores and services, and
runs until interrupted. Nothing below `koordbus` knows which subcommand started it.
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="koordbus",
        description="Co-location control plane for Kubernetes over NATS JetStream.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    from koordbus import calc, commands, crds, migration, quota

    commands.add_parsers(sub)
    quota.add_parser(sub)
    migration.add_parser(sub)
    calc.add_parser(sub)
    crds.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result: int = args.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
