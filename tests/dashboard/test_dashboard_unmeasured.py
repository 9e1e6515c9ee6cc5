"""A DB of --no-optimize --no-benchmark results: passed rows with NULL latencies render as dashes, not NaN."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from chrome import Chrome

from zoo_convert.dashboard.site import build_site
from zoo_convert.records import ManifestEntry, Settings
from zoo_convert.store import ResultStore


@pytest.fixture(scope="module")
def unmeasured_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real pipeline on the zoo's bert without optimization or latency, recorded and built into a site."""
    from zoo_convert import zoo
    from zoo_convert.pipeline import convert_one

    root = tmp_path_factory.mktemp("unmeasured")
    zoo.build(root / "zoo", only=["bert"])
    entry = ManifestEntry(source=str(root / "zoo" / "bert"), variants=("fp32", "int8"))
    result = convert_one(entry, Settings(out_dir=str(root / "artifacts"), optimize=False, benchmark=False))
    assert result.passed and result.variant("fp32").ort_p50_ms is None, result.message
    store = ResultStore(root / "results.duckdb")
    store.start_run("run-1", manifest="zoo.parquet", manifest_hash="h1", versions=result.versions,
                    resources={"CPU": 2.0}, settings={})
    store.record("run-1", "k-bert", result)
    store.finish_run("run-1")
    return build_site(root / "results.duckdb", root / "site").parent


def _garbage(text: str) -> list[str]:
    return re.findall(r"\bNaN\b|\bnull\b|\bundefined\b|\bNone\b|Infinity", text)


def test_passed_rows_without_latency_render_as_dashes(browser: Chrome, unmeasured_site: Path) -> None:
    browser.errors.clear()
    browser.open(unmeasured_site.joinpath("index.html").as_uri())
    headline = browser.eval("document.querySelector('#headline').innerText")
    assert "1/1" in headline and "models converted" in headline and _garbage(headline) == []
    row = browser.eval("[...document.querySelector('#models tbody tr').cells].map(td => td.textContent)")
    header = browser.eval("[...document.querySelectorAll('#models thead th')].map(th => th.textContent)")
    cells = dict(zip(header, row))
    assert cells["status"] == "passed" and cells["speedup"] == "–" and cells["ORT p50 ms"] == "–"
    assert browser.eval("document.querySelector('#speedup').textContent") == "no data"
    browser.eval("document.querySelector('#models tbody tr').click()")
    browser.wait_for("document.querySelectorAll('#drill h3').length >= 3")
    drill = browser.eval("document.querySelector('#drill').innerText")
    assert "– / –" in drill and "Per-output errors" in drill
    page = browser.eval("document.body.innerText")
    assert _garbage(page) == [] and _garbage(drill) == []
    assert browser.errors == []
