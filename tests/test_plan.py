"""Job cache keys: what changes the answer changes the key."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zoo_convert.plan import job_key
from zoo_convert.records import ManifestEntry, Settings

ENTRY = ManifestEntry(source="org/model")
VERSIONS = {"zoo_convert": "0.1.0", "onnxruntime": "1.0"}


def _key(settings: Settings) -> str:
    return job_key(ENTRY, "abc123", settings, VERSIONS)


def test_the_same_settings_give_the_same_key() -> None:
    assert _key(Settings()) == _key(Settings(out_dir="elsewhere", timeout_s=5.0))


@pytest.mark.parametrize("change", [{"optimize": False}, {"benchmark": False}, {"optimize": False, "benchmark": False}])
def test_switching_optimize_or_benchmark_off_changes_the_key(change: dict) -> None:
    """A --no-benchmark result has no latencies: a default nightly must not take it as its answer."""
    default = _key(Settings())
    assert _key(replace(Settings(), **change)) != default
    assert _key(Settings(**change)) == _key(Settings(**change))


def test_each_flag_gives_its_own_key() -> None:
    keys = {_key(Settings(optimize=o, benchmark=b)) for o in (True, False) for b in (True, False)}
    assert len(keys) == 4
