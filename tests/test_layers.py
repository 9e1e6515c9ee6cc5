"""The package's layering and process-wide state: what importing or running the pipeline must not do."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import zoo_convert

PACKAGE = Path(zoo_convert.__file__).parent
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"

# The layers, low to high: a module imports from its own layer or one below, never from above. The unit is
# the top-level module or folder of the package (``verify`` is zoo_convert/verify/). docs/architecture.md
# draws the same list; a test holds the two together.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("checks", "node", "onnx_graph"),
    ("errors",),
    ("variants",),
    ("records", "sources"),
    ("manifest", "job", "store"),
    ("exporters",),
    ("verify",),
    ("targets",),
    ("stages",),
    ("pipeline", "coverage"),
    ("farm",),
    ("publish", "dashboard", "zoo"),
    ("cli",),
)
STAGES = ("fetch", "export", "check", "optimize", "verify", "benchmark")


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name below ``zoo_convert`` (a folder's ``__init__`` by the folder's)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules one module imports: anywhere in it, TYPE_CHECKING blocks and function bodies included."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    package = [p for p in package if p]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            elif (node.module or "").startswith("zoo_convert"):
                module = str(node.module).removeprefix("zoo_convert").lstrip(".")
            else:
                continue
            for alias in node.names:  # ``from . import job`` imports a module, ``from .job import Case`` a name
                sub = f"{module}.{alias.name}" if module else alias.name
                found.add(sub if sub in modules else module)
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix("zoo_convert").lstrip(".") for a in node.names if a.name.startswith("zoo_convert")}
    return {m for m in found if m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _layer(module: str) -> int:
    top = module.split(".")[0]
    if not top:
        return -1  # the package's own __init__ (its version): below everything
    for i, layer in enumerate(LAYERS):
        if top in layer:
            return i
    raise AssertionError(f"zoo_convert.{module} is in no layer: add its folder to LAYERS and docs/architecture.md")


def test_every_module_has_a_layer_and_none_imports_from_above() -> None:
    graph = _graph()
    upward = sorted((a, b) for a, targets in graph.items() for b in targets if _layer(b) > _layer(a))
    assert not upward, f"imports from a layer above: {upward}"


def test_no_import_cycle() -> None:
    """Tarjan's strongly connected components of the import graph: every one a single module without a self-loop."""
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_the_checker_sees_what_it_checks() -> None:
    """Known edges are found, TYPE_CHECKING and function-level imports included, so an empty answer means something."""
    graph = _graph()
    assert "job" in graph["stages"] and "verify.runtime" in graph["stages.verify"]
    assert "farm.isolation" in graph["farm.driver"]  # a relative import inside a folder
    assert {"pipeline", "records"} <= graph["farm.warm"]  # function-level imports
    assert any(m.startswith("exporters") for m in graph["stages.export"])


def test_the_layers_are_the_ones_the_architecture_page_draws() -> None:
    text = ARCHITECTURE.read_text()
    block = text.split("<!-- layers -->")[1]
    drawn = [tuple(line.split("`")[1::2]) for line in block.splitlines() if line.strip().startswith(("1", "2", "3", "4", "5", "6", "7", "8", "9"))]
    assert tuple(drawn) == LAYERS[::-1], "docs/architecture.md's layer list and LAYERS differ"


def test_the_top_level_is_a_dozen_files_and_each_folder_says_what_it_is() -> None:
    assert len(list(PACKAGE.glob("*.py"))) <= 12
    for folder in (p for p in PACKAGE.iterdir() if (p / "__init__.py").exists()):
        assert ast.get_docstring(ast.parse((folder / "__init__.py").read_text())), f"{folder.name}/__init__.py: no docstring"


def test_no_stage_imports_another() -> None:
    graph = _graph()
    crossings = {(a, b) for a in STAGES for b in STAGES if a != b and f"stages.{b}" in graph[f"stages.{a}"]}
    assert not crossings, f"stage -> stage imports (move what they share below stages/): {crossings}"


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


def test_the_latency_fields_are_defined_once_and_every_layer_follows_them(tmp_path: Path) -> None:
    """VariantResult names them; the benchmark's Latency, the DB writer and publishing's reader all carry each."""
    from dataclasses import fields

    from zoo_convert.job import Latency, Timing
    from zoo_convert.publish import load_candidates
    from zoo_convert.publish.candidates import VariantRow
    from zoo_convert.records import LATENCY_FIELDS, ConversionResult, VariantResult
    from zoo_convert.store import ResultStore
    from zoo_convert.store.schema import MIGRATIONS

    assert len(LATENCY_FIELDS) == 17 and "bench_noisy" in LATENCY_FIELDS and "max_abs" not in LATENCY_FIELDS
    assert VariantRow is VariantResult  # publishing reads the record back, not a copy of its fields
    lat = Latency(ort=Timing(2.0, 3.0, 20, 0.05, 0.06), torch=Timing(6.0, 7.0, 20, 0.04, 0.05), threads=1, shape="1x128",
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
