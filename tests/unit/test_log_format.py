"""koordbus.logs: the JSON formatter writes one parseable object per record, whatever the record holds; the event
fields appear only inside a handling context; node names come from the subjects that carry one."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from bus import event_context, subjects
from koordbus.logs import JsonFormatter, formatter


def record(msg: object, *args: object, exc: bool = False, **extra: object) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            exc_info = sys.exc_info()
    rec = logging.LogRecord("koordbus.test", logging.WARNING, __file__, 1, msg, args or None, exc_info)
    rec.__dict__.update(extra)
    return rec


def formatted(rec: logging.LogRecord) -> dict[str, object]:
    event_context.EventContextFilter().filter(rec)
    line = JsonFormatter().format(rec)
    assert "\n" not in line
    parsed = json.loads(line)
    assert isinstance(parsed, dict)
    return parsed


class _Unprintable:
    def __str__(self) -> str:
        raise ValueError("no text for you")

    def __repr__(self) -> str:
        raise ValueError("no repr either")


def test_a_plain_line_has_time_level_logger_and_message_only() -> None:
    line = formatted(record("hello %s", "world"))
    assert set(line) == {"time", "level", "logger", "message"}
    assert (line["level"], line["logger"], line["message"]) == ("WARNING", "koordbus.test", "hello world")
    assert str(line["time"]).endswith("Z")


def test_an_exception_is_kept_as_its_traceback_text() -> None:
    line = formatted(record("failed", exc=True))
    assert "RuntimeError: boom" in str(line["exception"]) and "Traceback" in str(line["exception"])


@pytest.mark.parametrize(
    "msg, args, expected",
    [
        ({"a": 1}, (), "{'a': 1}"),
        (42, (), "42"),
        ("two %s %s", ("only-one",), "unformattable"),
        ("%d", ("not a number",), "unformattable"),
        (_Unprintable(), (), "could not be formatted"),
    ],
)
def test_odd_records_still_make_one_json_object(msg: object, args: tuple[object, ...], expected: str) -> None:
    line = formatted(record(msg, *args))
    assert expected in str(line["message"])


def test_values_json_cannot_hold_are_written_as_text() -> None:
    handling = event_context.HandlingEvent(event_id="e1", subject="x", stream_seq=3, consumer="c")
    token = event_context.enter(handling)
    try:
        event_context.bind_node("node-b")
        rec = record("inside")
        event_context.EventContextFilter().filter(rec)
    finally:
        event_context.leave(token)
    rec.node = {1, 2}  # a set: not JSON
    line = json.loads(JsonFormatter().format(rec))
    assert line["node"] == "{1, 2}" and line["event_id"] == "e1" and line["stream_seq"] == 3


def test_fields_appear_inside_a_handling_context_and_not_after_it() -> None:
    handling = event_context.HandlingEvent(
        event_id="e9", subject=subjects.nodemetric_computed("n.one"), stream_seq=7, consumer="c"
    )
    token = event_context.enter(handling)
    try:
        inside = formatted(record("inside"))
    finally:
        event_context.leave(token)
    outside = formatted(record("outside"))
    assert inside["event_id"] == "e9" and inside["node"] == "n.one" and inside["consumer"] == "c"
    assert "event_id" not in outside and "node" not in outside


@pytest.mark.parametrize(
    "subject, node",
    [
        (subjects.node_metrics("a.b"), "a.b"),
        (subjects.nodemetric_computed("n1"), "n1"),
        (f"{subjects.nodemetric_computed('n1.x')}.7", "n1.x"),  # as KOORD_NODEMETRIC stores it
        (f"{subjects.node_state('n0')}.3", "n0"),  # as KOORD_NODE stores it
        (subjects.noderesource_computed("n2"), "n2"),
        (subjects.NODERESOURCE_CONFIG_STATUS, None),
        (subjects.cluster_node("n3"), "n3"),
        (subjects.cluster_topology("n4"), "n4"),
        (subjects.cluster_pod("default", "web-0"), None),
        (subjects.slo_key("n5"), "n5"),
        (subjects.SLO_CONFIG_STATUS, None),
        (subjects.quota_events("tree"), None),
        ("koord.v1.node.~zz.metrics", None),
        ("other", None),
    ],
)
def test_the_node_comes_from_subjects_that_name_one(subject: str, node: str | None) -> None:
    assert event_context.node_in_subject(subject) == node


def test_an_unknown_format_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="text, json"):
        formatter("xml")
    assert isinstance(formatter("JSON"), JsonFormatter)
