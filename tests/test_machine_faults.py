"""A fault of the machine is never the model's verdict; artifacts never change under a recorded result (issue 23, items 1-2).

A full disk, an unusable ``--out``, a lost worker: recorded as the machine's kinds, which
the next run redoes without ``--retry-failed``. Every setting that changes the artifacts'
bytes is part of their folder's name, a recorded folder is never written again, and a
failed job leaves no folder behind.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import duckdb
import pytest

from zoo_convert import zoo
from zoo_convert.errors import FailureKind
from zoo_convert.manifest import read_manifest, write_manifest
from zoo_convert.pipeline import convert_one
from zoo_convert.farm.plan import make_plan
from zoo_convert.records import ManifestEntry, Settings
from zoo_convert.store.db import ResultStore


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("machine")
    zoo.build(root, only=["bert", "gpt2"])
    return root


def _fill(folder: Path, leave: int) -> None:
    """Fill the file system of ``folder`` until ``leave`` bytes are free (a real full disk)."""
    free = os.statvfs(folder)
    room = free.f_bavail * free.f_frsize - leave
    with open(folder / "filler", "wb") as f:
        f.write(b"\0" * max(room, 0))


def test_a_graph_copy_cut_short_by_a_full_disk_is_storage_error_not_a_corrupt_model(
    models: Path, tmp_path: Path, tiny_disk
) -> None:
    """Shape inference's C++ writer says nothing of a failed write: gpt2 was recorded ``internal`` (DecodeError) at check."""
    from zoo_convert.stages.check import check
    from zoo_convert.stages.export import export
    from zoo_convert.stages.fetch import fetch

    out = tiny_disk("size=8m")
    entry = ManifestEntry(source=str(models / "gpt2"), task="text-generation")
    exported = export(fetch(entry, Settings()), entry, Settings(), out / "gpt2")
    graph = exported.components[0].path
    _fill(out, leave=graph.stat().st_size // 2)  # room for half the inferred copy
    with pytest.raises(OSError) as info:
        check(exported)
    assert "shape inference wrote" in str(info.value) and "No space left on device" in str(info.value)
    (out / "filler").unlink()
    assert check(exported)["model"]["value_infos"] > 0  # room made: the same graph checks


def test_a_copy_cut_past_the_graphs_own_size_is_storage_error_too(models: Path, tiny_disk) -> None:
    """gpt2's graph is 82 KB with its weights beside it; its inferred copy cut at ~100 KB passed the size check
    and was read back as a corrupt model (``internal``, DecodeError). What is read back is now walked whole first."""
    from zoo_convert.errors import storage_fault
    from zoo_convert.stages.check import check
    from zoo_convert.stages.export import export
    from zoo_convert.stages.fetch import fetch

    out = tiny_disk("size=8m")
    entry = ManifestEntry(source=str(models / "gpt2"), task="text-generation")
    exported = export(fetch(entry, Settings()), entry, Settings(), out / "gpt2")
    graph = exported.components[0].path
    _fill(out, leave=graph.stat().st_size + 16 * 1024)  # more than the graph, less than its inferred copy
    with pytest.raises(OSError) as info:
        check(exported)
    fault = storage_fault(info.value)
    assert fault is not None and "onnx shape inference wrote" in str(fault) and "cut short" in str(fault), info.value
    (out / "filler").unlink()
    assert check(exported)["model"]["value_infos"] > 0


def test_a_graph_an_exporter_left_cut_short_is_the_disks_fault(models: Path, tiny_disk) -> None:
    """What a writer we do not control wrote is read back before anything reads it: cut short on a full file
    system is ENOSPC, on one with room a failing write (EIO); both are storage_error, redone by the next run."""
    import errno

    from zoo_convert import onnx_graph
    from zoo_convert.stages.export import _read_back, export
    from zoo_convert.stages.fetch import fetch

    out = tiny_disk("size=8m")
    entry = ManifestEntry(source=str(models / "gpt2"), task="text-generation")
    exported = export(fetch(entry, Settings()), entry, Settings(), out / "gpt2")
    graph, data = exported.components[0].path, onnx_graph.data_path(exported.components[0].path)
    _read_back(graph.parent, "optimum")  # whole: nothing to say
    whole = data.read_bytes()
    data.write_bytes(whole[: len(whole) // 2])  # the weights cut short
    with pytest.raises(OSError) as info:
        _read_back(graph.parent, "optimum")
    assert info.value.errno == errno.EIO and "its data file model.onnx_data is" in str(info.value)
    data.write_bytes(whole)
    graph.write_bytes(graph.read_bytes()[:-100])  # the graph itself, on a full disk
    _fill(out, leave=0)
    with pytest.raises(OSError) as info:
        _read_back(graph.parent, "optimum")
    assert info.value.errno == errno.ENOSPC, info.value
    assert "the optimum exporter wrote model.onnx cut short" in str(info.value)
    assert onnx_graph.unread(out / "filler") is None  # bytes that are no protobuf at all are not a cut


def test_a_job_the_disk_failed_leaves_no_folder_behind(models: Path, tiny_disk) -> None:
    """The transient tries of a job on a full disk each left a folder; none was ever pointed at by a result."""
    out = tiny_disk("size=700k")  # gpt2's export fits, its check's copy or optimize does not
    result = convert_one(ManifestEntry(source=str(models / "gpt2"), variants=("fp32",)), Settings(out_dir=str(out),
                         benchmark=False))  # fmt: skip
    assert result.failure_kind == "storage_error" and result.stage in ("export", "check", "optimize"), result.message
    assert result.artifacts_dir is None and list(out.iterdir()) == []


def test_an_unusable_out_folder_is_storage_error(models: Path) -> None:
    result = convert_one(ManifestEntry(source=str(models / "bert"), variants=("fp32",)), Settings(out_dir="/proc/self/x"))
    assert (result.failure_kind, result.stage) == ("storage_error", "export"), result.message
    assert "cannot make the artifact folder /proc/self/x/" in (result.message or "")


def test_a_run_refuses_an_unusable_out_before_any_job(models: Path, tmp_path: Path) -> None:
    from zoo_convert.errors import OutputDirError
    from zoo_convert.farm.driver import run_farm

    manifest = write_manifest([{"source": str(models / "bert"), "variants": ["fp32"]}], tmp_path / "m.parquet")
    (tmp_path / "a-file").write_text("")
    for out in ("/proc/self/artifacts", str(tmp_path / "a-file" / "artifacts")):
        with pytest.raises(OutputDirError, match=f"--out {out}: cannot write artifacts there"):
            run_farm(manifest, db_path=tmp_path / "r.duckdb", settings=Settings(out_dir=out))
    with duckdb.connect(str(tmp_path / "r.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM results").fetchone() == (0,)


def test_lost_workers_are_the_machines_fault_redone_by_the_next_run(tmp_path: Path) -> None:
    """Raylet killed with the DashboardAgent: 5 of 6 jobs recorded worker_lost, and the next run said nothing to do."""
    from zoo_convert.farm.isolation import failure_result

    kind = FailureKind.WORKER_LOST
    assert kind.transient and not kind.terminal
    with ResultStore(tmp_path / "r.duckdb") as store:
        store.start_run("run1", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
        lost = failure_result(ManifestEntry(source="zoo/bert"), kind, "The worker died unexpectedly")
        timed_out = failure_result(ManifestEntry(source="zoo/vit"), FailureKind.TIMEOUT, "killed after 10 s")
        store.record_many("run1", [("k-lost", lost), ("k-timeout", timed_out)])
        assert store.terminal_keys() == {"k-timeout"}


def test_every_setting_that_changes_the_bytes_gets_its_own_folder(models: Path, tmp_path: Path) -> None:
    """--no-optimize into the same --out replaced the fused model.onnx (23 nodes) by the plain one (243) under the
    first result."""
    entry = ManifestEntry(source=str(models / "bert"), task="feature-extraction", variants=("fp32",))
    fused = convert_one(entry, Settings(out_dir=str(tmp_path), benchmark=False))
    assert fused.passed, fused.message
    graph = Path(fused.artifacts_dir or "", "onnx", "model.onnx")
    before = graph.read_bytes()
    plain = convert_one(entry, Settings(out_dir=str(tmp_path), benchmark=False, optimize=False))
    assert plain.passed, plain.message
    assert plain.artifacts_dir != fused.artifacts_dir
    assert graph.read_bytes() == before  # the first result's artifacts are as they were
    again = convert_one(entry, Settings(out_dir=str(tmp_path), benchmark=False))  # the same job again (--force)
    assert again.artifacts_dir == f"{fused.artifacts_dir}.2" and graph.read_bytes() == before


def test_a_failed_job_leaves_no_folder_behind(models: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bert"
    shutil.copytree(models / "bert", bad)
    (bad / "config.json").write_text('{"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 32, '
                                     '"num_attention_heads": 5}')  # fmt: skip
    out = tmp_path / "out"
    result = convert_one(ManifestEntry(source=str(bad), task="feature-extraction", variants=("fp32",)),
                         Settings(out_dir=str(out), benchmark=False))  # fmt: skip
    assert result.failure_kind == "export_error", result.message
    assert result.artifacts_dir is None
    assert list(out.iterdir()) == []


def test_a_folder_back_at_an_answered_version_is_run_again_so_latest_shows_it(models: Path, tmp_path: Path) -> None:
    """bert stayed fetch_error in latest_results after its files were restored."""
    ckpt = tmp_path / "bert"
    shutil.copytree(models / "bert", ckpt)
    manifest = write_manifest([{"source": str(ckpt), "task": "feature-extraction", "variants": ["fp32"]}],
                              tmp_path / "m.parquet")  # fmt: skip
    settings = Settings(out_dir=str(tmp_path / "out"), benchmark=False)
    db = tmp_path / "r.duckdb"

    def run(n: int) -> tuple[int, str]:
        with ResultStore(db) as store:
            plan = make_plan(read_manifest(manifest), settings, store.terminal_keys(), latest=store.latest_keys())
            store.start_run(f"run{n}", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
            store.record_many(f"run{n}", [(j.key, convert_one(j.entry, settings)) for j in plan.jobs])
            with store.connect() as con:
                (status,) = con.execute("SELECT job_status FROM latest_results").fetchone()
        return len(plan.jobs), status

    assert run(1) == (1, "passed")
    good = (ckpt / "config.json").read_bytes()
    (ckpt / "config.json").write_text("[]")
    assert run(2) == (1, "failed")
    (ckpt / "config.json").write_bytes(good)  # restored: the version run 1 answered
    assert run(3) == (1, "passed")
    assert run(4) == (0, "passed")  # and from then on skipped
