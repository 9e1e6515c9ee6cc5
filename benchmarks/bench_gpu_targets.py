"""The GPU targets on a GPU node, from saved references alone: pass share and latency against ONNX Runtime's CPU.

A GPU node needs no PyTorch, no checkpoint and no conversion for this: only the artifact folders a CPU farm
wrote (each holds ``reference/``), numpy, click and onnxruntime-gpu. This runs ``python -m zoo_convert.cli
verify-target FOLDER... --target ort-cpu,<targets> --json`` once over all folders (the same rows the farm
records) and prints, per target:

- of the variants ``ort-cpu`` passed here, how many pass, fail, are unsupported or not run on the target;
- the providers its sessions really got (ONNX Runtime falls back to the CPU silently; such a row is ``not-run``);
- the median p50 latency on the target and on ``ort-cpu``, per variant, and their ratio (1 thread on the CPU;
  tiny models on a GPU measure launch overhead more than arithmetic: read the ratio with the models' size);
- its failures, clustered by message.

    python benchmarks/bench_gpu_targets.py build/demo/artifacts/*/* [--targets ort-cuda,ort-tensorrt] [--out rows.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STATUSES = ("passed", "failed", "unsupported", "not-run")


def device_names() -> str:
    """The CPU and the GPUs this ran on, named beside every latency."""
    cpu = "unknown CPU"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))  # fmt: skip
    except (OSError, StopIteration):
        pass
    try:
        gpus = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30, check=False).stdout.strip()  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        gpus = ""
    return f"CPU {cpu} ({os.cpu_count()} cores); GPU {gpus.replace(chr(10), '; ') or 'none'}"


def cluster(message: str) -> str:
    """A failure's signature: numbers, paths and quoted names blanked, so one cause is one line.

    A rougher cousin of the DB's ``failure_signature`` macro (store/schema.py): a GPU node that only re-checks
    needs no DuckDB; load ``--out``'s rows into the DB for the real clustering."""
    text = re.sub(r"/\S+", "<path>", message)
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "<name>", text)
    return re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", text)[:160]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", type=Path, help="artifact folders (each with reference/)")
    ap.add_argument("--targets", default="ort-cuda,ort-tensorrt", help="comma-separated GPU targets (ort-cpu is the baseline)")
    ap.add_argument("--out", type=Path, help="also write every row here (JSON lines)")
    args = ap.parse_args(argv)
    targets = [t for t in args.targets.split(",") if t and t != "ort-cpu"]

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "zoo_convert.cli", "verify-target", *map(str, args.folders),
                           "--target", ",".join(["ort-cpu", *targets]), "--json"],
                          capture_output=True, text=True, env=env, check=False)  # fmt: skip
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.stderr.strip():
        print(done.stderr.strip()[-2000:], file=sys.stderr)
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if not rows:
        print(f"no rows (verify-target exited {done.returncode})", file=sys.stderr)
        return 1

    by = {(r["folder"], r["variant"], r["target"]): r for r in rows}
    baseline = {(f, v) for (f, v, t), r in by.items() if t == "ort-cpu" and r["status"] == "passed"}
    print(f"# GPU targets: {len(args.folders)} folders, {len(baseline)} variants ONNX Runtime's CPU passed here;"
          f" {wall:.1f} s in all")  # fmt: skip
    print(f"# on {device_names()}")
    for target in targets:
        mine = [by[(f, v, target)] for f, v in sorted(baseline) if (f, v, target) in by]
        counts = Counter(r["status"] for r in mine)
        version = next((r["version"] for r in mine if r.get("version")), "-")
        share = counts["passed"] / len(mine) if mine else 0.0
        print(f"\n## {target} {version}: {counts['passed']}/{len(mine)} passed ({share:.0%}); "
              + ", ".join(f"{s} {counts[s]}" for s in STATUSES[1:] if counts[s]))  # fmt: skip
        print("providers: " + "; ".join(f"{p} x{n}" for p, n in Counter(r.get("providers") or "-" for r in mine).most_common()))
        print(f"seconds checking (all variants): {sum(r.get('seconds') or 0 for r in mine):.1f}")
        per_variant: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for r in mine:
            cpu = by[(r["folder"], r["variant"], "ort-cpu")]
            if r["latency_ms"] is not None and cpu["latency_ms"] is not None:
                per_variant[r["variant"]].append((r["latency_ms"], cpu["latency_ms"]))
        for variant, pairs in sorted(per_variant.items()):
            gpu_ms = statistics.median(g for g, _ in pairs)
            cpu_ms = statistics.median(c for _, c in pairs)
            ratio = statistics.median(g / c for g, c in pairs)
            print(f"latency {variant:<5} median p50 {gpu_ms:.3f} ms here, {cpu_ms:.3f} ms ort-cpu (1 thread);"
                  f" median ratio {ratio:.2f}x over {len(pairs)} models")  # fmt: skip
        failures = Counter(cluster(r["message"] or "") for r in mine if r["status"] != "passed")
        for signature, n in failures.most_common(8):
            print(f"  {n:>3} x {signature}")
        for r in mine:
            if r["status"] == "failed":
                print(f"  failed: {Path(r['folder']).parent.name} {r['variant']}: {(r['message'] or '')[:200]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
