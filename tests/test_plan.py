"""Job cache keys: what changes the answer changes the key."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from zoo_convert.farm.plan import job_key
from zoo_convert.records import ManifestEntry, Settings

ENTRY = ManifestEntry(source="org/model")
VERSIONS = {"zoo_convert": "0.1.0", "onnxruntime": "1.0"}


def _key(settings: Settings) -> str:
    return job_key(ENTRY, "abc123", settings, VERSIONS)


def test_the_same_settings_give_the_same_key() -> None:
    assert _key(Settings()) == _key(Settings(out_dir="elsewhere", timeout_s=5.0))


@pytest.mark.parametrize(
    "change", [{"optimize": False}, {"benchmark": False}, {"optimize": False, "benchmark": False}, {"verify_long": False},
               {"verify_generation": False}]
)
def test_switching_optimize_or_benchmark_off_changes_the_key(change: dict) -> None:
    """A --no-benchmark result has no latencies, a --no-long-shape one never saw a long input:
    a default nightly must not take either as its answer."""
    default = _key(Settings())
    assert _key(replace(Settings(), **change)) != default
    # ... and only that switch: what bounds or places the work still leaves the key alone
    assert _key(Settings(**change)) == _key(Settings(out_dir="elsewhere", timeout_s=5.0, **change))


def test_each_flag_gives_its_own_key() -> None:
    keys = {_key(Settings(optimize=o, benchmark=b)) for o in (True, False) for b in (True, False)}
    assert len(keys) == 4


def test_jobs_go_longest_first_by_last_durations_and_unknown_ones_first(tmp_path) -> None:
    from zoo_convert.manifest import read_manifest, write_manifest
    from zoo_convert.farm.plan import make_plan

    names = ("quick", "slow", "new", "urgent", "medium")
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text('{"model_type": "bert"}')
    rows = [{"source": str(tmp_path / n), "priority": 1 if n == "urgent" else 0} for n in names]
    manifest = read_manifest(write_manifest(rows, tmp_path / "m.parquet"))
    last = {(str(tmp_path / n), "optimum", None): s for n, s in (("quick", 1.0), ("slow", 300.0), ("medium", 20.0), ("urgent", 0.5))}
    plan = make_plan(manifest, Settings(), durations=last)
    assert [Path(j.entry.source).name for j in plan.jobs] == ["urgent", "new", "slow", "medium", "quick"]
    # without history: priority, then manifest order
    plan = make_plan(manifest, Settings())
    assert [Path(j.entry.source).name for j in plan.jobs] == ["urgent", "quick", "slow", "new", "medium"]


def test_one_unreadable_checkpoint_does_not_stop_the_plan(tmp_path: Path, poison) -> None:
    from zoo_convert.manifest import read_manifest, write_manifest
    from zoo_convert.farm.plan import make_plan

    hows = ("proc-mem", "dangling", "folder")
    for name in ("good", *hows):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text('{"model_type": "bert"}')
        if name != "good":
            poison(tmp_path / name, name)
    rows = [{"source": str(tmp_path / n)} for n in ("good", *hows)]
    plan = make_plan(read_manifest(write_manifest(rows, tmp_path / "m.parquet")), Settings())
    revisions = {Path(j.entry.source).name: j.resolved_revision for j in plan.jobs}
    assert revisions["good"].startswith("sha256:") and revisions["proc-mem"] == "unresolved:default", revisions
    assert len(plan.jobs) == 4  # each job's fetch records what is wrong with its checkpoint


def test_rows_that_are_one_job_are_planned_once(tmp_path: Path) -> None:
    """Two rows resolving to one key (a hub id without a revision and at "main": one commit) were both submitted,
    and the run stopped half-way: "job ... is already recorded in run ..."."""
    from zoo_convert.manifest import read_manifest, write_manifest
    from zoo_convert.farm.plan import make_plan

    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
    manifest = read_manifest(write_manifest([{"source": str(tmp_path / "bert")}], tmp_path / "m.parquet"))
    twice = replace(manifest, entries=(*manifest.entries, replace(manifest.entries[0], row=2, priority=3)))
    plan = make_plan(twice, Settings())
    assert [j.entry.row for j in plan.jobs] == [1] and (plan.total, plan.skipped) == (1, 0)


def test_the_optimization_level_is_in_the_key_and_o2_keeps_the_keys_made_before_levels() -> None:
    # The key of a default job, as it was computed before optimization levels existed (O2).
    import hashlib
    import json
    from dataclasses import asdict

    s = Settings()
    old = {"source": ENTRY.source, "resolved_revision": "abc123", "task": None, "opset": None, "exporter": "optimum",
           "variants": sorted(ENTRY.variants), "gpu": False, "allow_remote_code": False, "allow_pickle": False,
           "tolerances": {k: asdict(v) for k, v in sorted(s.tolerances.items())}, "verify_shapes": s.verify_shapes,
           "verify_long": True, "verify_generation": True, "providers": s.providers, "external_data_threshold": s.external_data_threshold,
           "optimize": True, "benchmark": True, "versions": VERSIONS}
    assert _key(Settings(optimization="O2")) == hashlib.sha256(
        json.dumps(old, sort_keys=True, default=str).encode()).hexdigest()[:32]
    keys = {_key(Settings(optimization=level)) for level in ("O1", "O2", "O3")}
    assert len(keys) == 3
    # A manifest row's level is the job's: the same key as the run-wide setting.
    row = replace(ENTRY, optimize="O3")
    assert job_key(row, "abc123", Settings(), VERSIONS) == _key(Settings(optimization="O3"))


def test_fixed_shapes_and_atol_change_the_key_and_none_keeps_it() -> None:
    default = _key(Settings())
    assert _key(Settings(shapes={})) == default
    assert _key(Settings(shapes={"batch_size": 2})) != default
    assert _key(Settings(shapes={"batch_size": 2})) != _key(Settings(shapes={"sequence_length": 2}))
    tolerances = {**Settings().tolerances, "fp32": replace(Settings().tolerances["fp32"], max_abs=1e-3)}
    assert _key(Settings(tolerances=tolerances)) != default
