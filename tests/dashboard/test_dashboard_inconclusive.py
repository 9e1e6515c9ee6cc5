"""An inconclusive model (verified against a PyTorch reference that proves nothing) is shown as such, never as a pass."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from chrome import Chrome
from synthetic import good, result

from zoo_convert.dashboard.site import build_site
from zoo_convert.store import ResultStore

WHY = "inconclusive: PyTorch's logits is all zero at every verify input (1x7, 3x19), so matching it proves nothing"


@pytest.fixture(scope="module")
def inconclusive_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("inconclusive")
    zero = tuple(replace(v, status="inconclusive", message=WHY, max_abs=0.0, min_cosine=1.0)
                 for v in good("mobilevit-z"))
    inconclusive = replace(result("zoo/mobilevit-z", "mobilevit", variants=zero), status="inconclusive",
                           message=f"fp32: {WHY}")
    store = ResultStore(root / "results.duckdb")
    store.start_run("run-1", manifest="zoo.parquet", manifest_hash="h1", versions={}, resources={}, settings={})
    store.record("run-1", "k-bert", result("zoo/bert-a", "bert", variants=good("bert-a")))
    store.record("run-1", "k-zero", inconclusive)
    store.finish_run("run-1")
    return build_site(root / "results.duckdb", root / "site").parent


def test_inconclusive_is_counted_apart_in_the_headline_matrix_and_table(browser: Chrome, inconclusive_site: Path) -> None:
    browser.errors.clear()
    browser.open(inconclusive_site.joinpath("index.html").as_uri())
    cards = browser.eval("[...document.querySelectorAll('#headline .card')].map(c => c.innerText.replace(/\\s+/g, ' '))")
    assert "1/2 models converted (fp32 verified), latest result each" in cards
    assert "1 inconclusive: the PyTorch reference proves nothing" in cards
    assert "0 not converted" in cards
    cell = browser.eval(
        "[...document.querySelectorAll('#matrix tr')].find(r => r.cells[0].textContent === 'mobilevit').cells[3]"
        ".outerHTML"
    )
    assert ">0/1 <span" in cell and "1?" in cell and 'title="1 inconclusive"' in cell
    statuses = browser.eval("[...document.querySelectorAll('#models tbody tr')].map(r => r.cells[0].textContent + ' ' +"
                            " [...r.cells].map(c => c.textContent).join('|'))")
    assert any("inconclusive" in s and "mobilevit-z" in s for s in statuses), statuses
    browser.eval("const s = document.querySelector('#f-status'); s.value = 'inconclusive';"
                 " s.dispatchEvent(new Event('input'))")
    shown = browser.eval("[...document.querySelectorAll('#models tbody tr')].map(r => r.textContent)")
    assert len(shown) == 1 and "mobilevit-z" in shown[0] and "inconclusive" in shown[0]
    assert browser.errors == []
