"""The dashboard in a real headless Chromium: loads cleanly, shows the matrix and the table, filters, drills down."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chrome import Chrome

from zoo_convert.dashboard.data import MODEL_CAP


def test_the_page_renders_every_panel_without_console_errors(browser: Chrome, site_url: str) -> None:
    browser.errors.clear()
    browser.open(site_url)
    cells = browser.eval("[...document.querySelectorAll('#matrix td.cell')].map(td => td.textContent)")
    assert len(cells) >= 15 and "0/1" in cells and "1/1" in cells
    headline = browser.eval("document.querySelector('#headline').textContent")
    assert "models converted" in headline and "variants verified" in headline and "speedup" in headline
    assert browser.eval("document.querySelectorAll('#passrate circle').length") == 2 * 4  # two series, four runs
    assert browser.eval("document.querySelectorAll('#speedup rect').length") > 3
    assert browser.eval("document.querySelectorAll('#errors rect').length") > 3
    assert "export_error" in browser.eval("document.querySelector('#signatures').textContent")
    assert browser.errors == []


def test_the_table_shows_the_real_run_and_filters(browser: Chrome, site_url: str) -> None:
    browser.errors.clear()
    browser.open(site_url)
    sources = browser.eval("[...document.querySelectorAll('#models tbody tr td:first-child')].map(td => td.textContent)")
    assert len(sources) == 7 and "bert" in sources
    browser.eval("{ const s = document.querySelector('#f-status'); s.value = 'failed';"
                 " s.dispatchEvent(new Event('input')); }")
    statuses = browser.eval("[...document.querySelectorAll('#models tbody tr td:nth-child(6)')].map(td => td.textContent)")
    assert statuses and set(statuses) == {"failed"}
    browser.eval("{ document.querySelector('#f-status').value = '';"
                 " const q = document.querySelector('#search'); q.value = 'gpt2'; q.dispatchEvent(new Event('input')); }")
    assert browser.eval("[...document.querySelectorAll('#models tbody tr')].map(tr => tr.cells[0].textContent)") == [
        "zoo/gpt2-b"
    ]
    assert browser.errors == []


def test_drill_down_shows_outputs_census_and_latencies_of_the_real_model(browser: Chrome, site_url: str) -> None:
    browser.errors.clear()
    browser.open(site_url)
    browser.eval("[...document.querySelectorAll('#models tbody tr')].find(tr => tr.cells[0].textContent === 'bert')"
                 ".click()")
    browser.wait_for("document.querySelectorAll('#drill h3').length >= 3")
    drill = browser.eval("document.querySelector('#drill').textContent")
    assert "Per-output errors" in drill and "MatMul" in drill and "ORT p50/p90 ms" in drill
    assert "latency conditions" in drill and "thread(s) · 1x" in drill  # how each latency was taken
    assert browser.eval("document.querySelectorAll('#drill .ops span').length") > 3
    assert browser.errors == []


def test_the_site_works_offline_from_file_urls(browser: Chrome, site: Path) -> None:
    browser.errors.clear()
    browser.open(site.joinpath("index.html").as_uri())
    browser.eval("document.querySelector('#models tbody tr').click()")
    browser.wait_for("document.querySelectorAll('#drill h3').length >= 3")
    html = site.joinpath("index.html").read_text()
    assert "http://" not in html and "https://" not in html  # nothing fetched from a CDN
    assert browser.errors == []


@pytest.mark.slow
def test_embedded_data_is_bounded(site: Path) -> None:
    html = site.joinpath("index.html").read_text()
    data = json.loads(html.split('<script id="zoo-data" type="application/json">', 1)[1].split("</script>", 1)[0])
    assert len(data["models"]) <= MODEL_CAP
    assert not any(k.startswith("detail_") for k in data)


@pytest.mark.slow
def test_a_real_pipeline_result_lands_in_every_table(results_db: Path, real_result) -> None:
    from zoo_convert.store import ResultStore

    with ResultStore(results_db, read_only=True).connect() as con:
        rows = con.execute("SELECT variant, status, opset, export_s > 0, size_bytes > 0, versions['torch']"
                           " FROM results WHERE job_key = 'k-real-bert' ORDER BY variant").fetchall()
        outputs = con.execute("SELECT count(*) FROM verification WHERE job_key = 'k-real-bert'").fetchone()[0]
        ops = con.execute("SELECT count(*) FROM op_census WHERE job_key = 'k-real-bert'").fetchone()[0]
    assert [r[0] for r in rows] == ["fp32", "int8", "q4"]
    assert all(r[2:5] == (17, True, True) for r in rows) and rows[0][5] == real_result.versions["torch"]
    assert rows[0][1] == real_result.variant("fp32").status
    assert outputs >= 4 and ops == len(real_result.op_census) > 3
