"""int8: our streaming quantizer against ORT's ``quantize_dynamic`` and optimum-cli's ``--avx512_vnni``, side by side.

Models: the real all-MiniLM-L6-v2 and a random-weight bert-base (BertConfig defaults,
the checkpoint ``bench_realsize.py`` builds, cached in ``build/realsize/ckpt``). Each is
exported plain (``optimum-cli export onnx``, no optimization: the graph every side
quantizes, cached in ``build/quantize``), then quantized by:

* ``ours <recipe>``: ``zoo_convert.variants.quantize.quantize`` with a recipe of :data:`RECIPES`
  (which MatMuls and Gathers stay float, int8 or uint8 weights, per channel or not);
* ``ort``: ``onnxruntime.quantization.quantize_dynamic`` with the chosen recipe's settings
  and exclusions (the same graph, ORT's time and memory);
* ``optimum vnni``: ``optimum-cli onnxruntime quantize --avx512_vnni`` (per-tensor QInt8
  weights, MatMuls only), optimum's documented int8 route.

Each quantization runs alone in a child process, timed, its memory sampled (peak RSS).
Then one child times every artifact interleaved in rounds at ``--threads`` (batch 1 x
128 real tokens) against PyTorch and takes the cosine vs PyTorch over several real
passages (``_realsize.latency``). Targets, every model: the chosen recipe's p50 <=
optimum vnni's with cosine >= its cosine; its peak memory < ORT's.

    .venv/bin/python benchmarks/bench_quantize.py [--only minilm,bert-base] [--threads 1] [--rounds 8]
        [--recipes chosen,all,...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from _common import BIN, Measured, cpu_model, machine, measure, verdict
from _realsize import MODELS, RealModel
from bench_realsize import checkpoint

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "build" / "quantize"
GB = 1e9
CHOSEN = "chosen"

# name -> quantize() settings; ``exclude`` names the node groups kept float (see ``exclusions``).
# chosen: the farm's int8 (every MatMul with a weight int8, embedding lookups float, quantize_dynamic's
# MatMulConstBOnly); scores: chosen plus the MatMuls of two activations that read no Softmax (attention's Q.K^T);
# all: ORT's defaults (embeddings uint8 too: a smaller file); gelu-float: an older recipe (FFN down-projections
# float); attention: chosen plus every MatMul of two activations (probabilities times V too, as optimum's avx512_vnni);
# per-tensor-attention: both per tensor, optimum's recipe but for the embedding tables (docs/benchmarks.md:
# what each costs in cosine and p50).
RECIPES: dict[str, dict[str, Any]] = {
    CHOSEN: {"weight_type": "int8", "per_channel": True, "exclude": ["default"]},
    "scores": {"weight_type": "int8", "per_channel": True, "exclude": ["default"], "activations": "scores"},
    "all": {"weight_type": "int8", "per_channel": True, "exclude": []},
    "gelu-float": {"weight_type": "int8", "per_channel": True, "exclude": ["gelu"]},
    "attention": {"weight_type": "int8", "per_channel": True, "exclude": ["default"], "activations": "all"},
    "per-tensor": {"weight_type": "int8", "per_channel": False, "exclude": ["embeddings"]},
    "per-tensor-attention": {"weight_type": "int8", "per_channel": False, "exclude": ["embeddings"], "activations": "all"},
    "uint8": {"weight_type": "uint8", "per_channel": True, "exclude": ["embeddings"]},
}


def exclusions(graph: Path, groups: list[str]) -> list[str]:
    """The node names of the named groups: ``default`` (default_exclude), ``gelu`` (post-GELU MatMuls), ``embeddings``."""
    from zoo_convert.variants import quantize

    model = quantize.load_lazily(graph)
    found = {
        "default": quantize.default_exclude(model),
        "gelu": quantize.post_gelu_matmuls(model),
        "embeddings": quantize.embedding_gathers(model),
    }
    return sorted(set().union(*(found[g] for g in groups)))


def child(argv: list[str]) -> int:
    """``quantize HOW SRC DST RECIPE``: one quantization, run alone so its process's memory is its own."""
    how, src, dst, recipe = argv[0], Path(argv[1]), Path(argv[2]), RECIPES[argv[3]]
    exclude = exclusions(src, recipe["exclude"])
    activations = recipe.get("activations", "none")
    external = True  # as the farm writes bert-size graphs: ORT reads the weights from a data file either way
    if how == "ours":
        from zoo_convert.variants.quantize import quantize

        quantize(src, dst, weight_type=recipe["weight_type"], per_channel=recipe["per_channel"],
                 exclude=frozenset(exclude), external=external, activations=activations)  # fmt: skip
    else:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        from zoo_convert.variants.quantize import load_lazily, probability_matmuls

        if activations == "scores":  # ORT's nearest: every MatMul of two activations but those reading a Softmax
            exclude += probability_matmuls(load_lazily(src))

        quantize_dynamic(src, dst, per_channel=recipe["per_channel"], nodes_to_exclude=exclude,
                         weight_type={"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}[recipe["weight_type"]],
                         use_external_data_format=external,
                         extra_options={"MatMulConstBOnly": activations == "none"})  # fmt: skip
    return 0


def plain_export(model: RealModel, ckpt: Path, work: Path) -> Path:
    """The unoptimized optimum export every side quantizes (kept between runs)."""
    out = work / "plain"
    if not (out / "model.onnx").is_file():
        shutil.rmtree(out, ignore_errors=True)
        cmd = [str(BIN / "optimum-cli"), "export", "onnx", "--model", str(ckpt), "--task", model.task, str(out)]
        m = measure(cmd, work / "plain.log")
        if m.rc != 0:
            raise SystemExit(f"export of {model.name} failed; see {work / 'plain.log'}")
    return out


def run(label: str, cmd: list[str], out: Path, log: Path) -> Measured:
    """One measured quantization into a clean ``out`` (onnx appends to a data file left by an earlier run)."""
    shutil.rmtree(out, ignore_errors=True)
    for old in out.parent.glob(out.name + "*"):
        old.unlink()
    m = measure(cmd, log)
    files = out.glob("*.onnx*") if out.is_dir() else out.parent.glob(out.name + "*")
    size = sum(p.stat().st_size for p in files)
    print(f"  {label:28} exit {m.rc}  wall {m.wall_s:6.2f} s  peak {m.peak_bytes / GB:5.2f} GB  "
          f"size {size / 1e6:6.1f} MB  (load {m.load:.1f})", flush=True)  # fmt: skip
    if m.rc != 0:
        raise SystemExit(f"{label} failed; see {log}")
    return m


def bench(model: RealModel, recipes: list[str], threads: int, rounds: int) -> dict[str, Any]:
    work = WORK / model.name
    work.mkdir(parents=True, exist_ok=True)
    ckpt = checkpoint(model)
    plain = plain_export(model, ckpt, work)
    print(f"{model.name}: plain export {plain / 'model.onnx'}", flush=True)
    me = [sys.executable, __file__, "quantize"]
    artifacts: dict[str, Path] = {"plain fp32": plain / "model.onnx"}
    cost: dict[str, Measured] = {}
    for recipe in recipes:
        out = work / f"ours-{recipe}.onnx"
        cost[f"ours {recipe}"] = run(f"ours {recipe}", [*me, "ours", str(plain / "model.onnx"), str(out), recipe], out,
                                     work / f"ours-{recipe}.log")  # fmt: skip
        artifacts[f"ours {recipe}"] = out
    out = work / "ort.onnx"
    cost["ort"] = run(f"ort quantize_dynamic ({recipes[0]})", [*me, "ort", str(plain / "model.onnx"), str(out), recipes[0]],
                      out, work / "ort.log")  # fmt: skip
    artifacts["ort"] = out
    vnni = work / "vnni"
    cmd = [str(BIN / "optimum-cli"), "onnxruntime", "quantize", "--onnx_model", str(plain), "--avx512_vnni", "-o", str(vnni)]
    cost["optimum vnni"] = run("optimum vnni", cmd, vnni, work / "vnni.log")
    artifacts["optimum vnni"] = next(vnni.glob("*quantized*.onnx"))

    spec = work / "latency.json"
    spec.write_text(json.dumps({"model_dir": str(ckpt), "task": model.task, "threads": threads, "rounds": rounds,
                                "block_s": 0.3, "artifacts": {k: str(p) for k, p in artifacts.items()}}))  # fmt: skip
    result = work / "latency-result.json"
    m = measure([sys.executable, str(Path(__file__).with_name("_realsize.py")), "latency", str(spec), str(result)],
                work / "latency.log")  # fmt: skip
    if m.rc != 0:
        raise SystemExit(f"latency of {model.name} failed; see {work / 'latency.log'}")
    report: dict[str, Any] = json.loads(result.read_text())
    report["load"], report["cost"] = m.load, cost
    return report


def main() -> int:
    if sys.argv[1:2] == ["quantize"]:
        return child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="minilm,bert-base")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--recipes", default=",".join(RECIPES), help=f"the first is judged ({CHOSEN} by default)")
    args = ap.parse_args()
    recipes = args.recipes.split(",")
    print(f"CPU: {cpu_model()}; {machine()}", flush=True)
    checks: dict[str, bool] = {}
    summary = []
    for name in args.only.split(","):
        model = next(m for m in MODELS if m.name == name)
        rep = bench(model, recipes, args.threads, args.rounds)
        sides, cost = rep["sides"], rep["cost"]
        print(f"\n{name}: {rep['threads']} thread(s), {rep['shape']}, {rep['cases']} passages for cosine, load {rep['load']:.1f}")
        print(f"{'side':28}{'p50 ms':>9}{'IQR/p50':>9}{'runs':>6}{'cosine':>10}{'quant s':>9}{'peak GB':>9}")
        for side, r in sides.items():
            c = cost.get(side)
            q = f"{c.wall_s:9.2f}{c.peak_bytes / GB:9.2f}" if c else ""
            cos = f"{r['cosine']:10.5f}" if "cosine" in r else " " * 10
            print(f"{side:28}{r['p50_ms']:9.2f}{r['iqr_rel']:9.2f}{r['runs']:6}{cos}{q}")
        ours, vnni, ort = sides[f"ours {recipes[0]}"], sides["optimum vnni"], cost["ort"]
        mine = cost[f"ours {recipes[0]}"]
        lat, mem, wall = ours["p50_ms"] / vnni["p50_ms"], mine.peak_bytes / ort.peak_bytes, mine.wall_s / ort.wall_s
        print(f"ratios ({recipes[0]}): p50 vs optimum vnni {lat:.2f}x, cosine {ours['cosine']:.5f} vs {vnni['cosine']:.5f}; "
              f"quantize wall vs ORT {wall:.2f}x, peak vs ORT {mem:.2f}x")  # fmt: skip
        checks[f"{name}: p50 <= optimum vnni"] = lat <= 1.0
        checks[f"{name}: cosine >= optimum vnni"] = ours["cosine"] >= vnni["cosine"]
        checks[f"{name}: peak < ORT's"] = mem < 1.0
        summary.append(f"{name} {lat:.2f}x p50, cosine {ours['cosine']:.4f} vs {vnni['cosine']:.4f}, peak {mem:.2f}x ORT")
    return verdict("bench_quantize", checks, f"{'; '.join(summary)} ({cpu_model()}, {args.threads} thread(s))")


if __name__ == "__main__":
    sys.exit(main())
