"""What the `koordbus quota` and `koordbus migration` commands share: the REST API client, options, files, output.

`Api` wraps httpx with the bearer token; `CliError` ends a command with a message and an exit code (2 for usage or
connection problems, 1 when the API refused something); `load_documents` reads YAML/JSON files with List kinds
expanded; `table` and `dump` print. `add_connection_options` gives a command --api, --token and --token-file (with
their KOORDBUS_* variables and the token `koordbus up` writes), and `run_verb` runs the chosen verb with an Api.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import httpx
import yaml

DEFAULT_API: Final = "http://127.0.0.1:8080"
DEFAULT_TOKEN_FILE: Final = Path(".koordbus") / "api-token"


class CliError(Exception):
    """Stops the command: the message goes to stderr and the process exits with `code`."""

    def __init__(self, message: str, *, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


# --- talking to the API


class Api:
    def __init__(self, base: str, token: str, *, timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(base_url=base.rstrip("/"), headers=headers, timeout=timeout)
        self.base = base

    def close(self) -> None:
        self._client.close()

    def call(self, method: str, path: str, *, body: Any = None, ok: Iterable[int] = (200, 201)) -> httpx.Response:
        try:
            response = self._client.request(method, path, json=body)
        except httpx.HTTPError as e:
            raise CliError(f"cannot reach the koordbus API at {self.base}: {e} (is it running? --api)") from None
        if response.status_code in (401, 403):
            raise CliError(f"{error_text(response)} (pass --token or --token-file)")
        if response.status_code not in ok and response.status_code >= 500:
            raise CliError(f"the API failed ({response.status_code}): {error_text(response)}")
        return response

    def stream(
        self, path: str, *, params: Any = None, headers: dict[str, str] | None = None, read_timeout: float = 60.0
    ) -> contextlib.AbstractContextManager[httpx.Response]:
        """A GET whose body is read as it arrives (Server-Sent Events); `read_timeout` bounds a silence."""
        timeout = httpx.Timeout(self._client.timeout.connect, read=read_timeout)
        return self._client.stream("GET", path, params=params, headers=headers, timeout=timeout)

    def json(self, method: str, path: str, *, body: Any = None) -> Any:
        """The decoded body of a request that must answer 200; any other answer is the command's error (exit 1)."""
        response = self.call(method, path, body=body)
        if response.status_code != 200:
            raise CliError(error_text(response), code=1)
        return response.json()


def error_text(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip() or f"HTTP {response.status_code}"
    if not isinstance(body, dict):
        return str(body)
    lines = [str(body.get("error", body))]
    violations = body.get("violations") or []
    if len(violations) > 1:
        lines = ["the request breaks quota rules:", *(f"  - {v['message']} [{v['rule']}]" for v in violations)]
    return "\n".join(lines)


def token(args: argparse.Namespace) -> str:
    if args.token:
        return str(args.token)
    path = Path(args.token_file) if args.token_file else DEFAULT_TOKEN_FILE
    if path.is_file():
        return path.read_text(encoding="utf-8").strip()
    if args.token_file:
        raise CliError(f"token file {path} does not exist")
    return ""


def load_documents(paths: Sequence[str]) -> list[dict[str, Any]]:
    """Every object in the files ('-' is stdin): YAML (multi-document) or JSON, List kinds expanded."""
    out: list[dict[str, Any]] = []
    for path in paths:
        try:
            text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise CliError(f"cannot read {path}: {e}") from None
        try:
            documents = list(yaml.safe_load_all(text))
        except yaml.YAMLError as e:
            raise CliError(f"{path} is not valid YAML or JSON: {' '.join(str(e).split())}") from None
        for position, document in enumerate(d for d in documents if d is not None):
            if not isinstance(document, dict):
                raise CliError(f"{path}: document {position + 1} is not an object")
            items = document.get("items") if str(document.get("kind", "")).endswith("List") else None
            out.extend(items if isinstance(items, list) else [document])
    return out


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines) + "\n"


def dump(document: Any, output: str) -> str:
    if output == "json":
        return json.dumps(document, indent=2, sort_keys=False) + "\n"
    return yaml.safe_dump(document, sort_keys=False)


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--api", default=os.environ.get("KOORDBUS_API_URL", DEFAULT_API), help=f"API URL (default {DEFAULT_API})"
    )
    parser.add_argument("--token", default=os.environ.get("KOORDBUS_API_TOKEN"), help="bearer token")
    parser.add_argument(
        "--token-file",
        default=os.environ.get("KOORDBUS_API_TOKEN_FILE"),
        help=f"file holding the bearer token (default {DEFAULT_TOKEN_FILE}, which koordbus up writes)",
    )


def add_output_option(parser: argparse.ArgumentParser, default: str = "table") -> None:
    parser.add_argument("-o", "--output", choices=("table", "json", "yaml"), default=default, help="output format")


def run_verb(args: argparse.Namespace, *, command: str) -> int:
    """Run `args.verb_run(api, args)` with an Api for --api and the token; CliError → its message and code."""
    try:
        api = Api(args.api, token(args))
        try:
            code: int = args.verb_run(api, args)
        finally:
            api.close()
        return code
    except CliError as e:
        sys.stderr.write(f"koordbus {command} {args.verb}: {e}\n")
        return e.code
