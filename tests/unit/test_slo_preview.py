"""services.slo.preview: outcomes grouped by what happens, changes by JSON path, the ConfigMap in effect as the last
good value, and Koordinator-written specs compared by value."""

from __future__ import annotations

import json

from services.common import sloconfig
from services.slo import preview, render

THRESHOLD = json.dumps(
    {
        "clusterStrategy": {"enable": True},
        "nodeStrategies": [{"name": "gpu", "nodeSelector": {"matchLabels": {"pool": "gpu"}}, "enable": False}],
    }
)


def _current(data: dict[str, str], labels: dict[str, str]) -> dict[str, object]:
    return render.render_node_slo(sloconfig.parse_slo_config(data), labels, {})


def test_nodes_are_grouped_by_spec_current_spec_and_entries() -> None:
    now = {"cpu-burst-config": '{"clusterStrategy": {"policy": "auto"}}'}
    nodes = [
        preview.NodeFacts(name="b", current=_current(now, {})),
        preview.NodeFacts(name="a", current=_current(now, {})),
        preview.NodeFacts(name="g", labels={"pool": "gpu"}, current=_current(now, {"pool": "gpu"})),
        preview.NodeFacts(name="new"),
    ]
    result = preview.preview({**now, "resource-threshold-config": THRESHOLD}, in_effect=now, nodes=nodes)
    assert [outcome.nodes for outcome in result.outcomes] == [("a", "b"), ("g",), ("new",)]
    plain, gpu, new = result.outcomes
    assert [(c.path, c.before, c.after) for c in plain.changes] == [("resourceUsedThresholdWithBE.enable", False, True)]
    assert gpu.changes == () and gpu.entries["resource-threshold-config"] == "nodeStrategies[0] (gpu)"
    assert new.current is None and new.changes == ()


def test_a_key_in_error_keeps_the_config_in_effect() -> None:
    now = {"resource-threshold-config": THRESHOLD}
    nodes = [preview.NodeFacts(name="n", current=_current(now, {}))]
    result = preview.preview(
        {"resource-threshold-config": '{"clusterStrategy": {"enable": 1}}'}, in_effect=now, nodes=nodes
    )
    assert [(e.key, e.path) for e in result.errors] == [("resource-threshold-config", "$.clusterStrategy.enable")]
    assert result.outcomes[0].changes == ()
    # With nothing in effect, the key in error has the default: the gate shows that change.
    alone = preview.preview({"resource-threshold-config": "{"}, in_effect=None, nodes=nodes)
    assert [(c.path, c.after) for c in alone.outcomes[0].changes] == [("resourceUsedThresholdWithBE.enable", False)]


def test_changes_name_paths_and_compare_bandwidth_by_value() -> None:
    before = {"a": {"x": 1, "y": [1]}, "gone": True, "systemStrategy": {"totalNetworkBandwidth": "1k"}}
    after = {"a": {"x": 2, "y": [1], "z": {}}, "systemStrategy": {"totalNetworkBandwidth": 1000}}
    changes = preview.diff(preview.normalized(before), after)
    assert [(c.path, c.change) for c in changes] == [("a.x", "changed"), ("a.z", "added"), ("gone", "removed")]
    assert preview.diff({"v": 1}, {"v": True}) != []  # a bool is not the number 1


def test_invalid_and_missing_selectors_are_warned_about() -> None:
    text = json.dumps(
        {"nodeStrategies": [{"nodeSelector": {"matchExpressions": [{"key": "k", "operator": "Gt"}]}}, {"name": "x"}]}
    )
    result = preview.preview({"cpu-burst-config": text}, in_effect=None, nodes=None)
    assert result.errors == ()
    assert result.warnings[0].startswith("cpu-burst-config nodeStrategies[0]: its nodeSelector is invalid")
    assert result.warnings[1].startswith("cpu-burst-config nodeStrategies[1] (x): no nodeSelector")
