"""Helpers shared by the benchmark scripts: the machine's load, the zoo, the verdict line."""

from __future__ import annotations

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
