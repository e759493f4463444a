"""Settings loading: defaults, then KOORDBUS_* environment variables, then explicit overrides."""

import pytest

from bus import streams
from koordbus.settings import EmbeddedStreamSettings
from services.api.settings import ApiSettings
from services.common.settings import SettingsError, load
from services.nodemetric.settings import NodeMetricSettings


def test_defaults_env_and_overrides_in_that_order() -> None:
    assert load(ApiSettings, env={}).port == 8080
    assert load(ApiSettings, env={"KOORDBUS_PORT": "9000"}).port == 9000
    assert load(ApiSettings, {"port": 7000}, env={"KOORDBUS_PORT": "9000"}).port == 7000
    assert load(ApiSettings, {"port": None}, env={"KOORDBUS_PORT": "9000"}).port == 9000


def test_tuples_and_floats_from_env() -> None:
    s = load(
        NodeMetricSettings,
        env={"KOORDBUS_AGGREGATE_DURATIONS_SECONDS": "60, 120", "KOORDBUS_STALE_AFTER_SECONDS": "90.5"},
    )
    assert s.aggregate_durations_seconds == (60, 120)
    assert s.stale_after_seconds == 90.5


def test_bad_values_name_the_variable() -> None:
    with pytest.raises(SettingsError, match="KOORDBUS_PORT"):
        load(ApiSettings, env={"KOORDBUS_PORT": "eighty"})
    with pytest.raises(SettingsError, match="not a TCP port"):
        load(ApiSettings, env={"KOORDBUS_PORT": "70000"})
    with pytest.raises(SettingsError, match="node_memory_collect_policy"):
        load(NodeMetricSettings, {"node_memory_collect_policy": "everything"})


def test_up_caps_its_streams_from_the_environment() -> None:
    caps = load(EmbeddedStreamSettings, env={"KOORDBUS_NODEMETRIC_STREAM_MAX_BYTES": "-1"}).caps()
    assert caps == streams.SizeCaps(node=1536 * 2**20, nodemetric=-1, noderesource=256 * 2**20)
    assert load(EmbeddedStreamSettings, env={"KOORDBUS_NODE_STREAM_MAX_BYTES": "4096"}).caps().node == 4096
    for bad in ("0", "-2"):
        with pytest.raises(SettingsError, match="KOORDBUS_NODERESOURCE_STREAM_MAX_BYTES: expected a positive number"):
            load(EmbeddedStreamSettings, env={"KOORDBUS_NODERESOURCE_STREAM_MAX_BYTES": bad})
    with pytest.raises(SettingsError, match="KOORDBUS_NODE_STREAM_MAX_BYTES"):
        load(EmbeddedStreamSettings, env={"KOORDBUS_NODE_STREAM_MAX_BYTES": "1.5GiB"})
