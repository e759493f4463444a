"""Log formats of every koordbus process: human text (the default) or one JSON object per line.

`koordbus.runtime.configure_logging` picks the formatter from `--log-format` / KOORDBUS_LOG_FORMAT and installs
`bus.event_context.EventContextFilter` on the handler, so a line logged while a consumer handles an event carries
that event's id, subject, stream sequence, consumer and node. `JsonFormatter` writes `time` (UTC, ISO 8601 with
milliseconds), `level`, `logger`, `message`, those event fields when set, and `exception` / `stack` when present;
it never raises, whatever the record holds. Standard library only: the agent uses it on every node.
"""

from __future__ import annotations

import datetime
import json
import logging
from typing import Any, Final

from bus.event_context import EVENT_FIELDS

FORMATS: Final = ("text", "json")
TEXT_FORMAT: Final = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def _utc_iso(created: float) -> str:
    moment = datetime.datetime.fromtimestamp(created, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _message_of(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception as e:  # a format string and arguments that do not match: show both rather than lose the line
        return f"{record.msg!r} % {record.args!r} (unformattable: {type(e).__name__}: {e})"


class JsonFormatter(logging.Formatter):
    """One JSON object per record; see the module docstring for the keys."""

    def format(self, record: logging.LogRecord) -> str:
        try:
            return json.dumps(self.entry(record), ensure_ascii=False, default=_fallback)
        except Exception as e:  # the last resort: a line that says what went wrong, still one JSON object
            return json.dumps(
                {
                    "time": _utc_iso(getattr(record, "created", 0.0) or 0.0),
                    "level": str(getattr(record, "levelname", "")),
                    "logger": str(getattr(record, "name", "")),
                    "message": f"log record could not be formatted: {type(e).__name__}: {e}",
                }
            )

    def entry(self, record: logging.LogRecord) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "time": _utc_iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": _message_of(record),
        }
        for name in EVENT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return entry


def _fallback(value: object) -> str:
    try:
        return str(value)
    except Exception:
        return object.__repr__(value)


def formatter(log_format: str) -> logging.Formatter:
    """The formatter for `log_format` ("text", the default when empty, or "json"); ValueError names the choices."""
    match log_format.strip().lower():
        case "json":
            return JsonFormatter()
        case "text" | "":
            return logging.Formatter(TEXT_FORMAT)
        case _:
            raise ValueError(f"unknown log format {log_format!r}: choose one of {', '.join(FORMATS)}")
