"""Stream subject transforms as nats-server applies them, for the in-memory bus and for code that must know which
partition a node's messages land in.

A transform maps a source pattern of literal and `*` tokens to a destination that refers to the matched tokens
as `{{wildcard(i)}}` and hashes one of them into a partition as `{{partition(n,i)}}`: FNV-1a (32-bit) of the
token's bytes modulo n — the function nats-server uses, so `partition_of` agrees with the subjects the server stores
(tests/bus/test_subject_transform.py checks this against a real nats-server). Only what koordbus uses is supported:
single-token partitions, no `>` in the source.
"""

from __future__ import annotations

import re

_REFERENCE = re.compile(r"\{\{\s*(\w+)\(([^)]*)\)\s*\}\}")


class TransformError(ValueError):
    """A transform this module does not support or that does not fit its source."""


def fnv1a32(data: bytes) -> int:
    value = 0x811C9DC5
    for byte in data:
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


def partition_of(token: str, partitions: int) -> int:
    """The partition nats-server's `{{partition(partitions, i)}}` gives the subject token `token`."""
    return fnv1a32(token.encode()) % partitions


def apply(source: str, destination: str, subject: str) -> str | None:
    """`subject` as the transform stores it; None when the source pattern does not match it (stored unchanged)."""
    pattern = source.split(".")
    if ">" in pattern:
        raise TransformError(f"transform source {source!r}: `>` is not supported here")
    tokens = subject.split(".")
    if len(tokens) != len(pattern) or any(p not in ("*", t) for p, t in zip(pattern, tokens, strict=True)):
        return None
    matched = [t for p, t in zip(pattern, tokens, strict=True) if p == "*"]

    def token(index: str) -> str:
        position = int(index)
        if not 1 <= position <= len(matched):
            raise TransformError(f"transform {source!r} → {destination!r}: no wildcard {position}")
        return matched[position - 1]

    def replace(reference: re.Match[str]) -> str:
        function, arguments = reference.group(1), [a.strip() for a in reference.group(2).split(",")]
        if function == "wildcard" and len(arguments) == 1:
            return token(arguments[0])
        if function == "partition" and len(arguments) == 2:
            return str(partition_of(token(arguments[1]), int(arguments[0])))
        raise TransformError(f"transform destination {destination!r}: unsupported {reference.group(0)}")

    return _REFERENCE.sub(replace, destination)
