"""Manifest validation: every bad row reported with its number and reason; valid rows expand into jobs."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from zoo_convert.cli import cli
from zoo_convert.manifest import MAX_OPSET, MIN_OPSET, TASKS, read_manifest, write_manifest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture()
def mixed(tmp_path: Path) -> Path:
    """Two good rows (one local folder, one hub id) and one bad row per kind of problem."""
    (tmp_path / "bert").mkdir()
    rows = [
        {"source": "bert", "task": "fill-mask", "opsets": [17, 18], "variants": ["fp32"]},  # 1 ok: 2 jobs
        {"source": "org/model", "priority": 5},  # 2 ok
        {"source": "../../etc"},  # 3 path escape
        {"source": None},  # 4 missing source
        {"source": "a--b"},  # 5 invalid repo id
        {"source": "org/other", "opsets": [3]},  # 6 impossible opset
        {"source": "./nowhere"},  # 7 missing local folder
        {"source": "x/y", "task": "bogus-task", "variants": ["fp64"]},  # 8 two reasons
        {"source": "org/model", "priority": 1},  # 9 duplicate of row 2
        {"source": "org/m2", "timeout_s": -1.0, "exporter": "tf"},  # 10
    ]
    return write_manifest(rows, tmp_path / "m.parquet")


def test_every_bad_row_is_reported_with_its_number(mixed: Path) -> None:
    m = read_manifest(mixed)
    reasons = {p.row: p.reason for p in m.problems}
    assert sorted(reasons) == [3, 4, 5, 6, 7, 8, 10]  # 9 repeats row 2: said once, apart (see below)
    assert "'..'" in reasons[3]
    assert reasons[4] == "missing source"
    assert "invalid repo id 'a--b'" in reasons[5]
    assert "impossible opset" in reasons[6] and "[3]" in reasons[6]
    assert "not found" in reasons[7]
    assert "unknown task 'bogus-task'" in reasons[8] and "unknown variant" in reasons[8]
    assert m.duplicates == {9: 2}
    assert "timeout_s" in reasons[10] and "unknown exporter 'tf'" in reasons[10]
    assert m.bad_rows[5]["source"] == "a--b"


def test_valid_rows_expand_per_opset_with_absolute_local_paths(mixed: Path) -> None:
    m = read_manifest(mixed)
    assert [(e.row, e.opset) for e in m.entries] == [(1, 17), (1, 18), (2, None)]
    assert m.entries[0].source == str(mixed.parent / "bert") and m.entries[0].variants == ("fp32",)
    assert m.entries[2].variants == ("fp32", "fp16", "int8") and m.entries[2].priority == 5


def test_opt_in_variants_are_asked_for_by_name(tmp_path: Path) -> None:
    """uint8 and q4 exist but only a row that names them gets them; a transformers.js dtype is not a variant."""
    rows = [{"source": "org/a", "variants": ["fp32", "uint8", "q4"]}, {"source": "org/b", "variants": ["q8"]}]
    m = read_manifest(write_manifest(rows, tmp_path / "m.parquet"))
    assert [e.variants for e in m.entries] == [("fp32", "uint8", "q4")]
    ((row, reason),) = [(p.row, p.reason) for p in m.problems]
    assert row == 2 and "unknown variant" in reason and "fp32, fp16, int8, uint8, q4" in reason


def test_file_level_problems(tmp_path: Path) -> None:
    pq.write_table(pa.table({"task": ["fill-mask"], "opsets": ["17"]}), tmp_path / "a.parquet")
    m = read_manifest(tmp_path / "a.parquet")
    assert {p.column for p in m.file_problems} == {"source", "opsets"}
    (tmp_path / "b.parquet").write_text("not parquet")
    assert "cannot read Parquet" in str(read_manifest(tmp_path / "b.parquet").file_problems[0])
    # int64 and large_string are accepted and cast
    pq.write_table(pa.table({"source": pa.array(["org/a"], pa.large_string()), "priority": [3]}), tmp_path / "c.parquet")
    assert read_manifest(tmp_path / "c.parquet").entries[0].priority == 3


def test_validate_command_prints_every_problem_and_exits_1(mixed: Path) -> None:
    res = CliRunner().invoke(cli, ["manifest", "validate", str(mixed)])
    assert res.exit_code == 1
    assert sum(line.startswith("row ") for line in res.output.splitlines()) == 7
    assert "warning: 1 duplicate rows ignored (the same source, revision, task, opset and exporter as an earlier row):" \
           " row 9 = row 2" in res.output


def test_bundled_hub_manifest_is_valid() -> None:
    m = read_manifest(REPO / "manifests" / "hub_examples.parquet")
    assert m.rows > 2500 and not m.problems


@pytest.mark.slow
def test_100k_rows_validate_with_one_bad_row_found(tmp_path: Path) -> None:
    # the speed target (< 2 s) is measured in benchmarks/bench_manifest.py
    n = 100_000
    sources = [f"org/model-{i}" for i in range(n)]
    sources[76_543] = "org/../escape"
    table = pa.table(
        {
            "source": sources,
            "task": ["fill-mask"] * n,
            "opsets": [[17]] * n,
            "variants": [["fp32", "int8"]] * n,
        }
    )
    pq.write_table(table, tmp_path / "big.parquet")
    m = read_manifest(tmp_path / "big.parquet")
    assert len(m.entries) == n - 1
    assert [p.row for p in m.problems] == [76_544]


def test_static_tables_match_the_toolchain() -> None:
    import onnx
    from optimum.exporters.tasks import TasksManager
    from torch.onnx import _constants

    assert TASKS == set(TasksManager.get_all_tasks()) | set(TasksManager._SYNONYM_TASK_MAP)
    assert (MIN_OPSET, MAX_OPSET) == (_constants.ONNX_MIN_OPSET, _constants.ONNX_MAX_OPSET)
    assert MAX_OPSET <= onnx.defs.onnx_opset_version()


def test_a_local_folder_with_revisions_is_said_per_row(tmp_path: Path) -> None:
    """`manifest validate` said 0 problems, then `run` stopped after one job: 'job ... is already recorded in run ...'."""
    (tmp_path / "bert").mkdir()
    rows = [{"source": "bert", "revision": "main"}, {"source": "bert", "revision": "v1"}, {"source": "org/model",
            "revision": "v1"}, {"source": "bert"}]  # fmt: skip
    m = read_manifest(write_manifest(rows, tmp_path / "m.parquet"))
    reasons = {p.row: p.reason for p in m.problems}
    assert reasons == {
        1: "revision 'main' given for a local folder, which has none: leave it empty",
        2: "revision 'v1' given for a local folder, which has none: leave it empty",
    }
    assert [(e.source, e.revision) for e in m.entries] == [("org/model", "v1"), (str(tmp_path / "bert"), None)]


def test_duplicate_rows_are_said_once_and_cost_no_job(tmp_path: Path) -> None:
    """100,000 rows with 50,000 duplicates and 2 real jobs: 424 s, 100,027 lines of output, the DB lock held throughout."""
    import subprocess
    import sys
    import time

    rows = [{"source": f"org/m{i % 2}", "variants": ["fp32"]} for i in range(20_000)]
    path = write_manifest(rows, tmp_path / "m.parquet")
    t0 = time.monotonic()
    m = read_manifest(path)
    assert time.monotonic() - t0 < 30
    assert (len(m.entries), m.problems, len(m.duplicates)) == (2, (), 19_998)
    assert m.duplicates_summary is not None and m.duplicates_summary.startswith("19998 duplicate rows ignored")
    assert "row 3 = row 1, row 4 = row 2" in m.duplicates_summary and m.duplicates_summary.endswith("and 19993 more")
    exe = str(Path(sys.executable).with_name("zoo-convert"))
    done = subprocess.run([exe, "manifest", "validate", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "", done.stdout[:500]
    assert done.stderr.splitlines() == [f"warning: {m.duplicates_summary}", "20000 rows, 2 jobs, 0 problems"]


def test_a_row_asks_for_its_optimization_level(tmp_path: Path) -> None:
    rows = [{"source": "org/a", "optimize": "O3"}, {"source": "org/b"}, {"source": "org/c", "optimize": "O4"},
            {"source": "org/d", "optimize": "o2x"}]
    m = read_manifest(write_manifest(rows, tmp_path / "m.parquet"))
    assert [(e.source, e.optimize) for e in m.entries] == [("org/a", "O3"), ("org/b", None)]
    reasons = {p.row: p.reason for p in m.problems}
    assert "unknown optimize level 'O4'" in reasons[3] and "O4, O3 in fp16, is the fp16 variant" in reasons[3]
    assert reasons[4] == "unknown optimize level 'o2x' (choose from O1, O2, O3)"


def test_from_csv_keeps_revisions_and_drops_what_validate_would_refuse(tmp_path: Path) -> None:
    csv_file = tmp_path / "ids.csv"
    csv_file.write_text(
        "model_id,task,revision,library,source\n"
        "google-bert/bert-base-uncased,fill-mask,v1.0,transformers,listed somewhere\n"  # 1: pinned, kept pinned
        "openai/whisper-tiny,,,,\n"  # 2
        "bad id here,,,,\n"  # 3: invalid id
        ",fill-mask,,,\n"  # 4: no id
        "google-bert/bert-base-uncased,fill-mask,v1.0,transformers,\n"  # 5: duplicate of 1
        "google-bert/bert-base-uncased,fill-mask,main,transformers,\n"  # 6: another revision: another job
        "org/model,no-such-task,,,\n"  # 7
    )
    out = tmp_path / "m.parquet"
    res = CliRunner().invoke(cli, ["manifest", "from-csv", str(csv_file), str(out)])
    assert res.exit_code == 0, res.output
    assert res.stdout == f"wrote 3 rows to {out} (4 dropped)\n"
    dropped = [line for line in res.stderr.splitlines() if line.startswith("dropped")]
    assert [d.split(":")[0] for d in dropped] == [f"dropped csv row {n}" for n in (3, 4, 5, 7)]
    assert "invalid repo id 'bad id here'" in dropped[0] and dropped[1].endswith("missing source")
    assert "duplicate of csv row 1" in dropped[2] and "unknown task 'no-such-task'" in dropped[3]
    m = read_manifest(out)
    assert not m.problems and not m.duplicates
    assert [(e.source, e.revision, e.task) for e in m.entries] == [
        ("google-bert/bert-base-uncased", "v1.0", "fill-mask"), ("openai/whisper-tiny", None, None),
        ("google-bert/bert-base-uncased", "main", "fill-mask")]  # the CSV's own "source" column is not the id
    (tmp_path / "nohead.csv").write_text("id,task\nx,y\n")
    res = CliRunner().invoke(cli, ["manifest", "from-csv", str(tmp_path / "nohead.csv"), str(tmp_path / "n.parquet")])
    assert res.exit_code == 2 and "no model_id column (its header: id, task)" in res.output
    assert not (tmp_path / "n.parquet").exists()
    (tmp_path / "bad.csv").write_text("model_id\nbad id\n\n")
    res = CliRunner().invoke(cli, ["manifest", "from-csv", str(tmp_path / "bad.csv"), str(tmp_path / "b.parquet")])
    assert res.exit_code == 2 and "no row could be used (1 dropped: csv row 1: invalid repo id 'bad id'" in res.output
    assert not (tmp_path / "b.parquet").exists()  # a manifest every run would refuse is not written
