"""What the morning reader asks of the dashboard, in a real Chromium: converted vs partial, the zoo over runs,
sorting and CSV, a URL per model with its tolerances, history, publication and artifacts, what changed."""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from chrome import Chrome
from synthetic import VERSIONS, good, result

from zoo_convert.dashboard.site import build_site
from zoo_convert.store import ResultStore

ROWS = "[...document.querySelectorAll('#models tbody tr')]"


def _column(browser: Chrome, name: str) -> list[str]:
    header = browser.eval("[...document.querySelectorAll('#models thead th')].map(th => th.textContent)")
    i = [h.rstrip(" ▲▼") for h in header].index(name)
    return browser.eval(f"{ROWS}.map(tr => tr.cells[{i}].textContent)")


def _select(browser: Chrome, selector: str, value: str) -> None:
    browser.eval(f"{{ const s = document.querySelector({selector!r}); s.value = {value!r};"
                 " s.dispatchEvent(new Event('input')); }")


def test_converted_partial_and_failed_are_told_apart(browser: Chrome, site_url: str) -> None:
    browser.errors.clear()
    browser.open(site_url)
    cards = dict(browser.eval("[...document.querySelectorAll('#headline .card')]"
                              ".map(c => [c.querySelector('span').textContent, c.querySelector('b').textContent])"))
    # 7 models: gpt2-b and bert-a broke, vit-e and t5-d never exported; wavlm-f converted with a failed fp16
    assert cards["models converted (fp32 verified), latest result each"] == "3/7"
    assert cards["partial: converted, a variant failed"] == "1"
    assert cards["not converted"] == "4"
    assert cards["variants verified (of those made)"] == "12/15"  # the real bert made fp32, int8 and q4 only
    _select(browser, "#f-status", "partial")
    assert _column(browser, "model") == ["zoo/wavlm-f"] and _column(browser, "status") == ["partial"]
    _select(browser, "#f-status", "failed")
    assert sorted(_column(browser, "model")) == ["zoo/bert-a", "zoo/gpt2-b", "zoo/t5-d", "zoo/vit-e"]
    _select(browser, "#f-status", "problem")
    assert len(_column(browser, "model")) == 5
    _select(browser, "#f-status", "passed")
    assert set(_column(browser, "status")) == {"passed"} and len(_column(browser, "model")) == 2
    assert browser.errors == []


def test_pass_rate_over_runs_is_the_whole_zoo_after_each_run(browser: Chrome, site_url: str) -> None:
    browser.open(site_url)
    titles = browser.eval("[...document.querySelectorAll('#passrate circle title')].map(t => t.textContent)")
    converted = [t.split(": ", 1)[1] for t in titles if "models converted" in t]
    # run-3 redid only t5-d (which failed): the zoo still had 2 of 5 converted, not 0 of 1
    assert [c.split(" ")[0] for c in converted] == ["5/5", "3/5", "2/5", "3/7"]
    assert any(t.startswith("nightly-4 (run-4)") for t in titles)


def test_the_model_table_sorts_by_any_column(browser: Chrome, site_url: str) -> None:
    browser.open(site_url)
    click = "[...document.querySelectorAll('#models thead th')].find(th => th.textContent.startsWith({!r})).click()"
    browser.eval(click.format("max abs fp32"))
    values = _column(browser, "max abs fp32")
    numbers = [float(v) for v in values if v != "–"]
    assert numbers == sorted(numbers) and values[-len(values) + len(numbers):].count("–") == len(values) - len(numbers)
    assert values[len(numbers):] == ["–"] * (len(values) - len(numbers))  # unmeasured rows last
    browser.eval(click.format("max abs fp32"))
    desc = [float(v) for v in _column(browser, "max abs fp32") if v != "–"]
    assert desc == sorted(numbers, reverse=True)
    assert browser.eval("document.querySelector('#models th[aria-sort]').textContent").startswith("max abs fp32")
    browser.eval(click.format("model"))
    assert _column(browser, "model") == sorted(_column(browser, "model"))


def test_csv_download_holds_the_rows_shown_in_full(browser: Chrome, site_url: str, tmp_path: Path) -> None:
    browser.errors.clear()
    browser.open(site_url)
    browser.download_to(tmp_path)
    _select(browser, "#f-status", "problem")
    browser.eval("document.querySelector('#csv').click()")
    deadline = time.monotonic() + 10
    while not (tmp_path / "models.csv").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    rows = list(csv.DictReader(io.StringIO((tmp_path / "models.csv").read_text())))
    assert [r["source"] for r in rows] == _column(browser, "model")
    wavlm = next(r for r in rows if r["source"] == "zoo/wavlm-f")
    assert wavlm["message"].startswith("fp16 optimize crashed") and wavlm["message"].endswith("(signal 11)")
    shown = dict(zip(_column(browser, "model"), _column(browser, "message")))
    assert shown["zoo/wavlm-f"] == wavlm["message"]  # whole in the cell, two lines of it on screen
    bert = next(r for r in rows if r["source"] == "zoo/bert-a")
    assert bert["status"] == "failed" and bert["fp16"] == "passed" and float(bert["max_abs_fp32"]) == 0.5
    assert browser.errors == []


def _hash(source: str, opset: int) -> str:
    return f"#model={quote(source, safe='')}&exporter=optimum&opset={opset}"


def _open_at(browser: Chrome, url: str) -> None:
    """Load the page afresh at a #fragment (from the same page, a new fragment would not reload it)."""
    browser.open("about:blank")
    browser.open(url)


def test_a_drill_down_has_its_own_url_and_tells_everything(browser: Chrome, site_url: str, real_result) -> None:
    browser.errors.clear()
    _open_at(browser, site_url + _hash(real_result.source, 17))
    browser.wait_for("document.querySelectorAll('#drill h3').length >= 4")
    drill = browser.eval("document.querySelector('#drill').innerText")
    assert drill.startswith("bert ") and real_result.source in drill  # its name, then its whole source
    assert "max abs ≤ 1.0e-4 · cos ≥ 0.9999" in drill and "\tcos ≥ 0.98\t" in drill  # from the run's settings
    assert real_result.artifacts_dir in drill
    assert browser.eval("document.querySelector('#drill a').href") == "https://hub.example/my-org/bert-ONNX/commit/c0ffee"
    assert "my-org/bert-ONNX · published" in drill
    # clicking a row moves the address; going back returns to the model before
    browser.eval(f"{ROWS}.find(tr => tr.cells[0].textContent === 'zoo/gpt2-b').click()")
    browser.wait_for("location.hash.includes('gpt2-b') && document.querySelector('#drill h2').textContent"
                     ".startsWith('zoo/gpt2-b') && document.querySelectorAll('#drill h3').length >= 4")
    history = browser.eval("[...document.querySelectorAll('#drill table')].find(t => t.previousElementSibling"
                           ".textContent.startsWith('History')).innerText")
    assert "nightly-4" in history and "nightly-2026-01-02" in history and "run-1" in history
    assert len(history.strip().splitlines()) == 1 + 3  # header + its three jobs, newest first
    browser.eval("history.back()")
    browser.wait_for("document.querySelector('#drill h2').textContent.startsWith('bert ')")
    assert browser.errors == []


def test_a_failed_variant_shows_no_size(browser: Chrome, site_url: str) -> None:
    _open_at(browser, site_url + _hash("zoo/wavlm-f", 17))
    browser.wait_for("document.querySelectorAll('#drill h3').length >= 4")
    table = browser.eval("[...document.querySelector('#drill table').rows].map(r => [...r.cells].map(c => c.textContent))")
    sizes = {row[0]: row[table[0].index("size MB")] for row in table[1:]}
    assert sizes == {"fp32": "1.6", "fp16": "–", "int8": "0.4"}


def test_the_matrix_has_a_task_column(browser: Chrome, site_url: str) -> None:
    browser.open(site_url)
    header = browser.eval("[...document.querySelectorAll('#matrix th')].map(th => th.textContent)")
    assert header[:3] == ["model type", "task", "opset"]
    bert = browser.eval("[...document.querySelectorAll('#matrix tbody tr')].map(tr => tr.cells[1].textContent)")
    assert set(bert) == {"feature-extraction", "fill-mask"}


def test_an_opt_in_variant_gets_its_column_once_made(browser: Chrome, site_url: str, real_result) -> None:
    """Only the real bert asked for q4: the matrix, the model table and its drill-down show it."""
    _open_at(browser, site_url + _hash(real_result.source, 17))
    browser.wait_for("document.querySelectorAll('#drill h3').length >= 4")
    header = browser.eval("[...document.querySelectorAll('#matrix th')].map(th => th.textContent)")
    assert header[3:] == ["fp32", "fp16", "int8", "q4"]  # uint8: nobody made it, no column
    cells = browser.eval("[...document.querySelectorAll('#matrix tbody tr')].map(tr => [...tr.cells].map(c => c.textContent))")
    assert sorted(row[-1] for row in cells if row[-1]) == ["1/1"]
    models_header = browser.eval("[...document.querySelectorAll('#models thead th')].map(th => th.textContent)")
    assert "q4" in [h.rstrip(" ▲▼") for h in models_header]
    drill = browser.eval("document.querySelector('#drill').innerText")
    assert "\tcos ≥ 0.95\t" in drill  # q4's own tolerance, from the run's settings
    assert real_result.variant("q4").status == "passed"


def test_regressions_say_what_changed(browser: Chrome, site_url: str) -> None:
    browser.open(site_url)
    rows = browser.eval("[...document.querySelectorAll('#regressions tbody tr')].map(tr => tr.innerText)")
    assert any("zoo/gpt2-b" in r and "broke" in r and "torch 2.13.0 -> 2.14.0" in r for r in rows)
    assert any("zoo/roberta-c" in r and "slower" in r and "checkpoint abababab" in r and "cdcdcdcdcd" in r
               for r in rows)
    # A slower row shows PyTorch's figures beside ONNX Runtime's: a new checkpoint, both sides moved (5 -> 22.5 ms).
    assert any("zoo/roberta-c" in r and "slower" in r and "22.5" in r for r in rows)
    assert all("nightly-2026-01-02" in r for r in rows)  # since: the run each one is compared with


def test_numbers_do_not_wrap_on_a_narrow_screen(browser: Chrome, site_url: str) -> None:
    browser.set_width(700)
    try:
        _open_at(browser, site_url + _hash("zoo/roberta-c", 17))
        browser.wait_for("document.querySelectorAll('#drill h3').length >= 4")
        lines = browser.eval(
            "[...document.querySelectorAll('td.num')].filter(td => td.textContent.trim() && td.getClientRects().length).map(td => {"
            " const r = document.createRange(); r.selectNodeContents(td);"
            " return [td.textContent, new Set([...r.getClientRects()].map(b => Math.round(b.top))).size]; })")
    finally:
        browser.reset_size()
    assert len(lines) > 50 and [text for text, n in lines if n != 1] == []  # a collapsed column shows none


@pytest.fixture(scope="module")
def many_runs_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Thirty named nightlies of two models."""
    root = tmp_path_factory.mktemp("many-runs")
    store = ResultStore(root / "results.duckdb")
    for day in range(1, 31):
        run = f"r{day}"
        store.start_run(run, manifest="m", manifest_hash="h", versions=VERSIONS, resources={}, settings={},
                        name=f"nightly-2026-01-{day:02d}")
        store.record(run, f"a{day}", result("zoo/a", "bert", variants=good("a")))
        store.record(run, f"b{day}", result("zoo/b", "gpt2", variants=good("b", max_abs=10.0 ** -(day % 7))))
        store.finish_run(run)
    return build_site(root / "results.duckdb", root / "site").parent


def test_run_labels_on_the_x_axis_do_not_overlap(browser: Chrome, many_runs_site: Path) -> None:
    browser.errors.clear()
    browser.open(many_runs_site.joinpath("index.html").as_uri())
    boxes = json.loads(browser.eval(
        "JSON.stringify([...document.querySelectorAll('#passrate text.xlabel')].map(t => {"
        " const b = t.getBoundingClientRect(); return [t.textContent, b.left, b.right]; }))"))
    labels = [b[0] for b in boxes]
    assert len(boxes) >= 2 and labels[0].startswith("nightly-2026-01-01") and labels[-1].startswith("nightly-2026-01-30")
    for (_, _, right), (_, left, _) in zip(boxes, boxes[1:]):
        assert right <= left, boxes
    assert browser.errors == []
