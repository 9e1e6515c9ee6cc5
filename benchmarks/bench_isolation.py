"""Isolation overhead per job: the same conversion in-process vs in a warm fork-server child; target <= 150 ms.

Both sides start warm: this process imports ``zoo_convert.farm.warm`` (the same
imports and tiny conversion, single-threaded, the fork server preloads) and the
fork server is started and warmed before the clock runs. Then the zoo's bert
(fill-mask, fp32) is converted ``--reps`` times on each side, interleaved, each
into a fresh folder. The overhead is the median of the paired differences
(isolated - in-process); a no-op job (``_jobs.tiny_result``) through the same
layer shows the bare cost of fork + pickle + result file.

    .venv/bin/python benchmarks/bench_isolation.py [--reps 25]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import build_zoo, machine, rss_bytes, verdict, zoo_rows
from _jobs import tiny_result

TARGET_MS = 150.0


def main() -> int:
    """Time both sides interleaved; print each pair; exit 1 over the target."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--model", default="bert", help="zoo model to convert")
    args = ap.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory(prefix="bench-iso-") as tmp:
        manifest = build_zoo(Path(tmp, "zoo"), [args.model])
        task = zoo_rows(manifest)[0]["task"]
        return measure(Path(tmp), Path(tmp, "zoo", args.model), task, args.reps)


def measure(tmp: Path, model: Path, task: str, reps: int) -> int:
    """The interleaved measurement proper."""
    t0 = time.perf_counter()
    import zoo_convert.farm.warm  # noqa: F401 - warms this process exactly as the fork server warms itself
    from zoo_convert.farm.isolation import fork_server, run_isolated
    from zoo_convert.pipeline import convert_one
    from zoo_convert.records import ManifestEntry, Settings

    print(f"in-process warm-up {time.perf_counter() - t0:.1f} s")
    entry = ManifestEntry(source=str(model), task=task, variants=("fp32",))

    def settings(i: int, side: str) -> Settings:
        return Settings(out_dir=str(tmp / f"{side}{i}"))

    t0 = time.perf_counter()
    assert run_isolated(convert_one, entry, settings(-1, "iso")).passed  # starts the fork server, waits its warm-up
    print(f"fork server start + warm-up + first job {time.perf_counter() - t0:.1f} s")
    assert convert_one(entry, settings(-1, "inproc")).passed
    inproc, iso = [], []
    print(f"{'rep':>4} {'in-process s':>13} {'isolated s':>11} {'diff ms':>8}")
    for i in range(reps):
        t0 = time.perf_counter()
        a = convert_one(entry, settings(i, "inproc"))
        inproc.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        b = run_isolated(convert_one, entry, settings(i, "iso"))
        iso.append(time.perf_counter() - t0)
        assert a.passed and b.passed, (a.message, b.message)
        print(f"{i:>4} {inproc[-1]:>13.3f} {iso[-1]:>11.3f} {1000 * (iso[-1] - inproc[-1]):>8.0f}", flush=True)
    noop = []
    for i in range(max(reps, 20)):
        t0 = time.perf_counter()
        assert run_isolated(tiny_result, entry, settings(i, "noop")).passed
        noop.append(time.perf_counter() - t0)
    server_rss = rss_bytes(fork_server().server_pid) / 2**20
    overhead = 1000 * statistics.median(b - a for a, b in zip(inproc, iso))
    noop_ms = 1000 * statistics.median(noop)
    print(f"median in-process {statistics.median(inproc):.3f} s, isolated {statistics.median(iso):.3f} s")
    print(f"median paired overhead {overhead:.0f} ms; no-op job through the layer {noop_ms:.0f} ms"
          f" (min {1000 * min(noop):.0f} ms); fork server RSS {server_rss:.0f} MB")  # fmt: skip
    checks = {f"overhead <= {TARGET_MS:g} ms": overhead <= TARGET_MS}
    return verdict(
        "bench_isolation",
        checks,
        f"isolation overhead {overhead:.0f} ms per job (no-op job {noop_ms:.0f} ms), {reps} reps, target {TARGET_MS:g} ms",
    )


if __name__ == "__main__":
    sys.exit(main())
