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

``--generation`` measures the generation check instead (``zoo_convert.verify.generation``: 16 greedy
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
from collections.abc import Callable
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
    print(machine())
    if args.generation:
        return generation(args)
    models, totals, changed = side_by_side(
        args, lambda rows: rows, (SHORT, "short", ("--no-long-shape",)), (LONG, "long", ()), "bench-verify-"
    )
    ratio = totals[LONG] / totals[SHORT] if totals[SHORT] else float("nan")  # nan: no model was verified
    return verdict(
        "bench_verify_shapes",
        {f"long shape <= {TARGET:g}x the short shapes' verify time": ratio <= TARGET},
        f"{len(models)} models: verify {totals[SHORT]:.1f} s with the short shapes, {totals[LONG]:.1f} s with the long"
        f" one too ({ratio:.2f}x; each model's fastest of {args.repeat} runs); {len(changed)} model+variant statuses differ",
    )


def generation(args: argparse.Namespace) -> int:
    """Verify seconds of the zoo's models with past without and with the generation check, side by side."""

    def with_past(rows: list[dict[str, object]]) -> list[dict[str, object]]:
        kept = [r for r in rows if str(r.get("task") or "").endswith("-with-past")]
        print(f"{len(kept)} of them exported with past: {' '.join(Path(str(r['source'])).name for r in kept)}", flush=True)
        return kept

    models, totals, changed = side_by_side(
        args, with_past, (NO_GEN, "forward", ("--no-generation",)), (GEN, "generation", ()), "bench-generation-"
    )
    ratio = totals[GEN] / totals[NO_GEN] if totals[NO_GEN] else float("nan")  # nan: no model with past among them
    return verdict(
        "bench_verify_shapes --generation",
        {f"generation <= {GENERATION_TARGET:g}x the verify time without it": ratio <= GENERATION_TARGET},
        f"{len(models)} models with past: verify {totals[NO_GEN]:.1f} s without generation, {totals[GEN]:.1f} s with it"
        f" ({ratio:.2f}x; each model's fastest of {args.repeat} runs); {len(changed)} model+variant statuses differ",
    )


Config = tuple[str, str, tuple[str, ...]]  # (name, run label, zoo-convert run flags)


def side_by_side(
    args: argparse.Namespace,
    pick: Callable[[list[dict[str, object]]], list[dict[str, object]]],
    before: Config,
    after: Config,
    prefix: str,
) -> tuple[list[str], dict[str, float], list[tuple[str, str]]]:
    """Both configurations on the same zoo rows, alternating, ``--repeat`` times each; per-model and total verify seconds.

    Returns the models, each configuration's total of each model's fastest run, and the
    (model, variant) pairs whose status differs between them (printed with the message).
    """
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        work = args.keep or Path(tmp)
        rows = pick(zoo_job_rows(args, work))
        runs: dict[str, list[Rows]] = defaultdict(list)
        for i in range(args.repeat):
            order = [before, after]
            for config, label, flags in order if i % 2 == 0 else order[::-1]:
                name = f"{label}-{i + 1}"
                farm = run_farm_cli(name, rows, work, "--no-benchmark", *flags)
                runs[config].append(verify_rows(work / name / "results.duckdb"))
                print(f"{config} run {i + 1}: {farm.wall_s:.0f} s wall, "
                      f"verify {sum(s for s, _, _ in runs[config][-1].values()):.1f} s", flush=True)  # fmt: skip
    first, second = before[0], after[0]
    models = sorted({model for by_key in runs[first] for model, _ in by_key})
    fastest = {config: {m: min(per_model(r).get(m, 0.0) for r in runs[config]) for m in models} for config in runs}
    print(f"\n{'model':28}{first:>22}{second:>24}{'ratio':>8}   (verify s, fastest run of each, summed over variants)")
    for model in models:
        a, b = fastest[first][model], fastest[second][model]
        print(f"{model:28}{a:>22.2f}{b:>24.2f}{b / a if a else float('nan'):>8.2f}")
    totals = {config: sum(fastest[config].values()) for config in (first, second)}
    # Each run's own total too: on a loaded machine one model's fastest run can be either configuration's.
    print("\nverify seconds, all models and variants, per run: "
          + "; ".join(f"{config}: " + ", ".join(f"{sum(s for s, _, _ in r.values()):.1f}" for r in runs[config])
                      for config in (first, second)))  # fmt: skip
    changed = []
    for key in sorted(runs[first][0]):
        status, (_, other, message) = runs[first][0][key][1], runs[second][0].get(key, (0.0, "missing", ""))
        if status != other:
            changed.append(key)
            print(f"status differs: {key[0]} {key[1]}: {status} with {first}, {other} with {second}: {message[:300]}")
    return models, totals, changed


if __name__ == "__main__":
    sys.exit(main())
