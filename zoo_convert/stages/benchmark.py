"""Benchmark stage: ONNX Runtime and PyTorch eager latency on the same inputs."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..errors import BenchmarkError, ZooConvertError, is_our_bug
from ..records import Settings
from ..runtime import Branch, Case, cases, feed_for, session_for, torch_threads
from . import Artifact, Component, ExportedModel, Latency

if TYPE_CHECKING:
    from onnxruntime import InferenceSession

BENCH_BATCH = 1
BENCH_SEQUENCE = 128
# One second of 16 kHz audio for raw-waveform models.
BENCH_AUDIO_SAMPLES = 16000
MIN_RUNS = 5


def benchmark(exported: ExportedModel, artifact: Artifact, settings: Settings) -> Latency:
    """p50/p90 of one forward pass, batch 1, sequence 128 (vision: the processor's size).

    One timed iteration runs every component once, in order, on the inputs
    verify generates (memoized, so PyTorch and ORT see identical tensors):

    * single-graph models: ``model``;
    * decoders with past: one step of 128 new tokens over a 128-token cache
      (clamped to the position table), the shape optimum validates with;
    * encoder-decoders: the encoder on 128 tokens plus one decoder step over a
      128-token cache (the cache branch of a merged decoder), i.e. the cost
      of the first generated token after the prompt.

    PyTorch runs eager under ``torch.inference_mode`` with the same thread count as ORT.
    """
    try:
        steps: list[_Step] = []
        for comp in exported.components:
            found = cases(exported, comp, BENCH_BATCH, BENCH_SEQUENCE, settings, audio_samples=BENCH_AUDIO_SAMPLES)
            # A merged decoder is timed on its cache branch: one step after the prompt.
            case = found[Branch.CACHE] if Branch.CACHE in found else found[Branch.WHOLE]
            session = session_for(exported, artifact, comp, settings)
            steps.append((comp, case, session, feed_for(session, case, comp)))

        def run_ort() -> None:
            for _, _, session, feed in steps:
                session.run(None, feed)

        ort_ms = _timings(run_ort, settings)
        torch_ms = _torch_timings(steps, settings)
    except ZooConvertError as exc:
        raise BenchmarkError(exc.message) from exc
    except Exception as exc:  # noqa: BLE001 - any runtime failure while timing is a benchmark error
        if is_our_bug(exc):
            raise
        raise BenchmarkError(f"{type(exc).__name__}: {exc}") from exc
    return Latency(
        ort_p50_ms=_pct(ort_ms, 50),
        ort_p90_ms=_pct(ort_ms, 90),
        torch_p50_ms=_pct(torch_ms, 50),
        torch_p90_ms=_pct(torch_ms, 90),
    )


# One component's part of a timed iteration: its inputs, its session and its feed.
_Step = tuple[Component, Case, "InferenceSession", dict[str, np.ndarray]]


def _torch_timings(steps: list[_Step], settings: Settings) -> list[float]:
    """PyTorch eager over the same components, patched as for export (tuple caches in, same outputs).

    Each component is patched only around its own call: the patchers of an
    encoder and of the whole seq2seq model that contains it cannot be nested.
    Timed as loaded: verify's shorter inputs may have switched a model's mode.
    """
    import torch

    for comp, _, _, _ in steps:
        if comp.as_loaded is not None:
            comp.as_loaded.restore()

    def run_torch() -> None:
        for comp, case, _, _ in steps:
            with case.config.patch_model_for_export(comp.torch_module):
                comp.torch_module(**case.torch_inputs)

    with torch_threads(settings.threads), torch.inference_mode():
        return _timings(run_torch, settings)


def _timings(fn: Callable[[], None], settings: Settings) -> list[float]:
    """Milliseconds of up to ``bench_runs`` calls after the warm-up ones.

    A slow model stops early once ``bench_budget_s`` is spent (after at least
    MIN_RUNS calls): the farm's throughput should not hinge on one big graph.
    """
    for _ in range(settings.bench_warmup):
        fn()
    times: list[float] = []
    spent = 0.0
    while len(times) < max(1, settings.bench_runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
        spent += times[-1] / 1000.0
        if len(times) >= MIN_RUNS and spent > settings.bench_budget_s:
            break
    return times


def _pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 4)
