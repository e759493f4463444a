"""`koordbus events …`: our events from the terminal, through the REST API (services.api.events).

Registered by koordbus/cli.py. `tail` follows `/api/v1/events/stream` — filtered by `--type` and `--node`,
`--quota`, `--tree`, `--namespace`, `--workload`, from now, `--since` or `--cursor` — printing one line per event
(or the JSON envelope with `-o json`); when the connection drops it reconnects with the last event's id, so nothing
is missed or printed twice. `list` prints a page of history (and the cursor of the next one on stderr), `types`
the catalogue. Connection options and exit codes as `koordbus quota` (koordbus.apiclient).

`SseParser` (pure) turns the lines of a Server-Sent Events body into messages; the tests' subscribers use it too.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import httpx

from koordbus import apiclient

KEYS: Final = ("node", "quota", "tree", "namespace", "workload")
RECONNECT_SECONDS: Final = (1.0, 2.0, 5.0)


@dataclass(frozen=True)
class SseMessage:
    event: str
    data: str
    id: str = ""


@dataclass
class SseParser:
    """Feed it the body's lines (without line endings); a blank line completes a message. Comments (`: …`) are
    skipped; `event` defaults to "message"; several `data` lines join with newlines."""

    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _id: str = ""

    def feed(self, line: str) -> SseMessage | None:
        if not line:
            if not self._data and not self._event:
                return None
            message = SseMessage(event=self._event or "message", data="\n".join(self._data), id=self._id)
            self._event, self._data, self._id = "", [], ""
            return message
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            self._id = value
        return None


def iter_sse(lines: Iterable[str]) -> Iterator[SseMessage]:
    parser = SseParser()
    for line in lines:
        if (message := parser.feed(line)) is not None:
            yield message


async def parse_sse(lines: AsyncIterator[str]) -> AsyncIterator[SseMessage]:
    parser = SseParser()
    async for line in lines:
        if (message := parser.feed(line)) is not None:
            yield message


def _params(args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {k: getattr(args, k) for k in KEYS if getattr(args, k)}
    if args.type:
        params["type"] = ",".join(args.type)
    if args.since:
        params["since"] = args.since
    if getattr(args, "cursor", None):
        params["cursor"] = args.cursor
    return params


def _when(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def event_line(envelope: dict[str, Any], *, width: int = 160) -> str:
    keys = " ".join(f"{k}={envelope[k]}" for k in KEYS if envelope.get(k))
    data = json.dumps(envelope.get("data"), separators=(",", ":"))
    if len(data) > width:
        data = data[: width - 1] + "…"
    return f"{_when(envelope['time'])}  {envelope['type']:<22} {keys}  {data}".rstrip()


def cmd_tail(api: apiclient.Api, args: argparse.Namespace) -> int:
    params = _params(args)
    last_id = ""
    printed = 0
    failures = 0
    while True:
        headers = {"Last-Event-ID": last_id} if last_id else {}
        if last_id:
            params.pop("since", None)
            params.pop("cursor", None)
        try:
            with api.stream("/api/v1/events/stream", params=params, headers=headers) as response:
                if response.status_code != 200:
                    response.read()
                    code = 1 if response.status_code < 500 else 2
                    raise apiclient.CliError(apiclient.error_text(response), code=code)
                failures = 0
                for message in iter_sse(response.iter_lines()):
                    if message.event == "warning":
                        sys.stderr.write(f"warning: {json.loads(message.data)['message']}\n")
                        continue
                    if message.event in ("dropped", "shutdown"):
                        why = "dropped this subscription" if message.event == "dropped" else "is stopping"
                        sys.stderr.write(f"the API {why}: {json.loads(message.data)['reason']}\n")
                        break
                    last_id = message.id or last_id
                    sys.stdout.write(
                        message.data + "\n" if args.output == "json" else event_line(json.loads(message.data)) + "\n"
                    )
                    sys.stdout.flush()
                    printed += 1
                    if args.count and printed >= args.count:
                        return 0
        except httpx.HTTPError as e:
            if failures == 0 and not last_id and printed == 0 and isinstance(e, httpx.ConnectError):
                raise apiclient.CliError(
                    f"cannot reach the koordbus API at {api.base}: {e} (is it running? --api)"
                ) from None
            wait = RECONNECT_SECONDS[min(failures, len(RECONNECT_SECONDS) - 1)]
            sys.stderr.write(f"connection lost ({e}); reconnecting in {wait:g} s from the last event\n")
            failures += 1
            time.sleep(wait)
            continue
        wait = RECONNECT_SECONDS[min(failures, len(RECONNECT_SECONDS) - 1)]
        failures += 1
        time.sleep(wait)


def cmd_list(api: apiclient.Api, args: argparse.Namespace) -> int:
    params = _params(args)
    params["limit"] = args.limit
    page = api.json("GET", "/api/v1/events?" + str(httpx.QueryParams(params)))
    for warning in page["warnings"]:
        sys.stderr.write(f"warning: {warning}\n")
    for envelope in page["events"]:
        sys.stdout.write(json.dumps(envelope) + "\n" if args.output == "json" else event_line(envelope) + "\n")
    if page["next"]:
        sys.stderr.write(f"more: --cursor {page['next']}\n")
    return 0


def cmd_types(api: apiclient.Api, args: argparse.Namespace) -> int:
    listed = api.json("GET", "/api/v1/events/types")
    rows = [[t["type"], t["stream"], ",".join(t["keys"]) or "-", t["description"]] for t in listed]
    sys.stdout.write(apiclient.table(["TYPE", "STREAM", "KEYS", "DESCRIPTION"], rows))
    return 0


def _add_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--type", action="append", help="event type (repeat or comma-separate; `koordbus events types` lists them)"
    )
    for key in KEYS:
        parser.add_argument(f"--{key}", help=f"only events carrying this {key}")
    parser.add_argument("--since", help="from this time: unix seconds or RFC 3339 (2026-11-24T03:00:00Z)")
    parser.add_argument("--cursor", help="after this event id (an id printed by -o json, or `list`'s next cursor)")
    parser.add_argument(
        "-o", "--output", choices=("line", "json"), default="line", help="one line per event, or its JSON envelope"
    )


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "events",
        help="follow or list koordbus's events through the API (tail, list, types)",
        description="Our events — NodeMetric and batch/mid decisions, quota changes and statuses, migration "
        "decisions, node actuations and evictions, nodes joining and leaving — from the koordbus REST API, "
        "filtered by type and key. Needs a token with role viewer.",
        epilog="Exit codes: 0 done; 1 the API refused the request; 2 usage or connection error.",
    )
    apiclient.add_connection_options(parser)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    tail = verbs.add_parser(
        "tail",
        help="follow events live (reconnects by itself, from the last event)",
        description="Print events as they happen until interrupted (or --count). A dropped connection is resumed "
        "from the last event printed: nothing missed, nothing twice.",
    )
    _add_filters(tail)
    tail.add_argument("--count", type=int, default=0, help="stop after this many events (default: never)")
    tail.set_defaults(verb_run=cmd_tail)
    listing = verbs.add_parser("list", help="a page of past events, oldest first (default: the last hour)")
    _add_filters(listing)
    listing.add_argument("--limit", type=int, default=100, help="events per page (at most 1000)")
    listing.set_defaults(verb_run=cmd_list)
    types = verbs.add_parser("types", help="the event types and the keys each can be filtered by")
    types.set_defaults(verb_run=cmd_types)
    parser.set_defaults(run=lambda args: apiclient.run_verb(args, command="events"))
