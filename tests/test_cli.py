"""The CLI as a user runs it: a subprocess of the installed console script."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click
from click.testing import CliRunner
import pytest

from zoo_convert.cli import cli

ROOT = Path(__file__).resolve().parents[1]
EXE = str(Path(sys.executable).with_name("zoo-convert"))


def _commands(group: click.Group, prefix: str = "") -> list[str]:
    names = []
    for name, cmd in group.commands.items():
        full = f"{prefix}{name}"
        names += _commands(cmd, full + " ") if isinstance(cmd, click.Group) else [full]
    return names


def test_every_command_is_documented_in_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    missing = [c for c in _commands(cli) if f"zoo-convert {c}" not in readme]
    assert not missing, f"commands missing from README.md: {missing}"


def test_every_command_has_an_example_in_its_help() -> None:
    def leaves(group: click.Group) -> list[click.Command]:
        out = []
        for cmd in group.commands.values():
            out += leaves(cmd) if isinstance(cmd, click.Group) else [cmd]
        return out

    missing = [c.name for c in leaves(cli) if "Example" not in (c.help or "")]
    assert not missing, missing


@pytest.mark.slow
def test_convert_prints_a_summary_and_writes_the_record(minilm_dir: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [EXE, "convert", str(minilm_dir), "--out", str(tmp_path), "--variants", "fp32"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "PASSED" in proc.stdout and "fp32" in proc.stdout
    # Nothing of the farm's: DuckDB and pyarrow were 80 MB of a real-size job's peak (and 0.1 s), Ray is more.
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "torch" in imported and not imported & {"duckdb", "pyarrow", "ray"}, sorted(imported & {"duckdb", "pyarrow", "ray"})
    said = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert said == [], said  # no library's notices between the CLI's lines
    record = json.loads(next(tmp_path.rglob("result.json")).read_text())
    assert record["status"] == "passed" and record["variants"][0]["max_abs"] <= 1e-4
    # One model on this machine uses its CPUs, as optimum-cli does (a farm job: 1), and says so.
    assert record["variants"][0]["bench_threads"] == len(os.sched_getaffinity(0))


@pytest.mark.slow
def test_convert_failure_exits_1_with_json(tmp_path: Path) -> None:
    proc = subprocess.run(
        [EXE, "convert", str(tmp_path), "--out", str(tmp_path / "o"), "--json"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 1, proc.stderr
    record = json.loads(proc.stdout)
    assert record["failure_kind"] == "fetch_error" and "no config.json" in record["message"]


@pytest.mark.slow  # one CLI process per bad usage
def test_bad_usage_exits_2(tmp_path: Path) -> None:
    proc = subprocess.run([EXE, "convert", str(tmp_path), "--out", str(tmp_path), "--variants", "fp64"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and re.search(r"unknown variant", proc.stderr)


def test_convert_refuses_a_task_optimum_has_not_before_fetching(tmp_path: Path) -> None:
    code, out, _ = _invoke("convert", "org/model", "--out", str(tmp_path / "o"), "--task", "fill-masks")
    assert code == 2 and "'--task': 'fill-masks' is not an optimum task" in out, out
    assert not (tmp_path / "o").exists()  # nothing fetched, no folder claimed


@pytest.mark.slow
def test_convert_no_optimize_no_benchmark_says_latency_was_not_measured(zoo_dir: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [EXE, "convert", str(zoo_dir / "bert"), "--out", str(tmp_path), "--variants", "fp32,int8",
         "--no-optimize", "--no-benchmark", "--no-long-shape"],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    # the exporters' tracer warnings, transformers' and optimum's notices: none between the CLI's own lines
    assert proc.stderr == "", proc.stderr
    lines = {line.split()[0]: line for line in proc.stdout.splitlines() if line.startswith(("  fp32", "  int8"))}
    assert set(lines) == {"fp32", "int8"}
    assert all("passed" in line and "latency not measured" in line for line in lines.values()), proc.stdout
    stages = next(line for line in proc.stdout.splitlines() if line.startswith("  stages:"))
    assert "verify[fp32]" in stages and "benchmark" not in stages and "ort p50" not in proc.stdout
    record = json.loads(next(tmp_path.rglob("result.json")).read_text())
    assert record["variants"][0]["optimizer"]["methods"] == ["none"]
    assert record["variants"][0]["ort_p50_ms"] is None
    assert {o["shape"] for o in record["variants"][0]["outputs"]} == {"1x7", "3x19"}  # --no-long-shape


@pytest.mark.parametrize("command", ["run", "convert"])
def test_no_optimize_and_no_benchmark_are_listed_in_help(command: str) -> None:
    proc = subprocess.run([EXE, command, "--help"], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "--no-optimize" in proc.stdout and "--no-benchmark" in proc.stdout and "--no-long-shape" in proc.stdout
    assert "--no-generation" in proc.stdout
    assert "skip the latency measurement" in proc.stdout


def _invoke(*args: str) -> tuple[int, str, BaseException | None]:
    from click.testing import CliRunner

    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.output, res.exception


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--timeout", "-1", "'--timeout': -1.0 is not in the range x>0"),
        ("--timeout", "0", "'--timeout': 0.0 is not in the range x>0"),
        ("--timeout", "nan", "'--timeout': must be a finite number of seconds, not nan"),
        ("--timeout", "inf", "'--timeout': must be a finite number of seconds, not inf"),  # refused in a manifest too
        ("--max-in-flight", "-1", "'--max-in-flight': -1 is not in the range x>=1"),
        ("--num-cpus", "0", "'--num-cpus': 0 is not in the range x>=1"),
        ("--max-attempts", "0", "'--max-attempts': 0 is not in the range x>=1"),
    ],
)
def test_run_refuses_out_of_range_options_before_doing_anything(option: str, value: str, said: str, tmp_path: Path) -> None:
    import ray

    from zoo_convert.manifest import write_manifest

    manifest = write_manifest([{"source": "bad..id"}], tmp_path / "m.parquet")
    db = tmp_path / "r.duckdb"
    code, out, _ = _invoke("run", str(manifest), "--db", str(db), "--out", str(tmp_path / "o"), option, value)
    assert code == 2 and said in out, out
    assert not db.exists() and not ray.is_initialized()  # nothing recorded, no Ray started


def test_convert_refuses_an_opset_outside_the_exporters_range_before_exporting(zoo_dir: Path, tmp_path: Path) -> None:
    from zoo_convert.pipeline import convert_one
    from zoo_convert.records import ManifestEntry, Settings

    code, out, _ = _invoke("convert", str(zoo_dir / "bert"), "--out", str(tmp_path / "o"), "--opset", "99")
    assert code == 2 and "'--opset': 99 is not in the range 7<=x<=23" in out, out
    assert not (tmp_path / "o").exists()
    # the library says so too, before loading the model
    result = convert_one(ManifestEntry(source=str(zoo_dir / "bert"), opset=99), Settings(out_dir=str(tmp_path / "o")))
    assert (result.failure_kind, result.message) == ("export_unsupported", "opset 99 is outside 7..23")
    assert not list((tmp_path / "o").rglob("*.onnx"))


def test_a_manifest_without_rows_is_one_line(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from zoo_convert.manifest import SCHEMA

    empty = tmp_path / "empty.parquet"
    pq.write_table(SCHEMA.empty_table(), empty)
    code, out, exc = _invoke("run", str(empty), "--db", str(tmp_path / "r.duckdb"), "--out", str(tmp_path / "o"))
    assert code == 2 and f"{empty} has no rows: nothing to convert" in out and isinstance(exc, SystemExit), out
    code, out, exc = _invoke("manifest", "validate", str(empty))
    assert code == 1 and "has no rows" in out and isinstance(exc, SystemExit), out


@pytest.mark.slow
def test_convert_json_prints_only_json_on_stdout_even_when_the_exporter_dumps_its_graph(zoo_dir: Path, tmp_path: Path) -> None:
    """At opset 9 BERT does not export (dynamic Slice): torch's exporter fails and prints its graph from C++."""
    proc = subprocess.run(
        [EXE, "convert", str(zoo_dir / "bert"), "--out", str(tmp_path), "--opset", "9", "--variants", "fp32",
         "--no-benchmark", "--json"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    record = json.loads(proc.stdout)
    assert record["failure_kind"] == "export_error" and record["opset_requested"] == 9
    assert "Torch IR graph at exception" in proc.stderr  # still there for whoever debugs it


def _leaves(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    out: dict[str, click.Command] = {}
    for name, cmd in group.commands.items():
        out.update(_leaves(cmd, f"{prefix}{name} ") if isinstance(cmd, click.Group) else {f"{prefix}{name}": cmd})
    return out


@pytest.mark.parametrize("command", sorted(_leaves(cli)))
def test_help_examples_keep_each_command_on_one_line(command: str) -> None:
    examples = [line.strip() for line in (_leaves(cli)[command].help or "").splitlines()
                if line.strip().startswith("zoo-convert ")]
    assert examples, f"{command} has no example"
    res = CliRunner().invoke(cli, [*command.split(), "--help"], terminal_width=80)
    assert res.exit_code == 0, res.output
    shown = [line.strip() for line in res.output.splitlines()]
    assert all(example in shown for example in examples), res.output


def test_db_has_one_default_in_every_command() -> None:
    defaults = {name: next((p.default, p.required) for p in cmd.params if p.name == "db_path")
                for name, cmd in _leaves(cli).items() if any(p.name == "db_path" for p in cmd.params)}
    assert {"run", "dashboard", "publish", "db status", "db query"} <= set(defaults)
    assert set(defaults.values()) == {("results.duckdb", False)}, defaults


def test_trust_remote_code_is_allow_remote_code() -> None:
    convert = cli.commands["convert"]
    for flag in ("--trust-remote-code", "--allow-remote-code"):
        ctx = convert.make_context("convert", ["some/model", "--out", "o", flag])
        assert ctx.params["allow_remote_code"] is True
    assert convert.make_context("convert", ["some/model", "--out", "o"]).params["allow_remote_code"] is False


def test_zoo_build_only_with_an_unknown_name_lists_the_zoo(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["zoo", "build", str(tmp_path / "z"), "--only", "bert,bret"])
    assert res.exit_code == 2 and "unknown zoo model(s): bret" in res.output
    assert all(name in res.output for name in ("bert", "gpt2", "whisper", "wavlm"))
    assert not (tmp_path / "z").exists()


def test_exit_codes_tell_an_operational_error_from_bad_usage(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from zoo_convert.manifest import write_manifest

    runner = CliRunner()
    # The results DB missing (StoreError), as one locked or unreadable would be: operational, 1.
    missing = runner.invoke(cli, ["db", "status", "--db", str(tmp_path / "none.duckdb")])
    assert missing.exit_code == 1 and "Error: no results database at" in missing.output, missing.output
    # Bad usage: a wrong argument the library refuses (UsageError), a manifest file that cannot be used.
    unknown = runner.invoke(cli, ["zoo", "build", str(tmp_path / "zoo"), "--only", "nope"])
    assert unknown.exit_code == 2 and "unknown zoo model(s): nope" in unknown.output, unknown.output
    (tmp_path / "m.parquet").write_text("not parquet")
    bad = runner.invoke(cli, ["run", str(tmp_path / "m.parquet"), "--db", str(tmp_path / "r.duckdb"), "--out", "o"])
    assert bad.exit_code == 2 and "cannot read Parquet file" in bad.output, bad.output
    assert not (tmp_path / "r.duckdb").exists()
    good = write_manifest([{"source": "org/x"}], tmp_path / "ok.parquet")
    assert runner.invoke(cli, ["manifest", "validate", str(good)]).exit_code == 0
    assert "Exit codes" in runner.invoke(cli, ["--help"]).output


@pytest.mark.parametrize(
    ("error", "code"),
    [("UsageError", 2), ("ManifestError", 2), ("RunLockedError", 2), ("StoreError", 1), ("PublishError", 1), ("FetchError", 1),
     ("UnsafeCheckpointError", 1), ("ZooConvertError", 1)],
)  # fmt: skip
def test_every_library_error_has_its_exit_code(error: str, code: int) -> None:
    from zoo_convert import errors
    from zoo_convert.cli import exit_code

    assert exit_code(getattr(errors, error)("x")) == code


def test_convert_optimize_levels_as_optimum_cli_spells_them(zoo_dir: Path, tmp_path: Path) -> None:
    o4 = subprocess.run([EXE, "convert", str(zoo_dir / "bert"), "--out", str(tmp_path), "--optimize", "O4"],
                        capture_output=True, text=True, timeout=120, check=False)
    assert o4.returncode == 2 and "O4 is optimum's O3 in fp16: here that is the fp16 variant" in o4.stderr, o4.stderr
    for command in ("convert", "run"):
        shown = CliRunner().invoke(cli, [command, "--help"], terminal_width=200).output
        assert "--optimize O1|O2|O3" in shown and "[default: O2]" in shown and "O4" in shown
    proc = subprocess.run([EXE, "convert", str(zoo_dir / "bert"), "--out", str(tmp_path), "--variants", "fp32",
                           "--optimize", "o1", "--no-benchmark", "--no-long-shape", "--json"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    optimizer = json.loads(proc.stdout)["variants"][0]["optimizer"]
    assert optimizer["level"] == "O1" and optimizer["methods"] == ["ort_basic"] and optimizer["fused_ops"] == {}


def test_convert_shape_overrides_and_atol_as_optimum_cli_spells_them_are_used_and_recorded(
    zoo_dir: Path, tmp_path: Path
) -> None:
    def convert(*extra: str) -> dict:
        proc = subprocess.run([EXE, "convert", str(zoo_dir / "bert"), "--out", str(tmp_path), "--variants", "fp32",
                               "--no-long-shape", "--json", *extra], capture_output=True, text=True, timeout=300, check=False)
        assert proc.stdout, proc.stderr
        return json.loads(proc.stdout)

    record = convert("--batch-size", "2", "--sequence-length", "11", "--atol", "1e-3", "--rtol", "2e-3")
    assert record["status"] == "passed", record["message"]
    fp32 = record["variants"][0]
    assert {o["shape"] for o in fp32["outputs"]} == {"2x11"} and fp32["bench_shape"] == "2x11"
    (verify,) = [s for s in record["stages"] if s["stage"] == "verify" and "variant" not in s["details"]]
    assert verify["details"]["shapes"] == {"batch_size": 2, "sequence_length": 11}
    assert verify["details"]["fp32_max_abs"] == 1e-3 and verify["details"]["fp32_rtol"] == 2e-3
    # A tolerance no float32 graph meets fails the fp32 graph, saying the tolerance it missed.
    strict = convert("--atol", "1e-12", "--rtol", "0", "--no-benchmark")
    assert strict["status"] == "failed" and "(tolerance 1e-12)" in strict["message"], strict["message"]
    scaled = convert("--atol", "1e-12", "--rtol", "1e-9", "--no-benchmark")
    assert "(tolerance 1e-12 + 1e-09·|PyTorch|)" in scaled["message"], scaled["message"]
    refused = CliRunner().invoke(cli, ["convert", str(zoo_dir / "bert"), "--out", str(tmp_path), "--rtol", "nan"])
    assert refused.exit_code == 2 and "must be a number" in refused.output, refused.output
    for command in ("convert", "run"):
        shown = CliRunner().invoke(cli, [command, "--help"], terminal_width=200).output
        assert all(f"--{o} " in shown for o in ("batch-size", "sequence-length", "height", "width", "num-channels",
                                                "audio-sequence-length", "feature-size", "nb-max-frames", "atol", "rtol"))


@pytest.mark.slow  # two conversions through the console script: a tiny bert and the tiny Stable Diffusion pipeline
def test_convert_imports_diffusers_only_for_a_diffusers_pipeline(zoo_dir: Path, tmp_path: Path) -> None:
    """optimum's exporter imports diffusers wherever it is installed: about 1 s of a one-model ``convert`` for
    nothing unless the model is a pipeline (node.no_diffusers). Python's own import log says what was imported."""
    imported = {}
    for name in ("bert", "stable-diffusion"):
        proc = subprocess.run([EXE, "convert", str(zoo_dir / name), "--out", str(tmp_path / name), "--variants", "fp32",
                               "--no-benchmark", "--no-long-shape", "--targets", "none", "--json"],
                              env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"},
                              capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert json.loads(proc.stdout)["status"] == "passed"
        imported[name] = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "optimum.exporters.onnx.convert" in imported["bert"] and "diffusers" not in imported["bert"]
    assert "diffusers" in imported["stable-diffusion"]
