"""Typed settings built once at the edge: defaults, then `KOORDBUS_*` environment variables, then explicit overrides.

Every service and the CLI describe their settings as a frozen dataclass (each field documented
in its docstring comment) and build it with `load(cls, overrides)`. Nothing creates settings
at import time; FastAPI routes get them injected.

A service's settings class names its own prefix (`ENV_PREFIX: ClassVar[str] = "KOORDBUS_QUOTA_"`): each field is
read from `KOORDBUS_QUOTA_<FIELD>` first, else from the shared `KOORDBUS_<FIELD>`, so two services in one process
(`koordbus up`) can differ in `instance` or `batch_size` and the unprefixed names keep working for all of them. A
class without a prefix (the CLI's shared settings, koordbus.settings) reads the shared names only, and a field
already named after its service (`api_tokens_file` of `KOORDBUS_API_`) keeps its one name.
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")

SHARED_PREFIX = "KOORDBUS_"


class SettingsError(ValueError):
    """A setting that cannot be used; the message names the setting and the environment variable."""


def env_names(cls: type, field: str) -> tuple[str, ...]:
    """The variables `load` reads for `field` of `cls`, the first one set winning: the service's own, then the
    shared one."""
    shared = SHARED_PREFIX + field.upper()
    prefix: str = getattr(cls, "ENV_PREFIX", SHARED_PREFIX)
    return (shared,) if shared.startswith(prefix) else (prefix + field.upper(), shared)


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
    """Build `cls` from its defaults, the environment and `overrides` (None values in overrides are ignored).

    A refused value names the variable it was read from."""
    environ = os.environ if env is None else env
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    read: dict[str, str] = {}  # field -> the variable its value came from
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        if overrides and overrides.get(field.name) is not None:
            values[field.name] = overrides[field.name]
            continue
        name = next((n for n in env_names(cls, field.name) if n in environ), None)
        if name is not None:
            values[field.name] = _convert(environ[name], hints[field.name], name)
            read[field.name] = name
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        named = [name for field, name in read.items() if re.search(rf"\b{field}\b", str(e)) and name not in str(e)]
        raise SettingsError(f"{e} (from {', '.join(named)})" if named else str(e)) from e
