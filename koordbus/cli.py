"""The `koordbus` command line (composition root): `up`, `agent`, `service`, `api`, `quota`, `colocation-profile`,
`migration`, `events`, `calc`, `certs`, `crds`, `scheduler`, `slo`.

Each subcommand builds its settings at the edge, wires the bus, stores and services, and
runs until interrupted. Nothing below `koordbus` knows which subcommand started it.
"""

from __future__ import annotations

import argparse
import sys


def build_parser(*, command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; for `command` "agent" only the agent's subcommand (koordbus.agent), so the node agent's
    process never loads the control-plane modules (the calculators' numpy among them: 16 MB on every node)."""
    parser = argparse.ArgumentParser(
        prog="koordbus",
        description="Co-location control plane for Kubernetes over NATS JetStream.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    from koordbus import agent

    if command == "agent":  # the node agent's process loads only its own subcommand's module
        agent.add_parser(sub)
    else:
        from koordbus import (
            api,
            calc,
            certs,
            crds,
            creds,
            db,
            events,
            migration,
            profile,
            quota,
            scheduler,
            service,
            slo,
            up,
        )

        up.add_parser(sub)
        agent.add_parser(sub)
        service.add_parser(sub)
        creds.add_parser(sub)
        certs.add_parser(sub)
        db.add_parser(sub)
        api.add_parser(sub)
        quota.add_parser(sub)
        profile.add_parser(sub)
        migration.add_parser(sub)
        events.add_parser(sub)
        calc.add_parser(sub)
        crds.add_parser(sub)
        scheduler.add_parser(sub)
        slo.add_parser(sub)
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
