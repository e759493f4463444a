"""Settings loading: defaults, then KOORDBUS_* environment variables, then explicit overrides."""

import pytest

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
