"""Helpers shared by the benchmark scripts: the machine's load, the zoo, the verdict line."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pyarrow.parquet as pq

BIN = Path(sys.executable).parent  # the venv's bin/: zoo-convert and optimum-cli live beside python


def machine() -> str:
    """CPUs and load averages: the numbers mean little without them."""
    one, five, fifteen = os.getloadavg()
    return f"{os.cpu_count()} CPUs, load average {one:.1f} / {five:.1f} / {fifteen:.1f} (1 / 5 / 15 min)"


def rss_bytes(pid: int | str = "self") -> int:
    """Current resident memory of a process (Linux /proc)."""
    with open(f"/proc/{pid}/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def build_zoo(out: Path, only: list[str] | None = None) -> Path:
    """Build the bundled zoo (or some of it) into ``out``; returns its manifest."""
    from zoo_convert import zoo

    return zoo.build(out, only)


def zoo_rows(manifest: Path) -> list[dict]:
    """The rows of a zoo manifest, in zoo order."""
    return pq.read_table(manifest).to_pylist()


def add_zoo_options(ap: argparse.ArgumentParser) -> None:
    """``--models``, ``--zoo`` and ``--keep``: the options of the scripts that run the bundled zoo."""
    ap.add_argument("--models", type=int, help="how many zoo models, evenly spread over the zoo (default: all)")
    ap.add_argument("--zoo", type=Path, help="an already built zoo (default: build one in a temp folder)")
    ap.add_argument("--keep", type=Path, help="work here and keep the logs, DBs and artifacts")


def zoo_job_rows(args: argparse.Namespace, work: Path) -> list[dict]:
    """The manifest rows of ``--zoo`` (else a zoo built under ``work``), ``--models`` of them, with absolute sources."""
    zoo_dir = args.zoo or work / "zoo"
    if args.zoo is None:
        build_zoo(zoo_dir)
    base = spread(zoo_rows(zoo_dir / "manifest.parquet"), args.models)
    rows = [{**r, "source": str((zoo_dir / r["source"]).resolve())} for r in base]
    print(f"{len(rows)} models: {' '.join(Path(r['source']).name for r in rows)}", flush=True)
    return rows


def spread(items: list, n: int | None) -> list:
    """``n`` items evenly spaced over ``items`` (all of them when n is None), so every family is sampled."""
    if n is None or n >= len(items):
        return list(items)
    return [items[round(i * (len(items) - 1) / max(1, n - 1))] for i in range(n)] if n > 1 else items[:1]


def verdict(name: str, checks: dict[str, bool], summary: str) -> int:
    """Print the one-line result (last line of every script) and return the exit status."""
    missed = [k for k, ok in checks.items() if not ok]
    word = "PASS" if not missed else "FAIL (missed: " + ", ".join(missed) + ")"
    print(f"{name}: {word}: {summary}", flush=True)
    return 1 if missed else 0
