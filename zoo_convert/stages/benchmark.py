"""Benchmark stage: ONNX Runtime latency of every verified variant next to PyTorch eager, each side timed alone.

Each side (PyTorch, then each variant's sessions) is timed in a block of its own:
warm-up, then enough calls for a median that repeats (:func:`_block`), on the same
inputs and the same thread count, its sessions opened for its block and closed
after it. Interleaving the sides call by call (what this stage did before) let
one side's idle threads compete with the next side's: ONNX Runtime's pool spin-waits
after a run, and at two threads PyTorch's bert read 10x slower than at one. Blocks
are fair only if the machine is the same for all of them, so in a farm the stage
runs in the node's latency phase (``forked.alone_on_node``: no conversion runs on the
node meanwhile, other benchmarks only on other CPUs), and every measurement records how many CPUs
other processes kept busy during it (/proc/stat less this process's own time).
PyTorch is timed once per job, not once per variant. A model whose weights are stored outside its graph
(over ``Settings.external_data_threshold``) is not held beside the torch model:
PyTorch is timed alone once its references are computed (:func:`time_torch_alone`,
outside the latency phase) and released before optimize, whose children would otherwise
add each variant's copy to it (llama-style, 2.3 GB of weights: held, the parent's 2.8 GB
beside the fp16 child's 4.2 GB made a 7.1 GB peak; timed first, 4.8 GB).

Every measurement carries its conditions: calls, p50, p90, spread (IQR / p50),
threads, batch x length, CPU model and the other processes' busy CPUs during it. A side is
sampled until its median is pinned down: the median's 95 % confidence interval narrower than
:data:`NOISY_CI` of it (:func:`median_ci`), or its time budget is spent. It is noisy when the
interval is still wider, or others kept more CPUs busy than the measurement left free (plus
:data:`NOISY_OTHERS_SLACK`); noisy figures stay in the record but are left out of the dashboard's
speedup headline, the ``slower`` regressions and the model card.

The inputs are verify's (:func:`zoo_convert.verify.runtime.cases`, memoized, computed by
``verify.references`` before any variant was made): valid shapes for the
modality, capped by the config's position table. A benchmark never fails a
verified variant: whatever goes wrong while timing leaves its latency empty with
the reason in ``Latency.note``.
"""

from __future__ import annotations

import bisect
import functools
import gc
import itertools
import math
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .. import node
from ..errors import first_line, is_our_bug
from ..records import Settings
from ..verify.runtime import (
    ENCODER_OUTPUT_INPUTS,
    Branch,
    Case,
    TorchAlone,
    as_loaded_forward,
    audio_encoder,
    cases,
    feed_for,
    ort_session,
    torch_threads,
)
from . import Artifact, Component, ExportedModel, Latency, Timing

if TYPE_CHECKING:
    from onnxruntime import InferenceSession

BENCH_BATCH = 1
BENCH_SEQUENCE = 128
# One second of 16 kHz audio for raw-waveform models.
BENCH_AUDIO_SAMPLES = 16000
MIN_RUNS = 5
# Per side: untimed calls for at least this long, then timed samples for at least MIN_TIMED_S (bench_runs samples at
# least), then more until the median is pinned down (NOISY_CI) or the budget is spent.
WARMUP_S = 0.02
MIN_TIMED_S = 0.05
MAX_RUNS = 2000  # timed calls per side at most (a call of nothing would run forever to MIN_TIMED_S)
# One sample is as many back-to-back calls as last this long (one call when a call is longer): a tiny graph's
# call lasts tens of microseconds, and one slow call (a page fault, a timer tick, a neighbour's burst) is a
# sample of its own when calls are timed one by one. In the farm's latency phase on the 2-core VM, per-call
# spreads of 0.2-0.75 (IQR / p50) came down to 0.02-0.15 (make demo, quiet: fp32 rows noisy 122 -> 12 of 136,
# together with BLOCKS and the target checks no longer reloading their runtimes in the phase). 2.5 ms since the
# median's interval decides how many samples a side takes: 20 samples are 50 ms of a tiny graph.
SAMPLE_S = 0.0025
# A side's median is trusted when its 95 % confidence interval is narrower than this share of it (+-5 %). It
# replaced "IQR / p50 above 0.15": a side whose calls spread by nature (t5's PyTorch decoder step, IQR 0.16 in
# block after block on a quiet machine) was noisy however long it was timed; sampled on, its median is known as
# precisely as any other's, and a side with little spread needs no more than bench_runs samples. Neither rule sees
# a process running slower than the next (docs/how-a-job-runs.md: the same job's p50 between runs).
NOISY_CI = 0.10
# ... or during which other processes kept more CPUs busy than the measurement left free, plus this slack
# (a farm's own daemons: raylet, the driver's loop).
NOISY_OTHERS_SLACK = 0.25
# Blocks a side is timed in at most, while they come out noisy (see _measure).
BLOCKS = 3
TORCH = "torch"


def bench_cases(exported: ExportedModel, settings: Settings) -> list[tuple[Component, Case]]:
    """The inputs of one timed iteration, one case per component (a merged decoder's cache branch).

    The decoder of an audio encoder is fed as a user's pipeline feeds it (optimum's
    ORTModelForSpeechSeq2Seq): the encoder's PyTorch output on the benchmark's audio, a
    cross-attention cache as long, and the encoder's attention mask. Generated on its own, its
    encoder side would be as long as its tokens, which the audio's frames are not (moonshine:
    40 frames of 1 s against 128 tokens, a broadcast error in every variant).
    """
    found: list[tuple[Component, Case]] = []
    fixed = settings.shapes
    shape = (fixed.get("batch_size", BENCH_BATCH), fixed.get("sequence_length", BENCH_SEQUENCE))
    audio = fixed.get("audio_sequence_length", BENCH_AUDIO_SAMPLES)
    encoded: Case | None = None
    for comp in exported.components:
        config = comp.onnx_config
        if encoded is not None and config is not None and any(n in config.inputs for n in ENCODER_OUTPUT_INPUTS):
            # A decoder fed by an audio encoder: fed what the encoder made of the audio, as a user's pipeline is.
            by_branch = cases(exported, comp, *shape, settings, audio_samples=audio, reference=False, encoded=encoded)
        else:
            # An audio encoder's output is what its decoder is fed: its PyTorch output is wanted (nothing is
            # compared). Otherwise inputs only: PyTorch's outputs at the benchmark's shape are never compared.
            feeds = len(exported.components) > 1 and config is not None and audio_encoder(config)
            by_branch = cases(exported, comp, *shape, settings, audio_samples=audio, reference=feeds)
            encoded = by_branch[Branch.WHOLE] if feeds else encoded
        # A merged decoder is timed on its cache branch: one step after the prompt.
        found.append((comp, by_branch[Branch.CACHE] if Branch.CACHE in by_branch else by_branch[Branch.WHOLE]))
    return found


def benchmark(exported: ExportedModel, artifacts: list[Artifact], settings: Settings) -> dict[str, Latency]:
    """p50/p90 of one forward pass of each artifact and of PyTorch, batch 1, sequence 128 (vision: the processor's size).

    One timed iteration runs every component once, in order, on the inputs
    verify generates (memoized, so PyTorch and ORT see identical tensors):

    * single-graph models: ``model``;
    * decoders with past: one step of 128 new tokens over a 128-token cache
      (clamped to the position table), the shape optimum validates with;
    * encoder-decoders: the encoder on 128 tokens plus one decoder step over a
      128-token cache (the cache branch of a merged decoder), i.e. the cost
      of the first generated token after the prompt; an audio encoder on 1 s of
      audio (whisper: its 30 s window), its decoder fed what the encoder made of it
      (:func:`bench_cases`).

    Each side is timed in a block of its own (:func:`_block`): PyTorch eager under
    ``torch.inference_mode`` on ``settings.threads`` threads, then each variant's
    sessions, opened for their block and closed after it, on as many intra-op threads.
    Returns a Latency per artifact variant; one that could not be timed has its reason in ``note``.
    """
    conditions = _Conditions(threads=settings.threads, cpu=node.cpu_model())
    try:
        steps = bench_cases(exported, settings)
    except Exception as exc:  # noqa: BLE001 - no inputs, no latency: every variant says why
        return {a.variant: _unmeasured(conditions, exc) for a in artifacts}
    conditions.shape = steps[0][1].label.split("/")[0] if steps else ""
    times: dict[str, list[float]] = {}
    notes: dict[str, tuple[str, str | None]] = {}
    loads: list[float] = []
    alone = exported.cache.torch_alone
    if alone is not None:  # timed before optimize; the torch model is gone
        times[TORCH] = list(alone.ms)
        loads.append(alone.load)
        if alone.failed is not None:
            notes[TORCH] = alone.failed
    else:
        _measure(TORCH, lambda: _torch_side(steps, settings), settings, times, notes, loads)
    for art in artifacts:
        _measure(art.variant, functools.partial(_ort_side, art, steps, settings), settings, times, notes, loads)
    conditions.load = max(loads, default=0.0)
    torch_timing = _timing(times[TORCH]) if times.get(TORCH) and TORCH not in notes else None
    results = {}
    for art in artifacts:
        why = notes.get(art.variant) or (notes.get(TORCH) if torch_timing is None else None)
        ort_timing = _timing(times[art.variant]) if times.get(art.variant) and art.variant not in notes else None
        results[art.variant] = conditions.latency(ort_timing, torch_timing, why)
    return results


def _measure(
    side: str,
    make: Callable[[], Callable[[], None]],
    settings: Settings,
    times: dict[str, list[float]],
    notes: dict[str, tuple[str, str | None]],
    loads: list[float],
) -> None:
    """Make one side (its sessions, or the torch call), time it in its block, and let it go before the next side.

    A block that came out noisy is timed again, up to :data:`BLOCKS` blocks: on a VM's shared
    cores a neighbour's burst of a second or two slows every call in it (seen here: a tiny
    graph's p50 at 1.9x, alone in the farm). The block kept is the fastest of those that are
    not noisy (``timeit``'s advice: the slower repeats are the interference), else the one whose median is pinned down best.
    """
    try:
        call = make()
    except Exception as exc:  # noqa: BLE001 - this side goes unmeasured, the others are timed
        notes[side] = _why(exc)
        return
    blocks: list[tuple[bool, float, list[float], float]] = []
    try:
        while len(blocks) < BLOCKS and not any(not noisy for noisy, *_ in blocks):
            ms, others = _block(call, settings)
            timing = _timing(ms)
            noisy = _noisy(others, timing, settings.threads)
            blocks.append((noisy, timing.ci if noisy else timing.p50_ms, ms, others))
    except Exception as exc:  # noqa: BLE001 - recorded as this side's reason
        notes[side] = _why(exc)
        return
    finally:
        del call  # its sessions close before the next side's open
    _, _, times[side], others = min(blocks, key=lambda b: (b[0], b[1]))
    loads.append(others)


def time_torch_alone(exported: ExportedModel, settings: Settings) -> None:
    """Time PyTorch now, alone, for a model :func:`too_big_to_hold`; the benchmark uses this figure.

    Called once verify's references are computed; the caller then releases the torch model.
    Never raises: a failure is kept as PyTorch's note for every variant.
    """
    times: dict[str, list[float]] = {}
    notes: dict[str, tuple[str, str | None]] = {}
    loads: list[float] = []
    _measure(TORCH, lambda: _torch_side(bench_cases(exported, settings), settings), settings, times, notes, loads)
    exported.cache.torch_alone = TorchAlone(tuple(times.get(TORCH, ())), notes.get(TORCH), max(loads, default=0.0))


def too_big_to_hold(exported: ExportedModel, settings: Settings) -> bool:
    """Whether the model is too big to hold its torch model through optimize, or two sessions at once."""
    weights = exported.details.get("weights_bytes")
    return isinstance(weights, int) and weights > settings.external_data_threshold


@dataclass
class _Conditions:
    threads: int
    cpu: str
    shape: str = ""
    load: float = 0.0

    def latency(self, ort: Timing | None, torch: Timing | None, why: tuple[str, str | None] | None) -> Latency:
        noisy = any(_noisy(self.load, t, self.threads) for t in (ort, torch))
        return Latency(
            ort=ort,
            torch=torch,
            threads=self.threads,
            shape=self.shape,
            cpu=self.cpu,
            load=round(self.load, 2),
            noisy=noisy and ort is not None,
            note=why[0] if why else None,
            traceback=why[1] if why else None,
        )


def _noisy(others: float, timing: Timing | None, threads: int) -> bool:
    """The median not pinned down, or other processes kept busy more CPUs than the measurement left free."""
    free = max(0, _cpus() - threads)  # the farm's other benchmark lanes among them: each on CPUs of its own
    return others > free + NOISY_OTHERS_SLACK or (timing is not None and timing.ci > NOISY_CI)


def _unmeasured(conditions: _Conditions, exc: BaseException) -> Latency:
    return conditions.latency(None, None, _why(exc))


def _why(exc: BaseException) -> tuple[str, str | None]:
    """A note for the record; a bug of ours says so and keeps its traceback."""
    if is_our_bug(exc):
        return f"internal: {first_line(exc)}", "".join(traceback.format_exception(exc))
    return f"not timed: {first_line(exc)}", None


def _torch_side(steps: list[tuple[Component, Case]], settings: Settings) -> Callable[[], None]:
    """PyTorch eager over the components, as loaded: the forward verify's reference runs.

    Fed and read as the export's patcher does (tuple caches in, the graph's outputs), never
    with its changes to the computation (``runtime.as_loaded_forward``).
    Timed as loaded: verify's shorter inputs may have switched a model's mode.
    """
    import torch

    for comp, _ in steps:
        if comp.torch_module is None:
            raise RuntimeError(f"the torch module of {comp.name} was released before the benchmark")
        if comp.as_loaded is not None:
            comp.as_loaded.restore()

    def run() -> None:
        with torch_threads(settings.threads), torch.inference_mode():
            for comp, case in steps:
                # One patcher per call, as the reference's: each sets use_cache on the modules it feeds.
                as_loaded_forward(comp, case.config)(**case.torch_inputs)

    return run


def _ort_side(art: Artifact, steps: list[tuple[Component, Case]], settings: Settings) -> Callable[[], None]:
    """One session per component of ``art``, held by the returned call until it is dropped."""
    from ..errors import BenchmarkError

    runs: list[tuple[InferenceSession, dict[str, np.ndarray]]] = []
    for comp, case in steps:
        path = art.files.get(comp.name)
        if path is None:
            raise BenchmarkError(f"{art.variant} has no graph for component {comp.name!r}")
        session = ort_session(path, threads=settings.threads, providers=settings.providers)
        runs.append((session, feed_for(session, case, comp)))

    def run() -> None:
        for session, feed in runs:
            session.run(None, feed)

    return run


def _block(call: Callable[[], None], settings: Settings) -> tuple[list[float], float]:
    """Milliseconds per call of one side, one figure per sample, timed in a block of its own; and the CPUs other
    processes kept busy meanwhile.

    Warm-up first: at least ``bench_warmup`` calls and :data:`WARMUP_S` seconds (the first
    calls pay allocations and, in ONNX Runtime, its thread pool's start); it also tells how
    many calls make a sample of :data:`SAMPLE_S` (one where a call is longer). Then timed
    samples, the garbage collector off (as ``timeit``: a collection is not the model's cost),
    until there are ``bench_runs`` of them and :data:`MIN_TIMED_S` seconds of them and their median's
    interval is within :data:`NOISY_CI` (:func:`median_ci`), or,
    after :data:`MIN_RUNS`, once ``bench_budget_s`` is spent: one big graph should not
    hold the node's latency phase. No other side runs in between, so no side's threads
    (ONNX Runtime's spin-waiting pool, PyTorch's OpenMP pool) compete with another's.
    """
    warm_until = time.perf_counter() + min(WARMUP_S, settings.bench_budget_s / 4)
    per_call = float("inf")  # the fastest warm-up call: the first ones pay for allocations
    for warm in itertools.count(1):
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
        per_call = min(per_call, t1 - t0)
        if warm >= settings.bench_warmup and t1 >= warm_until:
            break
    wanted = max(MIN_RUNS, settings.bench_runs)
    batch = max(1, min(MAX_RUNS // wanted, int(SAMPLE_S / per_call) if per_call > 0 else MAX_RUNS))
    busy = _Busy()
    ms: list[float] = []
    ordered: list[float] = []  # the samples sorted, for the median's interval after each one
    spent = 0.0
    collecting = gc.isenabled()
    gc.disable()
    try:
        while len(ms) < max(wanted, MAX_RUNS // batch):
            if len(ms) >= max(1, settings.bench_runs) and spent >= MIN_TIMED_S and _ci_of_sorted(ordered) <= NOISY_CI:
                break
            if len(ms) >= MIN_RUNS and spent > settings.bench_budget_s:
                break
            t1 = time.perf_counter()
            for _ in range(batch):
                call()
            elapsed = time.perf_counter() - t1
            ms.append(elapsed * 1000.0 / batch)
            bisect.insort(ordered, ms[-1])
            spent += elapsed
    finally:
        if collecting:
            gc.enable()
    return ms, busy.others()


class _Busy:
    """CPUs kept busy by other processes since this was made: the node's busy time (:func:`zoo_convert.node.busy_s`) less this
    process's."""

    def __init__(self) -> None:
        self.t0, self.machine0, self.own0 = time.perf_counter(), node.busy_s(), _own_cpu_s()

    def others(self) -> float:
        wall = time.perf_counter() - self.t0
        busy = node.busy_s()
        if wall <= 0 or busy is None or self.machine0 is None:
            return _load()  # no /proc/stat: the load average is the best there is
        return max(0.0, (busy - self.machine0 - (_own_cpu_s() - self.own0)) / wall)


def _own_cpu_s() -> float:
    """CPU-seconds of this process, every thread (ONNX Runtime's and PyTorch's pools included)."""
    t = os.times()
    return t.user + t.system


def _timing(ms: list[float]) -> Timing:
    q1, p50, q3, p90 = (float(np.percentile(ms, q)) for q in (25, 50, 75, 90))
    return Timing(p50_ms=round(p50, 4), p90_ms=round(p90, 4), runs=len(ms),
                  spread=round((q3 - q1) / p50, 4) if p50 > 0 else 0.0, ci=round(median_ci(ms), 4))  # fmt: skip


def median_ci(ms: list[float]) -> float:
    """The width of the median's ~95 % confidence interval over the median, from the samples' order statistics.

    No distribution assumed: with n samples the median lies between the order statistics
    n/2 - 0.98 sqrt(n) and n/2 + 1 + 0.98 sqrt(n) (1-based) with ~95 % confidence, whatever
    the samples' distribution. 20 samples make it about their IQR; it narrows as sqrt(n), so a side
    whose calls spread is pinned down by more samples. Up to 10 samples it is their whole range.
    """
    return _ci_of_sorted(sorted(ms))


def _ci_of_sorted(ordered: list[float]) -> float:
    n = len(ordered)
    if n == 0:
        return math.inf
    half = 0.98 * math.sqrt(n)
    lo = max(0, math.floor(n / 2 - half) - 1)
    hi = min(n - 1, math.ceil(n / 2 + 1 + half) - 1)
    mid = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
    return (ordered[hi] - ordered[lo]) / mid if mid > 0 else 0.0


def _cpus() -> int:
    """The node's CPUs (its cgroup's cpuset and quota, :func:`zoo_convert.node.cpus`); not this process's affinity, which a
    farm's latency phase pins to its benchmark lane (farm.isolation.pin_tree) while other lanes are timed on the other
    CPUs."""
    return node.cpus().count


def _load() -> float:
    """The 1-minute load average (0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0
