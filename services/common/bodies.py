"""Request bodies taken in safely: a size cap enforced while the body streams in, and JSON/YAML decoding that refuses
what would cost far more to hold than it took to send.

`BodyLimit` is an ASGI middleware (the API gateway, services.api.app, and the load-aware extender,
services.loadaware.http, wrap their apps in it): a request whose Content-Length is over the limit is answered 413
before a byte is read, and one that streams more than the limit (chunked, or lying about its length) is cut off with
a 413 as soon as it passes it, so no route ever buffers more than the limit. `decode_json` and `decode_yaml` are the
only way a route turns bytes into a document: invalid UTF-8, malformed text, YAML aliases (the "billion laughs"
bomb: a few hundred bytes expanding to gigabytes) and tags beyond plain JSON types, numbers Python will not hold,
keys that are not strings, lone surrogates and nesting deeper than MAX_DEPTH are each a BodyError whose message says
what and where (a JSON path or a byte offset); routes answer it with a 400. What they return is plain JSON data.
A client that goes away before its body has arrived is no error of ours: `client_went_away` answers it (a 400 nobody
reads) with one INFO line instead of a traceback.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import Any, Final

import msgspec
import yaml
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_DEPTH: Final = 64
"""Deepest nesting of objects and arrays a body may have; a Kubernetes object is about 10 deep."""


log = logging.getLogger(__name__)


async def client_went_away(request: Request, exc: Exception) -> Response:
    """The handler of starlette's ClientDisconnect (register it on the app): the client closed its connection while
    the route read the body."""
    log.info("%s %s: the client went away before its request body arrived", request.method, request.url.path)
    return Response(status_code=400)


class BodyError(ValueError):
    """A body that is not a well-formed document; the message names the problem and where it is."""


class BodyTooLarge(HTTPException):
    """Raised from `receive` when a streamed body passes the limit; the app's HTTPException handler answers it."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than the limit of {limit} bytes")


class BodyLimit:
    """Caps every HTTP request body at `limit` bytes without buffering it (see the module docstring).

    `refuse(status, message)` builds the response for a declared Content-Length over the limit (the app's own
    error shape); a body that passes the limit while streaming raises BodyTooLarge from `receive`.
    """

    def __init__(self, app: ASGIApp, *, limit: int, refuse: Callable[[int, str], ASGIApp]) -> None:
        self._app = app
        self._limit = limit
        self._refuse = refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        limit = self._limit
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            message = f"the request body is {declared} bytes; the limit is {limit} bytes"
            await self._refuse(413, message)(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        await self._app(scope, counting_receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def decode_json(raw: bytes) -> Any:
    """A JSON document, at most MAX_DEPTH deep; BodyError otherwise."""
    try:
        document = msgspec.json.decode(raw)
    except UnicodeDecodeError as e:
        raise BodyError(f"the body is not valid UTF-8 (byte {e.start})") from None
    except RecursionError:
        raise BodyError(f"the body is nested more than {MAX_DEPTH} levels deep") from None
    except (msgspec.DecodeError, ValueError) as e:
        raise BodyError(f"the body is not valid JSON: {e}") from None
    check_depth(document)
    return document


def decode_yaml(raw: bytes) -> Any:
    """A YAML document of plain JSON types (no aliases, no tags beyond the core schema), at most MAX_DEPTH deep."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BodyError(f"the body is not valid UTF-8 (byte {e.start})") from None
    try:
        document = yaml.load(raw, Loader=_PlainLoader)  # a SafeLoader made stricter
    except RecursionError:
        raise BodyError(f"the body is nested more than {MAX_DEPTH} levels deep") from None
    except yaml.YAMLError as e:
        raise BodyError(f"the body is not valid JSON or YAML: {' '.join(str(e).split())}") from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise BodyError(f"the body is not valid JSON or YAML: {e}") from None
    check_depth(document)
    return document


def check_depth(document: Any, *, limit: int = MAX_DEPTH) -> None:
    """BodyError naming the JSON path where `document` nests deeper than `limit`, or is not JSON data: a key that is
    not a string or a string that is not Unicode text (YAML makes both: `1: x`, escaped lone surrogates); iterative,
    so no recursion."""
    stack: list[tuple[Any, int, str]] = [(document, 0, "$")]
    while stack:
        value, depth, path = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                raise BodyError(f"the body has a string that is not Unicode text (a lone surrogate) at {path}")
            continue
        if isinstance(value, dict):
            if not all(isinstance(k, str) for k in value):
                odd = next(k for k in value if not isinstance(k, str))
                raise BodyError(f"the body has a key that is not a string ({_key(odd)}) at {path}; quote it")
            children = [(k, f"{path}.{_key(k)}") for k in value]
            children += [(v, f"{path}.{_key(k)}") for k, v in value.items()]
        elif isinstance(value, list):
            children = [(v, f"{path}[{i}]") for i, v in enumerate(value)]
        else:
            continue
        if depth >= limit:
            raise BodyError(f"the body is nested more than {limit} levels deep at {path}")
        stack.extend((child, depth + 1, child_path) for child, child_path in children)


_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_PLAIN_KEY: Final = re.compile(r"[A-Za-z0-9_./-]+")


def _key(key: object) -> str:
    """A key as a JSON path writes it: plain, or quoted and escaped (a message never carries raw control characters
    or surrogates)."""
    text = str(key)
    return text if _PLAIN_KEY.fullmatch(text) else json.dumps(text)


class _PlainLoader(yaml.SafeLoader):
    """SafeLoader without aliases and with only the JSON types (timestamps stay strings, as JSON would have them)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not accepted; write the value out", mark)
        return super().compose_node(parent, index)


_PlainLoader.yaml_constructors = {
    tag: constructor
    for tag, constructor in yaml.SafeLoader.yaml_constructors.items()
    if tag
    in (
        "tag:yaml.org,2002:null",
        "tag:yaml.org,2002:bool",
        "tag:yaml.org,2002:int",
        "tag:yaml.org,2002:float",
        "tag:yaml.org,2002:str",
        "tag:yaml.org,2002:seq",
        "tag:yaml.org,2002:map",
    )
}
_PlainLoader.yaml_constructors["tag:yaml.org,2002:timestamp"] = yaml.SafeLoader.construct_yaml_str
_PlainLoader.yaml_constructors[None] = yaml.SafeLoader.construct_undefined  # any other tag: an error
