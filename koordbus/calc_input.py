"""Reading one `koordbus calc` document: JSON, else YAML (a SafeLoader without implicit timestamps), into the kind's
input type, every error an InputError naming the field as a JSON path ("$.pods[0].spec: …")."""

from __future__ import annotations

from typing import Any

import msgspec
import yaml

from koordbus.calc_errors import InputError


def _path_message(err: msgspec.ValidationError) -> str:
    """msgspec's "Expected X, got Y - at `$.a[0]`" as "$.a[0]: Expected X, got Y".

    A struct's own check (schemas.kube's quantities) reports the field below the struct as a message starting
    with ".field.key: …"; that is joined onto the path: "$.pods[0].spec.overhead.cpu: cannot parse …".
    """
    text = str(err).replace("`float`", "`number`")
    message, sep, where = text.rpartition(" - at `")
    if not sep:
        return f"$: {text}"
    where = where.rstrip("`")
    if message.startswith("."):
        relative, _, message = message.partition(": ")
        return f"{where}{relative}: {message}"
    return f"{where}: {message}"


class _YamlLoader(yaml.SafeLoader):
    """YAML without its implicit timestamps: an unquoted `2026-01-01T12:00:00Z` stays the text JSON would carry
    (each kind reads its times itself, some to the nanosecond), instead of a datetime cut to the microsecond."""


_YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def decode_input(text: str, input_type: type[Any]) -> Any:
    """A JSON or YAML document as `input_type`; raises InputError naming the bad field."""
    try:
        return msgspec.json.decode(text, type=input_type)
    except msgspec.ValidationError as err:
        raise InputError(_path_message(err)) from None
    except msgspec.DecodeError:
        pass  # not JSON: try YAML, which also covers JSON with comments or trailing text
    try:
        document = yaml.load(text, Loader=_YamlLoader)  # a SafeLoader, less the timestamps
    except yaml.YAMLError as err:
        reason = " ".join(str(err).split())
        raise InputError(f"$: input is neither JSON nor YAML ({reason})") from None
    try:
        # Lax: PyYAML reads YAML 1.1, where `8e9` (no dot) is a string rather than a number.
        return msgspec.convert(document, input_type, strict=False)
    except msgspec.ValidationError as err:
        raise InputError(_path_message(err)) from None
