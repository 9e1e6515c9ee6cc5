"""The torch exporter's generic path and exporter auto, on zoo models optimum has no ONNX config for."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from zoo_convert import zoo
from zoo_convert.errors import ExportError, FailureKind
from zoo_convert.records import ManifestEntry, Settings
from zoo_convert.stages import Artifact, Checkpoint
from zoo_convert.stages.check import check
from zoo_convert.stages.export import export
from zoo_convert.stages.verify import verify
from zoo_convert.zoo.builder import build_model

pytestmark = pytest.mark.timeout(300)

GENERIC = [m for m in zoo.ZOO if m.exporter == "auto"]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The zoo's auto rows and bert, built alone (the whole zoo is not needed here)."""
    out = tmp_path_factory.mktemp("generic-zoo")
    for spec in [*GENERIC, *(m for m in zoo.ZOO if m.name == "bert")]:
        build_model(spec, out / spec.name)
    return out


def _checkpoint(path: Path, task: str) -> Checkpoint:
    config = json.loads((path / "config.json").read_text())
    return Checkpoint(path=path, resolved_revision="sha256:test", model_type=config["model_type"], task=task,
                      library="transformers", config=config)  # fmt: skip


def test_optimum_has_no_config_for_the_zoo_auto_rows() -> None:
    """What the generic path is for: each auto row's model type has no optimum ONNX config at all."""
    import optimum.exporters.onnx.model_configs  # noqa: F401 - registers the configs
    from optimum.exporters.tasks import TasksManager

    assert {m.model_type for m in GENERIC} == {"depth_anything", "dinov2_with_registers", "starcoder2"}
    for spec in GENERIC:
        with pytest.raises(KeyError):
            TasksManager.get_supported_tasks_for_model_type(spec.model_type, "onnx", library_name="transformers")


@pytest.mark.parametrize(
    "name",
    [
        "dinov2-registers",
        pytest.param("depth-anything", marks=pytest.mark.slow),
        pytest.param("starcoder2", marks=pytest.mark.slow),
    ],
)
def test_auto_exports_a_type_optimum_has_no_config_for_and_it_verifies(built: Path, tmp_path: Path, name: str) -> None:
    spec = next(m for m in GENERIC if m.name == name)
    ckpt = _checkpoint(built / name, spec.task)
    ex = export(ckpt, ManifestEntry(source=str(ckpt.path), exporter="auto"), Settings(), tmp_path)
    assert ex.details["exporter"] == "torch"
    assert ex.details["generic"].startswith(f"optimum cannot export model_type {spec.model_type!r}")
    assert [c.name for c in ex.components] == ["model"]
    check(ex)
    graph = onnx.load(str(ex.components[0].path), load_external_data=False).graph
    first = graph.input[0]
    assert first.name == ("input_ids" if spec.tokenizer else "pixel_values")
    assert first.type.tensor_type.shape.dim[0].dim_param == "batch_size"  # one graph for every batch
    checks = verify(ex, Artifact("fp32", {"model": ex.components[0].path}), Settings())
    assert checks and all(c.passed for c in checks), [c for c in checks if not c.passed]
    assert len({c.shape.split("x")[0] for c in checks}) >= 2  # verified at two batch sizes at least
    # the reference proves something: PyTorch's outputs are well within float16's range, not near zero
    peaks = [abs(r).max() for by_branch in ex.cache.cases.values() for case in by_branch.values() for r in case.reference.values()]
    assert peaks and min(peaks) > 1e-2, peaks


def test_auto_takes_optimum_where_it_has_a_config(built: Path, tmp_path: Path) -> None:
    ckpt = _checkpoint(built / "bert", "feature-extraction")
    ex = export(ckpt, ManifestEntry(source=str(ckpt.path), exporter="auto"), Settings(), tmp_path)
    assert ex.details["exporter"] == "optimum" and "generic" not in ex.details


def test_optimum_refuses_a_type_it_has_no_config_for(built: Path, tmp_path: Path) -> None:
    ckpt = _checkpoint(built / "dinov2-registers", "image-classification")
    with pytest.raises(ExportError) as err:
        export(ckpt, ManifestEntry(source=str(ckpt.path), exporter="optimum"), Settings(), tmp_path)
    assert err.value.kind is FailureKind.EXPORT_UNSUPPORTED and "dinov2_with_registers" in err.value.message


def test_generic_path_refuses_a_model_that_generates(built: Path, tmp_path: Path) -> None:
    """starcoder2 as a causal LM needs past key values, which the generic path does not export."""
    ckpt = _checkpoint(built / "starcoder2", "text-generation")
    with pytest.raises(ExportError) as err:
        export(ckpt, ManifestEntry(source=str(ckpt.path), task="text-generation", exporter="torch"), Settings(), tmp_path)
    assert err.value.kind is FailureKind.EXPORT_UNSUPPORTED
    assert "Starcoder2ForCausalLM generates" in err.value.message


def test_the_record_says_which_exporter_ran_and_why(built: Path, tmp_path: Path) -> None:
    """exporter auto resolves per row: the result and its DB rows name the exporter used and the reason."""
    from zoo_convert.pipeline import convert_one
    from zoo_convert.store import ResultStore

    settings = Settings(out_dir=str(tmp_path / "out"), benchmark=False)
    result = convert_one(ManifestEntry(source=str(built / "dinov2-registers"), exporter="auto", variants=("fp32",)), settings)
    assert (result.status, result.exporter, result.exporter_used) == ("passed", "auto", "torch"), result.message
    assert result.exporter_reason is not None and "dinov2_with_registers" in result.exporter_reason
    store = ResultStore(tmp_path / "r.duckdb")
    store.start_run("r1", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
    store.record("r1", "job", result)
    with store.connect() as con:
        rows = con.execute("SELECT exporter, exporter_used, exporter_reason FROM latest_results").fetchall()
    assert rows == [("auto", "torch", result.exporter_reason)]
