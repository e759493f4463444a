"""NodeMetricComputedRecord: the projector's view of NodeMetricComputed keeps the status as the JSON it arrived
as, still rejects what is not well-formed, and reads updateTime without decoding the pods."""

from __future__ import annotations

import msgspec
import pytest

from schemas.node import NodeMetricComputed, NodeMetricComputedRecord
from tests.support.events import nodemetric_computed

DECODER = msgspec.json.Decoder(NodeMetricComputedRecord)


def test_record_keeps_the_status_json_byte_for_byte() -> None:
    event = nodemetric_computed("node-a", 1_000.0)
    wire = msgspec.json.encode(event)
    record = DECODER.decode(wire)
    assert (record.node, record.report_time, record.spec, record.update_time) == (
        "node-a",
        1_000.0,
        event.spec,
        1_000.0,
    )
    assert bytes(record.status) == msgspec.json.encode(event.status)
    assert msgspec.json.decode(bytes(record.status), type=type(event.status)) == event.status
    assert NodeMetricComputedRecord.of(event) == record


@pytest.mark.parametrize(
    ("edit", "error"),
    [
        (lambda raw: raw.replace(b'"status":{', b'"status":{{'), msgspec.DecodeError),  # not JSON
        (
            lambda raw: raw.replace(b'"report_interval_seconds":60', b'"report_interval_seconds":"60"'),
            msgspec.ValidationError,
        ),
        (lambda raw: raw.replace(b'"nodemetric.computed.v1"', b'"nodemetric.computed.v9"'), msgspec.ValidationError),
    ],
)
def test_malformed_reports_still_fail_decoding(edit: object, error: type[Exception]) -> None:
    wire = msgspec.json.encode(nodemetric_computed("node-a", 1_000.0))
    broken = edit(wire)  # type: ignore[operator]
    assert broken != wire
    with pytest.raises(error):
        DECODER.decode(broken)


def test_a_status_without_update_time_is_refused_when_read() -> None:
    record = DECODER.decode(msgspec.json.encode(nodemetric_computed("node-a", 1_000.0)))
    broken = msgspec.structs.replace(record, status=msgspec.Raw(b'{"pods_metric":[]}'))
    with pytest.raises(msgspec.ValidationError, match="update_time"):
        _ = broken.update_time
    assert isinstance(msgspec.json.decode(msgspec.json.encode(record), type=NodeMetricComputed), NodeMetricComputed)
