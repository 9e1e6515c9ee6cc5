"""What the optimize / check / verify building blocks cost on a real-size graph, each alone in a fresh process.

The measurements behind REALSIZE_NOTES.md's proposals: for one plain export
(``optimum-cli export onnx`` without ``--optimize``) and the fused fp32 graph
made from it, each experiment runs in its own child process, which reports
its wall and CPU seconds and its peak RSS above the RSS it had after imports
(VmHWM, reset after imports). So "load the graph with its weights inline" and
"load it with the weights in a side file" are compared on equal terms.

    .venv/bin/python benchmarks/_what_if.py PLAIN.onnx FUSED.onnx CHECKPOINT_DIR [--only name,name] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import status_bytes

GB = 1e9


def _census(model: Any) -> dict[str, int]:
    fused = ("Attention", "SkipLayerNormalization", "EmbedLayerNormalization", "BiasGelu", "FastGelu", "Gelu",
             "LayerNormalization", "MultiHeadAttention", "GroupQueryAttention", "SimplifiedLayerNormalization",
             "SkipSimplifiedLayerNormalization", "RotaryEmbedding", "MatMulInteger", "DynamicQuantizeLinear")  # fmt: skip
    c = Counter(n.op_type for n in model.graph.node)
    return {k: c[k] for k in fused if c[k]}


def _heads_hidden(ckpt: Path) -> tuple[str, int, int]:
    from zoo_convert.stages.optimize import FUSION_TYPES

    config = json.loads((ckpt / "config.json").read_text())
    heads = next((config[k] for k in ("num_attention_heads", "n_head", "num_heads") if k in config), 0)
    hidden = next((config[k] for k in ("hidden_size", "n_embd", "d_model") if k in config), 0)
    return FUSION_TYPES.get(config["model_type"], "bert"), heads, hidden


def _session(path: str, level: str = "ORT_ENABLE_ALL") -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def _external_copy(src: str, folder: Path) -> str:
    """The same graph with its weights in ``model.onnx_data`` beside it."""
    import onnx

    out = folder / "model.onnx"
    onnx.save_model(onnx.load(src), str(out), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx_data", size_threshold=1024)  # fmt: skip
    return str(out)


def _fuse(plain: str, ckpt: Path, opt_level: int, shape_inference: bool) -> Any:
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    kind, heads, hidden = _heads_hidden(ckpt)
    options = FusionOptions(kind)
    options.enable_shape_inference = shape_inference
    return optimize_model(plain, model_type=kind, num_heads=heads, hidden_size=hidden, opt_level=opt_level,
                          use_gpu=False, optimization_options=options)  # fmt: skip


def _compare(reference: str, candidate: str) -> str:
    """Whether ORT loads ``candidate``, and its first output's max |diff| from ``reference`` on one generated input."""
    import numpy as np

    try:
        got_session = _session(candidate)
    except Exception as exc:  # noqa: BLE001 - the point is whether it loads
        return f"ORT cannot load it: {str(exc)[:120]}"
    ref_session = _session(reference)
    rng = np.random.default_rng(0)
    feed = {}
    for spec in ref_session.get_inputs():
        shape = []
        for dim in spec.shape:
            if isinstance(dim, int):
                shape.append(dim)
            elif "batch" in str(dim):
                shape.append(1)
            else:
                shape.append(16 if "+" in str(dim) else 8)
        if "int" in spec.type:
            feed[spec.name] = np.ones(shape, dtype=np.int64)
        else:
            feed[spec.name] = rng.standard_normal(shape).astype(np.float32)
    ref = ref_session.run(None, feed)[0]
    got = got_session.run(None, feed)[0]
    return f"ORT loads it; first output max |diff| vs fp32 {float(np.abs(ref.astype(np.float64) - got).max()):.3g}"


def experiments(plain: str, fused: str, ckpt: Path, scratch: Path) -> dict[str, Callable[[], str]]:
    """name -> a function doing the work once and returning a short note."""
    import onnx

    def load_full() -> str:
        m = onnx.load(plain)
        return f"{len(m.graph.node)} nodes, {m.ByteSize() / GB:.2f} GB proto"

    def load_graph_only() -> str:
        m = onnx.load(ext_plain(), load_external_data=False)
        return f"{len(m.graph.node)} nodes, {m.ByteSize() / GB:.3f} GB proto"

    def ext_plain() -> str:
        path = scratch / "ext" / "model.onnx"
        if not path.exists():
            raise SystemExit("run the 'externalize' experiment first")
        return str(path)

    def externalize() -> str:
        (scratch / "ext").mkdir(exist_ok=True)
        _external_copy(plain, scratch / "ext")
        return "plain export rewritten with its weights in model.onnx_data"

    def inputs_via_ort() -> str:
        s = _session(plain, "ORT_DISABLE_ALL")
        return f"{len(s.get_inputs())} inputs"

    def save_inline() -> str:
        m = onnx.load(plain)
        t0 = time.perf_counter()
        onnx.save_model(m, str(scratch / "inline.onnx"))
        return f"save alone {time.perf_counter() - t0:.2f} s"

    def save_external() -> str:
        m = onnx.load(plain)
        t0 = time.perf_counter()
        onnx.save_model(m, str(scratch / "x.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                        location="x.onnx_data", size_threshold=1024)  # fmt: skip
        return f"save alone {time.perf_counter() - t0:.2f} s"

    def fuse(opt_level: int, shape_inference: bool) -> Callable[[], str]:
        def run() -> str:
            opt = _fuse(plain, ckpt, opt_level, shape_inference)
            return json.dumps(_census(opt.model))

        return run

    def fp16(inference: str) -> Callable[[], str]:
        """inference: symbolic (ours), onnx (onnx.shape_inference) or none (types from the graph as written)."""

        def run() -> str:
            from onnxruntime.transformers.float16 import convert_float_to_float16
            from onnxruntime.transformers.onnx_model import OnnxModel

            model = OnnxModel(onnx.load(fused))
            cwd = os.getcwd()
            os.chdir(scratch)  # symbolic inference may drop temp files into the cwd
            try:
                if inference == "none":
                    model.model = convert_float_to_float16(model.model, keep_io_types=True, disable_shape_infer=True)
                else:
                    model.convert_float_to_float16(use_symbolic_shape_infer=inference == "symbolic", keep_io_types=True)
            finally:
                os.chdir(cwd)
            out = scratch / f"fp16-{inference}.onnx"
            onnx.save_model(model.model, str(out))
            return _compare(fused, str(out))

        return run

    def quantize(external: bool) -> Callable[[], str]:
        def run() -> str:
            from onnxruntime.quantization import QuantType, quantize_dynamic

            src = ext_plain() if external else plain
            out = scratch / f"int8-{external}.onnx"
            quantize_dynamic(src, str(out), per_channel=True, weight_type=QuantType.QInt8,
                             use_external_data_format=external, extra_options={"EnableSubgraph": True})  # fmt: skip
            return json.dumps(_census(onnx.load(str(out), load_external_data=False)))

        return run

    def session(path: Callable[[], str], level: str) -> Callable[[], str]:
        def run() -> str:
            _session(path(), level)
            return level

        return run

    return {
        "externalize (setup)": externalize,
        "onnx.load, weights inline": load_full,
        "onnx.load graph only, weights external": load_graph_only,
        "input names from an ORT session": inputs_via_ort,
        "onnx.checker full, weights inline": lambda: (onnx.checker.check_model(plain, full_check=True), "ok")[1],
        "onnx.checker full, weights external": lambda: (onnx.checker.check_model(ext_plain(), full_check=True), "ok")[1],
        "onnx.checker, no full_check, inline": lambda: (onnx.checker.check_model(plain), "ok")[1],
        "infer_shapes_path, weights inline": lambda: (
            onnx.shape_inference.infer_shapes_path(plain, str(scratch / "inferred.onnx")), "ok")[1],
        "infer_shapes_path, weights external": lambda: (
            onnx.shape_inference.infer_shapes_path(ext_plain(), str(scratch / "ext" / "inferred.onnx")), "ok")[1],
        "save, weights inline": save_inline,
        "save, weights external": save_external,
        "fuse opt_level 0, symbolic shapes (ours)": fuse(0, True),
        "fuse opt_level 0, no symbolic shapes": fuse(0, False),
        "fuse opt_level 1, no symbolic shapes": fuse(1, False),
        "fuse opt_level 2, no symbolic shapes (O2)": fuse(2, False),
        "fp16 of fused, symbolic shapes (ours)": fp16("symbolic"),
        "fp16 of fused, onnx shape inference": fp16("onnx"),
        "fp16 of fused, no shape inference": fp16("none"),
        "quantize_dynamic, weights inline (ours)": quantize(False),
        "quantize_dynamic, weights external": quantize(True),
        "ORT session, ORT_DISABLE_ALL, plain": session(lambda: plain, "ORT_DISABLE_ALL"),
        "ORT session, ORT_ENABLE_ALL, plain": session(lambda: plain, "ORT_ENABLE_ALL"),
        "ORT session, ORT_ENABLE_ALL, fused": session(lambda: fused, "ORT_ENABLE_ALL"),
    }  # fmt: skip


def child(name: str, plain: str, fused: str, ckpt: Path, scratch: Path) -> None:
    """Run one experiment; print one JSON line."""
    import onnx  # noqa: F401 - imports before the baseline
    import onnxruntime  # noqa: F401
    import onnxruntime.quantization  # noqa: F401
    import onnxruntime.transformers.optimizer  # noqa: F401

    fn = experiments(plain, fused, ckpt, scratch)[name]
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = status_bytes("VmRSS")
    w0, c0 = time.perf_counter(), time.process_time()
    note = fn()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "rise": status_bytes("VmHWM") - base, "note": note}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plain", help="a plain export (weights inline)")
    ap.add_argument("fused", help="the fused fp32 graph made from it")
    ap.add_argument("checkpoint", type=Path, help="the checkpoint folder (config.json: heads, hidden size)")
    ap.add_argument("--only", help="comma-separated substrings of experiment names")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.plain, args.fused, args.checkpoint, args.scratch)
        return 0
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; plain {args.plain}; fused {args.fused}")
    with tempfile.TemporaryDirectory(prefix="what-if-", dir=Path(args.plain).parent) as tmp:
        names = list(experiments(args.plain, args.fused, args.checkpoint, Path(tmp)))
        wanted = [n for n in names if n.startswith("externalize") or not args.only
                  or any(part in n for part in args.only.split(","))]  # fmt: skip
        print(f"{'experiment':46}{'wall s':>8}{'cpu s':>8}{'peak rise GB':>13}  note (median of {args.repeat})")
        for name in wanted:
            runs = []
            for _ in range(1 if name.startswith("externalize") else args.repeat):
                cmd = [sys.executable, __file__, args.plain, args.fused, str(args.checkpoint), "--child", name,
                       "--scratch", tmp]  # fmt: skip
                proc = subprocess.run(cmd, capture_output=True, text=True)
                lines = proc.stdout.strip().splitlines()
                if proc.returncode != 0 or not lines:
                    runs.append({"wall_s": float("nan"), "cpu_s": float("nan"), "rise": 0,
                                 "note": "failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1][:100]})  # fmt: skip
                    break
                runs.append(json.loads(lines[-1]))
            cpu = statistics.median(r["cpu_s"] for r in runs)
            wall = statistics.median(r["wall_s"] for r in runs)
            rise = statistics.median(r["rise"] for r in runs)
            print(f"{name:46}{wall:>8.2f}{cpu:>8.2f}{rise / GB:>13.2f}  {runs[-1]['note']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
