"""The deployment targets on the dashboard: "Where it runs, how fast" and the drill-down's "Runs in" read
compat_by_target beside ONNX Runtime's verdict, the targets' failures by signature; on the first screen at 1280 px.

The DB is a real run: the zoo's bert and data2vec-text converted by the pipeline and checked on ort-cpu, openvino
and transformers.js (tests/dashboard/conftest.py, ``targets_db``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from chrome import Chrome

from zoo_convert.dashboard.site import build_site
from zoo_convert.store import ResultStore
from zoo_convert.store.queries import query

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

FIRST_SCREEN = 800  # px of a 1280 x 800 laptop screen


def _rows(browser: Chrome, selector: str) -> list[list[str]]:
    return list(browser.eval(f"[...document.querySelectorAll('{selector} tbody tr')].map(tr => [...tr.cells].map(c => c.innerText))"))


def _drill(browser: Chrome, name: str) -> list[list[str]]:
    """The drill-down's "Runs in" rows of the model called ``name``."""
    browser.eval(f"[...document.querySelectorAll('#models tbody tr')].find(tr => tr.cells[0].textContent === '{name}').click()")
    browser.wait_for("[...document.querySelectorAll('#drill h3')].some(h => h.textContent.startsWith('Runs in'))")
    return list(browser.eval(
        "(() => { const h = [...document.querySelectorAll('#drill h3')].find(h => h.textContent.startsWith('Runs in'));"
        " return [...h.nextElementSibling.querySelectorAll('tbody tr')].map(tr => [...tr.cells].map(c => c.innerText)); })()"))


def test_where_it_runs_reads_every_target_on_the_first_screen(browser: Chrome, targets_db: Path, tmp_path: Path) -> None:
    store = ResultStore(targets_db, read_only=True)
    _, recorded = query(store, "SELECT target, variant, status, target_version FROM compat_by_target"
                               " WHERE target <> 'ort-cpu' ORDER BY ALL")  # fmt: skip
    index = build_site(targets_db, tmp_path / "site")
    browser.errors.clear()
    browser.set_width(1280, FIRST_SCREEN)
    try:
        browser.open("about:blank")
        browser.open(index.as_uri())
        last_target = browser.eval("document.querySelector('#targets tbody tr:last-child').getBoundingClientRect().bottom + window.scrollY")
        # the panel shows all of its table: no column scrolled out of sight
        overflow = browser.eval("(() => { const p = document.querySelector('#targets').closest('.panel');"
                                " return p.scrollWidth - p.clientWidth; })()")
        targets = _rows(browser, "#targets")
        signatures = _rows(browser, "#target-signatures")
        shot = tmp_path / "targets-1280.png"
        browser.screenshot(shot)
        if os.environ.get("ZOO_SCREENSHOTS"):  # where a person wants to look at it
            shutil.copy(shot, Path(os.environ["ZOO_SCREENSHOTS"]) / shot.name)
        bert = _drill(browser, "bert")
        data2vec = _drill(browser, "data2vec-text")
    finally:
        browser.reset_size()
    assert browser.errors == []
    # every target has its rows, per variant, with its version, on the first screen
    assert last_target < FIRST_SCREEN and overflow <= 0, (last_target, overflow)
    shown = {(row[0].split()[0], row[1]) for row in targets}
    assert {(t, v) for t, v, *_ in recorded} | {("ort-cpu", "fp32")} <= shown, (recorded, targets)
    js = next(row for row in targets if row[0].startswith("transformers.js") and row[1] == "fp32")
    assert js[0] == "transformers.js\n4.3.2" and js[2] == "1/2" and js[3] == "1 unsupported", js
    assert float(js[4]) > 0 and js[5] == "–"  # its latency; noise is ort-cpu's benchmark's notion
    openvino = next(row for row in targets if row[0].startswith("openvino") and row[1] == "fp32")
    assert openvino[0].startswith("openvino\n2026.") and openvino[2] == "2/2", openvino
    ort = next(row for row in targets if row[0].startswith("ort-cpu") and row[1] == "fp32")
    assert ort[2] == "2/2" and ort[3] == "–"
    # the targets' failures by signature: data2vec-text is no architecture transformers.js knows
    unsupported = next(row for row in signatures if row[0] == "transformers.js")
    assert unsupported[1] == "unsupported" and "data2vec-text" in unsupported[5], signatures
    assert "has no architecture for model type" in unsupported[4], signatures
    # the drill-down lists each target with its version, status and latency
    assert ["transformers.js", "fp32", "passed", "4.3.2"] == bert[[r[0] for r in bert].index("transformers.js")][:4], bert
    assert {r[0] for r in bert} >= {"ort-cpu", "openvino", "transformers.js"}
    js_row = next(r for r in data2vec if r[0] == "transformers.js")
    assert js_row[2] == "unsupported" and 'no architecture for model type "data2vec-text"' in js_row[6], data2vec


def test_a_db_from_before_the_targets_shows_ort_cpu_alone(browser: Chrome, results_db: Path, tmp_path: Path) -> None:
    """The synthetic history has no target rows (runs from before the targets) besides the real bert's run."""
    copy = tmp_path / "old.duckdb"
    shutil.copy(results_db, copy)
    with ResultStore(copy).connect() as con:
        con.execute("DELETE FROM target_results")
    index = build_site(copy, tmp_path / "site")
    browser.errors.clear()
    browser.open("about:blank")
    browser.open(index.as_uri())
    targets = _rows(browser, "#targets")
    note = browser.eval("document.querySelector('#target-signatures').innerText")
    assert browser.errors == []
    assert targets and {row[0].split()[0] for row in targets} == {"ort-cpu"}
    assert "no failures on the deployment targets" in note
