"""Strings from the DB are data on the page: template markers, script tags and HTML comments in them change nothing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from chrome import Chrome
from synthetic import VERSIONS, good, result

from zoo_convert.dashboard.site import build_site
from zoo_convert.store import ResultStore

# Each one broke or hijacked the page when the data was a JS literal filled in before the other markers.
HOSTILE = {
    "source": "zoo/evil-/*JS*/-</script><script>window.pwned = 1</script>",
    "model_type": "/*CSS*/<!--<script>",
    "message": "/*DATA*/ <img src=x onerror=window.pwned=2> & </SCRIPT > \u2028 done",
    "tag": "<!--/*JS*/",
}


@pytest.fixture(scope="module")
def hostile_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    store = ResultStore(root / "results.duckdb")
    store.start_run("run-1", manifest="zoo.parquet", manifest_hash="h", versions=VERSIONS, resources={}, settings={})
    good_one = result("zoo/plain", "bert", variants=good("plain"))
    evil = result(HOSTILE["source"], HOSTILE["model_type"],
                  failure=("export_error", "export", HOSTILE["message"]))
    evil = replace(evil, tags=(HOSTILE["tag"],))
    store.record("run-1", "k-plain", good_one)
    store.record("run-1", "k-evil", evil)
    store.finish_run("run-1")
    return build_site(root / "results.duckdb", root / "site").parent


def test_hostile_strings_render_as_text(browser: Chrome, hostile_site: Path) -> None:
    browser.errors.clear()
    browser.open(hostile_site.joinpath("index.html").as_uri())
    assert browser.errors == []
    assert browser.eval("typeof window.pwned") == "undefined"
    sources = browser.eval("[...document.querySelectorAll('#models tbody tr')].map(tr => tr.cells[0].textContent)")
    assert sorted(sources) == sorted([HOSTILE["source"], "zoo/plain"])
    assert HOSTILE["model_type"] in browser.eval("document.querySelector('#matrix').textContent")
    assert browser.eval("document.querySelectorAll('#models img, #signatures img').length") == 0
    # the drill-down comes from a separate chunk script: the same strings stay text there too
    browser.eval(f"[...document.querySelectorAll('#models tbody tr')].find(tr => tr.cells[0].textContent"
                 f" === {HOSTILE['source']!r}).click()")
    browser.wait_for("document.querySelectorAll('#drill h3').length >= 2")
    drill = browser.eval("document.querySelector('#drill').textContent")
    assert HOSTILE["message"] in drill and HOSTILE["source"] in drill
    assert browser.eval("document.querySelectorAll('#drill img').length") == 0
    assert browser.eval("typeof window.pwned") == "undefined"
    assert browser.errors == []


def test_the_page_has_exactly_its_own_scripts(hostile_site: Path) -> None:
    html = hostile_site.joinpath("index.html").read_text()
    assert html.lower().count("<script") == 2 and html.lower().count("</script") == 2
    assert "<!--" not in html
