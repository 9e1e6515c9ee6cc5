"""Isolation: jobs run in children forked from a warm server; hangs, crashes and OOMs become results."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from zoo_convert.isolation import run_isolated
from zoo_convert.records import PASSED, ConversionResult, ManifestEntry, Settings

ENTRY = ManifestEntry(source="fault", row=7, tags=("t",))


def quick(entry: ManifestEntry, settings: Settings) -> ConversionResult:
    return ConversionResult(source=entry.source, status=PASSED)


def hang(entry: ManifestEntry, settings: Settings) -> ConversionResult:
    time.sleep(3600)
    raise AssertionError("unreachable")


def segfault(entry: ManifestEntry, settings: Settings) -> ConversionResult:
    os.kill(os.getpid(), signal.SIGSEGV)
    raise AssertionError("unreachable")


def hog(entry: ManifestEntry, settings: Settings) -> ConversionResult:
    chunks = []
    while True:
        chunks.append(bytearray(64 * 2**20))  # bytearray touches its pages: RSS grows
        time.sleep(0.005)


def raises(entry: ManifestEntry, settings: Settings) -> ConversionResult:
    raise RuntimeError("bug in a job function")


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(out_dir=str(tmp_path_factory.mktemp("iso")), bench_warmup=0, bench_runs=2)


def test_real_conversion_in_a_warm_child(zoo_dir: Path, settings: Settings) -> None:
    from zoo_convert.pipeline import convert_one

    entry = ManifestEntry(source=str(zoo_dir / "bert"), task="fill-mask", variants=("fp32",))
    result = run_isolated(convert_one, entry, settings, timeout_s=300)
    assert result.passed, result.message
    assert result.variant("fp32").max_abs is not None


def test_the_same_child_runs_jobs_repeatedly(settings: Settings) -> None:
    for _ in range(3):
        assert run_isolated(quick, ENTRY, settings).passed
    # the overhead target (< 150 ms per job) is measured in benchmarks/bench_isolation.py


def crash_in_verify(entry: ManifestEntry, settings: Settings) -> ConversionResult:
    from zoo_convert import pipeline

    pipeline.on_stage("verify[fp16]")
    os.kill(os.getpid(), signal.SIGSEGV)
    raise AssertionError("unreachable")


def test_a_crash_records_the_stage_it_happened_in(zoo_dir: Path, settings: Settings) -> None:
    entry = ManifestEntry(source=str(zoo_dir / "bert"), row=3)
    result = run_isolated(crash_in_verify, entry, settings)
    assert (result.failure_kind, result.stage) == ("crash", "verify")
    assert "SIGSEGV" in result.message and "verify[fp16]" in result.message
    assert result.model_type == "bert"


@pytest.mark.parametrize(
    ("fn", "kwargs", "kind"),
    [
        (hang, {"timeout_s": 1.0}, "timeout"),
        (segfault, {}, "crash"),
        (hog, {"memory_gb": 1.5}, "oom"),
        (raises, {}, "internal"),
    ],
)
def test_faults_become_results(fn, kwargs: dict, kind: str, settings: Settings) -> None:
    t0 = time.monotonic()
    result = run_isolated(fn, ENTRY, settings, **kwargs)
    assert result.failure_kind == kind, result.message
    assert (result.row, result.tags, result.status) == (7, ("t",), "failed")
    assert time.monotonic() - t0 < 30
    # the server survives: the next job runs normally
    assert run_isolated(quick, ENTRY, settings).passed
