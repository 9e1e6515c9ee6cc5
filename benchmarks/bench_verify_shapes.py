"""What the long verify shape costs: the bundled zoo's verify time with and without it.

``zoo-convert run --no-benchmark`` (all variants) on the bundled zoo, on a fresh DB
each time, with ``--no-long-shape`` (the two short shapes) and without it (the
short shapes plus one long shape per component, at the length the model is used
at: README, verify), alternating, ``--repeat`` times (2). Each run starts with no
fork server up. The figure is the sum over all models and variants of the verify
stage's seconds (``results.verify_s``) as recorded in each DB, not wall time: it
is what the long shape adds to each job. The machine may be shared: each model's
figure is its fastest run of each configuration (a neighbour only ever adds
time), and the verdict compares the sums of those.

It also lists each model+variant whose status differs between the two
configurations; those that pass at the short shapes and fail only at the long one
carry the ``long inputs only`` message.

Target: the long shape at most doubles the zoo's verify time.

``--generation`` measures the generation check instead (``zoo_convert.generation``: 16 greedy
steps on ONNX Runtime's own cache against PyTorch generate()), over the zoo's decoders and
encoder-decoders exported with past only: ``--no-generation`` against the default, both with
the long shape, side by side in one run. Target: it adds at most half of their verify time.

    .venv/bin/python benchmarks/bench_verify_shapes.py [--models N] [--zoo DIR] [--repeat 2] [--generation]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import duckdb
from _common import add_zoo_options, machine, verdict, zoo_job_rows
from bench_zoo import run_farm_cli

TARGET = 2.0
SHORT, LONG = "short shapes", "short + long"
GENERATION_TARGET = 1.5
NO_GEN, GEN = "one forward a shape", "+ 16 generation steps"


# (model, variant) -> (verify seconds, status, message)
Rows = dict[tuple[str, str], tuple[float, str, str]]


def verify_rows(db: Path) -> Rows:
    """(model, variant) -> (verify seconds, status, message) from one run's DB."""
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute(
        "SELECT source, variant, coalesce(verify_s, 0), status, coalesce(message, '') FROM results WHERE variant IS NOT NULL"
    ).fetchall()
    con.close()
    return {(Path(src).name, variant): (seconds, status, message) for src, variant, seconds, status, message in rows}


def per_model(run: Rows) -> dict[str, float]:
    """Verify seconds per model, summed over its variants."""
    found: dict[str, float] = defaultdict(float)
    for (model, _), (seconds, _, _) in run.items():
        found[model] += seconds
    return found


def main() -> int:
    """Run both configurations; print per-model and total verify seconds; exit 1 when the target is missed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_zoo_options(ap)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each configuration, alternating")
    ap.add_argument("--generation", action="store_true",
                    help="measure the generation check over the zoo's models with past instead of the long shape")
    args = ap.parse_args()
    if args.generation:
        return generation(args)
    print(machine())
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        work = args.keep or Path(tmp)
        rows = zoo_job_rows(args, work)
        runs: dict[str, list[Rows]] = defaultdict(list)
        for i in range(args.repeat):
            order = [(SHORT, ("--no-long-shape",)), (LONG, ())]
            for config, flags in order if i % 2 == 0 else order[::-1]:
                label = f"{'short' if config == SHORT else 'long'}-{i + 1}"
                farm = run_farm_cli(label, rows, work, "--no-benchmark", *flags)
                runs[config].append(verify_rows(work / label / "results.duckdb"))
                print(f"{config} run {i + 1}: {farm.wall_s:.0f} s wall, "
                      f"verify {sum(s for s, _, _ in runs[config][-1].values()):.1f} s", flush=True)  # fmt: skip

    models = sorted({model for by_key in runs[SHORT] for model, _ in by_key})
    fastest = {config: {m: min(per_model(r).get(m, 0.0) for r in runs[config]) for m in models} for config in runs}
    print(f"\n{'model':28}{'short verify s':>16}{'long verify s':>16}{'ratio':>8}   (fastest run of each, summed over variants)")
    for model in models:
        short, long = fastest[SHORT][model], fastest[LONG][model]
        print(f"{model:28}{short:>16.2f}{long:>16.2f}{long / short if short else float('nan'):>8.2f}")
    totals = {config: sum(fastest[config].values()) for config in (SHORT, LONG)}
    ratio = totals[LONG] / totals[SHORT]
    print("\nverify seconds, all models and variants, per run: "
          + "; ".join(f"{config}: " + ", ".join(f"{sum(s for s, _, _ in r.values()):.1f}" for r in runs[config])
                      for config in (SHORT, LONG)))  # fmt: skip
    changed = []
    for key in sorted(runs[SHORT][0]):
        short_status, long_status = runs[SHORT][0][key][1], runs[LONG][0].get(key, (0.0, "missing", ""))[1]
        if short_status != long_status:
            changed.append(key)
            print(f"status differs: {key[0]} {key[1]}: {short_status} with the short shapes, {long_status} with the long "
                  f"one: {runs[LONG][0].get(key, (0, '', ''))[2][:300]}")  # fmt: skip
    checks = {f"long shape <= {TARGET:g}x the short shapes' verify time": ratio <= TARGET}
    return verdict(
        "bench_verify_shapes",
        checks,
        f"{len(models)} models: verify {totals[SHORT]:.1f} s with the short shapes, {totals[LONG]:.1f} s with the long"
        f" one too ({ratio:.2f}x; each model's fastest of {args.repeat} runs); {len(changed)} model+variant statuses differ",
    )


def generation(args: argparse.Namespace) -> int:
    """Verify seconds of the zoo's models with past without and with the generation check, side by side."""
    print(machine())
    with tempfile.TemporaryDirectory(prefix="bench-generation-") as tmp:
        work = args.keep or Path(tmp)
        rows = [r for r in zoo_job_rows(args, work) if str(r.get("task") or "").endswith("-with-past")]
        print(f"{len(rows)} of them exported with past: {' '.join(Path(r['source']).name for r in rows)}", flush=True)
        runs: dict[str, list[Rows]] = defaultdict(list)
        for i in range(args.repeat):
            order = [(NO_GEN, ("--no-generation",)), (GEN, ())]
            for config, flags in order if i % 2 == 0 else order[::-1]:
                label = f"{'forward' if config == NO_GEN else 'generation'}-{i + 1}"
                farm = run_farm_cli(label, rows, work, "--no-benchmark", *flags)
                runs[config].append(verify_rows(work / label / "results.duckdb"))
                print(f"{config} run {i + 1}: {farm.wall_s:.0f} s wall, "
                      f"verify {sum(s for s, _, _ in runs[config][-1].values()):.1f} s", flush=True)  # fmt: skip
    models = sorted({model for by_key in runs[NO_GEN] for model, _ in by_key})
    fastest = {config: {m: min(per_model(r).get(m, 0.0) for r in runs[config]) for m in models} for config in runs}
    print(f"\n{'model':28}{'verify s':>12}{'+ generation s':>16}{'ratio':>8}   (fastest run of each, summed over variants)")
    for model in models:
        before, after = fastest[NO_GEN][model], fastest[GEN][model]
        print(f"{model:28}{before:>12.2f}{after:>16.2f}{after / before if before else float('nan'):>8.2f}")
    totals = {config: sum(fastest[config].values()) for config in (NO_GEN, GEN)}
    ratio = totals[GEN] / totals[NO_GEN]
    # Each run's own total too: on a loaded machine one model's fastest run can be either configuration's.
    print("\nverify seconds, all models and variants, per run: "
          + "; ".join(f"{config}: " + ", ".join(f"{sum(s for s, _, _ in r.values()):.1f}" for r in runs[config])
                      for config in (NO_GEN, GEN)))  # fmt: skip
    changed = []
    for key in sorted(runs[NO_GEN][0]):
        before_status, after = runs[NO_GEN][0][key][1], runs[GEN][0].get(key, (0.0, "missing", ""))
        if before_status != after[1]:
            changed.append(key)
            print(f"status differs: {key[0]} {key[1]}: {before_status} without generation, {after[1]} with it: {after[2][:300]}")
    return verdict(
        "bench_verify_shapes --generation",
        {f"generation <= {GENERATION_TARGET:g}x the verify time without it": ratio <= GENERATION_TARGET},
        f"{len(models)} models with past: verify {totals[NO_GEN]:.1f} s without generation, {totals[GEN]:.1f} s with it"
        f" ({ratio:.2f}x; each model's fastest of {args.repeat} runs); {len(changed)} model+variant statuses differ",
    )


if __name__ == "__main__":
    sys.exit(main())
