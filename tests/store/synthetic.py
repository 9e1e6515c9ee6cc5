"""Hand-built ConversionResults (data, not mocks) and a three-run history for store and dashboard tests.

The history holds one of each thing the views must find:

    run-1: every model as below, bert-a passing with small errors
    run-2: bert-a breaks (verify_numerics), gpt2-b's fp32 error grows 100x, roberta-c is 50% slower,
           t5-d is skipped (a nightly skips unchanged jobs), vit-e fails to export
    run-3: only t5-d, now failing under a newer onnxruntime: compared with run-1, its latest earlier result

run-2 is named (``NAMES``), as ``run --name`` names a run.
"""

from __future__ import annotations

from pathlib import Path

from zoo_convert.records import ConversionResult, OutputCheck, StageResult, VariantResult
from zoo_convert.store import ResultStore

VERSIONS = {"zoo_convert": "0.1.0", "torch": "2.13.0", "onnxruntime": "1.32.0"}


def variant(
    name: str, *, passed: bool = True, max_abs: float = 1e-6, ort_ms: float = 2.0, message: str | None = None,
    torch_ms: float | None = None,
) -> VariantResult:
    """One variant with two outputs checked at two shapes; PyTorch ``torch_ms`` (2.5x ``ort_ms`` unless given)."""
    torch_ms = ort_ms * 2.5 if torch_ms is None else torch_ms
    outputs = tuple(
        OutputCheck(output=o, shape=s, max_abs=max_abs, max_rel=max_abs * 10, mean_abs=max_abs / 10, cosine=0.99999,
                    passed=passed)
        for o in ("last_hidden_state", "pooler_output")
        for s in ("1x7", "3x19")
    )
    return VariantResult(
        variant=name,
        status="passed" if passed else "failed",
        file=f"onnx/{name}.onnx",
        size_bytes=400_000 if name == "int8" else 1_600_000,
        failure_kind=None if passed else "verify_numerics",
        message=message,
        max_abs=max_abs,
        max_rel=max_abs * 10,
        mean_abs=max_abs / 10,
        min_cosine=0.99999,
        ort_p50_ms=ort_ms if passed else None,
        ort_p90_ms=ort_ms * 1.2 if passed else None,
        torch_p50_ms=torch_ms if passed else None,
        torch_p90_ms=torch_ms * 1.2 if passed else None,
        speedup=torch_ms / ort_ms if passed else None,
        optimizer={"fusion_applied": True, "fusions": {"Attention": 2, "LayerNormalization": 5}},
        outputs=outputs,
    )


def result(
    source: str,
    model_type: str,
    *,
    variants: tuple[VariantResult, ...] = (),
    opset: int = 17,
    failure: tuple[str, str, str] | None = None,
    versions: dict[str, str] = VERSIONS,
    revision: str = "sha256:" + "ab" * 32,
) -> ConversionResult:
    """A job's result; ``failure`` is (kind, stage, message) of a job-level failure."""
    failed = failure is not None or any(v.status == "failed" and v.variant == "fp32" for v in variants)
    kind, stage, message = failure or (None, None, None)
    if failure is None and failed:
        bad = next(v for v in variants if v.variant == "fp32")
        kind, stage, message = bad.failure_kind, "verify", f"fp32: {bad.message}"
    stages = [StageResult(s, "passed", 0.5, 300.0) for s in ("fetch", "export", "check", "optimize")]
    stages += [StageResult("verify", "passed", 0.2, 320.0, {"variant": v.variant}) for v in variants]
    stages += [StageResult("benchmark", "passed", 0.6, 330.0)] if variants else []  # one per job, every variant timed
    return ConversionResult(
        source=source,
        status="failed" if failed else "passed",
        task="feature-extraction",
        resolved_revision=revision,
        opset_requested=opset,
        model_type=model_type,
        library="transformers",
        failure_kind=kind,
        stage=stage,
        message=message,
        traceback="Traceback (most recent call last):\n  ...\n" if failure else None,
        opset=opset if variants else None,
        ir_version=10 if variants else None,
        node_count=120 if variants else None,
        op_census={"MatMul": 24, "Add": 30, "Softmax": 2} if variants else {},
        stages=tuple(stages),
        variants=variants,
        versions=versions,
        started_at="2026-01-01T00:00:00.000+00:00",
        finished_at="2026-01-01T00:00:05.000+00:00",
        node="node-1",
        tags=("nightly",),
    )


def good(name: str, *, max_abs: float = 1e-6, ort_ms: float = 2.0, torch_ms: float | None = None) -> tuple[VariantResult, ...]:
    """Three passing variants."""
    return tuple(variant(v, max_abs=max_abs, ort_ms=ort_ms, torch_ms=torch_ms) for v in ("fp32", "fp16", "int8"))


NUMERICS = "output 'last_hidden_state' max abs error 0.{n} > tolerance 0.0001 at shape 3x19"
EXPORT = "Could not export /tmp/zoo/{m}/model.safetensors: unsupported op 'aten::{m}_gelu' at 0x7f3a{n}beef"

HISTORY: dict[str, list[tuple[str, ConversionResult]]] = {
    "run-1": [
        ("k-bert-1", result("zoo/bert-a", "bert", variants=good("bert-a"))),
        ("k-gpt2-1", result("zoo/gpt2-b", "gpt2", variants=good("gpt2-b", max_abs=1e-5))),
        ("k-roberta-1", result("zoo/roberta-c", "roberta", variants=good("roberta-c", ort_ms=2.0))),
        ("k-t5-1", result("zoo/t5-d", "t5", variants=good("t5-d"), opset=14)),
        ("k-vit-1", result("zoo/vit-e", "vit", variants=good("vit-e"))),
    ],
    "run-2": [
        (
            "k-bert-2",
            result(
                "zoo/bert-a",
                "bert",
                variants=(variant("fp32", passed=False, max_abs=0.5, message=NUMERICS.format(n=5)),)
                + good("bert-a")[1:],
            ),
        ),
        ("k-gpt2-2", result("zoo/gpt2-b", "gpt2", variants=good("gpt2-b", max_abs=1e-3))),
        # ONNX Runtime 50 % slower, its PyTorch reference as before (5.0 ms): a slower conversion, not the machine.
        ("k-roberta-2", result("zoo/roberta-c", "roberta", variants=good("roberta-c", ort_ms=3.0, torch_ms=5.0))),
        ("k-vit-2", result("zoo/vit-e", "vit", failure=("export_error", "export", EXPORT.format(m="vit", n=1)))),
        ("k-manifest-2", ConversionResult(source="", status="failed", failure_kind="manifest_error",
                                          stage="manifest", message="row 7: source is empty", row=7)),
    ],
    "run-3": [
        ("k-t5-3", result("zoo/t5-d", "t5", opset=14, failure=("export_error", "export", EXPORT.format(m="t5", n=22)),
                          versions={**VERSIONS, "onnxruntime": "1.33.0"})),
    ],
}


NAMES = {"run-2": "nightly-2026-01-02"}


def fill(path: Path) -> ResultStore:
    """Write the three-run history into a fresh DB at ``path``."""
    store = ResultStore(path)
    for run_id, jobs in HISTORY.items():
        store.start_run(run_id, manifest="zoo.parquet", manifest_hash="h-" + run_id, versions=VERSIONS,
                        resources={"CPU": 2.0}, settings={"threads": 1, "int8_max_abs": float("inf")},
                        name=NAMES.get(run_id))
        for key, res in jobs:
            store.record(run_id, key, res)
        store.finish_run(run_id)
    return store
