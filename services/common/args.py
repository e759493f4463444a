"""Reading a Koordinator args document (a JSON or YAML file of LoadAwareSchedulingArgs, MigrationControllerArgs, …)
the same way for every service: one error family naming the field, the document read with YAML's safe loader, its
object converted to the args struct, and Go durations. Pure.

`ArgsError` is args that cannot be used; its `ArgsFormatError` is args that are not of the kind at all (not JSON or
YAML, not an object, a wrong type, a duration that does not parse), which `koordbus calc` reports as bad input
rather than as Koordinator refusing the args. Used by services.loadaware.args and services.migration.args, whose
`load_args` add their own defaulting and checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any, TypeVar

import msgspec
import yaml

from schemas import koordinator

ArgsT = TypeVar("ArgsT")


class ArgsError(ValueError):
    """Args that cannot be used (Koordinator's validation rejects them, or they cannot be read at all); the message
    names the field."""


class ArgsFormatError(ArgsError):
    """Args that are not of the kind at all: not JSON or YAML, a wrong type, a duration that does not parse."""


def load_document(text: str, *, source: str) -> Any:
    """The JSON or YAML document in `text` (blank text is `{}`); ArgsFormatError naming `source` when it is
    neither."""
    try:
        return yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as err:
        raise ArgsFormatError(f"{source}: not JSON or YAML: {' '.join(str(err).split())}") from None


def convert(document: Any, kind: type[ArgsT], *, name: str, source: str, strict: bool = True) -> ArgsT:
    """A decoded document as the args struct `kind` (Koordinator's `name` for it in the message); ArgsFormatError
    naming `source` and the field when it is not an object of that kind. `strict=False` for YAML, where `8e9`
    without a dot reads as a string."""
    if not isinstance(document, Mapping):
        raise ArgsFormatError(f"{source}: expected an object of {name}")
    try:
        return msgspec.convert(document, kind, strict=strict)
    except msgspec.ValidationError as err:
        raise ArgsFormatError(f"{source}: {err}") from None


def duration_seconds(text: str, *, field: str = "duration", negative: bool = True) -> Fraction:
    """A Go duration ("5m", "1h30m", "300s", "500ms", "-1m") in seconds (schemas.koordinator.parse_go_duration); ""
    is 0. ArgsFormatError naming `field` when it does not parse, or when it is negative and `negative` is False."""
    if text == "":
        return Fraction(0)
    try:
        seconds = koordinator.parse_go_duration(text)
    except ValueError:
        seconds = None
    if seconds is None or (seconds < 0 and not negative):
        raise ArgsFormatError(f"{field}: {text!r} is not a duration like '5m' or '500ms'")
    return seconds
