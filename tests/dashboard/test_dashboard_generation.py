"""The drill-down of a decoder shows its generation: steps on ORT's own cache, worst logits, greedy token match."""

from __future__ import annotations

from pathlib import Path

import pytest
from chrome import Chrome

from zoo_convert.dashboard.site import build_site
from zoo_convert.records import ManifestEntry, Settings
from zoo_convert.store import ResultStore


@pytest.fixture(scope="module")
def generation_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real pipeline on the zoo's gpt2 with past (fp32, int8), recorded and built into a site."""
    from zoo_convert import zoo
    from zoo_convert.pipeline import convert_one

    root = tmp_path_factory.mktemp("generation")
    zoo.build(root / "zoo", only=["gpt2"])
    entry = ManifestEntry(source=str(root / "zoo" / "gpt2"), task="text-generation-with-past", variants=("fp32", "int8"))
    result = convert_one(entry, Settings(out_dir=str(root / "artifacts"), benchmark=False, verify_long=False))
    fp32 = result.variant("fp32")
    assert result.passed and fp32 is not None and fp32.generation_steps == 16, result.message
    store = ResultStore(root / "results.duckdb")
    store.start_run("run-1", manifest="zoo.parquet", manifest_hash="h1", versions=result.versions,
                    resources={"CPU": 2.0}, settings={})  # fmt: skip
    store.record("run-1", "k-gpt2", result)
    store.finish_run("run-1")
    return build_site(root / "results.duckdb", root / "site").parent


def test_the_drill_down_shows_each_variants_generation(browser: Chrome, generation_site: Path) -> None:
    browser.errors.clear()
    browser.open(generation_site.joinpath("index.html").as_uri())
    browser.eval("document.querySelector('#models tbody tr').click()")
    browser.wait_for("document.querySelectorAll('#drill h3').length >= 3")
    headings = browser.eval("[...document.querySelectorAll('#drill h3')].map(h => h.textContent)")
    assert any(h.startswith("Generation") for h in headings), headings
    rows = browser.eval(
        "[...[...document.querySelectorAll('#drill h3')].find(h => h.textContent.startsWith('Generation'))"
        ".nextElementSibling.querySelectorAll('tbody tr')].map(tr => [...tr.cells].map(td => td.textContent))"
    )
    by_variant = {r[0]: r for r in rows}
    assert set(by_variant) == {"fp32", "int8"}
    assert by_variant["fp32"][1] == "16" and by_variant["fp32"][4] == "100.0%"
    drill = browser.eval("document.querySelector('#drill').innerText")
    assert "/step15" in drill  # each step's logits among the per-output errors
    assert browser.errors == []
