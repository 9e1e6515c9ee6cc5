"""Each deployment target on real runtimes, from the saved reference: ort-cpu, openvino, transformers.js, the GPU ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from zoo_convert import targets
from zoo_convert.errors import TargetNotRun
from zoo_convert.records import TARGETS, ConversionResult
from zoo_convert.targets import reference
from zoo_convert.targets.ort_gpu import OrtCuda, OrtTensorRT, gpu_devices

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_the_registry_is_the_records_list() -> None:
    assert targets.names() == TARGETS
    assert {"ort-cpu", "openvino", "transformers.js"} <= set(targets.installed())


def test_the_pipeline_records_every_variant_on_every_chosen_target(converted: dict[str, ConversionResult]) -> None:
    rows = {(t.target, t.variant): t for t in converted["bert"].targets}
    assert set(rows) == {(t, v) for t in ("ort-cpu", "openvino", "transformers.js") for v in ("fp32", "fp16", "int8")}
    assert all(r.status == "passed" and r.version and r.latency_ms for r in rows.values()), rows
    assert rows["openvino", "fp32"].max_abs is not None and rows["openvino", "fp32"].max_abs <= 1e-4
    assert rows["ort-cpu", "fp32"].providers == "CPUExecutionProvider"
    assert not converted["bart"].targets  # targets=() asks for none


@pytest.mark.parametrize("variant", ["fp32", "fp16", "int8"])
def test_ort_cpu_rechecks_the_saved_cases(folders: dict[str, Path], variant: str) -> None:
    ref = reference.load(folders["bart"])
    row = targets.check(targets.get("ort-cpu"), ref, variant)
    assert row.status == "passed", row.message
    assert row.max_abs is not None and row.max_abs <= ref.tolerances[variant].max_abs


def test_openvino_compiles_fp32_at_f32_and_passes_bert(folders: dict[str, Path]) -> None:
    row = targets.check(targets.get("openvino"), reference.load(folders["bert"]), "fp32")
    assert row.status == "passed", row.message
    assert row.providers == "CPU (inference precision f32)"
    assert row.max_abs is not None and row.max_abs <= 1e-4  # bf16 (the default on AVX512-BF16) would be ~1e-2


def test_openvino_does_not_compile_the_merged_decoder_and_says_why(folders: dict[str, Path]) -> None:
    row = targets.check(targets.get("openvino"), reference.load(folders["bart"]), "fp32")
    assert row.status == "failed"
    assert row.message is not None and "decoder_model_merged.onnx" in row.message
    assert "If" in row.message


def test_transformers_js_loads_each_dtype_and_passes_bert(folders: dict[str, Path]) -> None:
    ref = reference.load(folders["bert"])
    for variant in ("fp32", "fp16", "int8"):
        row = targets.check(targets.get("transformers.js"), ref, variant)
        assert row.status == "passed", (variant, row.message)
        assert row.version == "4.3.2" and row.latency_ms


def test_transformers_js_without_the_architecture_is_unsupported(folders: dict[str, Path]) -> None:
    row = targets.check(targets.get("transformers.js"), reference.load(folders["data2vec-text"]), "fp32")
    assert row.status == "unsupported"
    assert row.message == 'transformers.js 4.3.2 has no architecture for model type "data2vec-text"'


@pytest.mark.skipif(bool(gpu_devices()), reason="a GPU node: the CPU-node behaviour is what is checked here")
def test_gpu_targets_are_not_installed_on_a_cpu_node_and_never_run_as_cpu(folders: dict[str, Path]) -> None:
    assert "ort-cuda" not in targets.installed() and "ort-tensorrt" not in targets.installed()
    ref = reference.load(folders["bert"])
    for target in (OrtCuda(), OrtTensorRT()):
        row = targets.check(target, ref, "fp32")
        assert row.status == "not-run" and row.max_abs is None and row.latency_ms is None
        assert row.message is not None and target.name in row.message


def test_a_session_that_fell_back_to_the_cpu_is_not_a_gpu_result(folders: dict[str, Path]) -> None:
    """ONNX Runtime falls back silently to the CPU when CUDA cannot load: the target refuses the session."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers() and gpu_devices():
        pytest.skip("CUDA loads here")
    files = reference.load(folders["bert"]).files("fp32")
    with pytest.raises(TargetNotRun, match="fell back to CPUExecutionProvider"):
        OrtCuda().load(folders["bert"], "fp32", files)
