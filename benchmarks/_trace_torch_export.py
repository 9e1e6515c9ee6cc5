"""Where a torch-exporter export's time goes in a warm process: each dynamo export of a sequence, split in phases.

The process first warms itself as the fork server does (``zoo_convert.farm.warm``: imports, one
tiny optimum conversion); ``--warm-dynamo`` adds one dynamo export of a tiny module first, as a
fork server that warms the torch exporter would. Then each zoo model's export stage runs with
``--exporter torch`` in turn, and per export the wall and CPU seconds of torch.onnx's phases:
capture (``torch.export`` per strategy tried), decompositions (the retrace to torch.onnx's op set),
translation to ONNX, the opset conversion, onnxscript's optimizer, the program's save, and ours
after it (axis names, externalizing). The wrappers time the calls and change nothing.

    .venv/bin/python benchmarks/_trace_torch_export.py [--models bert,gpt2,vit] [--zoo DIR] [--warm-dynamo]
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import importlib
import inspect
import resource
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from _common import build_zoo, cpu_model, machine, zoo_rows

# (module, attribute path, phase): the calls timed. A phase's time includes the timed calls inside it.
PHASES = (
    ("torch.onnx._internal.exporter._capture_strategies", "TorchExportNonStrictStrategy._capture", "capture"),
    ("torch.onnx._internal.exporter._capture_strategies", "TorchExportStrictStrategy._capture", "capture (strict, fallback)"),
    ("torch.onnx._internal.exporter._registration", "ONNXRegistry.from_torchlib", "op registry"),
    ("torch.onnx._internal.exporter._core", "_prepare_exported_program_for_export", "decompositions"),
    ("torch.onnx._internal.exporter._core", "_exported_program_to_onnx_program", "translation"),
    ("onnxscript._framework_apis.torch_2_11", "convert_version", "opset conversion"),
    ("torch.onnx._internal.exporter._onnx_program", "ONNXProgram.optimize", "onnxscript optimize"),
    ("torch.onnx._internal.exporter._onnx_program", "ONNXProgram.save", "save"),
    ("zoo_convert.exporters.torch_onnx", "name_dynamic_axes", "axis names"),
    ("zoo_convert.onnx_graph", "externalize", "externalize"),
    ("zoo_convert.stages.export", "_load_model", "load model"),
    ("zoo_convert.stages.export", "_submodels", "optimum split"),
    ("zoo_convert.stages.export", "check_weights", "check weights"),
    ("torch.onnx", "export", "torch.onnx.export (all)"),
)

spent: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _timed(fn: Any, phase: str) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        w0, c0 = time.perf_counter(), _cpu()
        try:
            return fn(*args, **kwargs)
        finally:
            row = spent[phase]
            row[0] += time.perf_counter() - w0
            row[1] += _cpu() - c0
            row[2] += 1

    return wrapper


def install() -> None:
    """Wrap every call of PHASES in place (attributes of classes and modules alike)."""
    import torch.onnx

    for module_name, path, phase in PHASES:
        owner: Any = importlib.import_module(module_name)
        *parents, attr = path.split(".")
        for p in parents:
            owner = getattr(owner, p)
        wrapped = _timed(getattr(owner, attr), phase)
        classmethod_ = isinstance(inspect.getattr_static(owner, attr), classmethod)
        setattr(owner, attr, staticmethod(wrapped) if classmethod_ else wrapped)  # bound to its class already
    # the stages call torch.onnx.export through the torch module: the wrapper above replaced it there


def main() -> int:
    """Warm up, export each model, print its phases."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="bert,gpt2,vit,t5")
    ap.add_argument("--zoo", type=Path)
    ap.add_argument("--warm-dynamo", action="store_true", help="one dynamo export of a tiny module after the warm-up")
    ap.add_argument("--opset", type=int)
    ap.add_argument("--profile", type=Path, help="cProfile the last export into this file")
    args = ap.parse_args()
    print(machine(), "|", cpu_model(), flush=True)
    names = args.models.split(",")
    with tempfile.TemporaryDirectory(prefix="trace-torch-") as tmp:
        zoo_dir = args.zoo or Path(tmp, "zoo")
        if args.zoo is None:
            build_zoo(zoo_dir, names)
        rows = {Path(r["source"]).name: r for r in zoo_rows(zoo_dir / "manifest.parquet")}
        w0, c0 = time.perf_counter(), _cpu()
        import zoo_convert.farm.warm  # noqa: F401 - the fork server's warm-up

        print(f"fork-server warm-up: {time.perf_counter() - w0:.1f} s wall, {_cpu() - c0:.1f} s CPU", flush=True)
        install()
        if args.warm_dynamo:
            from zoo_convert.farm import warm as _warm

            w0, c0 = time.perf_counter(), _cpu()
            _warm.convert_tiny_bert("torch")
            print(f"dynamo warm-up: {time.perf_counter() - w0:.1f} s wall, {_cpu() - c0:.1f} s CPU", flush=True)
            spent.clear()
        from zoo_convert.records import ManifestEntry, Settings
        from zoo_convert.stages import export as export_stage
        from zoo_convert.stages import fetch

        for i, name in enumerate(names, 1):
            row = rows[name]
            entry = ManifestEntry(source=str(zoo_dir / row["source"]), task=row["task"], exporter="torch", opset=args.opset)
            settings = Settings(out_dir=f"{tmp}/out")
            ckpt = fetch.fetch(entry, settings)
            spent.clear()
            profiler = cProfile.Profile() if args.profile and i == len(names) else None
            w0, c0 = time.perf_counter(), _cpu()
            if profiler:
                profiler.enable()
            exported = export_stage.export(ckpt, entry, settings, Path(tmp, "out", name))
            wall, cpu = time.perf_counter() - w0, _cpu() - c0
            if profiler:
                profiler.disable()
                profiler.dump_stats(args.profile)
            print(f"\nexport {i}: {name} ({row['task']}, {len(exported.components)} graph(s), opset {exported.opset}): "
                  f"{wall:.2f} s wall, {cpu:.2f} s CPU", flush=True)
            for phase, (pw, pc, n) in sorted(spent.items(), key=lambda kv: -kv[1][0]):
                print(f"  {phase:28s} {pw:6.2f} s wall {pc:6.2f} s CPU  x{n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
