"""Where one conversion's time and memory go: ``convert_one`` in-process, with the expensive calls counted.

Wraps (without changing them) the calls a real-size conversion pays for: the
stages, the helpers inside optimize, export, check and verify, every onnx
load / save / checker / shape inference, ORT's symbolic shape inference, the
transformers optimizer's fusions, fp16 conversion, quantize_dynamic and every
ONNX Runtime session. Per call name it prints the calls, wall and CPU seconds,
bytes read or written, the process's peak RSS while the call ran (exact: the
kernel's high-water mark, reset at every wrapped call's entry and exit) and how
far that peak rose above the RSS the call started at. A call's time includes
the wrapped calls it makes (so rows overlap); ``forks`` counts the load checks'
children, whose memory this process does not see.

    .venv/bin/python benchmarks/_trace_convert.py CHECKPOINT --task TASK [--variants fp32,fp16,int8]
        [--no-benchmark] [--out DIR] [--json trace.json] [--timeline] [--release]

``--release`` runs a full garbage collection, then glibc's malloc_trim, after
export, check and optimize, and prints the RSS after each: how much of what a
stage leaves resident is unreachable cycles, how much freed memory glibc kept,
and how much is still referenced.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import gc
import importlib
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import status_bytes

GB = 1e9


@dataclass(eq=False)  # identity, not fields: nested calls can look alike
class Frame:
    name: str
    rss0: int
    peak: int = 0


@dataclass
class Row:
    calls: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    bytes: int = 0
    peak: int = 0
    rise: int = 0
    details: list[str] = field(default_factory=list)


class Tracer:
    """Per call name: count, time, bytes and the exact peak RSS while it ran."""

    def __init__(self) -> None:
        self.rows: dict[str, Row] = {}
        self.active: list[Frame] = []
        self.events: list[tuple[float, str, float, float]] = []  # (t, "name>" or "<name", rss GB, peak GB)
        self.t0 = time.perf_counter()

    def _mark(self) -> int:
        """Fold the high-water mark since the last mark into every active frame, then reset it."""
        hwm = status_bytes("VmHWM")
        for frame in self.active:
            frame.peak = max(frame.peak, hwm)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return status_bytes("VmRSS")

    def wrap(
        self, name: str, fn: Callable[..., Any], nbytes: Callable[..., int] | None = None, light: bool = False
    ) -> Callable[..., Any]:
        """``fn`` counted under ``name``; ``light`` counts calls and time only (for per-node calls)."""
        if getattr(fn, "__traced__", False):
            return fn

        @functools.wraps(fn)
        def counted(*args: Any, **kwargs: Any) -> Any:
            w0, c0 = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                row = self.rows.setdefault(name, Row())
                row.calls += 1
                row.wall_s += time.perf_counter() - w0
                row.cpu_s += time.process_time() - c0

        @functools.wraps(fn)
        def traced(*args: Any, **kwargs: Any) -> Any:
            rss = self._mark()
            frame = Frame(name, rss, rss)
            self.active.append(frame)
            self.events.append((time.perf_counter() - self.t0, name + ">", rss / GB, 0.0))
            w0, c0 = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                wall, cpu = time.perf_counter() - w0, time.process_time() - c0
                rss_end = self._mark()
                self.active.remove(frame)
                row = self.rows.setdefault(name, Row())
                row.calls += 1
                row.wall_s += wall
                row.cpu_s += cpu
                row.peak = max(row.peak, frame.peak)
                row.rise = max(row.rise, frame.peak - frame.rss0)
                if nbytes is not None:
                    try:
                        row.bytes += nbytes(*args, **kwargs)
                    except Exception:  # noqa: BLE001 - a size we cannot tell is left out
                        pass
                self.events.append((time.perf_counter() - self.t0, "<" + name, rss_end / GB, frame.peak / GB))

        wrapper = counted if light else traced
        wrapper.__traced__ = True  # type: ignore[attr-defined]
        return wrapper


def _size(path: Any) -> int:
    """A graph file's bytes plus its external data file (``<name>_data`` or ``<name>.data``) if any."""
    if not isinstance(path, (str, os.PathLike)):
        return len(path.SerializeToString()) if hasattr(path, "ByteSize") and path.ByteSize() < 2**31 else 0
    p = Path(path)
    total = p.stat().st_size if p.is_file() else 0
    for data in (p.with_name(p.name + "_data"), p.with_name(p.name + ".data")):
        if data.is_file():
            total += data.stat().st_size
    return total


def _load_bytes(f: Any, *args: Any, load_external_data: bool = True, **kwargs: Any) -> int:
    if not isinstance(f, (str, os.PathLike)):
        return 0
    return _size(f) if load_external_data else Path(f).stat().st_size


def _save_bytes(proto: Any, f: Any, *args: Any, **kwargs: Any) -> int:
    return _size(f) if isinstance(f, (str, os.PathLike)) else 0


def _first_path_bytes(first: Any, *args: Any, **kwargs: Any) -> int:
    return _size(first) if isinstance(first, (str, os.PathLike)) else 0


def _session_bytes(self: Any, path: Any, *args: Any, **kwargs: Any) -> int:
    return _size(path) if isinstance(path, (str, os.PathLike)) else 0


def _replace_everywhere(old: Any, new: Any) -> int:
    """Point every module global bound to ``old`` (``from x import f`` copies included) at ``new``."""
    n = 0
    for mod in list(sys.modules.values()):
        d = getattr(mod, "__dict__", None)
        if not d:
            continue
        for key, value in list(d.items()):
            if value is old:
                d[key] = new
                n += 1
    return n


def _classes(name: str) -> list[type]:
    """Every class called ``name`` in loaded modules (ORT imports some modules twice, under two names)."""
    found: dict[int, type] = {}
    for mod in list(sys.modules.values()):
        cls = getattr(mod, name, None)
        if isinstance(cls, type) and cls.__name__ == name:
            found[id(cls)] = cls
    return list(found.values())


def install(tr: Tracer) -> None:
    """Wrap the calls worth counting; import everything first so ``from`` bindings are found."""
    import onnx
    import onnx.checker
    import onnx.external_data_helper
    import onnx.shape_inference
    import onnxruntime
    import onnxruntime.quantization
    import onnxruntime.quantization.quant_utils
    import onnxruntime.quantization.quantize
    import onnxruntime.transformers.onnx_model
    import onnxruntime.transformers.optimizer
    import optimum.exporters.onnx.convert

    import symbolic_shape_infer  # noqa: F401 - the copy ORT's transformers tools import via sys.path

    # Our own calls by module and name; names a refactor removed are reported, not fatal.
    ours = {
        "zoo_convert.stages.fetch": ["fetch"],
        "zoo_convert.stages.export": ["export", "_load_model", "_export_optimum", "_describe", "_copy_side_files"],
        "zoo_convert.stages.check": ["check", "_inferred_value_infos"],
        "zoo_convert.stages.optimize": ["optimize", "_int8", "_q4", "_fp32", "_fuse", "_ort_offline", "_fp16",
                                        "_to_fp16", "_verified", "_census"],
        "zoo_convert.stages.verify": ["references", "check", "judge", "_run_ort"],
        "zoo_convert.stages.benchmark": ["benchmark", "_interleaved", "_torch_side", "_ort_side"],
        "zoo_convert.verify.runtime": ["ort_session", "session_for", "cases", "_make_case", "graph_inputs", "_tokenizer"],
        "zoo_convert.onnx_graph": ["load", "externalize", "internalize", "save", "move", "link"],
        "zoo_convert.stages.forked": ["run_forked"],
    }  # fmt: skip
    # Imported before any wrapping, so their ``from onnx import ...`` bindings are replaced too.
    modules, missing = {}, []
    for module in ours:
        try:
            modules[module] = importlib.import_module(module)
        except ImportError:
            missing.append(module)

    plain = {
        (onnx, "load_model", _load_bytes),
        (onnx, "load_model_from_string", None),
        (onnx, "save_model", _save_bytes),
        (onnx.checker, "check_model", _first_path_bytes),
        (onnx.shape_inference, "infer_shapes", None),
        (onnx.shape_inference, "infer_shapes_path", _first_path_bytes),
        (onnx.external_data_helper, "load_external_data_for_model", None),
        (onnx.external_data_helper, "convert_model_to_external_data", None),
        (onnxruntime.transformers.optimizer, "optimize_model", _first_path_bytes),
        (onnxruntime.transformers.optimizer, "optimize_by_onnxruntime", None),
        (onnxruntime.quantization, "quantize_dynamic", _first_path_bytes),
        (onnxruntime.quantization.quant_utils, "load_model_with_shape_infer", _first_path_bytes),
        (onnxruntime.quantization.quant_utils, "save_and_reload_model_with_shape_infer", None),
        (optimum.exporters.onnx.convert, "export_models", None),
        (optimum.exporters.onnx.convert, "export_pytorch", None),
    }
    for mod, attr, nbytes in plain:
        fn = getattr(mod, attr)
        label = f"{mod.__name__.split('.')[0]}.{attr}" if mod.__name__ != "onnx" else f"onnx.{attr}"
        # Symbolic shape inference calls these once per node: count them, don't mark memory each time.
        light = attr in ("infer_shapes", "load_model_from_string")
        _replace_everywhere(fn, tr.wrap(label + (" (count, time)" if light else ""), fn, nbytes, light))
    # The aliases onnx.load / onnx.save are the same functions, so they were caught above.

    for cls in _classes("InferenceSession"):
        # The Python class, and the C++ one it constructs (reads the file; optimization and prepacking
        # happen after, in initialize_session, counted in the Python row only).
        python = cls.__module__.endswith("collection")
        label = "ort.InferenceSession" if python else "  ort C.InferenceSession() (no init)"
        cls.__init__ = tr.wrap(label, cls.__init__, _session_bytes if python else None)
    for cls in _classes("SymbolicShapeInference"):
        cls.infer_shapes = staticmethod(tr.wrap("ort.SymbolicShapeInference.infer_shapes", cls.infer_shapes))
        cls._infer_impl = tr.wrap("ort.SymbolicShapeInference._infer_impl (every run)", cls._infer_impl)
    for cls in _classes("SymbolicShapeInferenceHelper"):
        cls.infer = tr.wrap("ort.SymbolicShapeInferenceHelper.infer (fusions, fp16)", cls.infer)
    for cls in _classes("OnnxModel"):
        cls.convert_float_to_float16 = tr.wrap("ort.OnnxModel.convert_float_to_float16", cls.convert_float_to_float16)
        cls.save_model_to_file = tr.wrap("ort.OnnxModel.save_model_to_file", cls.save_model_to_file)
    for cls in _classes("BertOnnxModel"):
        cls.optimize = tr.wrap("ort.fusions (BertOnnxModel.optimize)", cls.optimize)

    for module, mod in modules.items():
        short = module.rsplit(".", 1)[1]
        for attr in ours[module]:
            fn = getattr(mod, attr, None)
            if fn is None:
                missing.append(f"{module}.{attr}")
                continue
            label = f"STAGE {short}" if attr == short and ".stages." in module else f"{short}.{attr}"
            _replace_everywhere(fn, tr.wrap(label, fn))
    if missing:
        print(f"not traced (not in this version): {', '.join(missing)}", file=sys.stderr)
    # Count the forked children (each variant is made in one: zoo_convert.stages.forked); what they
    # call is not traced, their time shows as the parent's wait in run_forked.
    forks = tr.rows.setdefault("os.fork (forked.run_forked children)", Row())
    real_fork = os.fork

    def counted_fork() -> int:
        forks.calls += 1
        return real_fork()

    os.fork = counted_fork  # type: ignore[assignment]


def print_timeline(events: list[tuple[float, str, float, float]]) -> None:
    """The wrapped calls as they nested, with RSS at entry and exit and the peak in between."""
    depth = 0
    for t, name, rss, peak in events:
        if name.endswith(">"):
            print(f"{t:8.2f} {'  ' * depth}{name[:-1]}  rss {rss:.2f}")
            depth += 1
        else:
            depth -= 1
            print(f"{t:8.2f} {'  ' * depth}/{name[1:]}  rss {rss:.2f}  peak {peak:.2f}")


def _then_release(fn: Callable[..., Any], name: str, libc: Any) -> Callable[..., Any]:
    """``fn``, then a full garbage collection, then glibc's malloc_trim(0); prints the RSS after each."""

    def released(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        before = status_bytes("VmRSS")
        found = gc.collect()
        collected = status_bytes("VmRSS")
        libc.malloc_trim(0)
        print(f"after {name}: RSS {before / GB:.2f} GB, after gc.collect() ({found} objects) {collected / GB:.2f} GB,"
              f" after malloc_trim {status_bytes('VmRSS') / GB:.2f} GB", flush=True)  # fmt: skip
        return result

    return released


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--task")
    ap.add_argument("--variants", default="fp32,fp16,int8")
    ap.add_argument("--no-benchmark", action="store_true")
    ap.add_argument("--no-optimize", action="store_true")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--json", type=Path, help="write rows and the call timeline here")
    ap.add_argument("--timeline", action="store_true", help="print the calls in order, nested, with RSS")
    ap.add_argument("--release", action="store_true", help="gc.collect() and malloc_trim(0) after export, check, optimize")
    args = ap.parse_args()

    t_start = time.perf_counter()
    tr = Tracer()
    install(tr)
    t_imports = time.perf_counter() - t_start
    from zoo_convert.pipeline import convert_one
    from zoo_convert.records import ManifestEntry, Settings
    from zoo_convert.stages import export

    if args.release:
        from zoo_convert.stages import check, optimize

        libc = ctypes.CDLL("libc.so.6")
        for mod, name in ((export, "export"), (check, "check"), (optimize, "optimize")):
            _replace_everywhere(getattr(mod, name), _then_release(getattr(mod, name), name, libc))

    with tempfile.TemporaryDirectory(prefix="trace-convert-") as tmp:
        out = args.out or Path(tmp)
        entry = ManifestEntry(source=args.checkpoint, task=args.task, variants=tuple(args.variants.split(",")))
        settings = Settings(out_dir=str(out), optimize=not args.no_optimize, benchmark=not args.no_benchmark)
        c0 = resource.getrusage(resource.RUSAGE_SELF)
        w0 = time.perf_counter()
        result = convert_one(entry, settings)
        wall = time.perf_counter() - w0
        c1 = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime
    print(f"{args.checkpoint}: {result.status} {result.failure_kind or ''} {result.message or ''}".rstrip())
    # No ru_maxrss here: resetting VmHWM (clear_refs) resets the figure getrusage reports too.
    print(f"imports and wrapping {t_imports:.1f} s; convert_one wall {wall:.1f} s, CPU {cpu:.1f} s "
          f"(+ {kids.ru_utime + kids.ru_stime:.1f} s in children); peak RSS {max(r.peak for r in tr.rows.values()) / GB:.2f} GB; "
          f"load {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'call':44}{'calls':>6}{'wall s':>8}{'cpu s':>8}{'GB io':>8}{'peak GB':>9}{'rise GB':>9}")
    order = sorted(tr.rows.items(), key=lambda kv: (not kv[0].startswith("STAGE"), -kv[1].wall_s))
    for name, r in order:
        io = f"{r.bytes / GB:.2f}" if r.bytes else ""
        print(f"{name:44}{r.calls:>6}{r.wall_s:>8.2f}{r.cpu_s:>8.2f}{io:>8}{r.peak / GB:>9.2f}{r.rise / GB:>9.2f}")
    if args.timeline:
        print_timeline(tr.events)
    if args.json:
        rows = {k: vars(v) for k, v in tr.rows.items()}
        record = {"rows": rows, "events": tr.events, "wall_s": wall, "cpu_s": cpu, "result": json.loads(result.to_json())}
        args.json.write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
