"""The catalog in a real browser: headless Debian Chromium driven by Selenium, against `zoo serve`'s app on
the small registry and against `zoo catalog`'s files on a plain static server. Each page is written as a
screenshot into $ZOO_SCREENSHOTS (default /tmp/zoo-screenshots)."""

import json
import math
import urllib.parse
from pathlib import Path

import pytest

from tests.web_support import screenshots_dir, serving_app, serving_files
from zoo import render
from zoo.api import Zoo
from zoo.errors import SearchSyntaxError
from zoo.query import parse
from zoo.web import views
from zoo.web.app import create_app
from zoo.web.export import export_catalog

WAIT_S = 60


@pytest.fixture(scope="module")
def site(small_registry):
    with serving_app(create_app(small_registry)) as base:
        yield base


def wait(driver, condition, message=""):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S).until(lambda d: condition(d), message)


def ready(driver):
    """Wait for the page's script to finish drawing (it sets body[data-ready])."""
    wait(
        driver,
        lambda d: d.execute_script("return document.body && document.body.dataset.ready === 'true'"),
        "the page script did not finish",
    )


def navigate(driver, act):
    """Do something that loads a new page (submit, click a link) and wait until that page is drawn."""
    old = driver.find_element("tag name", "html")
    act()
    wait(driver, lambda d: not _alive(old), "no new page loaded")
    ready(driver)


def _alive(element) -> bool:
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

    try:
        _ = element.tag_name  # raises for a stale element
        return True
    except StaleElementReferenceException:
        return False
    except WebDriverException as e:  # mid-navigation Chromium may say so in its inspector's words instead
        if "does not belong to the document" in str(e):
            return False
        raise


def search_box(driver, text: str):
    from selenium.webdriver.common.keys import Keys

    box = driver.find_element("id", "q")
    box.clear()
    navigate(driver, lambda: box.send_keys(text + Keys.ENTER))


def table_names(driver) -> list[str]:
    return [td.text for td in driver.find_elements("css selector", "#table tbody td[data-col='name']")]


def shot(driver, name: str):
    driver.save_screenshot(str(screenshots_dir() / name))


def marks(driver):
    return driver.find_elements("css selector", "#scatter circle.mark")


def assert_pareto_front(driver, points, x, y, better_x=-1, better_y=1):
    """The listed front is the Pareto front by definition (better_x/better_y: 1 where more is better, -1 where
    less is): no plotted model is at least as good on one axis and better on the other than a front model,
    and every other model is matched or beaten on both by a front model."""
    front = [li.get_attribute("data-name") for li in driver.find_elements("css selector", "#front li")]
    plotted = [p for p in points if p[x] and p[y]]
    on = [p for p in plotted if p["name"] in front]
    gx, gy = (lambda p: p[x] * better_x), (lambda p: p[y] * better_y)  # bigger is better on both
    assert (
        front and len(on) == len(front) and sorted(front, key=lambda n: [-gx(p) for p in on if p["name"] == n]) == front
    )
    for p in on:
        assert not any(gx(q) >= gx(p) and gy(q) > gy(p) for q in plotted), p["name"]
    for p in plotted:
        if p["name"] not in front:
            assert any(gx(q) >= gx(p) and gy(q) >= gy(p) for q in on), p["name"]
    drawn = driver.find_element("css selector", "#scatter polyline.front").get_attribute("points").split()
    assert len(drawn) == len(front)


def test_search_sort_plot_hover_and_click_through(browser, site, small_registry):
    zoo = Zoo(small_registry)
    browser.get(site + "/")
    ready(browser)
    everything = zoo.search(None, limit=None)
    assert table_names(browser) == [i.name for i in everything]
    # the plot: one mark per row that has both values, and the Pareto front of them
    plotted = [i for i in everything if i.flops and i.params]
    assert sorted(m.get_attribute("data-name") for m in marks(browser)) == sorted(i.name for i in plotted)
    assert 0 < len(plotted) < len(everything)  # a row without FLOPs (detection) is counted, not drawn
    assert browser.find_element("id", "plot-note").text.startswith(f"{len(everything) - len(plotted)} not plotted")
    points = [{"name": i.name, "flops": i.flops, "params": i.params} for i in plotted]
    assert_pareto_front(browser, points, "flops", "params", -1, -1)  # fewer FLOPs and fewer params are better
    assert len(browser.find_elements("css selector", "#front li")) < len(plotted)

    search_box(browser, "params<2e7 and flops>1G")
    assert "q=params%3C2e7" in browser.current_url
    expected = zoo.search("params<2e7 and flops>1G", limit=None)
    assert table_names(browser) == [i.name for i in expected] and len(expected) >= 3
    shot(browser, "01-search.png")

    header = browser.find_element("css selector", "#table th[data-col='params'] a")
    navigate(browser, header.click)
    assert "sort=-params" in browser.current_url
    assert table_names(browser) == [i.name for i in zoo.search("params<2e7 and flops>1G", order_by="-params")]
    header = browser.find_element("css selector", "#table th[data-col='params'] a")
    navigate(browser, header.click)
    assert table_names(browser) == [i.name for i in zoo.search("params<2e7 and flops>1G", order_by="params")]

    # one mark per row (every row here has FLOPs and params), each named after its row
    assert sorted(m.get_attribute("data-name") for m in marks(browser)) == sorted(i.name for i in expected)
    points = [{"name": i.name, "flops": i.flops, "params": i.params} for i in expected]

    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support.ui import Select

    target = marks(browser)[-1]  # drawn last, so on top of any mark at the same spot
    ActionChains(browser).move_to_element(target).perform()
    tooltip = browser.find_element("id", "tooltip")
    wait(browser, lambda d: tooltip.is_displayed(), "no tooltip on hover")
    assert target.get_attribute("data-name") in tooltip.text
    size = next(i.input_size for i in expected if i.name == target.get_attribute("data-name"))
    assert f" at {size[-2]}x{size[-1]}" in tooltip.text  # the size the point's numbers are at
    shot(browser, "02-plot-hover.png")

    navigate(browser, lambda: Select(browser.find_element("id", "plot-x")).select_by_value("params"))  # y: GFLOPs
    assert "x=params" in browser.current_url and len(marks(browser)) == len(expected)
    assert_pareto_front(browser, points, "params", "flops", -1, -1)
    assert browser.find_element("css selector", "#scatter .axis-label").text == "parameters"

    name = marks(browser)[-1].get_attribute("data-name")
    navigate(browser, lambda: ActionChains(browser).click(marks(browser)[-1]).perform())
    assert browser.current_url.endswith("/model/" + name) and browser.find_element("id", "title").text == name


def test_facets_narrow_by_the_grammar(browser, site, small_registry):
    browser.get(site + "/?q=" + urllib.parse.quote("params>1e6"))
    ready(browser)
    facet = browser.find_element("css selector", "#facets [data-facet='family'] a")
    family = facet.text
    navigate(browser, facet.click)
    q = f"params>1e6 and family={family}"
    assert browser.find_element("id", "q").get_attribute("value") == q
    assert table_names(browser) == [i.name for i in Zoo(small_registry).search(q, limit=None)]


def test_the_page_says_when_the_plot_and_the_facets_are_a_sample(browser, site, small_registry, monkeypatch):
    """Past MAX_RESULTS matches the plot and the facets are of the first SAMPLE rows (zoo.web.views.search): the
    note beside the plot and above the facets says how many of how many; a result plotted whole says nothing."""
    monkeypatch.setattr(views, "MAX_RESULTS", 5)
    monkeypatch.setattr(views, "SAMPLE", 3)
    browser.get(site + "/?sort=-params")
    ready(browser)
    said = "a sample: the first 3 of 5+ matches, in the table's order"
    assert said in browser.find_element("id", "plot-note").text
    assert browser.find_element("id", "facet-note").text == said
    assert len(marks(browser)) <= 3
    counted = sum(
        int(li.text.rsplit(" ", 1)[1]) for li in browser.find_elements("css selector", "[data-facet='family'] li")
    )
    assert counted == 3
    monkeypatch.setattr(views, "MAX_RESULTS", 10_000)
    browser.get(site + "/?sort=-params")
    ready(browser)
    assert "sample" not in browser.find_element("id", "plot-note").text and not browser.find_elements(
        "id", "facet-note"
    )
    shot(browser, "search-sampled.png")


def test_the_fits_box_filters_by_plan_and_shows_max_batch(browser, site, small_registry):
    """Typing a run into the fits box keeps the models whose plan fits it, each with its max batch."""
    browser.get(site + "/?sort=name")
    ready(browser)
    spec = "RTX 4090 train batch=512"
    box = browser.find_element("id", "fits")
    navigate(browser, lambda: (box.send_keys(spec), box.submit()))
    want = Zoo(small_registry)._search_fits(None, "name", None, ["name", "max_batch"], spec)[0]
    assert table_names(browser) == [r["name"] for r, _ in want]
    cells = browser.find_elements("css selector", "#table td[data-col='max_batch']")
    assert [int(c.text) for c in cells] == [r["max_batch"] for r, _ in want]
    assert f"models fit {spec}" in browser.find_element("id", "summary").text
    assert browser.find_element("id", "fits").get_attribute("value") == spec  # kept across the navigation


def test_a_syntax_error_is_shown_inline_with_a_caret_at_its_column(browser, site):
    browser.get(site + "/")
    ready(browser)
    bad = "params < 7B and flops >> 1G"
    search_box(browser, bad)
    with pytest.raises(SearchSyntaxError) as expected:
        parse(bad)
    error = browser.find_element("id", "error")
    assert error.is_displayed() and expected.value.args[0].split("\n")[0] in error.text
    caret = error.find_element("css selector", "pre.caret").text.split("\n")
    assert caret[0] == bad and caret[1].index("^") == expected.value.column - 1
    assert "invalid" in browser.find_element("id", "q").get_attribute("class")
    assert browser.find_elements("css selector", "#table tbody tr") == []
    shot(browser, "03-syntax-error.png")


def test_model_page_tree_tensors_and_estimate(browser, site, small_registry):
    zoo = Zoo(small_registry)
    info = zoo.info("timm/resnet18", tensors=True)
    browser.get(site + "/model/timm/resnet18")
    ready(browser)
    rows = [
        [c.text for c in tr.find_elements("css selector", "th, td")]
        for tr in browser.find_elements("css selector", "#show tr")
    ]
    assert rows == [[label, text] for label, text in render.info_rows(info)]
    assert len(browser.find_elements("css selector", "#tensors tbody tr")) == 100
    assert 'zoo.get("timm/resnet18")' in browser.find_element("id", "snippets").text

    browser.find_element("css selector", "#tree-details > summary").click()  # expand: runs Zoo.scan
    wait(browser, lambda d: d.find_elements("css selector", "#tree .node"), "the module tree did not load")
    scan = zoo.scan("timm/resnet18", strict=False)
    nodes = browser.find_elements("css selector", "#tree .node")
    assert [n.get_attribute("data-module") for n in nodes] == [m.name for m in scan.modules]
    layer = browser.find_element("css selector", "#tree details[data-module='layer1']")
    inner = layer.find_element("css selector", "[data-module='layer1.0']")
    assert not inner.is_displayed()
    layer.find_element("tag name", "summary").click()
    assert inner.is_displayed() and "64x56x56" in inner.text  # its output shape
    shot(browser, "04-model-tree.png")

    form = browser.find_element("id", "estimate-form")
    batch = form.find_element("name", "batch")
    batch.clear()
    batch.send_keys("8")
    form.find_element("name", "training").click()
    form.find_element("css selector", "button[type='submit']").click()
    wait(browser, lambda d: d.find_elements("css selector", "#estimate-bar rect.seg"), "no estimate bar")
    expected = zoo.estimate("timm/resnet18", batch=8, dtype="bf16", training=True)
    parts = {
        r.get_attribute("data-part"): float(r.get_attribute("width"))
        for r in browser.find_elements("css selector", "#estimate-bar rect.seg")
    }
    assert set(parts) == {"weights", "gradients", "optimizer_states", "inputs", "activations"}
    widths = {p: getattr(expected, p) * 600 / expected.upper_bound for p in parts}
    assert all(abs(parts[p] - widths[p]) < 0.02 for p in parts)
    assert browser.find_element("id", "estimate-total").text == render.human(expected.total, "B")
    browser.execute_script("document.getElementById('estimate-result').scrollIntoView()")
    shot(browser, "05-model-estimate.png")


def test_the_static_catalog_searches_in_the_page(browser, small_registry, tmp_path):
    zoo = Zoo(small_registry)
    export_catalog(tmp_path / "site", small_registry, trees=False)
    with serving_files(tmp_path / "site") as base:
        browser.get(base + "/index.html")
        ready(browser)
        assert table_names(browser) == [i.name for i in zoo.search(None, limit=None)]
        search_box(browser, "name~'resnet*' or task=object-detection")
        assert table_names(browser) == [
            i.name for i in zoo.search("name~'resnet*' or task=object-detection", limit=None)
        ]
        assert len(marks(browser)) == sum(
            1 for i in zoo.search("name~'resnet*' or task=object-detection", limit=None) if i.flops and i.params
        )
        shot(browser, "06-static-search.png")

        # the in-page grammar (static/grammar.js) against zoo.search: the cases tests/test_search.py also reads
        cases = json.loads((Path(__file__).parent / "grammar_cases.json").read_text())
        script = """const [queries, sorts, done] = arguments;
          Promise.all([import('./static/grammar.js'), fetch('data/index.json').then(r => r.json())])
            .then(([g, index]) =>
            done(queries.map(q => sorts.map(s => g.search(index, new URLSearchParams({q, sort: s, per_page: 200}))
              .points.map(p => p.name)))));"""
        got = browser.execute_async_script(script, cases["searches"], cases["sorts"])
        want = [
            [[i.name for i in zoo.search(q, order_by=s, limit=None)] for s in cases["sorts"]] for q in cases["searches"]
        ]
        assert got == want
        script = """const [queries, done] = arguments;
          Promise.all([import('./static/grammar.js'), fetch('data/index.json').then(r => r.json())])
            .then(([g, index]) =>
            done(queries.map(q => { try { g.parse(q, index.fields); return null; }
              catch (e) { return e.column; } })));"""
        columns = browser.execute_async_script(script, [q for q, _ in cases["errors"]])
        assert columns == [column for _, column in cases["errors"]]
        # the numbers a search or its sort names are columns, with the cells the server's search gives
        named = [
            ["infer_4090_amp>0 or params>0", "-PRED_INFER_4090_AMP"],
            ["bench_cpu>1 or family=timm", "-train_3090_amp"],
        ]
        script = """const [cases, done] = arguments;
          Promise.all([import('./static/grammar.js'), fetch('data/index.json').then(r => r.json())])
            .then(([g, index]) => done(cases.map(([q, sort]) => {
              const r = g.search(index, new URLSearchParams({q, sort}));
              return [r.columns, r.rows]; })));"""
        pages = [views.search(zoo, {"q": q, "sort": sort}) for q, sort in named]
        assert browser.execute_async_script(script, named) == [[p["columns"], p["rows"]] for p in pages]
        assert pages[0]["columns"][-2:] == ["infer_4090_amp", "pred_infer_4090_amp"]
        browser.get(base + "/index.html?" + urllib.parse.urlencode({"q": named[0][0], "sort": named[0][1]}))
        ready(browser)
        assert browser.find_element("css selector", "#table th[data-col='infer_4090_amp']").text == "infer_4090_amp"
        cells = browser.find_elements("css selector", "#table td[data-col='pred_infer_4090_amp']")
        want = [r["pred_infer_4090_amp"] for r in pages[0]["rows"]]
        assert [c.text for c in cells] == ["-" if v is None else f"{math.floor(v + 0.5)} (predicted)" for v in want]

        link = browser.find_element("css selector", "#table td[data-col='name'] a")
        name = link.text
        navigate(browser, link.click)
        assert browser.find_element("id", "title").text == name
        assert len(browser.find_elements("css selector", "#tensors tbody tr")) == min(
            100, len(zoo.info(name, tensors=True).tensor_table)
        )
        shot(browser, "07-static-model.png")


def test_with_published_accuracy_the_plot_is_top1_against_cost(browser, small_registry, tmp_path):
    # The registry records no accuracy yet (pretrained variants are another issue); the pages show a
    # top1 field as soon as the data has one. Made-up values, set in the exported index, show that.
    zoo = Zoo(small_registry)
    export_catalog(tmp_path / "site", small_registry)
    index_file = tmp_path / "site" / "data" / "index.json"
    index = json.loads(index_file.read_text())
    made_up = {
        "timm/resnet18": 69.7,
        "timm/vit_tiny_patch16_224": 75.5,
        "timm/efficientnet_b0": 77.7,
        "torchvision/mobilenet_v3_small": 67.7,
        "timm/swin_tiny_patch4_window7_224": 81.4,
        "torchvision/resnet18": 69.8,
    }
    index["columns"].append("top1")
    index["fields"]["top1"] = "number"  # searchable, as recorded fields are
    for row in index["models"]:
        row["top1"] = made_up.get(row["name"])
    index_file.write_text(json.dumps(index))
    with serving_files(tmp_path / "site") as base:
        browser.get(base + "/index.html?sort=-top1")
        ready(browser)
        assert table_names(browser)[: len(made_up)] == sorted(made_up, key=made_up.get, reverse=True)
        assert browser.find_element("css selector", "#table th[data-col='top1']").text.startswith("top-1")
        labels = [t.text for t in browser.find_elements("css selector", "#scatter .axis-label")]
        assert labels == ["GFLOPs (batch 1)", "top-1 (%)"]
        assert sorted(m.get_attribute("data-name") for m in marks(browser)) == sorted(made_up)
        points = [
            {"name": i.name, "flops": i.flops, "top1": made_up[i.name]}
            for i in zoo.search(None, limit=None)
            if i.name in made_up
        ]
        assert_pareto_front(browser, points, "flops", "top1")
        front = [li.get_attribute("data-name") for li in browser.find_elements("css selector", "#front li")]
        assert front == ["torchvision/mobilenet_v3_small", "timm/efficientnet_b0", "timm/swin_tiny_patch4_window7_224"]
        shot(browser, "08-static-top1-plot.png")


def _plot_marks(driver) -> dict[str, bool]:
    """{model: drawn as a prediction} of the plot's marks."""
    return {m.get_attribute("data-name"): "predicted" in m.get_attribute("class").split() for m in marks(driver)}


def test_the_plot_takes_any_two_fields_and_marks_predictions(browser, site, small_registry, tmp_path):
    """x = the RTX 4090's measured throughput (timm's published numbers for the small registry's timm
    architectures), y = params: models timm did not measure (torchvision's) are drawn at their roofline
    prediction, as rings, named predictions in the tooltip, the legend and the front; without predictions only
    the measured ones are drawn; the static catalog draws the same."""
    from selenium.webdriver.common.action_chains import ActionChains

    from zoo.throughput.roofline import predicted

    everything = Zoo(small_registry).search(None, limit=None)
    measured = {i.name: i.infer_4090_amp for i in everything if i.infer_4090_amp and i.params}
    guessed = {
        i.name: predicted(i, "pred_infer_4090_amp")
        for i in everything
        if not i.infer_4090_amp and i.params and predicted(i, "pred_infer_4090_amp")
    }
    assert len(measured) >= 3 and len(guessed) >= 2  # both kinds are on the plot
    url = "/?x=infer_4090_amp&y=params"
    browser.get(site + url)
    ready(browser)
    assert _plot_marks(browser) == {**dict.fromkeys(measured, False), **dict.fromkeys(guessed, True)}
    labels = [t.text for t in browser.find_elements("css selector", "#scatter .axis-label")]
    assert labels == ["infer_4090_amp (samples/s, measured)", "parameters"]
    assert "predicted" in browser.find_element("id", "predicted-key").text
    points = [
        {"name": n, "x": v, "params": next(i.params for i in everything if i.name == n)}
        for n, v in {**measured, **guessed}.items()
    ]
    assert_pareto_front(browser, points, "x", "params", 1, -1)  # faster and smaller are better
    for li in browser.find_elements("css selector", "#front li"):
        assert ("(predicted)" in li.text) == (li.get_attribute("data-name") in guessed), li.text
    ring = next(m for m in marks(browser) if m.get_attribute("data-name") in guessed)
    ActionChains(browser).move_to_element(ring).perform()
    wait(browser, lambda d: d.find_element("id", "tooltip").is_displayed(), "no tooltip on hover")
    assert "samples/s infer_4090_amp (predicted)" in browser.find_element("id", "tooltip").text
    shot(browser, "09-plot-predicted.png")

    navigate(browser, lambda: browser.find_element("id", "plot-predicted").click())
    assert "predicted=0" in browser.current_url and _plot_marks(browser) == dict.fromkeys(measured, False)

    export_catalog(tmp_path / "site", small_registry)
    with serving_files(tmp_path / "site") as base:
        browser.get(base + "/index.html" + url.lstrip("/"))
        ready(browser)
        assert _plot_marks(browser) == {**dict.fromkeys(measured, False), **dict.fromkeys(guessed, True)}
        for page in (base + "/index.html?x=license", site + "/?x=license"):  # a field the plot cannot draw
            browser.get(page)
            ready(browser)
            assert "x must be one of" in browser.find_element("id", "error").text and not marks(browser)
