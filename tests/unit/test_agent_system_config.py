"""agent.system_config: koordlet's SystemConfig values from the NodeSLO's systemStrategy, with its ranges."""

from __future__ import annotations

from agent.system_config import MIN_FREE_KBYTES, REAP_BACKGROUND, WATERMARK_SCALE_FACTOR, system_wants

GIB_KB = 1024 * 1024


def test_koordinators_defaults_on_a_64_gib_node() -> None:
    wants, skipped = system_wants(
        {"minFreeKbytesFactor": 100, "watermarkScaleFactor": 150, "memcgReapBackGround": 0}, mem_total_kb=64 * GIB_KB
    )
    assert [(w.root, w.path, w.value) for w in wants] == [
        ("proc", MIN_FREE_KBYTES, str(64 * GIB_KB * 100 // 10000)),  # 1 % of memory: 671088 kB
        ("proc", WATERMARK_SCALE_FACTOR, "150"),
        ("sys", REAP_BACKGROUND, "0"),
    ]
    assert skipped == []
    assert "× minFreeKbytesFactor 100 / 10000 = 671088 kB" in wants[0].reason


def test_values_outside_koordlets_ranges_are_not_written_and_say_why() -> None:
    wants, skipped = system_wants(
        {"minFreeKbytesFactor": 100, "watermarkScaleFactor": 401, "memcgReapBackGround": 2, "pageCacheLimitEnabled": 1},
        mem_total_kb=512 * 1024,  # 512 MiB: 1 % is 5242 kB, under the 10 MiB floor
    )
    assert wants == []
    reasons = {s.field: s.why for s in skipped}
    assert "= 5242 kB, outside [10240, 10485760]" in reasons["minFreeKbytesFactor"]
    assert reasons["watermarkScaleFactor"] == "watermarkScaleFactor 401 outside [10, 400]"
    assert reasons["memcgReapBackGround"] == "memcgReapBackGround 2 outside [0, 1]"
    assert "Anolis" in reasons["pageCacheLimitEnabled"]
    # the bounds themselves are allowed; a non-integer is not read
    wants, _ = system_wants({"watermarkScaleFactor": 10, "minFreeKbytesFactor": True}, mem_total_kb=GIB_KB)
    assert [w.value for w in wants] == ["10"]
