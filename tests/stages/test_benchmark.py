"""Benchmark stage: each side timed in a block of its own, its time budget, and when a measurement is noisy."""

from __future__ import annotations

import dataclasses
import itertools
import os
import time

import numpy as np
import pytest

from zoo_convert.records import Settings
from zoo_convert.stages import Timing, benchmark
from zoo_convert.stages.benchmark import (
    MIN_RUNS,
    MIN_TIMED_S,
    NOISY_CI,
    NOISY_OTHERS_SLACK,
    _block,
    _Busy,
    _Conditions,
    _cpus,
    _measure,
    _timing,
    median_ci,
)


def test_a_side_is_warmed_then_timed_in_one_block_until_it_has_its_runs_and_its_seconds() -> None:
    calls: list[float] = []
    ms, others = _block(lambda: calls.append(time.perf_counter()), Settings(bench_warmup=3, bench_runs=4, bench_budget_s=10.0))
    assert len(ms) >= 4 and len(calls) >= len(ms) + 3  # warm-up calls are not timed
    assert others >= 0.0


def test_sides_are_timed_one_after_the_other_never_interleaved() -> None:
    order: list[str] = []
    times: dict[str, list[float]] = {}
    settings = Settings(bench_warmup=1, bench_runs=3, bench_budget_s=10.0)
    for side in ("torch", "fp32", "int8"):
        _measure(side, lambda side=side: (lambda: order.append(side)), settings, times, {}, [])
    # one block per side: the sequence changes side exactly twice
    assert sum(a != b for a, b in zip(order, order[1:])) == 2 and order[0] == "torch" and order[-1] == "int8"
    assert set(times) == {"torch", "fp32", "int8"}


def test_runs_stop_at_the_budget_but_not_below_the_minimum() -> None:
    def slow() -> None:
        time.sleep(0.01)

    ms, _ = _block(slow, Settings(bench_warmup=2, bench_runs=100, bench_budget_s=0.0))
    assert len(ms) == MIN_RUNS and all(t >= 10 for t in ms)


def test_fast_calls_are_timed_in_samples_of_many_calls_and_slow_ones_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(benchmark, "WARMUP_S", 0.0)  # one warm-up call: every other call is a timed one
    calls: list[int] = []
    ms, _ = _block(lambda: calls.append(1), Settings(bench_warmup=1, bench_runs=30, bench_budget_s=1.0))
    timed = len(calls) - 1
    # a call of nothing: 30 samples (or more), each the same number of calls, and more than one
    assert len(ms) >= 30 and timed % len(ms) == 0 and timed // len(ms) > 1
    ms, _ = _block(lambda: time.sleep(MIN_TIMED_S), Settings(bench_warmup=0, bench_runs=3, bench_budget_s=1.0))
    assert len(ms) == 3 and all(t >= MIN_TIMED_S * 1000 for t in ms)  # a long call is a sample of its own


def test_a_side_that_fails_goes_unmeasured_with_its_reason_and_the_others_go_on() -> None:
    def broken() -> None:
        raise ValueError("no kernel for this shape")

    times: dict[str, list[float]] = {}
    notes: dict[str, tuple[str, str | None]] = {}
    settings = Settings(bench_warmup=0, bench_runs=6)
    _measure("torch", lambda: (lambda: None), settings, times, notes, [])
    _measure("fp16", lambda: broken, settings, times, notes, [])
    assert notes["fp16"][0] == "not timed: ValueError: no kernel for this shape"
    assert "fp16" not in times and len(times["torch"]) >= 6


@pytest.mark.alone  # what the other processes keep busy must be less than the machine
@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux /proc/stat")
def test_the_cpus_other_processes_keep_busy_are_measured_apart_from_our_own() -> None:
    busy = _Busy()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.3:  # this process spins one CPU: not counted as another's
        pass
    assert busy.others() < _cpus()


def test_the_median_interval_narrows_with_more_samples_whatever_their_spread() -> None:
    rng = np.random.default_rng(0)
    assert median_ci(list(10 * rng.lognormal(0, 0.15, 20))) > NOISY_CI  # IQR ~0.2 of the median
    assert median_ci(list(10 * rng.lognormal(0, 0.15, 400))) < NOISY_CI / 2
    assert median_ci([5.0] * 3) == 0.0 and median_ci([1.0, 2.0, 3.0]) == 1.0  # under 6 samples: their whole range


@pytest.mark.alone  # sleeps of 4-6 ms pinned down within a budget: a busy machine stretches them
def test_a_side_whose_calls_spread_is_sampled_until_its_median_is_pinned_down() -> None:
    rng = np.random.default_rng(1)

    def call() -> None:  # 4-6 ms, uniformly: each call a sample of its own, IQR / p50 ~0.2
        time.sleep(float(rng.uniform(0.004, 0.006)))

    ms, _ = _block(call, Settings(bench_warmup=1, bench_runs=20, bench_budget_s=5.0))
    t = _timing(ms)
    assert t.runs > 20 and t.spread > 0.15 and t.ci <= NOISY_CI, t
    # No budget left: MIN_RUNS samples, their whole range as the interval (4 to 6 ms, every 5 calls): noisy.
    cycle = itertools.cycle([0.004, 0.006, 0.005, 0.0045, 0.0055])
    ms, _ = _block(lambda: time.sleep(next(cycle)), Settings(bench_warmup=0, bench_runs=20, bench_budget_s=0.0))
    assert len(ms) == MIN_RUNS and _timing(ms).ci > NOISY_CI


def test_timing_records_runs_percentiles_and_the_spread() -> None:
    t = _timing([10.0, 10.0, 11.0, 12.0, 30.0])
    assert (t.runs, t.p50_ms) == (5, 11.0) and t.p50_ms <= t.p90_ms
    assert t.spread == round((12.0 - 10.0) / 11.0, 4)


def test_a_median_not_pinned_down_or_other_processes_busy_on_the_cpus_it_needs_is_noisy() -> None:
    quiet = Timing(p50_ms=10.0, p90_ms=10.5, runs=20, spread=0.02, ci=0.03)
    spread = Timing(p50_ms=10.0, p90_ms=20.0, runs=20, spread=0.2, ci=NOISY_CI + 0.01)
    # Spread samples whose median many of them pin down are to be trusted: t5's PyTorch side, IQR 0.16.
    pinned = Timing(p50_ms=10.0, p90_ms=13.0, runs=200, spread=0.2, ci=NOISY_CI - 0.01)
    free = max(0, _cpus() - 1)  # one thread: the others may use the rest
    calm = _Conditions(threads=1, cpu="cpu", shape="1x128", load=free + NOISY_OTHERS_SLACK)
    assert not calm.latency(quiet, quiet, None).noisy and not calm.latency(pinned, pinned, None).noisy
    assert calm.latency(spread, quiet, None).noisy and calm.latency(quiet, spread, None).noisy
    busy = _Conditions(threads=1, cpu="cpu", shape="1x128", load=free + NOISY_OTHERS_SLACK + 0.1)
    lat = busy.latency(quiet, quiet, None)
    assert lat.noisy and lat.load == round(free + NOISY_OTHERS_SLACK + 0.1, 2) and lat.speedup == 1.0
    # No ORT figure, nothing to distrust: the note says why it is empty.
    empty = busy.latency(None, quiet, ("not timed: no graph", None))
    assert not empty.noisy and empty.note == "not timed: no graph" and empty.speedup is None


# Every audio encoder-decoder of the zoo: raw samples (moonshine), filterbank frames (speech_to_text), a 30 s window (whisper).
AUDIO_ENCODER_DECODERS = ["moonshine", "speech-to-text", "whisper"]


@pytest.mark.parametrize("name", AUDIO_ENCODER_DECODERS)
def test_an_audio_decoder_is_timed_on_what_its_encoder_makes_of_the_audio(name: str, zoo_export) -> None:
    """moonshine's latency was empty: its decoder was fed 128 frames of noise beside 1 s of audio's mask (40 frames).

    A user's pipeline (optimum's ORTModelForSpeechSeq2Seq, generate) feeds the decoder the encoder's output
    and the encoder's attention mask; verify's toy shapes are left as they are.
    """
    from zoo_convert.records import Settings
    from zoo_convert.stages import Artifact
    from zoo_convert.stages.benchmark import bench_cases, benchmark
    from zoo_convert.stages.verify import verify
    from zoo_convert.verify.runtime import Branch, RuntimeCache, cases

    ex = dataclasses.replace(zoo_export(name), cache=RuntimeCache())  # the shared export's memo left as it was
    fp32 = Artifact("fp32", {c.name: c.path for c in ex.components})
    settings = Settings(bench_warmup=1, bench_runs=3)
    assert all(c.passed for c in verify(ex, fp32, settings))
    lat = benchmark(ex, [fp32], settings)["fp32"]
    assert lat.note is None and lat.ort is not None and lat.torch is not None, lat.note
    (encoder, enc_case), (decoder, dec_case) = bench_cases(ex, settings)
    frames = enc_case.reference["last_hidden_state"]
    fed = dec_case.feed["encoder_hidden_states"]
    assert fed.shape == frames.shape and np.array_equal(fed, frames)
    assert dec_case.feed["past_key_values.0.encoder.key"].shape[2] == frames.shape[1]
    if "attention_mask" in enc_case.feed:  # moonshine: samples, speech_to_text: filterbank frames
        assert np.array_equal(dec_case.feed["encoder_attention_mask"], enc_case.feed["attention_mask"])
    # verify's decoder cases are as they were: the encoder side as long as the toy shape's tokens.
    toy = cases(ex, decoder, 1, 7, settings, audio_samples=7000)[Branch.CACHE]
    assert toy.feed["encoder_hidden_states"].shape[1] == 7


def test_a_noisy_block_is_timed_again_and_the_fastest_quiet_one_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = iter([[1.0, 3.0, 1.0, 3.0, 2.0], [2.0, 2.0, 2.0, 2.0, 2.0], [9.0] * 5])  # spread 2.0, then quiet

    def block(call: object, settings: Settings) -> tuple[list[float], float]:
        return next(blocks), 0.0

    times: dict[str, list[float]] = {}
    loads: list[float] = []
    monkeypatch.setattr(benchmark, "_block", block)  # the blocks a VM's neighbour would make, in order
    _measure("fp32", lambda: (lambda: None), Settings(), times, {}, loads)
    assert times["fp32"] == [2.0] * 5 and loads == [0.0]  # the quiet second block; no third one was timed
    assert next(blocks) == [9.0] * 5
