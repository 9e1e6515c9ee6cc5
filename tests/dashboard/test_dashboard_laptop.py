"""The dashboard on a laptop's screen and in a reader's hands: the model table from 1280 px up, the headline's
median saying what it is taken over, a failed fetch's row, and the back button closing the drill-down."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from chrome import Chrome
from synthetic import variant

from zoo_convert.dashboard.site import build_site
from zoo_convert.records import ConversionResult
from zoo_convert.store import ResultStore

# Each model table cell, as laid out: [model, status, height of its row, width of the message column].
_LAYOUT = """(() => {
  const heads = [...document.querySelectorAll('#models thead th')].map(th => th.textContent.replace(/[ ▲▼]+$/, ''));
  const msg = heads.indexOf('message'), status = heads.indexOf('status');
  const wrap = document.querySelector('.table-wrap');
  return {
    message_width: document.querySelectorAll('#models thead th')[msg].getBoundingClientRect().width,
    rows: [...document.querySelectorAll('#models tbody tr')].map(tr => [tr.cells[0].textContent,
      tr.cells[status].textContent, tr.getBoundingClientRect().height, tr.cells[msg].querySelector('span').title]),
    overflow: wrap.scrollWidth - wrap.clientWidth,
  };
})()"""


@pytest.mark.parametrize("width", [1280, 1440, 1920])
def test_the_model_table_reads_well_from_1280_px_up(width: int, browser: Chrome, site_url: str, tmp_path: Path) -> None:
    browser.errors.clear()
    browser.set_width(width)
    try:
        browser.open("about:blank")
        browser.open(site_url)
        layout = browser.eval(_LAYOUT)
        shot = tmp_path / f"dashboard-{width}.png"
        browser.screenshot(shot)
    finally:
        browser.reset_size()
    assert shot.stat().st_size > 10_000  # kept in the test's tmp dir, to look at
    assert layout["message_width"] >= 240, layout
    failed = [r for r in layout["rows"] if r[1] == "failed"]
    assert len(failed) == 4 and max(r[2] for r in layout["rows"]) <= 80, layout["rows"]
    assert layout["overflow"] <= 0  # no sideways scrolling to reach the message
    # the row shows two lines of the message; its title holds it whole
    titles = {r[0]: r[3] for r in layout["rows"]}
    assert titles["zoo/wavlm-f"].startswith("fp16 optimize crashed") and titles["zoo/wavlm-f"].endswith("(signal 11)")
    assert browser.errors == []


def _store(path: Path) -> ResultStore:
    """Two calm speedups, a noisy one, an fp32 that failed, and a model that failed in fetch."""
    store = ResultStore(path)
    store.start_run("r", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
    for name, speedup, noisy in (("a", 2.0, False), ("b", 3.0, False), ("c", 60.6, True)):
        fp32 = replace(variant("fp32"), speedup=speedup, bench_noisy=noisy)
        store.record("r", name, ConversionResult(source=f"zoo/{name}", status="passed", model_type="bert",
                                                 variants=(fp32,)))  # fmt: skip
    store.record("r", "d", ConversionResult(source="zoo/d", status="failed", model_type="bert", failure_kind="verify_numerics",
                                            stage="verify", message="fp32: off", variants=(variant("fp32", passed=False),)))  # fmt: skip
    store.record("r", "e", ConversionResult(source="zoo/e", status="failed", model_type="gpt2", failure_kind="fetch_error",
                                            stage="fetch", message="tokenizer.json cannot be loaded"))  # fmt: skip
    store.finish_run("r")
    return store


def test_the_median_speedup_says_over_how_many_models_and_why_the_others_are_out(browser: Chrome, tmp_path: Path) -> None:
    _store(tmp_path / "r.duckdb")
    index = build_site(tmp_path / "r.duckdb", tmp_path / "site")
    browser.errors.clear()
    browser.open(index.as_uri())
    cards = dict(browser.eval("[...document.querySelectorAll('#headline .card')]"
                              ".map(c => [c.querySelector('span').textContent, c.querySelector('b').textContent])"))
    label = next(k for k in cards if k.startswith("median fp32 speedup"))
    assert cards[label] == "2.5×"
    assert label == ("median fp32 speedup vs PyTorch over 2 of 5 models; 3 left out: 1 noisy (median not within ±5% or other"
                     " processes on the CPUs it needed), 2 not timed (fp32 not verified, or no latency)")
    assert browser.errors == []


def test_a_model_that_never_exported_shows_its_type_and_no_opset(browser: Chrome, tmp_path: Path) -> None:
    _store(tmp_path / "r.duckdb")
    index = build_site(tmp_path / "r.duckdb", tmp_path / "site")
    browser.errors.clear()
    browser.open(index.as_uri())
    heads = browser.eval("[...document.querySelectorAll('#models thead th')].map(th => th.textContent)")
    row = browser.eval("[...document.querySelectorAll('#models tbody tr')].find(tr => tr.cells[0].textContent === 'zoo/e')"
                       ".innerText")
    cells = dict(zip(heads, browser.eval("[...[...document.querySelectorAll('#models tbody tr')].find(tr =>"
                                         " tr.cells[0].textContent === 'zoo/e').cells].map(td => td.textContent)")))
    assert (cells["type"], cells["opset"]) == ("gpt2", "–") and "default" not in row
    matrix = browser.eval("[...document.querySelectorAll('#matrix tbody tr')].map(tr => [...tr.cells].slice(0, 3)"
                          ".map(td => td.textContent))")
    assert ["gpt2", "–", "–"] in matrix, matrix
    browser.eval("[...document.querySelectorAll('#models tbody tr')].find(tr => tr.cells[0].textContent === 'zoo/e').click()")
    browser.wait_for("document.querySelectorAll('#drill h3').length >= 3")
    assert re.search(r"gpt2 · .* · opset – ·", browser.eval("document.querySelector('#drill h2').textContent"))
    assert browser.errors == []


def test_the_back_button_closes_the_drill_down(browser: Chrome, site_url: str) -> None:
    browser.errors.clear()
    browser.open("about:blank")
    browser.open(site_url)
    assert browser.eval("document.querySelector('#drill').hidden")
    browser.eval("[...document.querySelectorAll('#models tbody tr')].find(tr => tr.cells[0].textContent === 'zoo/gpt2-b')"
                 ".click()")
    browser.wait_for("!document.querySelector('#drill').hidden && document.querySelectorAll('#drill h3').length >= 4")
    assert browser.eval("document.querySelectorAll('#models tr.sel').length") == 1
    browser.eval("history.back()")
    browser.wait_for("location.hash === '' && document.querySelector('#drill').hidden")
    assert browser.eval("document.querySelectorAll('#models tr.sel').length") == 0
    # forward opens it again: the drill-down follows the address both ways
    browser.eval("history.forward()")
    browser.wait_for("!document.querySelector('#drill').hidden && document.querySelector('#drill h2').textContent"
                     ".startsWith('zoo/gpt2-b')")
    assert browser.errors == []
