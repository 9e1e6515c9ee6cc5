"""The dashboard's first screen at 1280 px answers what broke, where it runs and how fast; models read by name;
a noisy latency is marked, never shown as a figure."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from chrome import Chrome
from synthetic import variant

from zoo_convert.dashboard.site import build_site
from zoo_convert.records import ConversionResult
from zoo_convert.store import ResultStore

ZOO = "/srv/farm/nightly/2026-12-02/zoo"  # sources as a farm records them: absolute folders
FIRST_SCREEN = 800  # px of a 1280 x 800 laptop screen


def _store(path: Path) -> None:
    """Forty passed models (so the page is long), one of them timed under noise, a partial one and two failures."""
    store = ResultStore(path)
    store.start_run("r", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
    for i in range(40):
        fp32 = replace(variant("fp32", ort_ms=1.5 + i), bench_noisy=(i == 0))
        store.record("r", f"k{i}", ConversionResult(source=f"{ZOO}/model-{i:02d}", status="passed",
                                                    model_type=f"type{i}", task="fill-mask", variants=(fp32,)))  # fmt: skip
    store.record("r", "wavlm", ConversionResult(
        source=f"{ZOO}/wavlm", status="passed", model_type="wavlm", task="audio-classification",
        variants=(variant("fp32"), variant("fp16", passed=False, message="fp16 of model: ONNX Runtime crashed"))))
    store.record("r", "bigbird", ConversionResult(
        source=f"{ZOO}/bigbird", status="failed", model_type="big_bird", failure_kind="verify_numerics",
        stage="verify", message="long inputs only: diverged at 1x128",
        variants=tuple(variant(v, passed=False) for v in ("fp32", "fp16", "int8"))))
    store.record("r", "other-bigbird", ConversionResult(
        source="/elsewhere/zoo2/bigbird", status="failed", model_type="big_bird", failure_kind="export_error",
        stage="export", message="no ONNX config"))
    store.finish_run("r")


def _top(browser: Chrome, selector: str) -> float:
    return float(browser.eval(f"document.querySelector('{selector}').getBoundingClientRect().top + window.scrollY"))


def test_what_broke_where_it_runs_and_how_fast_are_on_the_first_screen(browser: Chrome, tmp_path: Path) -> None:
    _store(tmp_path / "r.duckdb")
    index = build_site(tmp_path / "r.duckdb", tmp_path / "site")
    browser.errors.clear()
    browser.set_width(1280, FIRST_SCREEN)
    try:
        browser.open("about:blank")
        browser.open(index.as_uri())
        tops = {s: _top(browser, s) for s in ("#broke tbody tr:last-child", "#targets tbody tr", "#headline")}
        broke = browser.eval("[...document.querySelectorAll('#broke tbody tr')].map(tr => [...tr.cells].map(c => c.textContent))")
        targets = browser.eval("[...document.querySelectorAll('#targets tbody tr')].map(tr => tr.innerText)")
        # a cell's text wider than its column runs over the next one's (a fixed table layout)
        overflowing = browser.eval("[...document.querySelectorAll('#broke td')].filter(c => c.scrollWidth > c.clientWidth)"
                                   ".map(c => c.textContent)")
        browser.screenshot(tmp_path / "first-screen-1280.png")
    finally:
        browser.reset_size()
    assert all(top < FIRST_SCREEN - 40 for top in tops.values()), tops
    # the failures, worst first, each by its readable name; two folders called bigbird keep apart
    assert [row[:3] for row in broke] == [["zoo2/bigbird", "big_bird", "failed"], ["zoo/bigbird", "big_bird", "failed"],
                                          ["wavlm", "wavlm", "partial"]]
    assert broke[2][3] == "fp16" and broke[2][4] == "verify_numerics"
    assert broke[1][3] == "fp32 fp16 int8" and overflowing == [], overflowing
    # where it runs and how fast: fp32 verified on ONNX Runtime's CPU, median of the calm latencies, the noisy one out;
    # no deployment target rows in this DB: ort-cpu alone
    fp32 = next(t for t in targets if "\tfp32\t" in t)
    assert fp32.startswith("ort-cpu\tfp32\t41/42\t1 failed\t") and fp32.endswith("\t1")  # 1 noisy
    assert all(t.startswith("ort-cpu\t") for t in targets)
    assert browser.errors == []


def test_the_model_table_reads_names_and_marks_noisy_latencies(browser: Chrome, tmp_path: Path) -> None:
    _store(tmp_path / "r.duckdb")
    index = build_site(tmp_path / "r.duckdb", tmp_path / "site")
    browser.errors.clear()
    browser.set_width(1920)
    try:
        browser.open(index.as_uri())
        heads = browser.eval("[...document.querySelectorAll('#models thead th')].map(th => th.textContent)")
        rows = browser.eval("[...document.querySelectorAll('#models tbody tr')].map(tr => [...tr.cells].map(c => c.textContent))")
        titles = browser.eval("[...document.querySelectorAll('#models tbody tr td:first-child span')].map(s => s.title)")
    finally:
        browser.reset_size()
    cells = {row[0]: dict(zip(heads, row)) for row in rows}
    assert f"{ZOO}/model-00" in titles and "model-00" in cells  # the name shown, the whole source in its title
    assert cells["model-00"]["ORT p50 ms"] == "noisy" and cells["model-01"]["ORT p50 ms"] == "2.5"
    # the drill-down marks it too, and lists where the model runs
    browser.eval("[...document.querySelectorAll('#models tbody tr')].find(tr => tr.cells[0].textContent === 'model-00').click()")
    browser.wait_for("document.querySelectorAll('#drill h3').length >= 4")
    drill = browser.eval("document.querySelector('#drill').innerText")
    assert "Runs in" in drill and "ort-cpu\tfp32\tpassed" in drill and "1.5" not in drill.split("Variants")[0]
    assert browser.errors == []
