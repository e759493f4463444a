"""Typed settings built once at the edge: defaults, then `KOORDBUS_*` environment variables, then explicit overrides.

Every service and the CLI describe their settings as a frozen dataclass (each field documented
in its docstring comment) and build it with `load(cls, overrides)`. Nothing creates settings
at import time; FastAPI routes get them injected.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")

ENV_PREFIX = "KOORDBUS_"


class SettingsError(ValueError):
    """A setting that cannot be used; the message names the setting and the environment variable."""


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def _convert(raw: str, target: Any, name: str) -> Any:
    origin = typing.get_origin(target)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(target) if a is not type(None)]
        if raw == "" and len(options) < len(typing.get_args(target)):
            return None
        return _convert(raw, options[0], name)
    if target is bool:
        lowered = raw.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off", ""):
            return False
        raise SettingsError(f"{name}: expected a boolean (true/false), got {raw!r}")
    if target is int or target is float:
        try:
            return target(raw)
        except ValueError as e:
            raise SettingsError(f"{name}: expected a {target.__name__}, got {raw!r}") from e
    if origin is tuple:
        (item,) = {a for a in typing.get_args(target) if a is not Ellipsis}
        return tuple(_convert(part.strip(), item, name) for part in raw.split(",") if part.strip())
    return raw


def load(cls: type[T], overrides: Mapping[str, Any] | None = None, *, env: Mapping[str, str] | None = None) -> T:
    """Build `cls` from its defaults, the environment and `overrides` (None values in overrides are ignored)."""
    environ = os.environ if env is None else env
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        if overrides and overrides.get(field.name) is not None:
            values[field.name] = overrides[field.name]
        elif env_name(field.name) in environ:
            values[field.name] = _convert(environ[env_name(field.name)], hints[field.name], env_name(field.name))
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise SettingsError(str(e)) from e
