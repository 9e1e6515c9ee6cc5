"""The generation check on the record: every variant of a decoder, the results DB and its view, the card."""

from __future__ import annotations

from pathlib import Path

import pytest

from zoo_convert import zoo
from zoo_convert.records import PASSED, ConversionResult, ManifestEntry, Settings, VariantResult
from zoo_convert.store import ResultStore

# fp32 must generate PyTorch's tokens; int8 and q4 record their share.
VARIANTS = ("fp32", "int8", "q4")


@pytest.fixture(scope="module")
def converted(zoo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, ConversionResult]:
    """The zoo's gpt2 and t5, converted with their catalogue tasks (with past), without the benchmark."""
    from zoo_convert.pipeline import convert_one

    out = tmp_path_factory.mktemp("generation-record")
    settings = Settings(out_dir=str(out), benchmark=False, verify_long=False)
    found = {}
    for name in ("gpt2", "t5"):
        task = next(m.task for m in zoo.ZOO if m.name == name)
        found[name] = convert_one(ManifestEntry(source=str(zoo_dir / name), task=task, variants=VARIANTS), settings)
    return found


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_every_variant_of_a_decoder_records_its_generation(converted: dict[str, ConversionResult], name: str) -> None:
    result = converted[name]
    assert result.status == PASSED, result.message
    assert [v.variant for v in result.variants] == list(VARIANTS)
    for v in result.variants:
        assert v.generation_steps == 16, (v.variant, v.generation_note)
        assert v.generation_note is None
        steps = [c for c in v.outputs if "/step" in c.shape]
        assert len(steps) == 16 and steps[0].shape.endswith("/step00") and steps[-1].shape.endswith("/step15")
        assert v.generation_max_abs == max(c.max_abs for c in steps)
        assert v.generation_min_cosine == min(c.cosine for c in steps)
        assert v.generation_token_match is not None and 0.0 <= v.generation_token_match <= 1.0
    fp32 = result.variant("fp32")
    assert fp32 is not None and fp32.generation_token_match == 1.0
    assert fp32.generation_max_abs is not None and fp32.generation_max_abs < 1e-4
    # int8/q4 logits are further off than fp32's, and that shows in the steps' numbers.
    quantized = result.variant("int8")
    assert quantized is not None and quantized.generation_max_abs is not None
    assert quantized.generation_max_abs > fp32.generation_max_abs


def test_generation_is_written_to_the_db_and_its_view(converted: dict[str, ConversionResult], tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r.duckdb")
    store.start_run("r", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
    store.record("r", "gpt2", converted["gpt2"])
    store.record("r", "bert", ConversionResult(source="zoo/bert", status=PASSED, variants=(VariantResult("fp32", PASSED),)))
    with store.connect() as con:
        rows = con.execute(
            "SELECT variant, generation_steps, generation_max_abs, generation_token_match FROM results"
            " WHERE job_key = 'gpt2' ORDER BY variant"
        ).fetchall()
        view = con.execute("SELECT source, variant, steps, token_match FROM generation ORDER BY variant").fetchall()
        steps = con.execute(
            "SELECT count(*) FROM verification WHERE job_key = 'gpt2' AND variant = 'fp32' AND shape LIKE '%/step%'"
        ).fetchone()
    by_variant = {v.variant: v for v in converted["gpt2"].variants}
    assert rows == sorted(
        (v, 16, by_variant[v].generation_max_abs, by_variant[v].generation_token_match) for v in VARIANTS
    )
    # The view holds the models that generate: not bert.
    assert [(Path(s).name, v, n) for s, v, n, _ in view] == [("gpt2", v, 16) for v in sorted(VARIANTS)]
    assert steps == (16,)


def test_the_card_and_the_dashboard_show_generation(converted: dict[str, ConversionResult], tmp_path: Path) -> None:
    from zoo_convert.dashboard.data import DETAIL_QUERIES
    from zoo_convert.publish.candidates import load_candidates
    from zoo_convert.publish.card import model_card

    store = ResultStore(tmp_path / "r.duckdb")
    store.start_run("r", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
    store.record("r", "t5", converted["t5"])
    (candidate,) = load_candidates(store, "r")
    card = model_card(candidate, "org/t5-onnx")
    assert "### Generation" in card
    fp32_row = next(line for line in card.splitlines() if line.startswith("| fp32 | 16 |"))
    assert fp32_row.endswith("| 100% |")
    assert "| int8 | 16 |" in card and "| q4 | 16 |" in card
    assert "r.generation_token_match" in DETAIL_QUERIES["detail_variants"]
