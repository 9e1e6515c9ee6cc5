"""What the deployment targets pass and what they cost: the target step per model, per target, on the zoo and at real size.

1. The bundled zoo (``--models N`` spread over it for a quick run; all of it by default) converted by
   ``zoo-convert run --targets none --no-benchmark`` (every variant verified, references saved, no target run).
2. One real-size model, bert-base (random weights, the real configuration; ``_realsize.py`` builds it into
   ``build/realsize/ckpt`` once), converted by ``zoo-convert convert --targets none --no-benchmark --threads 1``.
3. Then, one model at a time, the farm's own target step (``zoo_convert.stages.target.check``: one forked child
   per target, as a job runs it) for each target alone, from a process that imported what a farm job has
   (torch, the pipeline; openvino preloaded as the fork server does): wall and CPU seconds (the children's, node
   included) are that target's added seconds per model.

Printed per target: of the variants ONNX Runtime passed, how many pass there (the share), fail, are unsupported
or not run; the mean, median and largest added seconds per model; the models that cost the most. Target: the
targets together add <= ``--max-s`` (3) CPU seconds per tiny-zoo model on average (the wall is printed beside:
on a quiet machine it is the CPU, one thread each; on a shared one it is inflated by the load). The projection for
``make demo`` (139 models, 2 cores) is printed for information.

    .venv/bin/python benchmarks/bench_targets.py [--models 8] [--targets ort-cpu,openvino,transformers.js]
        [--no-realsize] [--zoo DIR] [--keep DIR] [--max-s 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from _common import (
    BIN,
    add_zoo_options,
    cpu_model,
    machine,
    measure,
    verdict,
    zoo_job_rows,
)
from _realsize import is_built

ROOT = Path(__file__).resolve().parents[1]
CKPT_DIR = ROOT / "build" / "realsize" / "ckpt"
REALSIZE = "bert-base"
DEMO_MODELS, DEMO_CORES = 139, 2


@dataclass
class Tally:
    """One target's rows and seconds over the models it checked."""

    rows: dict[str, int] = field(default_factory=dict)  # status -> rows, of the variants ORT passed
    wall: dict[str, float] = field(default_factory=dict)  # model -> seconds
    cpu: dict[str, float] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)  # model/variant -> message


def children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def convert_zoo(rows: list[dict], work: Path) -> dict[Path, list[tuple[str, str, str | None]]]:
    """The zoo through the farm, every variant verified and its reference saved, no target run: each artifact folder
    with its variants' (variant, status, failure kind) as the DB recorded them."""

    from zoo_convert.manifest import write_manifest

    if (work / "results.duckdb").exists():  # --keep DIR of an earlier run: its conversions are reused
        print(f"reusing the conversions of {work}", flush=True)
        return _recorded(work)
    manifest = write_manifest(rows, work / "manifest.parquet")
    out = work / "artifacts"
    cmd = [str(BIN / "zoo-convert"), "run", str(manifest), "--db", str(work / "results.duckdb"), "--out", str(out),
           "--targets", "none", "--no-benchmark"]  # fmt: skip
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    (work / "farm.log").write_text(done.stdout + done.stderr)
    print(f"zoo converted in {time.perf_counter() - t0:.0f} s (rc {done.returncode}; log {work / 'farm.log'})", flush=True)
    return _recorded(work)


def _recorded(work: Path) -> dict[Path, list[tuple[str, str, str | None]]]:
    import duckdb

    con = duckdb.connect(str(work / "results.duckdb"), read_only=True)
    found: dict[Path, list[tuple[str, str, str | None]]] = {}
    for folder, variant, status, kind in con.execute(
        "SELECT artifacts_dir, variant, status, failure_kind FROM results WHERE artifacts_dir IS NOT NULL"
        " AND variant IS NOT NULL ORDER BY artifacts_dir"
    ).fetchall():
        found.setdefault(Path(folder), []).append((variant, status, kind))
    con.close()
    return found


def convert_realsize(work: Path) -> tuple[Path, list[tuple[str, str, str | None]]] | None:
    """bert-base at real size, built once into build/realsize/ckpt, converted here; its artifact folder."""
    folder = CKPT_DIR / REALSIZE
    if not is_built(REALSIZE, folder):
        print(f"building {REALSIZE} into {folder} ...", flush=True)
        CKPT_DIR.mkdir(parents=True, exist_ok=True)
        built = measure([sys.executable, str(Path(__file__).with_name("_realsize.py")), "build", REALSIZE, str(folder)],
                        CKPT_DIR / f"{REALSIZE}.build.log")  # fmt: skip
        if built.rc != 0:
            print(f"building {REALSIZE} failed; see {CKPT_DIR / f'{REALSIZE}.build.log'}")
            return None
    out = work / "realsize"
    cmd = [str(BIN / "zoo-convert"), "convert", str(folder), "--task", "fill-mask", "--out", str(out),
           "--targets", "none", "--no-benchmark", "--threads", "1"]  # fmt: skip
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    (work / "realsize.log").write_text(done.stdout + done.stderr)
    print(f"{REALSIZE} converted in {time.perf_counter() - t0:.0f} s (rc {done.returncode})", flush=True)
    found = sorted(out.glob("*/*/result.json"))
    if not found:
        return None
    result = json.loads(found[0].read_text())
    return found[0].parent, [(v["variant"], v["status"], v.get("failure_kind")) for v in result.get("variants", [])]


def check_targets(folder: Path, made: list[tuple[str, str, str | None]], names: tuple[str, ...],
                  tallies: dict[str, Tally], label: str) -> None:  # fmt: skip
    """The farm's target step for each target alone on one artifact folder: rows and added seconds."""
    from zoo_convert.records import PASSED, VariantResult
    from zoo_convert.stages import target as stage

    variants = [VariantResult(variant=v, status=status, failure_kind=kind) for v, status, kind in made]
    passed = {v.variant for v in variants if v.status == PASSED}
    if not passed or not (folder / "reference").is_dir():
        return
    exported = SimpleNamespace(out_dir=folder)
    for name in names:
        tally = tallies.setdefault(name, Tally())
        w0, c0 = time.perf_counter(), children_cpu()
        rows = stage.check(exported, variants, (name,))  # type: ignore[arg-type]
        tally.wall[label], tally.cpu[label] = time.perf_counter() - w0, children_cpu() - c0
        for row in rows:
            if row.variant in passed:
                tally.rows[row.status] = tally.rows.get(row.status, 0) + 1
                if row.status != PASSED:
                    tally.failures[f"{label}/{row.variant}"] = f"{row.status}: {(row.message or '')[:90]}"


def report(title: str, tallies: dict[str, Tally], top: int = 3) -> tuple[float, float]:
    """Print one table; return the mean CPU and wall seconds per model of all the targets together."""
    print(f"\n{title}")
    print(f"{'target':16s} {'pass / ORT-passed':>20s} {'failed':>7s} {'unsupp.':>7s} {'not run':>7s}"
          f"   added s per model: {'CPU mean':>8s} {'median':>6s} {'max':>6s} {'wall mean':>9s}")  # fmt: skip
    cpu_total = wall_total = 0.0
    for name, t in tallies.items():
        n = sum(t.rows.values())
        share = f"{t.rows.get('passed', 0)} / {n} ({100 * t.rows.get('passed', 0) / n:.0f} %)" if n else "-"
        cpu, wall = list(t.cpu.values()), list(t.wall.values())
        if not cpu:
            continue
        cpu_total += statistics.fmean(cpu) if cpu else 0.0
        wall_total += statistics.fmean(wall) if wall else 0.0
        print(f"{name:16s} {share:>20s} {t.rows.get('failed', 0):7d} {t.rows.get('unsupported', 0):7d}"
              f" {t.rows.get('not-run', 0):7d}   {'':19s} {statistics.fmean(cpu):8.2f} {statistics.median(cpu):6.2f}"
              f" {max(cpu):6.2f} {statistics.fmean(wall):9.2f}")  # fmt: skip
    print(f"{'all together':16s} {'':>20s} {'':7s} {'':7s} {'':7s}   {'':19s} {cpu_total:8.2f} {'':6s} {'':6s} {wall_total:9.2f}")
    for name, t in tallies.items():
        worst = sorted(t.cpu, key=lambda m: -t.cpu[m])[:top]
        if len(t.cpu) > top:
            print(f"  {name}: most CPU s: " + ", ".join(f"{m} {t.cpu[m]:.2f}" for m in worst))
    return cpu_total, wall_total


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_zoo_options(ap)
    ap.add_argument("--targets", default="ort-cpu,openvino,transformers.js", help="comma-separated (default: the demo's)")
    ap.add_argument("--no-realsize", action="store_true", help=f"skip the real-size {REALSIZE}")
    ap.add_argument("--max-s", type=float, default=3.0, help="target: all targets' mean added CPU s per tiny model")
    ap.add_argument("--failures", action="store_true", help="list every ORT-passed variant a target did not pass")
    args = ap.parse_args(argv)
    print(f"{machine()}; {cpu_model()}", flush=True)

    # What a farm job's process holds when it forks the target children (fork cost grows with the parent).
    import torch  # noqa: F401

    import zoo_convert.pipeline  # noqa: F401
    from zoo_convert import targets

    asked = tuple(args.targets.split(","))
    names = tuple(n for n in asked if targets.get(n).unavailable() is None)
    for n in asked:
        if n not in names:
            print(f"skipped: {targets.get(n).unavailable()}")
        else:
            targets.get(n).preload()  # as the farm's fork server does
    loads: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-targets-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        rows = zoo_job_rows(args, work)
        folders = convert_zoo(rows, work / "zoo-run")
        zoo: dict[str, Tally] = {}
        t0 = time.perf_counter()
        for folder, made in folders.items():
            check_targets(folder, made, names, zoo, folder.parent.name.removeprefix("zoo__"))
            loads.append(os.getloadavg()[0])
        print(f"target step on {len(folders)} models, one at a time: {time.perf_counter() - t0:.0f} s", flush=True)
        cpu_zoo, wall_zoo = report(f"tiny zoo: {len(folders)} models (each target alone, one model at a time)", zoo)
        if args.failures:
            for name, t in zoo.items():
                for key, msg in t.failures.items():
                    print(f"  {name} {key}: {msg}")
        if not args.no_realsize:
            real = convert_realsize(work)
            if real is not None:
                big: dict[str, Tally] = {}
                check_targets(real[0], real[1], names, big, REALSIZE)
                loads.append(os.getloadavg()[0])
                report(f"real size: {REALSIZE} (random weights, the real configuration; fp32, fp16, int8)", big)
                for name, t in big.items():
                    for key, msg in t.failures.items():
                        print(f"  {name} {key}: {msg}")
    demo_s = DEMO_MODELS * cpu_zoo / DEMO_CORES
    print(f"\nmake demo projection: {DEMO_MODELS} models x {cpu_zoo:.2f} CPU s / {DEMO_CORES} cores = +{demo_s:.0f} s"
          " of the farm's wall (its budget for targets and the latency phase together: +139 s)")  # fmt: skip
    load = f"load {min(loads):.1f}-{max(loads):.1f} during the checks" if loads else "no checks ran"
    return verdict(
        "bench_targets",
        {f"targets <= {args.max_s:g} CPU s per tiny model": bool(zoo) and cpu_zoo <= args.max_s},
        f"{', '.join(names)}: {cpu_zoo:.2f} CPU s ({wall_zoo:.2f} s wall) added per tiny-zoo model, all together;"
        f" {cpu_model()}, {load}",
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
