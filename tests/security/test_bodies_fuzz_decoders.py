"""Hypothesis fuzzing of every event decoder in schemas/ and of the body decoders of services.common.bodies (issue
#19, point 7): whatever bytes arrive, a decoder returns a value or raises its one documented error kind —
msgspec.DecodeError / ValidationError or a UnicodeDecodeError for the event decoders (the bus terms the message
and dead-letters it at once),
BodyError for the bodies (a 400) — and nothing else escapes.

The decoders are found by walking schemas/, so a new one is fuzzed without being listed here. Inputs are random
bytes, JSON and msgpack documents whose keys and tags are the decoder's own field names and type tags (so they get
past the tag and into the fields), and valid-looking documents mutated byte by byte.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import schemas
from bus import _loop
from services.common import bodies

Decode = Callable[[bytes], Any]
EXPECTED = (msgspec.DecodeError, UnicodeDecodeError)
"""What the consumer loops dead-letter at once as undecodable (bus._loop.DECODE_ERRORS); anything else is retried as
an unexpected handler error, so a poison message would come back again and again."""


def _decoders() -> Iterator[tuple[str, Decode, bool, Any]]:
    """(name, decode, msgpack?, decoded type) of every decoder object and decode_* function in schemas/ (a function
    may raise its module's own format error, a ValueError naming the field, too)."""
    for info in pkgutil.iter_modules(schemas.__path__):
        module = importlib.import_module(f"schemas.{info.name}")
        for name, value in sorted(vars(module).items()):
            if isinstance(value, msgspec.json.Decoder | msgspec.msgpack.Decoder):
                yield f"{info.name}.{name}", value.decode, isinstance(value, msgspec.msgpack.Decoder), value.type
            elif type(value).__name__.endswith("Decoder") and hasattr(value, "decode") and not isinstance(value, type):
                inner = getattr(value, "_decoder", None)
                yield f"{info.name}.{name}", value.decode, isinstance(inner, msgspec.msgpack.Decoder), inner.type
            elif name.startswith("decode_") and callable(value) and value.__module__ == module.__name__:
                yield f"{info.name}.{name}", value, False, None


DECODERS = list(_decoders())


def _vocabulary(decoded: Any) -> list[str]:
    """Every field name, tag field and tag value reachable from the decoded type."""
    words: set[str] = set()
    seen: set[int] = set()
    todo = [msgspec.inspect.type_info(decoded)] if decoded is not None else []
    while todo and len(seen) < 500:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, msgspec.inspect.StructType):
            words.update(f.encode_name for f in node.fields)
            if node.tag_field is not None:
                words.add(node.tag_field)
                words.add(str(node.tag))
            todo.extend(f.type for f in node.fields)
        for attr in ("types", "item_type", "key_type", "value_type", "item_types"):
            child = getattr(node, attr, None)
            if isinstance(child, tuple):
                todo.extend(child)
            elif child is not None:
                todo.append(child)
    return sorted(words) or ["type"]


def _documents(words: list[str]) -> st.SearchStrategy[Any]:
    keys = st.sampled_from(words) | st.text(max_size=8)
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**63), max_value=2**64 - 1)  # all msgpack holds
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.sampled_from([*words, "1e400", "9999999999999999999Ei", "-1", "", "NaN"])
        | st.text(max_size=12)
    )
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=6),
        max_leaves=25,
    )


@st.composite
def _inputs(draw: st.DrawFn, words: list[str], msgpack: bool) -> bytes:
    kind = draw(st.sampled_from(["bytes", "document", "mutated"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    document = draw(st.dictionaries(st.sampled_from(words), _documents(words), max_size=8))
    raw = msgspec.msgpack.encode(document) if msgpack else msgspec.json.encode(document)
    if kind == "document":
        return raw
    mutated = bytearray(raw)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        if not mutated:
            break
        position = draw(st.integers(min_value=0, max_value=len(mutated) - 1))
        mutated[position] = draw(st.integers(min_value=0, max_value=255))
    return bytes(mutated)


@pytest.mark.parametrize(("name", "decode", "msgpack", "decoded"), DECODERS, ids=[d[0] for d in DECODERS])
def test_an_event_decoder_raises_only_its_decode_errors(name: str, decode: Decode, msgpack: bool, decoded: Any) -> None:
    words = _vocabulary(decoded)
    documented = _documented_errors(name)

    @given(data=_inputs(words, msgpack))
    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def fuzz(data: bytes) -> None:
        with contextlib.suppress(*documented):
            decode(data)

    fuzz()


def _documented_errors(name: str) -> tuple[type[BaseException], ...]:
    module = importlib.import_module(f"schemas.{name.split('.')[0]}")
    own = [v for k, v in vars(module).items() if k.endswith("FormatError") and isinstance(v, type)]
    return (*EXPECTED, *own)


def _invalid_utf8_error() -> UnicodeDecodeError:
    try:
        msgspec.json.decode(b'"\xff"')
    except UnicodeDecodeError as e:
        return e
    raise AssertionError("msgspec decoded invalid UTF-8")


def test_what_a_decoder_may_raise_is_dead_lettered_at_once() -> None:
    for error in (msgspec.DecodeError("x"), msgspec.ValidationError("x"), _invalid_utf8_error()):
        assert isinstance(error, EXPECTED)
        assert isinstance(_loop.decide(error, num_delivered=1, max_deliver=5), _loop.DeadLetter), error


def test_every_decoder_family_is_found() -> None:
    names = {d[0] for d in DECODERS}
    assert {"node.NODE_EVENT_DECODER", "cluster.CLUSTER_EVENT_DECODER", "quota_events.decode_quota_event"} <= names
    assert {"migration_events.decode_migration_event", "qos.QOS_EVENT_DECODER", "extender.EXTENDER_ARGS"} <= names


JSON_ISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=30,
)


YAML_PREFIXES = ["", "x: &a [1]\ny: *a\n", "!!python/name:os.system ''\n", "t: !!timestamp 2024-01-01\n"]


@st.composite
def _body_bytes(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["bytes", "text", "json", "nested", "yaml"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "text":
        return draw(st.text(max_size=200)).encode("utf-8", "surrogatepass")
    if kind == "nested":
        depth = draw(st.integers(min_value=1, max_value=300))
        opener = draw(st.sampled_from(["[", '{"a":', "- ", "a: "]))
        return (opener * depth).encode()
    document = draw(JSON_ISH)
    if kind == "json":
        return msgspec.json.encode(document)
    alias = draw(st.sampled_from(YAML_PREFIXES))
    return (alias + msgspec.json.encode(document).decode()).encode()


@given(raw=_body_bytes())
@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_body_decoders_raise_only_body_errors(raw: bytes) -> None:
    for decode in (bodies.decode_json, bodies.decode_yaml):
        try:
            document = decode(raw)
        except bodies.BodyError as e:
            str(e).encode()  # the message goes into a JSON answer: it must be valid text
        else:
            msgspec.json.encode(document)  # what a route goes on with is plain JSON data


@given(document=JSON_ISH)
@settings(max_examples=200, deadline=None, database=None)
def test_body_decoders_read_plain_json_as_is(document: Any) -> None:
    raw = msgspec.json.encode(document)
    assert bodies.decode_json(raw) == document
