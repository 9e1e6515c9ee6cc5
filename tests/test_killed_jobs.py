"""A job killed inside the fork server (its timeout, a crash) leaves no partial artifact folder; a recorded one stays.

Issue 23: "Failed jobs leave empty artifact folders behind; they should not." The pipeline removes the folder
of a job that fails in Python; a child killed by its caller never gets that far.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from zoo_convert.farm.isolation import run_isolated
from zoo_convert.pipeline import StageCallback, convert_one
from zoo_convert.records import ConversionResult, ManifestEntry, Settings

pytestmark = [pytest.mark.slow, pytest.mark.alone]  # a warm fork server and real exports of a tiny bert; a 20 s timeout


def _after_export(on_stage: StageCallback | None, then: str) -> StageCallback:
    """The stage callback, which once export has written its files hangs or crashes the child."""

    def callback(name: str) -> None:
        if on_stage is not None:
            on_stage(name)
        if name == "check":
            if then == "hang":
                time.sleep(3600)
            os.kill(os.getpid(), signal.SIGSEGV)

    return callback


def hang_after_export(entry: ManifestEntry, settings: Settings, *, on_stage: StageCallback | None = None) -> ConversionResult:
    return convert_one(entry, settings, on_stage=_after_export(on_stage, "hang"))


def crash_after_export(entry: ManifestEntry, settings: Settings, *, on_stage: StageCallback | None = None) -> ConversionResult:
    return convert_one(entry, settings, on_stage=_after_export(on_stage, "crash"))


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from zoo_convert import zoo

    return zoo.build(tmp_path_factory.mktemp("zoo"), ["bert"]).parent / "bert"


def _folders(out: Path) -> list[str]:
    """The model folders and their artifact folders under --out."""
    return sorted(str(p.relative_to(out)) for p in [*out.glob("*"), *out.glob("*/*")] if p.is_dir())


def test_a_job_killed_at_its_timeout_leaves_no_folder_and_a_recorded_one_stays(bert: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    settings = Settings(out_dir=str(out), benchmark=False, verify_long=False)
    entry = ManifestEntry(source=str(bert), task="fill-mask", variants=("fp32",))
    passed = run_isolated(convert_one, entry, settings, timeout_s=300)
    assert passed.passed and passed.artifacts_dir is not None, passed.message
    recorded = Path(passed.artifacts_dir)
    before = sorted(p.name for p in recorded.iterdir())
    assert "onnx" in before

    killed = run_isolated(hang_after_export, entry, settings, timeout_s=20)
    assert killed.failure_kind == "timeout" and "during check" in (killed.message or ""), killed.message
    # main: <name>.2 stayed behind, its onnx/ half a job's work that nothing points at
    assert _folders(out) == [recorded.parent.name, f"{recorded.parent.name}/{recorded.name}"]
    assert sorted(p.name for p in recorded.iterdir()) == before  # the recorded result's folder is untouched


def test_a_job_whose_child_crashes_leaves_no_folder(bert: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    settings = Settings(out_dir=str(out), benchmark=False, verify_long=False)
    entry = ManifestEntry(source=str(bert), task="fill-mask", variants=("fp32",))
    crashed = run_isolated(crash_after_export, entry, settings, timeout_s=300)
    assert crashed.failure_kind == "crash" and "SIGSEGV" in (crashed.message or ""), crashed.message
    assert "during check" in (crashed.message or "")
    assert _folders(out) == []  # main: bert/optimum-opsetdefault-... with the export's files
