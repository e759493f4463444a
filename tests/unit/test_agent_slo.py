"""agent.slo.effective_slo: the NodeSLO spec merged onto the agent defaults, disabled QoS sections neutralised."""

from __future__ import annotations

from agent.slo import AGENT_DEFAULTS, effective_slo, spec_problems
from services.common.sloconfig import parse_slo_config
from services.slo.render import render_node_slo


def test_no_nodeslo_yet_means_the_defaults_with_every_class_disabled() -> None:
    slo = effective_slo(None)
    assert slo["resourceUsedThresholdWithBE"] == AGENT_DEFAULTS["resourceUsedThresholdWithBE"]
    assert slo["systemStrategy"]["watermarkScaleFactor"] == 150
    be = slo["resourceQOSStrategy"]["beClass"]
    # The BE defaults (groupIdentity -1, CAT 0-30 %) are replaced by the "none" values while disabled.
    assert be["cpuQOS"] == {"enable": False, "groupIdentity": 0, "schedIdle": 0, "coreExpeller": False}
    resctrl = be["resctrlQOS"]
    assert resctrl == {"enable": False, "catRangeStartPercent": 0, "catRangeEndPercent": 100, "mbaPercent": 100}
    assert be["memoryQOS"]["wmarkScalePermill"] == 50 and be["memoryQOS"]["wmarkMinAdj"] == 0
    assert slo["hostApplications"] == []


def test_enabling_a_section_brings_its_class_defaults_and_the_given_values() -> None:
    spec = {
        "resourceQOSStrategy": {
            "beClass": {"resctrlQOS": {"enable": True, "mbaPercent": 60}, "memoryQOS": {"enable": True}},
            "lsClass": {"cpuQOS": {"enable": True}},
        },
        "cpuBurstStrategy": {"policy": "auto", "cpuBurstPercent": None},
    }
    slo = effective_slo(spec)
    qos = slo["resourceQOSStrategy"]
    assert qos["beClass"]["resctrlQOS"] == {
        "enable": True,
        "catRangeStartPercent": 0,
        "catRangeEndPercent": 30,
        "mbaPercent": 60,
    }
    assert qos["beClass"]["memoryQOS"]["wmarkMinAdj"] == 50 and qos["beClass"]["memoryQOS"]["wmarkRatio"] == 95
    assert qos["lsClass"]["cpuQOS"] == {"enable": True, "groupIdentity": 2, "schedIdle": 0, "coreExpeller": True}
    assert qos["lsClass"]["resctrlQOS"]["enable"] is False
    assert slo["cpuBurstStrategy"]["policy"] == "auto" and slo["cpuBurstStrategy"]["cpuBurstPercent"] == 1000


def test_explicit_values_in_a_disabled_section_are_not_applied() -> None:
    spec = {"resourceQOSStrategy": {"beClass": {"cpuQOS": {"enable": False, "groupIdentity": -1}}}}
    assert effective_slo(spec)["resourceQOSStrategy"]["beClass"]["cpuQOS"]["groupIdentity"] == 0


def test_merging_does_not_leak_into_the_defaults() -> None:
    effective_slo({"resourceQOSStrategy": {"beClass": {"cpuQOS": {"enable": True}}}})
    assert AGENT_DEFAULTS["resourceQOSStrategy"]["beClass"]["cpuQOS"]["groupIdentity"] == -1
    assert effective_slo(None)["resourceQOSStrategy"]["beClass"]["cpuQOS"]["enable"] is False


def test_a_rendered_nodeslo_round_trips_into_the_agent_view() -> None:
    config = parse_slo_config(
        {
            "resource-threshold-config": '{"clusterStrategy": {"enable": true, "cpuSuppressThresholdPercent": 55}}',
            "host-application-config": '{"applications": [{"name": "nginx", "qos": "LS"}]}',
        }
    )
    slo = effective_slo(render_node_slo(config, {}, {}))
    assert slo["resourceUsedThresholdWithBE"]["enable"] is True
    assert slo["resourceUsedThresholdWithBE"]["cpuSuppressThresholdPercent"] == 55
    assert slo["hostApplications"] == [{"name": "nginx", "qos": "LS"}]
    assert slo["systemStrategy"]["minFreeKbytesFactor"] == 100


def test_spec_problems_accepts_rendered_specs_and_refuses_bad_values() -> None:
    assert spec_problems(None) == [] and spec_problems({}) == []
    good = {
        "resourceUsedThresholdWithBE": {
            "enable": True,
            "cpuSuppressThresholdPercent": 50,
            "cpuSuppressPolicy": "cfsQuota",
        },
        "cpuBurstStrategy": {"policy": "auto", "cfsQuotaBurstPeriodSeconds": 60},
    }
    assert spec_problems(good) == []
    bad = {
        "resourceUsedThresholdWithBE": {
            "enable": "yes",
            "cpuSuppressThresholdPercent": "65",
            "memoryEvictThresholdPercent": 120,
            "cpuEvictThresholdPercent": -5,
            "evictEnabledPriorityThreshold": "high",
            "cpuEvictTimeWindowSeconds": 1e9,
        },
        "resourceQOSStrategy": {"beClass": {"resctrlQOS": {"enable": True, "mbaPercent": -1}}},
        "cpuBurstStrategy": {"policy": "sometimes", "cfsQuotaBurstPeriodSeconds": 1.5},
    }
    problems = spec_problems(bad)
    assert any("cpuSuppressThresholdPercent: '65'" in p for p in problems)
    assert any("memoryEvictThresholdPercent: 120" in p for p in problems)
    assert any("cpuEvictThresholdPercent: -5" in p for p in problems)
    assert any("evictEnabledPriorityThreshold: 'high' is not an integer" in p for p in problems)
    assert any("cpuEvictTimeWindowSeconds: 1000000000.0 is not an integer" in p for p in problems)
    assert any("enable is not a boolean" in p for p in problems)
    assert any("beClass.resctrlQOS.mbaPercent: -1" in p for p in problems)
    assert any("policy: 'sometimes'" in p for p in problems)
    assert any("cfsQuotaBurstPeriodSeconds: 1.5" in p for p in problems)
    assert spec_problems([1, 2]) == ["the spec is not an object"]  # type: ignore[arg-type]
    assert spec_problems({"cpuBurstStrategy": "auto"}) == []  # a non-object section is ignored (defaults apply)
