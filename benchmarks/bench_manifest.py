"""``zoo-convert manifest validate`` on a 100,000-row manifest: target <= 2 s.

Writes a manifest of hub ids with varied tasks, opsets, exporters and variants,
with one bad row in every 1,000 (so the report path runs too), then times
``read_manifest`` in this process (median of a few calls) and the CLI command end
to end (a fresh interpreter: its start-up and imports included). The target
applies to both; when only the CLI misses it, its start-up is what limits it.

    .venv/bin/python benchmarks/bench_manifest.py [--rows 100000] [--runs 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import BIN, machine, verdict

from zoo_convert.manifest import read_manifest, write_manifest

TARGET_S = 2.0
TASKS = ("feature-extraction", "fill-mask", "text-classification", "text-generation-with-past", "image-classification")
BAD_EVERY = 1000


def make_rows(n: int) -> list[dict]:
    """``n`` distinct rows; every BAD_EVERY-th one has an impossible opset."""
    rows = []
    for i in range(n):
        bad = i % BAD_EVERY == BAD_EVERY - 1
        rows.append(
            {
                "source": f"org{i % 997}/model-{i:06d}",
                "task": TASKS[i % len(TASKS)],
                # most manifests leave the opset to the exporter; some rows ask for two
                "opsets": [99] if bad else (None if i % 2 else ([14, 18] if i % 10 == 0 else [17])),
                "exporter": "torch" if i % 7 == 0 else "optimum",
                "variants": ["fp32", "int8"] if i % 3 else ["fp32", "fp16", "int8"],
                "priority": i % 4,
                "tags": ["bench", f"shard:{i % 10}"],
            }
        )
    return rows


def main() -> int:
    """Time the library call and the CLI; print both; exit 1 over the target."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3, help="repetitions of each measurement (median)")
    args = ap.parse_args()
    print(machine())
    bad = args.rows // BAD_EVERY
    with tempfile.TemporaryDirectory(prefix="bench-manifest-") as tmp:
        path = write_manifest(make_rows(args.rows), Path(tmp) / "big.parquet")
        lib, cpu, cli = [], [], []
        for _ in range(args.runs):
            t0, c0 = time.perf_counter(), time.process_time()
            m = read_manifest(path)
            lib.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            assert m.rows == args.rows and len(m.problems) == bad, (m.rows, len(m.problems))
            t0 = time.perf_counter()
            proc = subprocess.run([str(BIN / "zoo-convert"), "manifest", "validate", str(path)],
                                  capture_output=True, text=True)  # fmt: skip
            cli.append(time.perf_counter() - t0)
            reported = len(proc.stdout.splitlines())
            assert proc.returncode == (1 if bad else 0) and reported == bad, (proc.returncode, reported, proc.stderr)
        t0 = time.perf_counter()
        subprocess.run([str(BIN / "zoo-convert"), "--help"], capture_output=True, check=True)
        startup = time.perf_counter() - t0
    lib_s, cli_s = sorted(lib)[len(lib) // 2], sorted(cli)[len(cli) // 2]
    print(f"rows {args.rows}, jobs {len(m.entries)}, bad rows {bad} (all reported by both)")
    print(f"{'':24}{'median s':>10}   runs")
    print(f"{'read_manifest (library)':24}{lib_s:>10.3f}   " + " ".join(f"{t:.3f}" for t in lib))
    print(f"{'  its CPU time':24}{sorted(cpu)[len(cpu) // 2]:>10.3f}   " + " ".join(f"{t:.3f}" for t in cpu))
    print(f"{'manifest validate (CLI)':24}{cli_s:>10.3f}   " + " ".join(f"{t:.3f}" for t in cli))
    print(f"{'zoo-convert --help':24}{startup:>10.3f}   (CLI start-up alone)")
    checks = {f"library <= {TARGET_S:g} s": lib_s <= TARGET_S, f"CLI <= {TARGET_S:g} s": cli_s <= TARGET_S}
    return verdict(
        "bench_manifest", checks, f"{args.rows} rows: library {lib_s:.2f} s, CLI end to end {cli_s:.2f} s (target {TARGET_S:g} s)"
    )


if __name__ == "__main__":
    sys.exit(main())
