"""The dashboard in headless Chromium against `koordbus up --simulate-nodes 50`: sign-in, each page loads and its
charts have data, a node page counts its pods, the quota tree's total is the nodes' allocatable and a quota change
made through the REST API shows in the tree view without a reload, a migration request shows in the queue with its
arbitration, the watermarks page lays out the thresholds the running extender stated with its findings, the charts'
y axes read distinct labels whatever the range, and a screenshot of each page lands in test-artifacts/browser/."""

from __future__ import annotations

import json
import re
import urllib.error
from typing import Any

import pytest

from tests.browser.conftest import SIMULATED_NODES, Koordbus, Page, open_tab

pytestmark = pytest.mark.e2e

LOADED = "[data-page={page}][data-loaded=true]"
QUOTA = "dash-team"


def wait_loaded(tab: Page, page: str, timeout: float = 20_000) -> None:
    tab.page.wait_for_selector(LOADED.format(page=page), timeout=timeout)


def points(tab: Page, selector: str) -> int:
    return int(tab.page.get_attribute(f"{selector} svg", "data-points") or 0)


def event_stream_on_server(up: Koordbus) -> bool:
    try:
        up.call("GET", "/api/v1/events/types")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return False
        raise
    return True


def test_sign_in_refuses_a_wrong_token_and_keeps_the_right_one_for_the_tab(browser: Any, koordbus_up: Koordbus) -> None:
    tab = open_tab(browser, token=None)
    try:
        tab.page.goto(koordbus_up.base + "/")
        tab.page.fill("#token", "not-a-token")
        tab.page.click("#login button")
        tab.page.wait_for_function("document.querySelector('#login-error')?.textContent.includes('token')")
        tab.page.fill("#token", koordbus_up.token)
        tab.page.click("#login button")
        wait_loaded(tab, "overviewPage")
        assert tab.page.evaluate("sessionStorage.getItem('koordbus.token')") == koordbus_up.token
        tab.page.reload()  # the token stays with the tab: no second sign-in
        wait_loaded(tab, "overviewPage")
        tab.screenshot("login-then-overview")
    finally:
        tab.page.context.close()


def test_a_sign_in_link_signs_the_tab_in_and_leaves_no_token_in_the_address_or_history(
    browser: Any, koordbus_up: Koordbus
) -> None:
    tab = open_tab(browser, token=None)
    try:
        tab.page.goto(f"{koordbus_up.base}/#token=not-a-token")
        tab.page.wait_for_function("document.querySelector('#login-error')?.textContent.includes('refused')")
        assert "not-a-token" not in tab.page.url
        assert tab.page.evaluate("sessionStorage.getItem('koordbus.token')") is None
        tab.page.goto(f"{koordbus_up.base}/#token={koordbus_up.token}")
        wait_loaded(tab, "overviewPage")
        assert koordbus_up.token not in tab.page.url and tab.page.url.endswith("/#/"), tab.page.url
        assert tab.page.evaluate("sessionStorage.getItem('koordbus.token')") == koordbus_up.token
        tab.page.reload()  # the link's entry was replaced: a reload finds no token in the address, only the tab's own
        wait_loaded(tab, "overviewPage")
        assert koordbus_up.token not in tab.page.url
        assert "#token=" in koordbus_up.log.read_text(), "koordbus up printed no sign-in link"
        assert not [e for e in tab.errors if "401" not in e], tab.errors  # the refused link's probe is a 401
    finally:
        tab.page.context.close()


def test_overview_shows_every_node_with_totals_histogram_and_table(tab: Page, koordbus_up: Koordbus) -> None:
    tab.page.goto(koordbus_up.base + "/")
    wait_loaded(tab, "overviewPage")
    tab.page.wait_for_function("document.querySelector('[data-card=nodes] .card-value') !== null")
    assert tab.page.inner_text("[data-card=nodes] .card-value") == str(SIMULATED_NODES)
    assert tab.page.inner_text("[data-card=stale] .card-value") == "0"
    cpu = tab.page.inner_text("[data-card=cpu] .card-value")
    assert cpu.endswith("%") and 0 < int(cpu[:-1]) <= 100, cpu
    # the histogram counts every node once
    assert points(tab, "#cpu-histogram") >= 10
    counts = tab.page.eval_on_selector_all(
        "#cpu-histogram rect.bar title", "ts => ts.map(t => Number(t.textContent.split(': ')[1]))"
    )
    assert sum(counts) == SIMULATED_NODES
    # the simulated cluster has colocation on: every node gets batch resources, which the totals show
    tab.page.wait_for_function(
        "!(document.querySelector('[data-card=batch-cpu] .card-detail')?.textContent ?? ' of 0 cores')"
        ".endsWith(' of 0 cores')",
        timeout=30_000,
    )
    # the table holds every node, but only the rows in view are in the DOM
    assert tab.page.get_attribute(".vtable", "data-rows") == str(SIMULATED_NODES)
    assert 10 <= tab.page.locator(".vrow").count() < SIMULATED_NODES
    tab.page.fill("#node-filter", "sim-node-004")
    tab.page.wait_for_function("document.querySelector('.vtable')?.dataset.rows === '10'")
    tab.page.fill("#node-filter", "")
    tab.screenshot("overview")
    assert tab.errors == []


def test_node_page_charts_percentiles_now_and_over_time(tab: Page, koordbus_up: Koordbus) -> None:
    tab.page.goto(koordbus_up.base + "/")
    wait_loaded(tab, "overviewPage")
    tab.page.click(".vrow a >> nth=0")  # the first node of the table, by the link a user clicks
    wait_loaded(tab, "nodePage")
    assert tab.page.url.endswith("#/node/sim-node-0001")
    # 3 aggregation windows × avg, p50, p90, p95, p99
    assert points(tab, "[data-chart=cpu-now]") == 15
    assert points(tab, "[data-chart=memory-now]") == 15
    paths = tab.page.eval_on_selector_all(
        "[data-chart=cpu-history] path.series", "ps => ps.map(p => [p.dataset.series, Number(p.dataset.points)])"
    )
    assert [name for name, _ in paths] == ["avg", "p50", "p95", "p99"]
    if event_stream_on_server(koordbus_up):
        # 30 minutes of backfilled history: a report a minute from the event history
        assert all(n >= 10 for _, n in paths), paths
    else:
        assert all(n >= 1 for _, n in paths), paths
    assert tab.page.is_visible("text=Batch and mid allocatable over time")
    # its batch/mid decisions, charted (a point per decision kept)
    tab.page.wait_for_function(
        "Number(document.querySelector('[data-chart=batch-cpu] svg')?.dataset.points || 0) >= 1", timeout=30_000
    )
    # the prod predictor next to mid: prod usage, peak and reclaimable per report, mid per decision; and the newest
    # prediction explained (the simulated prod pods were created long ago: every one is predicted)
    assert tab.page.is_visible("text=Prod usage, predicted peak and reclaimable, and mid allocatable")
    tab.page.wait_for_function(
        "[...document.querySelectorAll('[data-chart=prediction-cpu] path.series')].map(p => p.dataset.series).join()"
        " === 'prod usage,prod peak,reclaimable,mid-cpu'",
        timeout=30_000,
    )
    tab.page.wait_for_function(
        "/prod pods predicted/.test(document.querySelector('#node-prediction')?.textContent ?? '')", timeout=30_000
    )
    prediction = tab.page.text_content("#node-prediction") or ""
    assert re.search(r"reclaimable [0-9.]+ cores", prediction) and "null" not in prediction, prediction
    # its pods: those its NodeMetric names (issue 27: "pods 0" next to cores of pod usage)
    pods = int(tab.page.inner_text("[data-card=pods] .card-value"))
    metric = koordbus_up.call("GET", "/api/v1/nodemetrics/sim-node-0001")
    assert pods > 0 and abs(pods - len(metric["status"]["podsMetric"])) <= 2, (pods, metric["status"]["podsMetric"])
    tab.screenshot("node")
    assert tab.errors == []


def test_a_quota_change_through_the_api_appears_in_the_tree_without_reload(tab: Page, koordbus_up: Koordbus) -> None:
    tab.page.goto(koordbus_up.base + "/#/quotas")
    wait_loaded(tab, "quotasPage")
    assert tab.page.locator("tr[data-quota=koordinator-root-quota]").count() == 1
    # the default tree's total is the simulated nodes' allocatable (issue 27: "total –"); the root's runtime is what
    # it leaves the teams: the total less what the system and default quotas use (the simulated nodes' own pods)
    (default,) = [t for t in koordbus_up.call("GET", "/api/v1/quota-trees")["items"] if t["tree"] == "default"]
    total = re.search(r"total cpu (\d+), memory", tab.page.inner_text("#tree-summary"))
    assert total and int(total.group(1)) == int(default["total"]["cpu"]) >= SIMULATED_NODES, default
    runtime = float(tab.page.inner_text("tr[data-quota=koordinator-root-quota] td[data-figure=runtime]"))
    assert 0 < runtime < int(total.group(1)), runtime
    # a y axis of distinct labels (it read "0.00" five times)
    ticks = tab.page.locator("#quota-chart text.y-tick").evaluate_all("ts => ts.map((t) => t.textContent)")
    assert len(ticks) >= 3 and len(set(ticks)) == len(ticks) and ticks[0] == "0", ticks
    tab.page.evaluate("window.__sameDocument = true")
    koordbus_up.call(
        "POST",
        "/api/v1/quotas",
        {
            "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
            "kind": "ElasticQuota",
            "metadata": {"name": QUOTA, "namespace": "default"},
            "spec": {"min": {"cpu": "2", "memory": "4Gi"}, "max": {"cpu": "8", "memory": "16Gi"}},
        },
    )
    live = event_stream_on_server(koordbus_up)
    # live: the event stream brings it within a second or two; without one the page re-reads every 15 s
    timeout = 10_000 if live else 40_000
    row = f"tr[data-quota={QUOTA}]"
    tab.page.wait_for_selector(row, timeout=timeout)
    assert tab.page.inner_text(f"{row} td[data-figure=min]") == "2.00"
    assert tab.page.inner_text(f"{row} td[data-figure=max-memory]") == "16Gi"
    koordbus_up.call("PATCH", f"/api/v1/quotas/{QUOTA}", {"spec": {"min": {"cpu": "3"}}})
    tab.page.wait_for_function(
        f"document.querySelector('{row} td[data-figure=min]')?.textContent === '3.00'", timeout=timeout
    )
    assert tab.page.evaluate("window.__sameDocument") is True, "the page was reloaded"
    if live:
        assert tab.page.get_attribute("#stream-status", "data-state") == "live"
    # what-if: nothing is written, the answer names the quota and the min it would have
    tab.page.select_option("#whatif-quota", QUOTA)
    tab.page.fill("#whatif-min-cpu", "5")
    tab.page.click(".whatif button")
    tab.page.wait_for_selector(f"#whatif-result tr[data-quota={QUOTA}]")
    assert "min cpu: 3.00 → 5.00" in tab.page.inner_text(f"#whatif-result tr[data-quota={QUOTA}]")
    assert tab.page.inner_text(f"{row} td[data-figure=min]") == "3.00"
    assert points(tab, "#quota-chart") >= 3
    tab.screenshot("quotas")
    assert tab.errors == []


def test_a_migration_request_shows_in_the_queue_with_its_arbitration(tab: Page, koordbus_up: Koordbus) -> None:
    tab.page.goto(koordbus_up.base + "/#/migrations")
    wait_loaded(tab, "migrationsPage")
    assert points(tab, "#migration-phases") == 5  # one bar per phase, zero or not
    job = koordbus_up.call(
        "POST", "/api/v1/migrations", {"pod": {"namespace": "default", "name": "ghost"}, "mode": "EvictDirectly"}
    )["name"]
    live = event_stream_on_server(koordbus_up)
    tab.page.wait_for_selector(f"#migration-jobs tr[data-job='{job}']", timeout=10_000 if live else 40_000)
    tab.page.click(f"#migration-jobs tr[data-job='{job}'] a")
    tab.page.wait_for_function(
        f"document.querySelector('#migration-trail')?.textContent.includes({json.dumps(job)})", timeout=10_000
    )
    assert "ghost" in tab.page.inner_text("#migration-trail")
    # the simulated cluster runs LowNodeLoad: the descheduler's section shows its last round, and a plan for now
    tab.page.wait_for_selector("#descheduler-round [data-pool]", timeout=60_000)
    tab.page.click("#descheduler-plan")
    tab.page.wait_for_function(
        "document.querySelector('#descheduler-round')?.textContent.includes('plan for now, nothing acted on')",
        timeout=10_000,
    )
    assert tab.page.locator("#descheduler-round [data-pool]").count() == 1
    tab.screenshot("migrations")
    assert tab.errors == []


def test_watermarks_page_shows_the_lines_side_by_side_with_the_findings(tab: Page, koordbus_up: Koordbus) -> None:
    view = koordbus_up.call("GET", "/api/v1/config/watermarks")
    tab.page.goto(koordbus_up.base + "/#/watermarks")
    wait_loaded(tab, "watermarksPage")
    rows = tab.page.locator("#watermark-resources tbody tr")
    assert rows.count() == len(view["resources"]) == 2
    for row in view["resources"]:
        cells = tab.page.locator(f"#watermark-resources tr[data-resource={row['resource']}] td").all_inner_texts()
        assert cells[:2] == [row["resource"], f"{row['schedule']:g}%"]
    codes = tab.page.locator("#watermark-findings li").evaluate_all("items => items.map(i => i.dataset.code)")
    assert codes == [f["code"] for f in view["findings"]] and "no-shared-watermarks" in codes
    assert "descheduler" in tab.page.inner_text("#watermark-staleness")
    # `koordbus up` runs the load-aware extender: the scheduler's line is what it stated, not the defaults
    assert view["scheduler"]["reported"] is True
    assert "scheduler: reported;" in tab.page.inner_text("#watermark-staleness")
    assert not [f for f in view["findings"] if f["code"] == "not-reported" and "scheduler" in f["message"]]
    assert tab.page.get_attribute("nav a[data-tab=watermarks]", "class") == "active"
    tab.screenshot("watermarks")
    assert tab.errors == []


def test_chart_y_axis_ticks_in_the_browser(tab: Page, koordbus_up: Koordbus) -> None:
    """chart.js's y axis: a zero or empty range still reads 0, 0.5, 1 (the quotas chart once read "0.00" five
    times), a small range gets the decimals its step needs, a large one whole numbers, counts whole steps; every
    label distinct, and a bar chart of zeros draws those labels."""
    tab.page.goto(koordbus_up.base + "/")
    result = tab.page.evaluate(
        """async () => {
          const {AXES, yTicks, barChart} = await import('/ui/chart.js');
          const labels = (max, axis) => {
            const {step, ticks} = yTicks(max, axis);
            return ticks.map((v) => axis.label(v, step));
          };
          const cases = {};
          for (const [name, axis, max] of [
            ["zero cores", AXES.cores, 0], ["no data", AXES.cores, NaN], ["3 millicores", AXES.cores, 3],
            ["1.3 cores", AXES.cores, 1300], ["17 cores", AXES.cores, 17038], ["1600 cores", AXES.cores, 1600000],
            ["zero jobs", AXES.count, 0], ["3 jobs", AXES.count, 3], ["49 nodes", AXES.count, 49],
            ["zero bytes", AXES.bytes, 0], ["64 GiB", AXES.bytes, 64 * 2 ** 30], ["0.42 %", AXES.ratio, 0.0042],
            ["0.3", AXES.plain, 0.3],
          ]) cases[name] = labels(max, axis);
          const zeros = barChart([{label: "q", values: [{name: "used", value: 0}]}], {y: AXES.cores});
          cases["bar chart of zeros"] = [...zeros.querySelectorAll("text.y-tick")].map((t) => t.textContent);
          return cases;
        }"""
    )
    assert result == {
        "zero cores": ["0", "0.5", "1"],
        "no data": ["0", "0.5", "1"],
        "3 millicores": ["0", "0.001", "0.002", "0.003"],
        "1.3 cores": ["0", "0.5", "1", "1.5"],
        "17 cores": ["0", "5", "10", "15", "20"],
        "1600 cores": ["0", "500", "1000", "1500", "2000"],
        "zero jobs": ["0", "1"],
        "3 jobs": ["0", "1", "2", "3"],
        "49 nodes": ["0", "20", "40", "60"],
        "zero bytes": ["0B", "512Mi", "1Gi"],
        "64 GiB": ["0B", "20Gi", "40Gi", "60Gi", "80Gi"],
        "0.42 %": ["0%", "0.2%", "0.4%", "0.6%"],
        "0.3": ["0", "0.1", "0.2", "0.3"],
        "bar chart of zeros": ["0", "0.5", "1"],
    }
    assert tab.errors == []


def test_sse_parser_in_the_browser(tab: Page, koordbus_up: Koordbus) -> None:
    """sse.js's parser on the cases a chunked HTTP body produces: any line end, one split anywhere (a CRLF split
    between chunks too), comments, multi-line data, ids that persist, retry, events without data."""
    tab.page.goto(koordbus_up.base + "/")
    result = tab.page.evaluate(
        """async () => {
          const {SseParser} = await import('/ui/sse.js');
          const stream = ': keepalive\\r\\n' +
            'id: 7\\r\\nevent: quota.status\\r\\ndata: {"a":\\r\\ndata:  1}\\r\\n\\r\\n' +
            'event: warning\\ndata:{"message":"old"}\\n\\n' +
            'retry: 2500\\revent: ignored-without-data\\r\\r' +
            'data\\nid: 8\\n\\n' +
            'id: bad\\u0000id\\ndata: x\\n\\n' +
            'data: no blank line yet';
          const whole = new SseParser().push(stream);
          const splits = [];
          for (let cut = 0; cut <= stream.length; cut++) {
            const parser = new SseParser();
            splits.push(JSON.stringify([...parser.push(stream.slice(0, cut)), ...parser.push(stream.slice(cut))]));
          }
          const one = new SseParser();
          const byChar = [...stream].flatMap((c) => one.push(c));
          return {whole, sameWhateverTheSplit: splits.every((s) => s === JSON.stringify(whole)),
                  byChar: JSON.stringify(byChar) === JSON.stringify(whole), retry: one.retry, buffered: one.buffer};
        }"""
    )
    assert result["whole"] == [
        {"kind": "comment", "text": "keepalive"},
        {"kind": "event", "type": "quota.status", "data": '{"a":\n 1}', "id": "7"},
        {"kind": "event", "type": "warning", "data": '{"message":"old"}', "id": "7"},
        {"kind": "event", "type": "message", "data": "", "id": "8"},
        {"kind": "event", "type": "message", "data": "x", "id": "8"},
    ]
    assert result["sameWhateverTheSplit"] and result["byChar"]
    assert result["retry"] == 2500 and result["buffered"] == "data: no blank line yet"
