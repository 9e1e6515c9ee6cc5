"""Target rows in the DB (migration 11: target_results, compat_by_target, target_signatures), db status, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner

from zoo_convert.cli import cli
from zoo_convert.manifest import SCHEMA, validate_table
from zoo_convert.records import ConversionResult
from zoo_convert.store import ResultStore
from zoo_convert.store.queries import format_status, query, status
from zoo_convert.store.schema import MIGRATIONS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_target_rows_are_recorded_and_read(converted: dict[str, ConversionResult], tmp_path: Path) -> None:
    assert MIGRATIONS[10].version == 11 and MIGRATIONS[10].name == "deployment targets"
    assert MIGRATIONS[12].version == 13 and MIGRATIONS[12].name == "target graph"
    store = ResultStore(tmp_path / "r.duckdb")
    run_id = "run-1"
    store.start_run(run_id, manifest="m.parquet", manifest_hash="h", versions={}, resources={}, settings={})
    store.record(run_id, "bert-key", converted["bert"])
    store.finish_run(run_id)
    cols, rows = query(store, "SELECT target, variant, status, target_version, latency_ms, model_type, task"
                              " FROM compat_by_target ORDER BY target, variant")  # fmt: skip
    assert len(rows) == 9 and {r[2] for r in rows} == {"passed"} and {r[5] for r in rows} == {"bert"}
    assert {r[0] for r in rows} == {"ort-cpu", "openvino", "transformers.js"}
    text = format_status(status(store) or pytest.fail("no run"))
    assert "openvino         3 of 3 variants passed (2026." in text
    assert "transformers.js  3 of 3 variants passed (4.3.2), 0 failed, 0 unsupported, 0 not run" in text
    _, sig = query(store, "SELECT count(*) FROM target_signatures")
    assert sig == [(0,)]


def test_target_failures_cluster_into_signatures(converted: dict[str, ConversionResult], folders: dict[str, Path],
                                                 tmp_path: Path) -> None:  # fmt: skip
    from dataclasses import replace

    from zoo_convert import targets
    from zoo_convert.targets import reference

    rows = tuple(targets.check(targets.get("openvino"), reference.load(folders["deberta"]), v) for v in ("fp32", "fp16"))
    store = ResultStore(tmp_path / "r.duckdb")
    run_id = "run-1"
    store.start_run(run_id, manifest="m.parquet", manifest_hash="h", versions={}, resources={}, settings={})
    store.record(run_id, "deberta-key", replace(converted["deberta"], targets=rows))
    _, graphs = query(store, "SELECT variant, graph FROM compat_by_target ORDER BY variant")
    assert graphs[1] == ("fp32", "onnx/standard/model.onnx")  # the graph OpenVINO was given, recorded
    _, found = query(store, "SELECT target, status, n, signature FROM target_signatures ORDER BY signature")
    assert [(t, s) for t, s, *_ in found] == [("openvino", "failed")] * len(found) and sum(r[2] for r in found) == 2
    assert all("OpenVINO cannot compile" in r[3] and "<path>" not in r[3][:30] for r in found), found


def test_verify_target_rechecks_a_folder(folders: dict[str, Path]) -> None:
    done = CliRunner().invoke(cli, ["verify-target", str(folders["bert"]), "--target", "ort-cpu,openvino", "--variants", "fp32,int8"])
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert [ln.split()[0] for ln in lines] == ["ort-cpu", "ort-cpu", "openvino", "openvino"]
    assert all(" passed " in ln and "max abs" in ln and " ms" in ln for ln in lines)
    failed = CliRunner().invoke(cli, ["verify-target", str(folders["deberta"]), "--target", "openvino", "--variants", "fp32"])
    assert failed.exit_code == 1 and "failed" in failed.output and "model.onnx" in failed.output
    unsupported = CliRunner().invoke(cli, ["verify-target", str(folders["data2vec-text"]), "--target", "transformers.js",
                                           "--variants", "fp32"])  # fmt: skip
    assert unsupported.exit_code == 1 and " unsupported " in unsupported.output


def test_verify_target_over_several_folders_reports_each_and_skips_none(folders: dict[str, Path], tmp_path: Path) -> None:
    """What a GPU node runs over a whole farm's artifacts: one JSON row per folder, variant and target; a folder
    without a saved reference is said on stderr and the others still run."""
    done = CliRunner().invoke(cli, ["verify-target", str(folders["bert"]), str(tmp_path), str(folders["deberta"]),
                                    "--target", "ort-cpu", "--variants", "fp32", "--json"])  # fmt: skip
    assert done.exit_code == 1, done.output  # the folder without a reference
    rows = [json.loads(ln) for ln in done.stdout.splitlines()]
    assert [(Path(r["folder"]), r["target"], r["variant"], r["status"]) for r in rows] == [
        (folders["bert"], "ort-cpu", "fp32", "passed"), (folders["deberta"], "ort-cpu", "fp32", "passed")]
    assert f"{tmp_path}: " in done.stderr and "has no saved reference" in done.stderr


def test_python_m_zoo_convert_cli_is_the_cli() -> None:
    """A GPU node that only re-checks saved references runs the CLI from a checkout, uninstalled."""
    done = subprocess.run([sys.executable, "-m", "zoo_convert.cli", "verify-target", "--help"], capture_output=True,
                          text=True, cwd=Path(__file__).resolve().parents[2], check=False)  # fmt: skip
    assert done.returncode == 0 and "FOLDER..." in done.stdout, done.stderr


def test_verify_target_on_a_folder_without_reference_is_usage(tmp_path: Path) -> None:
    done = CliRunner().invoke(cli, ["verify-target", str(tmp_path), "--target", "ort-cpu"])
    assert done.exit_code == 2 and "has no saved reference" in done.output
    bad = CliRunner().invoke(cli, ["verify-target", str(tmp_path), "--target", "tflite"])
    assert bad.exit_code == 2 and "unknown target" in bad.output


def test_the_manifest_targets_column_is_validated(tmp_path: Path) -> None:
    table = pa.Table.from_pylist(
        [{"source": "org/a", "targets": ["openvino"]}, {"source": "org/b", "targets": ["tflite"]}, {"source": "org/c"}],
        schema=pa.schema([f.with_nullable(True) for f in SCHEMA]),
    )
    found = validate_table(table, base_dir=tmp_path)
    assert [e.targets for e in found.entries] == [("openvino",), None]
    assert len(found.problems) == 1 and "unknown target" in str(found.problems[0])


def test_publishing_carries_the_standard_graphs_the_saved_reference_names(converted: dict[str, ConversionResult],
                                                                          tmp_path: Path) -> None:  # fmt: skip
    """A published folder is re-checked by verify-target: its reference names onnx/standard/, so those ship too."""
    import json

    from zoo_convert.publish import load_candidates
    from zoo_convert.publish.files import repo_files

    store = ResultStore(tmp_path / "r.duckdb")
    store.start_run("run-1", manifest="m.parquet", manifest_hash="h", versions={}, resources={}, settings={})
    store.record("run-1", "clip-key", converted["clip"])
    store.finish_run("run-1")
    (candidate,) = load_candidates(store, "run-1")
    files = repo_files(candidate)
    manifest = json.loads(files["reference/manifest.json"].read_text())
    named = {f for graphs in (*manifest["variants"].values(), *manifest["standard"].values()) for f in graphs.values()}
    assert {"onnx/standard/model.onnx", "onnx/standard/model_fp16.onnx"} <= named <= set(files)
