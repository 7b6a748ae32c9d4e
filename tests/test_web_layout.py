"""The search page's layout in headless Chromium at three viewports (a wide screen, a laptop, a phone), on
the shipped registry (its long names), judged from element rectangles: the facets, the results table and
the plot do not overlap, nothing runs off the side of the page, and every model name in the table is
readable (a few lines at most, never a letter per line). Screenshots go where tests/web_support.py says."""

import pytest

from tests.conftest import ROOT
from tests.test_web_browser import ready
from tests.web_support import screenshots_dir, serving_app
from zoo.web.app import create_app

VIEWPORTS = [(1920, 1080, False), (1400, 1000, False), (390, 844, True)]

MEASURE = """
const box = (e) => { const r = e.getBoundingClientRect();
  return {left: r.left, top: r.top + scrollY, right: r.right, bottom: r.bottom + scrollY, width: r.width}; };
const results = document.getElementById("results");
const clip = box(results);
const scrolls = getComputedStyle(results).overflowX !== "visible";  // a table wider than its section scrolls in it
const visible = (r) => scrolls ? {...r, right: Math.min(r.right, clip.right), left: Math.max(r.left, clip.left)} : r;
const names = [...document.querySelectorAll("#table td[data-col='name']")].map((td) => {
  const range = document.createRange();
  range.selectNodeContents(td);
  const lines = new Set([...range.getClientRects()].map((r) => Math.round(r.top))).size;
  return {name: td.textContent, lines: lines, width: td.getBoundingClientRect().width};
});
return {viewport: innerWidth, page: document.documentElement.scrollWidth,
        facets: box(document.getElementById("facets")), table: visible(box(document.getElementById("table"))),
        results: clip, plot: box(document.getElementById("scatter")), names: names};
"""


@pytest.fixture(scope="module")
def shipped_site():
    with serving_app(create_app(str(ROOT / "registry.db"))) as base:
        yield base


def overlap(a: dict, b: dict) -> bool:
    return (
        a["left"] < b["right"] - 1
        and b["left"] < a["right"] - 1
        and a["top"] < b["bottom"] - 1
        and b["top"] < a["bottom"] - 1
    )


@pytest.mark.parametrize("width, height, phone", VIEWPORTS)
def test_the_search_page_lays_out_without_overlap_and_with_readable_names(browser, shipped_site, width, height, phone):
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": phone},
    )
    try:
        browser.get(shipped_site + "/?q=name~'*vit*'&sort=-params")  # long names: timm's ViT variants
        ready(browser)
        layout = browser.execute_script(MEASURE)
        browser.save_screenshot(str(screenshots_dir() / f"layout-search-{width}.png"))
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    assert layout["viewport"] == width and layout["page"] <= width, "the page is wider than the screen"
    for a, b in (("facets", "table"), ("facets", "plot"), ("table", "plot"), ("results", "plot")):
        assert not overlap(layout[a], layout[b]), (a, b, layout[a], layout[b])
    assert layout["plot"]["right"] <= width and layout["plot"]["left"] >= 0
    assert len(layout["names"]) >= 20
    for cell in layout["names"]:  # about 60 characters at most: three lines of 20 or more
        assert cell["lines"] <= 3 and cell["width"] >= 120, cell
