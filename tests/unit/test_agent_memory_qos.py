"""agent.memory_qos: memory.min / low / high of a container from its request, limit and its class's memoryQOS."""

from __future__ import annotations

from agent.memory_qos import container_values, enabled_anywhere

GI = 1 << 30


def test_the_spec_formulas() -> None:
    config = {"minLimitPercent": 50, "lowLimitPercent": 80, "throttlingPercent": 90}
    got = container_values(4 * GI, 8 * GI, config, node_memory=64 * GI)
    assert got["memory.min"] == str(2 * GI) and got["memory.low"] == str(4 * GI * 80 // 100)
    # request + (limit − request) × 90 % = 4 GiB + 3.6 GiB, rounded down to a 4 KiB page
    assert got["memory.high"] == str((4 * GI + 4 * GI * 90 // 100) // 4096 * 4096)
    no_limit = container_values(4 * GI, None, config, node_memory=16 * GI)  # the node's memory stands in
    assert no_limit["memory.high"] == str((4 * GI + 12 * GI * 90 // 100) // 4096 * 4096)


def test_low_and_high_never_under_min_and_none_values_release() -> None:
    got = container_values(
        GI, GI, {"minLimitPercent": 100, "lowLimitPercent": 10, "throttlingPercent": 1}, node_memory=0
    )
    assert got == {"memory.min": str(GI), "memory.low": str(GI), "memory.high": str(GI)}
    none = {"minLimitPercent": 0, "lowLimitPercent": 0, "throttlingPercent": 0}
    assert container_values(GI, 2 * GI, none, node_memory=8 * GI) == {
        "memory.min": "0", "memory.low": "0", "memory.high": "max"
    }  # fmt: skip
    assert container_values(GI, None, {"throttlingPercent": 50}, node_memory=0)["memory.high"] == "max"


def test_enabled_anywhere() -> None:
    assert not enabled_anywhere({"lsClass": {"memoryQOS": {"enable": False}}})
    assert enabled_anywhere({"lsClass": {"memoryQOS": {"enable": False}}, "beClass": {"memoryQOS": {"enable": True}}})
