"""The HTML report in a real browser, as a person opens it: Debian's chromium driven by
Playwright (its own browser download cannot be fetched here; .ci/run installs the `chromium`
package), on a report of committed records (the CPU smoke, five vLLM releases on CPU and an
H100 run).

It asserts what a reader sees at 1400x900: no console error, failed request or script error;
the verdict table above the fold, wider than nothing (no horizontal scroll) and no column
clipped; sorting, filtering and a line's details working; one distinct colour per outcome; the
forest plot drawn. The screenshot of the first screen goes to $PD_ACCURACY_SCREENSHOT when set:

    PD_ACCURACY_SCREENSHOT=docs/img/report.png python -m pytest tests/report/test_report_browser.py

(docs/results.md shows it). Without chromium the test fails and says how to install it: it is
never skipped.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from harness.report.history import append_results_dir
from harness.report.html import render_report

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ["results/reference/cpu-kv-digest-20261201/smoke",
           "results/reference/cpu-vllm-releases-20261205",
           "results/reference/gpu-h100-soak-expiry-digest-20261206/soak-expiry/records"]
VIEWPORT = {"width": 1400, "height": 900}
# what works on these machines (no GPU, no network): a fresh profile, nothing phoning home
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


def chromium() -> str:
    path = os.environ.get("PD_ACCURACY_CHROMIUM") or shutil.which("chromium")
    if not path:
        pytest.fail("no chromium: install Debian's package (apt-get install -y chromium; "
                    ".ci/run does) or point $PD_ACCURACY_CHROMIUM at a Chromium binary")
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("report")
    db = tmp / "history.sqlite"
    for records in RECORDS:
        append_results_dir(db, ROOT / records)
    return render_report(db, tmp / "report")


@pytest.fixture(scope="module")
def page(report, tmp_path_factory):
    from playwright.sync_api import sync_playwright

    problems: list[str] = []
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=chromium(),
            args=CHROMIUM_FLAGS, viewport=VIEWPORT)
        page = context.new_page()
        page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
                if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(f"script error: {e}"))
        page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
        page.goto(report.as_uri(), wait_until="load")
        page.problems = problems
        yield page
        context.close()


def test_the_page_loads_clean_with_its_forest_plot(page):
    assert page.problems == []
    assert page.evaluate("""() => {
        const img = document.querySelector('#forest img');
        return img.complete && img.naturalWidth > 600; }""")
    path = os.environ.get("PD_ACCURACY_SCREENSHOT")
    if path:   # 64 colours: the committed picture stays small (about 100 KB)
        import io

        from PIL import Image

        shot = Image.open(io.BytesIO(page.screenshot())).convert("RGB")
        shot.quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def test_the_verdict_table_is_above_the_fold_and_nothing_is_clipped(page):
    box = page.evaluate("""() => {
        const t = document.getElementById('verdicts');
        const first = t.tBodies[0].rows[0].getBoundingClientRect();
        const r = t.getBoundingClientRect();
        return {top: r.top, right: r.right, first: first.bottom, inner: innerWidth,
                scroll: document.documentElement.scrollWidth}; }""")
    assert box["top"] < 200 and box["first"] <= VIEWPORT["height"]
    assert box["right"] <= box["inner"] and box["scroll"] <= box["inner"]
    clipped = page.evaluate("""() => Array.from(
        document.querySelectorAll('#verdicts thead th, #verdicts tr.line td, #verdicts tr.line td *'))
        .filter(el => el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).display !== 'inline')
        .map(el => el.textContent.trim().slice(0, 60))""")
    assert clipped == []
    # every cell id is on one line: its box is one line high
    tall = page.evaluate("""() => Array.from(document.querySelectorAll('#verdicts .id'))
        .filter(el => el.getClientRects().length !== 1).map(el => el.textContent)""")
    assert tall == []


def _shown(page) -> list[dict]:
    return page.evaluate("""() => Array.from(document.querySelectorAll('#verdicts > tbody'))
        .filter(b => !b.hidden).map(b => ({id: b.dataset.id, outcome: b.dataset.outcome,
                                           kind: b.dataset.kind, delta: b.dataset.delta}))""")


def test_sorting_filtering_and_details(page):
    everything = _shown(page)
    assert len(everything) >= 12 and everything[0]["outcome"] in ("FAIL", "MISSED", "ERROR")
    page.click("th[data-key=delta] button")
    deltas = [float(r["delta"]) for r in _shown(page) if r["delta"]]
    assert deltas == sorted(deltas)
    page.click("th[data-key=delta] button")
    deltas = [float(r["delta"]) for r in _shown(page) if r["delta"]]
    assert deltas == sorted(deltas, reverse=True)

    page.fill("#filter", "corrupt-block")
    shown = _shown(page)
    assert shown and all("corrupt-block" in r["id"] or r["kind"] == "canary" for r in shown)
    assert page.inner_text("#shown") == f"{len(shown)} of {len(everything)} shown"
    page.fill("#filter", "")
    page.select_option("#outcome-filter", "XFAIL")
    assert {r["outcome"] for r in _shown(page)} == {"XFAIL"}
    page.select_option("#outcome-filter", "")
    page.select_option("#kind-filter", "canary")
    assert {r["kind"] for r in _shown(page)} == {"canary"}
    page.select_option("#kind-filter", "")
    assert len(_shown(page)) == len(everything)

    line = page.locator("#verdicts > tbody:not([hidden]) > tr.line").first
    details = page.locator("#verdicts > tbody:not([hidden]) > tr.details").first
    assert not details.is_visible()
    line.click()
    assert details.is_visible() and line.get_attribute("aria-expanded") == "true"
    text = details.inner_text()
    assert "Transfer" in text and "KV digest" in text and "Checks" in text
    line.press("Enter")
    assert not details.is_visible()


def test_each_outcome_has_its_own_colour(page):
    colours = page.evaluate("""() => {
        const out = {};
        document.querySelectorAll('#verdicts .chip').forEach(c => {
            out[c.textContent.trim()] = getComputedStyle(c).backgroundColor; });
        return out; }""")
    assert {"PASS", "XFAIL", "CAUGHT", "ERROR"} <= set(colours)
    assert len(set(colours.values())) == len(colours)
