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
