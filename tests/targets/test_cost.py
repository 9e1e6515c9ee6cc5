"""What the target step pays per job, by count (never by the clock: timings are benchmarks/bench_targets.py's)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from zoo_convert import targets
from zoo_convert.records import ConversionResult, VariantResult
from zoo_convert.stages import target as stage
from zoo_convert.targets import reference
from zoo_convert.targets.openvino import OpenVINO
from zoo_convert.targets.transformers_js import TransformersJs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _passed(folder: Path) -> list[VariantResult]:
    return [VariantResult(variant=v, status="passed") for v in reference.load(folder).variants]


def test_transformers_js_starts_node_once_per_job_for_every_variant(folders: dict[str, Path], tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Node, transformers.js's import and the config read are paid once per job, not once per dtype."""
    starts = tmp_path / "node-starts"
    real = TransformersJs.node_run

    def counted(self: TransformersJs, job: Path, ready: Any = None) -> dict[str, Any]:
        with starts.open("a") as f:  # the stage runs the target in a forked child: count in a file
            f.write(f"{job}\n")
        return real(self, job, ready)

    monkeypatch.setattr(TransformersJs, "node_run", counted)
    exported = SimpleNamespace(out_dir=folders["bert"])
    rows = stage.check(exported, _passed(folders["bert"]), ("transformers.js",)).rows()  # type: ignore[arg-type]
    assert [(r.variant, r.status) for r in rows] == [("fp32", "passed"), ("fp16", "passed"), ("int8", "passed")], rows
    assert len(starts.read_text().splitlines()) == 1
    assert all(r.seconds is not None and r.seconds > 0 for r in rows)


@pytest.mark.parametrize("name", ["ort-cpu", "openvino", "transformers.js"])
def test_a_rows_seconds_are_read_on_the_jobs_clock(folders: dict[str, Path], name: str) -> None:
    """A farm job's target rows leave out the windows it was paused in: timed on a clock that stopped the whole
    time (as a job's stops while a latency phase times others on its node), a row took no second; transformers.js's
    own per-variant times, which node keeps on running through a pause, are brought down to it too."""
    ref = reference.load(folders["bert"])
    stopped = [r.seconds for r in targets.check_variants(targets.get(name), ref, ("fp32", "int8"), clock=lambda: 7.0)]
    assert stopped == [0.0, 0.0]
    running = [r.seconds for r in targets.check_variants(targets.get(name), ref, ("fp32", "int8"))]
    assert all(s is not None and s > 0 for s in running), running


@pytest.mark.parametrize("name", ["ort-cpu", "openvino"])
def test_a_parked_check_is_judged_before_its_latency_phase(folders: dict[str, Path], name: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Comparing a parked check's answers with the saved reference happens before it waits for its phase (t5's three
    variants on OpenVINO: 156 ms to judge against 8 ms of timed calls): in the phase only the timed calls run."""
    order: list[str] = []
    judged = targets._judged

    def noted(*args: Any, **kwargs: Any) -> Any:
        order.append(f"judged {args[2]}")
        return judged(*args, **kwargs)

    monkeypatch.setattr(targets, "_judged", noted)
    rows = targets.check_variants(targets.get(name), reference.load(folders["bert"]), ("fp32", "int8"), timed=3,
                                  ready=lambda: order.append("phase"))  # fmt: skip
    assert order == ["judged fp32", "judged int8", "phase"]
    assert [r.status for r in rows] == ["passed", "passed"]
    assert all(r.latency_ms is not None and r.latency_ms > 0 for r in rows), rows  # timed after, in the phase


def test_one_node_process_keeps_each_variants_own_verdict(folders: dict[str, Path]) -> None:
    """A dtype transformers.js has no files for fails alone; the others in the same process still pass."""
    ref = reference.load(folders["bert"])
    broken = reference.Reference(ref.folder, {**ref.tolerances, "q4": ref.tolerances["int8"]},
                                 {**ref.variants, "q4": ref.variants["int8"]}, ref.cases)  # fmt: skip
    rows = targets.check_variants(targets.get("transformers.js"), broken, ("fp32", "q4", "int8"), timed=0)
    status = {r.variant: r.status for r in rows}
    assert status["fp32"] == status["int8"] == "passed", rows
    assert status["q4"] == "failed" and "q4" in (rows[1].message or ""), rows[1]


def test_a_check_asked_for_no_timed_calls_records_no_latency(folders: dict[str, Path]) -> None:
    """``timed=0`` (what a latency phase elsewhere would ask for): no timed call, no latency; the verdict stands."""
    rows = stage.check(SimpleNamespace(out_dir=folders["bert"]), _passed(folders["bert"]), ("ort-cpu",), timed=0).rows()  # type: ignore[arg-type]
    assert [r.status for r in rows] == ["passed"] * 3 and all(r.latency_ms is None for r in rows), rows
    timed = stage.check(SimpleNamespace(out_dir=folders["bert"]), _passed(folders["bert"]), ("ort-cpu",)).rows()  # type: ignore[arg-type]
    assert all(r.latency_ms is not None and r.latency_ms > 0 for r in timed), timed


def test_parked_checks_are_timed_only_when_their_rows_are_asked_for(folders: dict[str, Path]) -> None:
    """Each target checks every variant, then waits with them loaded (node too) until the job's latency phase asks."""
    exported = SimpleNamespace(out_dir=folders["bert"])
    pending = stage.check(exported, _passed(folders["bert"]), ("ort-cpu", "transformers.js"), park=True)  # type: ignore[arg-type]
    children = [child for *_, child in pending._children]
    assert len(children) == 2 and all(child.parked for child in children)  # checked, loaded, waiting
    rows = pending.rows()
    assert [(r.target, r.status) for r in rows] == [("ort-cpu", "passed"), ("transformers.js", "passed")] * 3, rows
    assert all(r.latency_ms is not None and r.latency_ms > 0 for r in rows), rows


def test_a_check_forked_after_openvino_is_preloaded_compiles_and_runs(folders: dict[str, Path]) -> None:
    """The fork server imports openvino before forking jobs (farm/warm.py): the children it forks still compile."""
    OpenVINO().preload()
    rows = stage.check(SimpleNamespace(out_dir=folders["bert"]), _passed(folders["bert"]), ("openvino",)).rows()  # type: ignore[arg-type]
    assert [r.status for r in rows] == ["passed"] * 3, rows


def test_a_model_type_transformers_js_lacks_is_unsupported_without_starting_node(
    folders: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Preloaded (the fork server asks node once), the known model types answer "no architecture" with node's words."""
    starts = tmp_path / "node-starts"
    real = TransformersJs.node_run

    def counted(self: TransformersJs, job: Path, ready: Any = None) -> dict[str, Any]:
        with starts.open("a") as f:
            f.write(f"{job}\n")
        return real(self, job, ready)

    monkeypatch.setattr(TransformersJs, "node_run", counted)
    cold = targets.check(TransformersJs(), reference.load(folders["data2vec-text"]), "fp32")
    assert len(starts.read_text().splitlines()) == 1  # without the preload, node says it
    warm = TransformersJs()
    warm.preload()
    assert warm.known is not None and "bert" in warm.known and "data2vec-text" not in warm.known
    rows = targets.check_variants(warm, reference.load(folders["data2vec-text"]), ("fp32", "int8"))
    assert [(r.status, r.message) for r in rows] == [(cold.status, cold.message)] * 2 == [("unsupported", cold.message)] * 2
    assert len(starts.read_text().splitlines()) == 1  # no node start for it
    assert targets.check(warm, reference.load(folders["bert"]), "fp32").status == "passed"
    assert len(starts.read_text().splitlines()) == 2
