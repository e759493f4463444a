"""Our events, for anyone with role viewer: `GET /api/v1/events/stream` (Server-Sent Events), `/api/v1/events/ws`
(WebSocket), `GET /api/v1/events` (pages of history) and `GET /api/v1/events/types` (the catalogue).

Every route takes the same filters: `type` (repeated or comma-separated; default every type) and `node`, `quota`,
`tree`, `namespace`, `workload` (an event matches when it carries the given value). A subscription resumes from
`cursor` (an event's id; the SSE `Last-Event-ID` header does the same) or `since` (unix seconds or RFC 3339); a
cursor older than a stream retains resumes at the oldest event it still holds, after a `warning` message saying so.
Bad filters and malformed cursors are a 400 naming the problem. A subscriber that does not read fast enough is
dropped (`dropped` with the reason, then the stream ends) and never holds up anyone else; past the caps on
subscriptions (in total, per caller) the answer is 503. When the process stops, every stream ends with `shutdown`
(the reason; reconnect with the last id; a WebSocket closes with 1001). The shapes are in
services.api.event_catalogue; the fan-out in services.api.event_hub.

SSE messages: `id: <cursor>`, `event: <type>`, `data: <envelope>`; `event: warning` / `dropped` / `shutdown` with a
JSON object; `: keepalive` comments every 15 s. WebSocket frames: the envelope, or `{"type": "warning" | "dropped" |
"shutdown", …}`;
the token goes in the `Authorization` header of the upgrade request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import Response, StreamingResponse

from services.api import event_catalogue as catalogue
from services.api import query_keys
from services.api.event_hub import CapacityError, EventHub, Message, Start
from services.common import auth, paging

log = logging.getLogger(__name__)

router = APIRouter(prefix="/api/v1", tags=["events"])
socket_router = APIRouter(prefix="/api/v1", tags=["events"])
"""The WebSocket route authenticates itself (router dependencies read HTTP requests)."""

MAX_PAGE: Final = 1000
TypeParam = Annotated[
    list[str], Query(description="event types, repeated or comma-separated (see /api/v1/events/types); default all")
]
KeyParam = Annotated[str | None, Query()]


def _hub(connection: Request | WebSocket) -> EventHub:
    hub: EventHub | None = connection.app.state.context.event_hub
    if hub is None:
        raise HTTPException(503, "events are not available: this API runs without a bus connection")
    return hub


def parse_since(text: str | None) -> float | None:
    """`since` as unix seconds (services.common.paging.parse_since); FilterError (a 400) for anything else."""
    try:
        return paging.parse_since(text)
    except ValueError as e:
        raise catalogue.FilterError(str(e)) from None


class EventQuery:
    """The query parameters every event route takes (a FastAPI dependency)."""

    def __init__(
        self,
        type: TypeParam = [],  # noqa: B006 - FastAPI reads the default, never mutates it
        node: KeyParam = None,
        quota: KeyParam = None,
        tree: KeyParam = None,
        namespace: KeyParam = None,
        workload: KeyParam = None,
        cursor: Annotated[str | None, Query(description="resume after this event id")] = None,
        since: Annotated[str | None, Query(description="unix seconds or RFC 3339")] = None,
    ) -> None:
        self.types = type
        self.keys = {"node": node, "quota": quota, "tree": tree, "namespace": namespace, "workload": workload}
        self.cursor = cursor
        self.since = since


EVENT_QUERY_KEYS: Final = query_keys.keys_of(EventQuery)
"""What the WebSocket route takes: the same keys as the HTTP routes' EventQuery."""


def _parse(
    types: list[str], keys: dict[str, str | None], cursor: str | None, since: str | None
) -> tuple[catalogue.EventFilter, Start]:
    try:
        event_filter = catalogue.parse_filter(types, keys)
        if cursor and since:
            raise catalogue.FilterError("give cursor (or Last-Event-ID) or since, not both")
        start = Start(cursor=catalogue.decode_cursor(cursor) if cursor else None, time=parse_since(since))
    except catalogue.FilterError as e:
        raise HTTPException(400, str(e)) from None
    return event_filter, start


@router.get("/events/types", summary="The event types, with the keys each can be filtered by")
async def event_types() -> list[dict[str, Any]]:
    return [
        {"type": t.name, "stream": t.stream, "keys": list(t.keys), "description": t.description}
        for t in catalogue.CATALOGUE
    ]


@router.get(
    "/events",
    summary="A page of past events, oldest first",
    description="From `cursor` (the `next` of the previous page) or `since` (default: an hour ago); `next` is null "
    "when the page reached the newest event. `warnings` says when a cursor is older than a stream retains.",
)
async def event_history(
    request: Request,
    query: Annotated[EventQuery, Depends()],
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
) -> Response:
    event_filter, start = _parse(query.types, query.keys, query.cursor, query.since)
    envelopes, next_cursor, warnings = await _hub(request).history(event_filter, start, limit=limit)
    body = b'{"events":[' + b",".join(envelopes) + b"],"
    body += json.dumps({"next": next_cursor, "warnings": warnings})[1:].encode()
    return Response(body, media_type="application/json")  # the envelopes are JSON already: no second encoding


@router.get(
    "/events/stream",
    summary="Follow events live (Server-Sent Events)",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "the event stream"},
        400: {"description": "unknown type or filter, malformed cursor or since"},
        503: {"description": "too many subscriptions, or no bus"},
    },
)
async def event_stream(
    request: Request,
    query: Annotated[EventQuery, Depends()],
    last_event_id: Annotated[str | None, Header(description="resume after this event id (SSE reconnects)")] = None,
) -> StreamingResponse:
    event_filter, start = _parse(query.types, query.keys, query.cursor or last_event_id, query.since)
    hub = _hub(request)
    identity: auth.Identity = request.state.identity
    try:
        sub = await hub.subscribe(event_filter, caller=identity.name)
    except CapacityError as e:
        raise HTTPException(503, str(e)) from None

    async def body() -> AsyncIterator[bytes]:
        yield b": subscribed\n\n"
        async for message in hub.events(sub, start):
            yield sse(message)

    return StreamingResponse(
        body(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def sse(message: Message) -> bytes:
    match message.kind:
        case "event":
            return (
                b"id: "
                + message.id.encode()
                + b"\nevent: "
                + message.event_type.encode()
                + b"\ndata: "
                + (message.data + b"\n\n")
            )
        case "keepalive":
            return b": keepalive\n\n"
        case _:
            return b"event: " + message.kind.encode() + b"\ndata: " + message.data + b"\n\n"


MAX_CLOSE_REASON_BYTES: Final = 123
"""RFC 6455 §5.5: a close frame's payload is at most 125 bytes, 2 of them the code; the reason is UTF-8."""


def close_reason(text: str) -> str:
    """`text` cut to fit a close frame: at most 123 bytes of UTF-8, never splitting a character."""
    encoded = text.encode()
    if len(encoded) <= MAX_CLOSE_REASON_BYTES:
        return text
    return encoded[: MAX_CLOSE_REASON_BYTES - 3].decode(errors="ignore") + "…"


@socket_router.websocket("/events/ws")
async def event_socket(websocket: WebSocket) -> None:
    params = websocket.query_params
    try:
        await auth.identify(websocket, auth.bearer_token(websocket), auth.VIEWER)
        identity: auth.Identity = websocket.state.identity
        query_keys.check(params, EVENT_QUERY_KEYS)
        keys = {k: params.get(k) for k in catalogue.KEYS}
        event_filter, start = _parse(params.getlist("type"), keys, params.get("cursor"), params.get("since"))
        hub = _hub(websocket)
        sub = await hub.subscribe(event_filter, caller=identity.name)
    except (HTTPException, CapacityError) as e:
        # Refused: an error frame with the HTTP status it stands for, then close code 4000 + that status.
        status = e.status_code if isinstance(e, HTTPException) else 503
        detail = str(e.detail) if isinstance(e, HTTPException) else str(e)
        await websocket.accept()
        await websocket.send_text(json.dumps({"type": "error", "status": status, "error": detail}))
        await websocket.close(code=4000 + status, reason=close_reason(detail))
        return
    await websocket.accept()

    async def pump() -> None:
        last = ""
        async for message in hub.events(sub, start):
            last = message.kind
            if message.kind == "event":
                await websocket.send_text(message.data.decode())
            else:  # warning, keepalive, dropped or shutdown (the last)
                payload = json.loads(message.data) if message.data else {}
                await websocket.send_text(json.dumps({"type": message.kind, **payload}))
        if last == "shutdown":  # 1001: going away
            await websocket.close(code=1001, reason="the server is stopping: reconnect with the last id")
        else:
            await websocket.close(code=1013, reason="dropped for falling behind: reconnect with the last id")

    async def until_closed() -> None:  # a client that leaves is noticed at once, not at the next send
        while (await websocket.receive())["type"] != "websocket.disconnect":
            pass

    tasks = [asyncio.create_task(pump()), asyncio.create_task(until_closed())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, RuntimeError):
                await task
