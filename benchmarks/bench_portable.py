"""What the graphs of standard ONNX ops fix on other runtimes, and what they cost ONNX Runtime (issue 32).

For every artifact folder with a saved reference under ARTIFACTS (``<model>/<job>/reference/``):

* per target and variant, the target's check on the shipped (fused) graph and, where the folder records
  one, on its graph of standard ONNX ops (``onnx/standard/``): passed / failed / unsupported each way;
* ONNX Runtime's latency on both graphs of a variant that has the two, at 1 thread, side by side:
  the first saved case (a short shape), rounds alternating the two sessions after a warm-up, the
  median of each; the ratio is standard / fused.

Each folder runs in a child process of its own (a runtime that crashes costs that folder only).
One JSON line per (folder, target, variant, graph) and per latency pair goes to --out; the summary
is printed. Usage::

    python benchmarks/bench_portable.py ARTIFACTS --targets openvino,transformers.js --out rows.jsonl
    python benchmarks/bench_portable.py ARTIFACTS --latency --rounds 30 --out latency.jsonl
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any


def folders(root: Path) -> list[Path]:
    """Artifact folders under ``root`` that hold a saved reference: the newest job folder of each model."""
    newest: dict[Path, Path] = {}
    for manifest in root.glob("*/*/reference/manifest.json"):
        job = manifest.parent.parent
        if job.parent not in newest or manifest.stat().st_mtime > (newest[job.parent] / "reference" / "manifest.json").stat().st_mtime:
            newest[job.parent] = job
    return sorted(newest.values())


def check_folder(folder: Path, targets: list[str], variants: list[str] | None) -> list[dict[str, Any]]:
    """Each target on each variant of one folder: the shipped graph, and the standard one where there is one."""
    from dataclasses import replace

    from zoo_convert import targets as registry
    from zoo_convert.targets import reference

    ref = reference.load(folder)
    rows = []
    for variant in variants or list(ref.variants):
        if variant not in ref.variants:
            continue
        shipped = ref.files(variant)
        standard = ref.files(variant, standard=True) if variant in ref.standard else None
        for name in targets:
            target = registry.get(name)
            graphs = {"shipped": False}
            if standard is not None and standard != shipped:
                graphs["standard"] = True
            for graph, wants_standard in graphs.items():
                chosen = replace(ref, standard=ref.standard if wants_standard else {})
                probe = _as(target, wants_standard)
                row = registry.check(probe, chosen, variant, timed=0)
                rows.append({"folder": str(folder), "model": folder.parent.name.split("__")[-1], "target": name,
                             "variant": variant, "graph": graph, "files": row.graph, "status": row.status,
                             "max_abs": row.max_abs, "message": (row.message or "")[:300]})  # fmt: skip
    return rows


def _as(target: Any, standard: bool) -> Any:
    """The target, told to read standard graphs or the shipped ones (a copy: the registry's stays as it is)."""
    import copy

    probe = copy.copy(target)
    probe.standard_ops = standard
    return probe


def latency_folder(folder: Path, rounds: int) -> list[dict[str, Any]]:
    """ONNX Runtime, 1 thread, on the shipped and the standard graph of each variant that has both, side by side."""
    import numpy as np
    import onnxruntime as ort

    from zoo_convert.targets import reference

    ref = reference.load(folder)
    rows = []
    for variant, standard in ref.standard.items():
        shipped = ref.variants.get(variant, {})
        if standard == shipped:
            continue
        sessions: dict[str, dict[str, ort.InferenceSession]] = {}
        for graph, files in (("fused", shipped), ("standard", standard)):
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 1
            opts.inter_op_num_threads = 1
            sessions[graph] = {c: ort.InferenceSession(str(folder / f), opts, providers=["CPUExecutionProvider"])
                               for c, f in files.items()}  # fmt: skip
        first: dict[str, Any] = {}
        for case in ref.cases:  # one short case per component: a merged decoder's cache branch as benchmark times it
            if not case.long:
                first.setdefault(case.component, case)
        feeds = {}
        for comp, case in first.items():
            session = sessions["fused"][comp]
            types = {i.name: i.type for i in session.get_inputs()}
            feeds[comp] = {n: (v.astype(np.float16) if types.get(n) == "tensor(float16)" else v)
                           for n, v in case.feed.items() if n in types}  # fmt: skip

        def once(graph: str) -> float:
            t0 = time.perf_counter()
            for comp, feed in feeds.items():
                sessions[graph][comp].run(None, feed)
            return time.perf_counter() - t0

        for graph in ("fused", "standard"):  # warm-up
            for _ in range(3):
                once(graph)
        times: dict[str, list[float]] = {"fused": [], "standard": []}
        for r in range(rounds):
            order = ("fused", "standard") if r % 2 == 0 else ("standard", "fused")
            for graph in order:
                times[graph].append(once(graph))
        fused, std = statistics.median(times["fused"]), statistics.median(times["standard"])
        rows.append({"folder": str(folder), "model": folder.parent.name.split("__")[-1], "variant": variant,
                     "fused_ms": round(fused * 1000, 4), "standard_ms": round(std * 1000, 4),
                     "ratio": round(std / fused, 4)})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("artifacts", type=Path)
    parser.add_argument("--targets", default="openvino")
    parser.add_argument("--variants", default=None)
    parser.add_argument("--only", default=None, help="comma-separated model names")
    parser.add_argument("--latency", action="store_true", help="time ONNX Runtime on fused vs standard instead")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    found = folders(args.artifacts)
    if args.only:
        keep = set(args.only.split(","))
        found = [f for f in found if f.parent.name.split("__")[-1] in keep]
    variants = args.variants.split(",") if args.variants else None
    rows: list[dict[str, Any]] = []
    ctx = multiprocessing.get_context("spawn")
    with args.out.open("w") as out:
        for folder in found:
            with ProcessPoolExecutor(1, mp_context=ctx) as pool:
                if args.latency:
                    job = pool.submit(latency_folder, folder, args.rounds)
                else:
                    job = pool.submit(check_folder, folder, args.targets.split(","), variants)
                try:
                    got = job.result(timeout=900)
                except (BrokenProcessPool, Exception) as exc:  # noqa: BLE001 - a crashed runtime costs its folder
                    got = [{"folder": str(folder), "model": folder.parent.name.split("__")[-1], "error": repr(exc)[:300]}]
            for row in got:
                out.write(json.dumps(row) + "\n")
                out.flush()
            rows += got
    summarize(rows, latency=args.latency)


def summarize(rows: list[dict[str, Any]], *, latency: bool) -> None:
    if latency:
        for variant in sorted({r["variant"] for r in rows if "ratio" in r}):
            ratios = [r["ratio"] for r in rows if r.get("variant") == variant and "ratio" in r]
            print(f"{variant}: {len(ratios)} models, standard/fused ONNX Runtime latency median {statistics.median(ratios):.3f}"
                  f" (min {min(ratios):.3f}, max {max(ratios):.3f})")  # fmt: skip
        return
    counts: Counter[tuple[str, str, str, str]] = Counter()
    for r in rows:
        if "status" in r:
            counts[r["target"], r["variant"], r["graph"], r["status"]] += 1
    for key, n in sorted(counts.items()):
        print(*key, n, sep="\t")
    errors = [r for r in rows if "error" in r]
    if errors:
        print(f"{len(errors)} folder(s) crashed: {', '.join(r['model'] for r in errors)}", file=sys.stderr)


if __name__ == "__main__":
    main()
