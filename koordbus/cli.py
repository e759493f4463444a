"""The `koordbus` command line (composition root): `up`, `agent`, `service`, `api`, `quota`, `migration`, `events`,
`calc`, `crds`, `scheduler`.

Each subcommand builds its settings at the edge, wires the bus, stores and services, and
runs until interrupted. Nothing below `koordbus` knows which subcommand started it.
"""

from __future__ import annotations

import argparse
import sys


def build_parser(*, command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; for `command` "agent" only the subcommands of koordbus.commands, so the node agent's
    process never loads the calculators' control-plane modules (numpy among them: 16 MB on every node)."""
    parser = argparse.ArgumentParser(
        prog="koordbus",
        description="Co-location control plane for Kubernetes over NATS JetStream.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    from koordbus import commands

    commands.add_parsers(sub)
    if command != "agent":
        from koordbus import calc, crds, events, migration, quota, scheduler

        quota.add_parser(sub)
        migration.add_parser(sub)
        events.add_parser(sub)
        calc.add_parser(sub)
        crds.add_parser(sub)
        scheduler.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(command=argv[0] if argv else None)
    args = parser.parse_args(argv)
    from services.common.settings import SettingsError

    try:
        result: int = args.run(args)
    except SettingsError as e:  # a KOORDBUS_* variable that cannot be used: its name and why, not a traceback
        raise SystemExit(f"koordbus {args.command}: {e}") from None
    return result


if __name__ == "__main__":
    sys.exit(main())
