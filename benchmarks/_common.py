"""Helpers shared by the benchmark scripts: the machine's load, the zoo, the verdict line."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

BIN = Path(sys.executable).parent  # the venv's bin/: zoo-convert and optimum-cli live beside python

# Real English for the latency and cosine benchmarks; the first fills 128 tokens of any tokenizer used here.
PASSAGES = (
    "The river runs through the old city from the northern hills to the sea. For centuries it carried grain, "
    "timber and stone to the markets on its banks, and the bridges that cross it were built one after another as "
    "the city grew: a narrow wooden one first, then the stone arches that still stand, and finally the iron bridge "
    "near the station. Today the barges are gone, but people walk along the water in the evening, children feed "
    "the ducks, and in summer the old warehouses host concerts, markets and a festival of films shown on a screen "
    "floating in the middle of the current. The city council plans to open a new footpath that will follow the "
    "river all the way to the coast, so that visitors can walk from the cathedral to the beach in a single day.",
    "How do I reset my password if I no longer have access to the email address on my account?",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The match was postponed because of heavy rain, and the league has not yet announced a new date.",
    "A transformer encoder maps a sequence of tokens to a sequence of contextual vectors.",
    "She quietly closed the kitchen window, made a cup of tea and sat down to read the letter again.",
    "Interest rates rose for the third time this year as the central bank tried to slow inflation.",
    "Add the flour slowly, stirring all the time, until the sauce is thick and smooth.",
)


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


def wait_for_cold_fork_servers(preloads: tuple[str, ...], limit_s: float = 60.0) -> float:
    """Wait until no fork server of these preloads is up: each farm run pays its own warm-up, as a nightly run does.

    A server exits LINGER_S after its last caller; it is found by its command line (its
    ``_serve`` call names the preload), as connecting to it would count as a caller. Returns the CPU seconds
    (user + sys) of the servers seen, with the jobs they forked and reaped: a server is a
    daemon, nobody's child, so ``RUSAGE_CHILDREN`` of the command that started it never counts it.
    """
    named = [f"'{p}'".encode() for p in preloads]
    seen: dict[str, float] = {}
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        up = {}
        for proc in Path("/proc").glob("[0-9]*"):
            cmdline = _read(proc / "cmdline")
            if b"_serve(" in cmdline and any(n in cmdline for n in named) and _owner(proc) == os.getuid():
                up[proc.name] = _read(proc / "stat").rsplit(b")", 1)[-1].split()
        for pid, fields in up.items():
            # the server itself, not its jobs (forked with its command line): it reaps them, their CPU is in its own
            # cutime/cstime. stat(5) fields 4 (ppid) and 14-17 (utime, stime, cutime, cstime), 2 and 12-15 after the name.
            if len(fields) > 14 and fields[1].decode() not in up:
                seen[pid] = sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
        if not up:
            return sum(seen.values())
        time.sleep(0.5)
    raise SystemExit(f"a fork server ({', '.join(preloads)}) is still up after {limit_s:g} s")


def _owner(proc: Path) -> int | None:
    """The uid owning a /proc entry (None once it is gone)."""
    try:
        return proc.stat().st_uid
    except OSError:
        return None


def _read(path: Path) -> bytes:
    """A /proc file's bytes; empty once its process is gone."""
    try:
        return path.read_bytes()
    except OSError:
        return b""


def cpu_model() -> str:
    """The CPU's model name and the int8 instruction sets ORT can use (/proc/cpuinfo): say it next to every latency."""
    name, flags = "unknown CPU", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name == "unknown CPU":
                name = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    has = [flag for flag in ("avx512_vnni", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16") if flag in flags]
    return f"{name} ({', '.join(has) if has else 'no VNNI/AMX'})"


@dataclass
class Measured:
    """One command's cost: wall, CPU (user + sys of it and every child it waited for) and memory.

    Attributes:
        peak_bytes: the larger of two lower bounds of the tree's peak memory: the highest sampled sum of
            PSS over the process and its descendants (a forked child's pages shared with its parent
            count once), and the main process's own high-water mark (VmHWM: exact, between samples too).
        maxrss_bytes: ``ru_maxrss`` from wait4: the largest single process of the tree, a forked child
            counted with the pages it shares with its parent.
        load: the 1-minute load average, mean over the samples.
        sys_s: the kernel's share of ``cpu_s``; minor_faults: the pages the tree touched for the first time (both
            from wait4, the same children). On a VM that hands freed memory back to its host, these move the wall.
        timeline: (seconds since start, tree PSS bytes, processes in the tree) per sample.
    """

    rc: int
    wall_s: float
    cpu_s: float
    peak_bytes: int
    maxrss_bytes: int
    load: float
    sys_s: float = 0.0
    minor_faults: int = 0
    timeline: list[tuple[float, int, int]] = field(default_factory=list)


def measure(cmd: list[str], log: Path, env: dict[str, str] | None = None, interval_s: float = 0.2) -> Measured:
    """Run ``cmd`` (output to ``log``), sampling its process tree's memory every ``interval_s``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        peak_tree = hwm = 0
        loads: list[float] = []
        timeline: list[tuple[float, int, int]] = []
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            tree = _tree(proc.pid)
            pss = sum(_pss(p) for p in tree)
            hwm = max(hwm, status_bytes("VmHWM", proc.pid))
            peak_tree = max(peak_tree, pss)
            loads.append(os.getloadavg()[0])
            timeline.append((round(time.perf_counter() - t0, 2), pss, len(tree)))
            time.sleep(interval_s)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return Measured(
        rc=proc.returncode,
        wall_s=wall,
        cpu_s=usage.ru_utime + usage.ru_stime,
        peak_bytes=max(peak_tree, hwm),
        maxrss_bytes=usage.ru_maxrss * 1024,
        load=sum(loads) / len(loads) if loads else os.getloadavg()[0],
        sys_s=usage.ru_stime,
        minor_faults=usage.ru_minflt,
        timeline=timeline,
    )


def _tree(root: int) -> list[int]:
    """``root`` and its living descendants, from the parent ids in /proc/*/stat."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_bytes().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _pss(pid: int) -> int:
    """Proportional set size in bytes (0 once the process is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def status_bytes(key: str, pid: int | str = "self") -> int:
    """One size field of /proc/PID/status (VmRSS, VmHWM, ...) in bytes; 0 once the process is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(key.encode() + b":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
