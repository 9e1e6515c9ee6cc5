"""The package's layering and process-wide state: what importing or running the pipeline must not do."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import zoo_convert.stages

STAGES = Path(zoo_convert.stages.__file__).parent


def _imported_modules(path: Path) -> set[str]:
    """Every module a file imports, relative imports resolved against ``zoo_convert.stages``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ["zoo_convert", "stages"][: 2 - (node.level - 1)] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}
    return found


def test_no_stage_imports_another() -> None:
    stages = {p.stem for p in STAGES.glob("*.py") if p.stem != "__init__"}
    assert {"fetch", "export", "check", "optimize", "verify", "benchmark"} <= stages
    crossings = {
        (p.stem, other)
        for p in STAGES.glob("*.py")
        for other in stages - {p.stem}
        if f"zoo_convert.stages.{other}" in _imported_modules(p)
    }
    assert not crossings, f"stage -> stage imports (move what they share to onnx_graph.py or runtime.py): {crossings}"


# Runs in a fresh interpreter (pytest resets warning filters around each test), with the
# toolchain imported first: what importing it does is its own business, not the pipeline's.
_STATE_PROBE = """
import json, logging, sys, warnings
import onnx, onnxruntime, onnxruntime.quantization, onnxruntime.transformers.optimizer, torch, torch.onnx
import optimum.exporters.onnx, optimum.exporters.tasks, transformers
from zoo_convert.pipeline import convert_one
from zoo_convert.records import ManifestEntry, Settings

def state():
    names = ("transformers", "optimum", "onnxruntime", "torch.onnx", "onnxscript", None)
    return {"filters": [repr(f) for f in warnings.filters], "levels": [logging.getLogger(n).level for n in names]}

before = state()
result = convert_one(ManifestEntry(source=sys.argv[1], task="feature-extraction", variants=("fp32",)),
                     Settings(out_dir=sys.argv[2], optimize=False, benchmark=False))
after = state()
changed = {k: [before[k], after[k]] for k in before if before[k] != after[k]}
print(json.dumps({"passed": result.passed, "changed": changed}))
"""


@pytest.mark.slow
def test_running_the_pipeline_changes_no_warning_filter_or_log_level(zoo_dir: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _STATE_PROBE, str(zoo_dir / "bert"), str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report == {"passed": True, "changed": {}}


def _package_imports(module: str) -> set[str]:
    """The zoo_convert modules one top-level module of the package imports, TYPE_CHECKING blocks included."""
    path = Path(zoo_convert.stages.__file__).parents[1] / f"{module.replace('.', '/')}.py"
    if not path.exists():
        path = path.with_suffix("") / "__init__.py"
    found = set()
    package = module.split(".")[:-1] if path.name != "__init__.py" else module.split(".")
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            found.add(".".join([*base, *([node.module] if node.module else [])]))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("zoo_convert"):
            found.add(str(node.module).removeprefix("zoo_convert.").removeprefix("zoo_convert"))
    return {m.removeprefix("zoo_convert.") for m in found}


@pytest.mark.parametrize(("low", "high"), [("runtime", "stages"), ("errors", "records"), ("job", "stages"),
                                           ("job", "runtime"), ("checks", "records"), ("checks", "errors")])
def test_shared_types_sit_below_what_uses_them(low: str, high: str) -> None:
    """The stage objects (job.py) and the verification numbers (checks.py) are imported, never import back."""
    assert high not in _package_imports(low), f"{low} imports {high}: a loop"
    if (low, high) in {("job", "stages"), ("job", "runtime"), ("checks", "records"), ("checks", "errors")}:
        assert low in _package_imports(high)


def test_the_latency_fields_are_defined_once_and_every_layer_follows_them(tmp_path: Path) -> None:
    """VariantResult names them; the benchmark's Latency, the DB writer and publishing's reader all carry each."""
    from dataclasses import fields

    from zoo_convert.job import Latency, Timing
    from zoo_convert.publish import load_candidates
    from zoo_convert.publish.candidates import VariantRow
    from zoo_convert.records import LATENCY_FIELDS, ConversionResult, VariantResult
    from zoo_convert.store import ResultStore
    from zoo_convert.store.schema import MIGRATIONS

    assert len(LATENCY_FIELDS) == 15 and "bench_noisy" in LATENCY_FIELDS and "max_abs" not in LATENCY_FIELDS
    assert VariantRow is VariantResult  # publishing reads the record back, not a copy of its fields
    lat = Latency(ort=Timing(2.0, 3.0, 20, 0.05), torch=Timing(6.0, 7.0, 20, 0.04), threads=1, shape="1x128",
                  cpu="cpu", load=0.5, noisy=False, note=None)
    columns = lat.columns()
    assert set(columns) == set(LATENCY_FIELDS) and columns["speedup"] == 3.0 and columns["torch_runs"] == 20
    schema = " ".join(m.sql for m in MIGRATIONS)
    assert all(f" {name} " in schema for name in LATENCY_FIELDS)
    # Through the DB and back: every latency field arrives as it was recorded.
    variant = VariantResult("fp32", "passed", file="onnx/model.onnx", **columns)  # type: ignore[arg-type]
    store = ResultStore(tmp_path / "r.duckdb")
    store.start_run("r", manifest="m", manifest_hash="-", versions={}, resources={}, settings={})
    store.record_many("r", [("k", ConversionResult(source="org/m", status="passed", variants=(variant,)))])
    (candidate,) = load_candidates(store, "r")
    (back,) = candidate.variants
    assert {f: getattr(back, f) for f in LATENCY_FIELDS} == {f: getattr(variant, f) for f in LATENCY_FIELDS}
    assert {f.name for f in fields(VariantResult) if f.metadata.get("latency")} == set(LATENCY_FIELDS)
