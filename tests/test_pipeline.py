"""The per-model pipeline end to end on real checkpoints: the bundled zoo and the real MiniLM."""

from __future__ import annotations

import hashlib
import itertools
import json
import multiprocessing
import os
import shutil
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pyarrow.parquet as pq
import pytest

from zoo_convert import node, onnx_graph
from zoo_convert.errors import LONG_INPUTS_ONLY, PublishError
from zoo_convert.pipeline import convert_one
from zoo_convert.records import DEFAULT_VARIANTS, ConversionResult, ManifestEntry, Settings

FAST = dict(bench_warmup=1, bench_runs=3)

# What the bundled zoo gives with the optimum exporter, model by model and variant by variant
# (the README's zoo table): every variant of every model verifies, except these, on purpose.
ZOO_FAILURES = {
    # traced at 16 tokens, the graph keeps the short-input path: wrong at the long shape only, and
    # so is every variant made from it (fp16 and int8 of bigbird, int8 of phi3-longrope, pass their own checks)
    "bigbird": {"fp32": "verify_numerics", "fp16": "verify_numerics", "int8": "verify_numerics"},
    "phi3-longrope": {"fp32": "verify_numerics", "fp16": "verify_numerics", "int8": "verify_numerics"},
    # exported with the full attention optimum's patcher switches it to: wrong at the long shape only,
    # and so is every variant made from it
    "bigbird-pegasus": {"fp32": "verify_numerics", "fp16": "verify_numerics", "int8": "verify_numerics"},
    # ONNX Runtime's CPU layout optimizer crashes loading the fp16 graph
    "wavlm": {"fp16": "optimize_error"},
}
# int8 is checked with the exact sums of its integer products on every CPU (on one without VNNI, where ONNX Runtime
# saturates them, on the graph's uint8 twin): the zoo's t5, mt5, dinov2, pegasus, siglip ... failed there before.


@pytest.fixture(scope="session")
def zoo_results(zoo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, ConversionResult]:
    """Every zoo model through the real pipeline, with the default variants (fp32, fp16, int8).

    No deployment target and no latency: this is ONNX Runtime's verdict on the whole zoo (what `make demo` adds on
    its targets is benchmarks/bench_targets.py's; the targets' tests take five zoo models, the latency's tests bert).
    Both cost more than half of this fixture's CI time (2.1 CPU s a model for the three targets).

    One job per CPU at one thread each, as a farm node runs them, each worker a fresh process (spawned: the suite's
    process has torch's and ONNX Runtime's thread pools running, which a fork would copy mid-flight). One after
    another, the zoo left one of CI's two CPUs idle for most of its minutes (2-core AMD EPYC: the fixture 375 s of the
    suite; two at once, 199 s alone with the zoo's build; the whole suite in CI 2003 -> 1890 s).
    """
    settings = Settings(out_dir=str(tmp_path_factory.mktemp("zoo-onnx")), benchmark=False, targets=())
    rows = pq.read_table(zoo_dir / "manifest.parquet").to_pylist()
    entries = [
        # the optimum exporter's table; the rows optimum has no config for go through auto's generic torch path
        ManifestEntry(
            source=str(zoo_dir / row["source"]),
            task=row["task"],
            exporter="auto" if row["exporter"] == "auto" else "optimum",
        )
        for row in rows
    ]
    workers = max(1, min(4, len(os.sched_getaffinity(0))))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = list(pool.map(convert_one, entries, itertools.repeat(settings)))
    return {row["source"]: result for row, result in zip(rows, results, strict=True)}


@pytest.mark.slow
def test_every_zoo_model_and_variant_ends_as_expected(zoo_results: dict[str, ConversionResult]) -> None:
    """Each variant verified (within its tolerance: fp32's max abs is 1e-4) or failed with its expected kind."""
    from zoo_convert import zoo

    assert list(zoo_results) == [m.name for m in zoo.ZOO] and len(zoo_results) == len(zoo.ZOO)
    got = {name: {v.variant: v.failure_kind or v.status for v in r.variants} for name, r in zoo_results.items()}
    expected = {name: {v: ZOO_FAILURES.get(name, {}).get(v, "passed") for v in DEFAULT_VARIANTS} for name in got}
    assert got == expected, {n: (r.failure_kind, r.message) for n, r in zoo_results.items() if got[n] != expected[n]}
    for name, result in zoo_results.items():
        fp32_failed = "fp32" in ZOO_FAILURES.get(name, {})
        assert (result.status, result.failure_kind) == (("failed", "verify_numerics") if fp32_failed else ("passed", None))
        assert result.partial == (not fp32_failed and name in ZOO_FAILURES), name
        fp32 = result.variant("fp32")
        assert fp32 is not None and (fp32_failed or (fp32.max_abs is not None and fp32.max_abs <= 1e-4)), name
        int8 = result.variant("int8")
        assert int8 is not None and int8.optimizer["components"], name
        twinned = {c: "verified_on" in d for c, d in int8.optimizer["components"].items()}
        assert twinned == dict.fromkeys(twinned, node.int8_saturates()), (name, twinned)


@pytest.mark.slow
def test_every_zoo_model_with_past_generates_and_verifies_both_branches(zoo_results: dict[str, ConversionResult]) -> None:
    """fp32 of every model exported with past: 16 steps on ORT's cache, PyTorch's tokens; a merged decoder, both branches.

    (tests/stages/test_generation.py and test_verify.py check one model of each cache layout in detail.)
    """
    from zoo_convert import zoo

    with_past = [m.name for m in zoo.ZOO if m.task.endswith("-with-past") and "fp32" not in ZOO_FAILURES.get(m.name, {})]
    assert len(with_past) > 20
    for name in with_past:
        fp32 = zoo_results[name].variant("fp32")
        assert fp32 is not None and fp32.generation_note is None, (name, fp32.generation_note)
        assert (fp32.generation_steps, fp32.generation_token_match) == (16, 1.0), name
        merged = {o.shape for o in fp32.outputs if o.output.startswith("decoder_model_merged/") and "/step" not in o.shape}
        if merged:  # an encoder-decoder: every length at both branches
            lengths = {shape.split("/")[0] for shape in merged}
            assert {"1x7", "3x19"} <= lengths, name
            assert merged == {f"{n}/{b}" for n in lengths for b in ("no-cache", "cache")}, name


@pytest.mark.slow
def test_a_model_right_for_short_inputs_only_is_told_apart(
    zoo_results: dict[str, ConversionResult], tmp_path: Path
) -> None:
    """verify_numerics either way; the message prefix (and the failing shapes) say which, in the DB too."""
    from zoo_convert.store import ResultStore

    long_only = {name for name, r in zoo_results.items() if r.message and LONG_INPUTS_ONLY in r.message}
    # block-sparse attention (frozen by the trace, or by the export's patcher), longrope past its original context
    assert long_only == {"bigbird", "bigbird-pegasus", "phi3-longrope"}
    for name in long_only:
        fp32 = zoo_results[name].variant("fp32")
        assert fp32.failure_kind == "verify_numerics"
        assert fp32.message.startswith(f"{LONG_INPUTS_ONLY}: the short shapes passed, diverged at 1x"), fp32.message
        assert all(o.passed for o in fp32.outputs if o.shape in ("1x7", "3x19"))
    with ResultStore(tmp_path / "results.duckdb") as store:
        store.start_run("r", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
        store.record_many("r", [(f"k{i}", r) for i, r in enumerate(zoo_results.values())])
        with store.connect() as con:
            sql = "SELECT source FROM results WHERE failure_kind = 'verify_numerics' AND message LIKE ?"
            rows = con.execute(sql, [f"{LONG_INPUTS_ONLY}:%"]).fetchall()
            signatures = con.execute("SELECT signature, models FROM failure_signatures").fetchall()
    assert {Path(source).name for (source,) in rows} == long_only
    # One signature for "right for short inputs only", apart from any other numerics failure.
    assert sum(n for sig, n in signatures if sig.startswith(LONG_INPUTS_ONLY)) == len(long_only)


@pytest.mark.slow
def test_results_carry_the_facts_of_the_export(zoo_results: dict[str, ConversionResult]) -> None:
    result = next(r for n, r in zoo_results.items() if r.passed and r.model_type == "bert")
    assert result.opset and result.ir_version and result.node_count > 10
    assert sum(result.op_census.values()) == result.node_count
    fp32 = result.variant("fp32")
    assert fp32.file == "onnx/model.onnx" and fp32.size_bytes > 0
    # Settings.verify_shapes and the long shape, not the dummy input
    assert {o.shape for o in fp32.outputs} == {"1x7", "3x19", "1x128"}
    assert [s.stage for s in result.stages][:5] == ["fetch", "export", "check", "verify", "optimize"]
    # ONNX Runtime's checks ran in the optimize children: their time is carried to each variant's verify
    checked = {s.details["variant"]: s.details.get("checks_seconds", 0) for s in result.stages
               if s.stage == "verify" and "variant" in s.details}  # fmt: skip
    assert set(checked) == {v.variant for v in result.variants} and all(t > 0 for t in checked.values()), checked
    assert Path(result.artifacts_dir, "onnx", "model.onnx").is_file()
    assert Path(result.artifacts_dir, "config.json").is_file()
    assert ConversionResult.from_json(result.to_json()) == result


@pytest.mark.slow
def test_minilm_converts_all_variants(minilm_dir: Path, tmp_path: Path) -> None:
    result = convert_one(ManifestEntry(source=str(minilm_dir)), Settings(out_dir=str(tmp_path), **FAST))
    assert result.passed, result.message
    assert result.variant("fp32").max_abs <= 1e-4
    assert result.variant("int8").min_cosine >= 0.98
    onnx_dir = Path(result.artifacts_dir, "onnx")
    assert {p.name for p in onnx_dir.glob("*.onnx")} == {"model.onnx", "model_fp16.onnx", "model_quantized.onnx",
                                                         "model_int8.onnx"}
    assert (Path(result.artifacts_dir) / "tokenizer.json").is_file()
    assert all(v.speedup and v.speedup > 0 for v in result.variants)


@pytest.mark.parametrize(
    ("change", "kind", "stage"),
    [
        (dict(source="/no/such/folder"), "fetch_not_found", "fetch"),
        (dict(source="org/../../etc/passwd"), "fetch_unsafe", "fetch"),
        (dict(task="automatic-speech-recognition"), "export_unsupported", "export"),
        # a BertModel checkpoint has no masked-LM head: the graph would be verified against a random one
        (dict(task="fill-mask"), "export_weights_mismatch", "export"),
    ],
)
def test_bad_input_is_a_recorded_failure(
    change: dict, kind: str, stage: str, minilm_dir: Path, tmp_path: Path
) -> None:
    entry = replace(ManifestEntry(source=str(minilm_dir), variants=("fp32",)), **change)
    result = convert_one(entry, Settings(out_dir=str(tmp_path), **FAST))
    assert (result.status, result.failure_kind, result.stage) == ("failed", kind, stage), result.message
    assert result.message and result.traceback
    json.loads(result.to_json())


def _graph_sha256(path: Path) -> str:
    """The graph with its weights, wherever they are stored."""
    return hashlib.sha256(onnx.load(str(path)).SerializeToString()).hexdigest()


def _census(path: Path) -> Counter[str]:
    return Counter(n.op_type for n in onnx.load(str(path)).graph.node)


@pytest.fixture(scope="module")
def unoptimized(zoo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[ConversionResult, str]:
    """The zoo bert with --no-optimize --no-benchmark, and the sha256 of model.onnx as export left it."""
    out = tmp_path_factory.mktemp("unoptimized")
    exported: dict[str, str] = {}

    def hash_export(stage: str) -> None:
        if stage == "optimize":  # export, check and the references are done; nothing has touched onnx/ since
            (path,) = out.rglob("onnx/model.onnx")
            exported["sha256"] = _graph_sha256(path)

    result = convert_one(
        ManifestEntry(source=str(zoo_dir / "bert"), task="feature-extraction"),
        Settings(out_dir=str(out), optimize=False, benchmark=False),
        on_stage=hash_export,
    )
    return result, exported["sha256"]


@pytest.mark.slow
def test_no_optimize_no_benchmark_verifies_the_export_as_written(
    unoptimized: tuple[ConversionResult, str], zoo_dir: Path, tmp_path: Path
) -> None:
    result, exported_sha256 = unoptimized
    assert result.passed, result.message
    stages = ["fetch", "export", "check", "verify", "optimize", "verify", "verify", "verify", "target"]
    assert [s.stage for s in result.stages] == stages
    model = Path(result.artifacts_dir, "onnx", "model.onnx")
    # The job kept the weights in model.onnx_data; the artifact has them inside again, the graph unchanged.
    assert not onnx_graph.data_path(model).exists()
    assert _graph_sha256(model) == exported_sha256
    fp32 = result.variant("fp32")
    assert fp32.status == "passed" and fp32.max_abs <= 1e-4
    assert {o.shape for o in fp32.outputs} == {"1x7", "3x19", "1x128"}
    assert fp32.optimizer["fusion_applied"] is False and fp32.optimizer["methods"] == ["none"]
    for v in result.variants:
        assert (v.ort_p50_ms, v.ort_p90_ms, v.torch_p50_ms, v.torch_p90_ms, v.speedup) == (None,) * 5, v.variant
    assert _census(model)["Attention"] == _census(model)["SkipLayerNormalization"] == 0
    # The default run fuses the same checkpoint: the test above would notice if --no-optimize did too.
    default = convert_one(
        ManifestEntry(source=str(zoo_dir / "bert"), task="feature-extraction", variants=("fp32",)),
        Settings(out_dir=str(tmp_path), **FAST),
    )
    fused = _census(Path(default.artifacts_dir, "onnx", "model.onnx"))
    assert fused["Attention"] > 0 and fused["SkipLayerNormalization"] > 0
    assert "benchmark" in [s.stage for s in default.stages] and default.variant("fp32").ort_p50_ms > 0


def test_no_optimize_still_makes_and_verifies_every_variant(unoptimized: tuple[ConversionResult, str]) -> None:
    result, _ = unoptimized
    assert {v.variant: v.status for v in result.variants} == dict.fromkeys(("fp32", "fp16", "int8"), "passed")
    verified = [s.details.get("variant") for s in result.stages if s.stage == "verify"]
    assert verified == [None, "fp32", "fp16", "int8"]  # PyTorch's side first, once, then each variant's
    onnx_dir = Path(result.artifacts_dir, "onnx")
    assert {p.name for p in onnx_dir.glob("*.onnx")} == {"model.onnx", "model_fp16.onnx", "model_quantized.onnx",
                                                         "model_int8.onnx"}
    assert result.variant("fp16").optimizer["components"]["model"]["source"] == "plain export"
    assert result.variant("fp16").max_abs <= 5e-2 and result.variant("int8").min_cosine >= 0.98
    assert _census(onnx_dir / "model_quantized.onnx")["MatMulInteger"] > 0


def test_every_artifact_file_gets_one_mode(zoo_dir: Path, tmp_path: Path) -> None:
    """onnx writes external data 0600 and a copy kept the checkpoint's mode; the artifacts are 0644 (less the umask),
    but a side file is never made wider than the checkpoint's own (a 0600 vocab.txt stays 0600)."""
    ckpt = tmp_path / "bert"
    shutil.copytree(zoo_dir / "bert", ckpt)
    (ckpt / "vocab.txt").chmod(0o600)
    (ckpt / "config.json").chmod(0o755)
    result = convert_one(
        ManifestEntry(source=str(ckpt), task="feature-extraction"),
        Settings(out_dir=str(tmp_path / "out"), external_data_threshold=0, benchmark=False),
    )
    assert result.passed, result.message
    files = [p for p in Path(result.artifacts_dir).rglob("*") if p.is_file()]
    assert {"model.onnx_data", "model_fp16.onnx_data", "vocab.txt", "config.json"} <= {p.name for p in files}
    umask = os.umask(0o022)
    os.umask(umask)
    assert {p.relative_to(tmp_path): oct(p.stat().st_mode & 0o777) for p in files} == {
        p.relative_to(tmp_path): oct(0o600 if p.name == "vocab.txt" else 0o644 & ~umask) for p in files
    }


@pytest.mark.parametrize(("options", "errno_name"), [("size=64k", "No space left"), ("ro", "Read-only file system")])
def test_a_full_or_read_only_disk_is_a_storage_error_not_the_models(
    options: str, errno_name: str, zoo_dir: Path, tiny_disk
) -> None:
    from zoo_convert.errors import FailureKind

    out = tiny_disk(options)
    result = convert_one(
        ManifestEntry(source=str(zoo_dir / "bert"), task="feature-extraction", variants=("fp32",)),
        Settings(out_dir=str(out), benchmark=False),
    )
    assert (result.failure_kind, result.stage) == ("storage_error", "export"), result.message
    assert errno_name in result.message
    kind = FailureKind(result.failure_kind)
    assert kind.transient and not kind.terminal  # the farm retries it, and the next run redoes it


def test_a_gpu_row_is_converted_and_judged_as_any_row(zoo_dir: Path, tmp_path: Path) -> None:
    """A ``gpu`` row only asks for a GPU node: the verdict stays ONNX Runtime's CPU one, the GPU is its targets' rows.

    With CUDA first in a gpu row's providers, an H200 ran verify in TF32 and failed fp32 of bert, gpt2, t5 and
    whisper (docs/targets.md). Here (no GPU) the same settings make the same artifact folder and the same record.
    """
    settings = Settings(out_dir=str(tmp_path), benchmark=False, targets=())
    entry = ManifestEntry(source=str(zoo_dir / "bert"), task="feature-extraction", variants=("fp32",))
    cpu = convert_one(entry, settings)
    gpu = convert_one(replace(entry, gpu=True), settings)
    assert cpu.passed and gpu.passed, (cpu.message, gpu.message)
    assert cpu.artifacts_dir and gpu.artifacts_dir
    # The folder's name hashes the settings that decide its bytes, providers included; the second run gets ".2".
    assert Path(gpu.artifacts_dir).name == Path(cpu.artifacts_dir).name + ".2"
    assert [(v.variant, v.status, v.max_abs) for v in gpu.variants] == [(v.variant, v.status, v.max_abs) for v in cpu.variants]


# A real bug of ours induced inside a real conversion: a value our own code then trips over.
# (attribute patched, its value, the stage that fails, a function of ours in the traceback)
OUR_BUGS = [
    ("zoo_convert.stages.export.shape_kwargs", lambda *args: None, "export", "_export_optimum"),
    ("zoo_convert.verify.shapes.MIN_LONG_TOKENS", None, "verify", "_clamp_sequence"),
]


@pytest.mark.parametrize(("target", "value", "stage", "frame"), OUR_BUGS, ids=[b[2] for b in OUR_BUGS])
def test_a_bug_of_ours_is_internal_with_its_traceback(
    target: str, value: object, stage: str, frame: str, zoo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zoo_convert.store import ResultStore

    monkeypatch.setattr(target, value)
    entry = ManifestEntry(source=str(zoo_dir / "bert"), task="feature-extraction", variants=("fp32",))
    result = convert_one(entry, Settings(out_dir=str(tmp_path / "out"), optimize=False, **FAST))
    assert (result.status, result.failure_kind, result.stage) == ("failed", "internal", stage), result.message
    assert "TypeError: " in result.message and frame in result.traceback
    if stage != "export":  # a variant-level failure keeps its own traceback, in the record and in the DB
        fp32 = result.variant("fp32")
        assert (fp32.failure_kind, fp32.traceback) == ("internal", result.traceback) and frame in fp32.traceback
        with ResultStore(tmp_path / "results.duckdb") as store:
            store.start_run("r", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
            store.record("r", "k", result)
            with store.connect() as con:
                sql = "SELECT failure_kind, stage, traceback FROM results WHERE variant = 'fp32'"
                row = con.execute(sql).fetchone()
        assert row[:2] == ("internal", stage) and frame in row[2]


def test_a_bug_of_ours_while_making_a_variant_fails_that_variant_as_internal(
    zoo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("zoo_convert.variants.quantize.BLOCK_BYTES", None)  # None // int in our int8 code
    entry = ManifestEntry(source=str(zoo_dir / "bert"), task="feature-extraction", variants=("fp32", "int8"))
    result = convert_one(entry, Settings(out_dir=str(tmp_path), benchmark=False, **FAST))
    assert result.passed, result.message  # fp32 decides; the broken int8 fails alone
    int8 = result.variant("int8")
    assert (int8.status, int8.failure_kind) == ("failed", "internal")
    assert int8.message.startswith("int8 of model: TypeError: ") and "in blocks" in int8.traceback
    assert "traceback" not in int8.optimizer and "traceback" not in int8.optimizer["components"]["model"]


def test_a_numerics_mismatch_is_recorded_with_every_check(zoo_dir: Path, tmp_path: Path) -> None:
    from zoo_convert.records import Tolerance

    strict = {"fp32": Tolerance(max_abs=0.0, min_cosine=1.0 + 1e-9)}
    entry = ManifestEntry(source=str(zoo_dir / "bert"), task="feature-extraction", variants=("fp32",))
    result = convert_one(entry, Settings(out_dir=str(tmp_path), tolerances=strict, optimize=False, benchmark=False))
    fp32 = result.variant("fp32")
    assert (result.failure_kind, result.stage, fp32.failure_kind) == ("verify_numerics", "verify", "verify_numerics")
    assert {o.shape for o in fp32.outputs} == {"1x7", "3x19", "1x128"} and not any(o.passed for o in fp32.outputs)
    assert not fp32.message.startswith(LONG_INPUTS_ONLY)  # the short shapes failed too: wrong, not long-only
    worst = max(fp32.outputs, key=lambda o: o.max_abs)
    assert fp32.max_abs == worst.max_abs and f"worst {worst.output} at {worst.shape}" in fp32.message
    assert "(tolerance 0)" in fp32.message and fp32.traceback is None  # data, not a crash


@pytest.fixture(scope="module")
def zero_logits_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The zoo's MobileViT at its default initialisation: its logits are exactly 0 for every image."""
    from zoo_convert import zoo

    spec = next(m for m in zoo.ZOO if m.name == "mobilevit")
    config = {k: v for k, v in spec.config.items() if k != "initializer_range"}
    folder = tmp_path_factory.mktemp("zero-logits") / "mobilevit-zero"
    zoo.build_model(replace(spec, name=folder.name, config=config), folder)
    return folder


@pytest.mark.slow
def test_a_pass_that_proves_nothing_is_recorded_inconclusive(zero_logits_dir: Path, tmp_path: Path) -> None:
    """Every variant "passed" with max abs 0 and cosine 1.0: now inconclusive, in the record and in the DB."""
    from zoo_convert.store import ResultStore
    from zoo_convert.store.queries import format_status, status

    entry = ManifestEntry(source=str(zero_logits_dir), task="image-classification", variants=("fp32", "int8"))
    result = convert_one(entry, Settings(out_dir=str(tmp_path / "out"), benchmark=False))
    assert result.status == "inconclusive" and not result.passed and not result.partial
    assert result.failure_kind is None and "logits is all zero at every verify input" in result.message
    assert {v.variant: v.status for v in result.variants} == {"fp32": "inconclusive", "int8": "inconclusive"}
    assert result.variant("fp32").max_abs == 0.0  # the numbers are kept: they are what proves nothing
    with ResultStore(tmp_path / "results.duckdb") as store:
        store.start_run("r", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
        store.record("r", "k", result)
        store.finish_run("r")
        with store.connect() as con:
            cells = con.execute("SELECT variant, passed, inconclusive, pass_rate FROM compat_matrix ORDER BY 1").fetchall()
            counts = con.execute("SELECT n_jobs, n_passed, n_failed FROM runs").fetchone()
        assert cells == [("fp32", 0, 1, 0.0), ("int8", 0, 1, 0.0)]
        assert counts == (1, 0, 0)
        # Not a failure to retry: the same key gives the same reference; --force redoes it.
        assert store.terminal_keys(include_failed=False) == {"k"}
        info = status(store)
    assert (info["converted"], info["inconclusive"], info["not_converted"]) == (0, 1, 0)
    assert "inconclusive   1 (the PyTorch reference proves nothing" in format_status(info)


def test_outputs_below_float16s_range_fail_fp16_saying_why(zoo_dir: Path, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForImageClassification

    src = tmp_path / "vit-tiny-logits"
    model = AutoModelForImageClassification.from_pretrained(zoo_dir / "vit")
    with torch.no_grad():
        model.classifier.weight.mul_(1e-6)
        model.classifier.bias.mul_(1e-6)
    model.save_pretrained(src)
    (src / "preprocessor_config.json").write_bytes((zoo_dir / "vit" / "preprocessor_config.json").read_bytes())
    entry = ManifestEntry(source=str(src), task="image-classification", variants=("fp32", "fp16"))
    result = convert_one(entry, Settings(out_dir=str(tmp_path / "out"), benchmark=False))
    assert result.passed and result.variant("fp32").status == "passed"
    fp16 = result.variant("fp16")
    assert (fp16.status, fp16.failure_kind) == ("failed", "verify_numerics")
    assert "below float16's smallest normal value 6.1e-05: fp16 cannot carry these outputs" in fp16.message


def test_a_broken_tokenizer_fails_the_fetch_instead_of_passing_on_random_ids(zoo_dir: Path, tmp_path: Path) -> None:
    import shutil

    src = tmp_path / "bert"
    shutil.copytree(zoo_dir / "bert", src)
    (src / "tokenizer.json").write_text((src / "tokenizer.json").read_text()[:500])
    result = convert_one(ManifestEntry(source=str(src), task="fill-mask"), Settings(out_dir=str(tmp_path / "out")))
    assert (result.status, result.failure_kind, result.stage) == ("failed", "fetch_error", "fetch")
    assert "tokenizer.json cannot be loaded" in result.message
    assert result.variants == () and result.artifacts_dir is None  # nothing made, nothing to publish


def test_a_bug_of_ours_while_timing_leaves_the_variant_verified_with_the_reason(
    zoo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A benchmark never fails a verified model: the latency stays empty and bench_note says why."""
    monkeypatch.setattr("zoo_convert.stages.benchmark.BENCH_SEQUENCE", None)  # None in our input sizing
    entry = ManifestEntry(source=str(zoo_dir / "bert"), task="feature-extraction", variants=("fp32", "int8"))
    result = convert_one(entry, Settings(out_dir=str(tmp_path), optimize=False, **FAST))
    assert result.passed, result.message
    for v in result.variants:
        assert v.status == "passed" and v.failure_kind is None, v.variant
        assert (v.ort_p50_ms, v.torch_p50_ms, v.speedup, v.bench_noisy) == (None, None, None, False)
        assert v.bench_note is not None and v.bench_note.startswith("internal: TypeError: "), v.bench_note
        assert v.traceback and "Traceback" in v.traceback and "benchmark.py" in v.traceback  # ours to fix: where


def test_one_variant_that_cannot_be_timed_keeps_its_status_and_the_others_are_timed(
    zoo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import zoo_convert.stages.benchmark as bench

    real = bench._ort_side

    def refuse_int8(art, steps, settings):  # ONNX Runtime refusing one variant's session at timing
        if art.variant == "int8":
            raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : no kernel")
        return real(art, steps, settings)

    monkeypatch.setattr(bench, "_ort_side", refuse_int8)
    entry = ManifestEntry(source=str(zoo_dir / "bert"), task="feature-extraction", variants=("fp32", "int8"))
    result = convert_one(entry, Settings(out_dir=str(tmp_path), **FAST))
    int8, fp32 = result.variant("int8"), result.variant("fp32")
    assert (int8.status, int8.ort_p50_ms) == ("passed", None)
    assert int8.bench_note == "not timed: RuntimeError: [ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : no kernel"
    assert fp32.ort_p50_ms and fp32.bench_note is None


def test_latency_is_measured_once_side_by_side_and_records_its_conditions(
    zoo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PyTorch timed once for the job (the same figures on every row); each figure says how it was taken;
    the job's process opens one ONNX Runtime session per artifact (the verify runs are in optimize's children)."""
    import onnxruntime

    opened: list[str] = []
    stages: list[str] = []
    real_init = onnxruntime.InferenceSession.__init__

    def counting_init(self, path, *args, **kwargs):  # counts in this process only: a forked child's count stays there
        if "export" not in stages[-1:]:  # optimum's exporter opens one of its own
            opened.append(Path(str(path)).name)
        real_init(self, path, *args, **kwargs)

    monkeypatch.setattr(onnxruntime.InferenceSession, "__init__", counting_init)
    entry = ManifestEntry(source=str(zoo_dir / "bert"), task="feature-extraction")
    result = convert_one(entry, Settings(out_dir=str(tmp_path), **FAST), on_stage=stages.append)
    assert result.passed, result.message
    assert sorted(opened) == ["model.onnx", "model_fp16.onnx", "model_quantized.onnx"]
    torch_figures = {(v.torch_p50_ms, v.torch_p90_ms, v.torch_runs, v.torch_spread) for v in result.variants}
    assert len(torch_figures) == 1
    for v in result.variants:
        assert v.ort_runs >= FAST["bench_runs"] and v.torch_runs >= FAST["bench_runs"], v.variant
        assert v.ort_spread is not None and v.torch_spread is not None
        assert v.bench_threads == 1 and v.bench_shape == "1x128" and v.bench_cpu and v.bench_load is not None
        assert isinstance(v.bench_noisy, bool) and v.bench_note is None
    assert [s.stage for s in result.stages].count("benchmark") == 1


def test_the_torch_model_is_released_once_its_references_are_computed(
    zoo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a benchmark, the variants are made after PyTorch's side is done and its model dropped."""
    seen: dict[str, object] = {}

    def observed(exported, variants, settings, **kwargs):
        seen["modules"] = [c.torch_module for c in exported.components]
        seen["references"] = exported.cache.references_done
        seen["cases"] = len(exported.cache.cases)

    _watch_torch(monkeypatch, seen, observed)
    entry = ManifestEntry(source=str(zoo_dir / "bert"), task="feature-extraction", variants=("fp32", "fp16"))
    result = convert_one(entry, Settings(out_dir=str(tmp_path), benchmark=False, **FAST))
    assert result.passed, result.message
    assert seen["modules"] == [None] and seen["references"] is True
    assert seen["collected"] is True  # freed, not only unlinked, before any child is forked
    assert seen["cases"] == 3  # 1x7, 3x19 and the long shape, computed before any variant
    assert {o.shape for o in result.variant("fp16").outputs} == {"1x7", "3x19", "1x128"}


def test_a_model_too_big_to_hold_is_timed_in_pytorch_before_optimize_and_released(
    zoo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over the external-data threshold, optimize's children would add each variant's copy to the torch
    model: PyTorch is timed alone first, the model dropped, the variants timed one session at a time."""
    seen: dict[str, object] = {}

    def observed(exported, variants, settings, **kwargs):
        seen["modules"] = [c.torch_module for c in exported.components]

    _watch_torch(monkeypatch, seen, observed)
    entry = ManifestEntry(source=str(zoo_dir / "bert"), task="feature-extraction", variants=("fp32", "int8"))
    result = convert_one(entry, Settings(out_dir=str(tmp_path), external_data_threshold=0, **FAST))
    assert result.passed, result.message
    assert seen["modules"] == [None] and seen["collected"] is True
    order = [(s.stage, s.details.get("torch_alone")) for s in result.stages]
    assert order.index(("benchmark", True)) < order.index(("optimize", None)) < order.index(("benchmark", None))
    assert len({(v.torch_p50_ms, v.torch_runs) for v in result.variants}) == 1
    for v in result.variants:
        assert v.torch_p50_ms and v.ort_p50_ms and v.speedup, v.variant
        assert min(v.ort_runs, v.torch_runs) >= FAST["bench_runs"] and v.bench_note is None


def _watch_torch(monkeypatch: pytest.MonkeyPatch, seen: dict[str, object], observe: Any) -> None:
    """Call ``observe`` as optimize starts; ``seen["collected"]``: whether the exported torch model
    was freed by then (a weak reference to it is dead without this process running the collector)."""
    import weakref

    import zoo_convert.stages.export as exporting
    import zoo_convert.stages.optimize as optimizing

    real_export, real_optimize = exporting.export, optimizing.optimize

    def exported(*args: Any, **kwargs: Any) -> Any:
        found = real_export(*args, **kwargs)
        seen["model"] = weakref.ref(found.components[0].torch_module)
        return found

    def optimizing_(exported: Any, variants: Any, settings: Any, **kwargs: Any) -> Any:
        observe(exported, variants, settings, **kwargs)
        seen["collected"] = seen["model"]() is None  # type: ignore[operator]
        return real_optimize(exported, variants, settings, **kwargs)

    monkeypatch.setattr(exporting, "export", exported)
    monkeypatch.setattr(optimizing, "optimize", optimizing_)


def test_the_benchmark_inputs_cost_no_pytorch_forward(zoo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Verify's cases carry PyTorch's outputs; the benchmark's shape is generated as inputs only."""
    import zoo_convert.verify.runtime as runtime

    made: list[tuple[int, bool, int]] = []
    real = runtime._make_case

    def recorded(exported, comp, config, branch, outputs, kwargs, settings, reference=True, encoded=None, *, key=()):
        case = real(exported, comp, config, branch, outputs, kwargs, settings, reference, encoded, key=key)
        made.append((kwargs["sequence_length"], reference, len(case.reference)))
        return case

    monkeypatch.setattr(runtime, "_make_case", recorded)
    entry = ManifestEntry(source=str(zoo_dir / "bert"), task="feature-extraction", variants=("fp32",))
    result = convert_one(entry, Settings(out_dir=str(tmp_path), **FAST))
    assert result.passed and result.variant("fp32").torch_p50_ms, result.message
    assert [m for m in made if not m[1]] == [(128, False, 0)]  # the benchmark's 1x128: inputs only
    assert sorted(m[0] for m in made if m[1]) == [7, 19, 128] and all(m[2] for m in made if m[1])


def test_fp16_is_made_from_the_fp32_candidate_kept_though_begun_from_one_being_checked(zoo_dir: Path, tmp_path: Path) -> None:
    """Two threads: fp16 starts from each fp32 candidate while it is checked; the one from the kept graph ships.

    An fp32 tolerance of 0 rejects both optimized candidates (the fused graph, ORT's offline one): fp32 keeps the
    plain export, and fp16 is the plain export's, not the fused graph's it was begun from."""
    from zoo_convert.records import Tolerance

    strict = {**Settings().tolerances, "fp32": Tolerance(max_abs=0.0, min_cosine=1.0 + 1e-9)}
    entry = ManifestEntry(source=str(zoo_dir / "bert"), task="feature-extraction", variants=("fp32", "fp16"))
    result = convert_one(entry, Settings(out_dir=str(tmp_path), tolerances=strict, benchmark=False, threads=2))
    fp32 = result.variant("fp32").optimizer["components"]["model"]
    fp16 = result.variant("fp16").optimizer["components"]["model"]
    assert fp32["method"] == "none" and fp32["children_at_once"] == 2
    assert "transformers optimizer (bert): output changed" in fp32["note"]
    assert "ORT offline optimization: output changed" in fp32["note"]
    assert fp16["source"] == "plain export" and "contrib_ops" not in fp16
    onnx_dir = Path(result.artifacts_dir) / "onnx"
    assert sorted(p.name for p in onnx_dir.iterdir()) == ["model.onnx", "model_fp16.onnx"]


def test_an_encoder_decoder_made_side_by_side_generates_with_every_variant(zoo_dir: Path, tmp_path: Path) -> None:
    """Two threads: each variant's decoder still generates 16 steps from its own variant's encoder.

    The decoder's children read the encoder's variant where it ships, so the encoder's are placed first: made
    side by side with the decoder's, fp16 and int8 would find no encoder graph and skip generation."""
    entry = ManifestEntry(source=str(zoo_dir / "t5"), task="text2text-generation-with-past")
    result = convert_one(entry, Settings(out_dir=str(tmp_path), benchmark=False, targets=(), threads=2))
    for name in ("fp32", "fp16", "int8"):
        v = result.variant(name)
        assert v.status == "passed" and v.generation_note is None and v.generation_steps == 16, (name, v.message)
        parts = v.optimizer["components"]
        assert {c: p["children_at_once"] for c, p in parts.items()} == {"encoder_model": 2, "decoder_model_merged": 2}


def test_a_variant_is_no_better_than_the_export_it_was_made_from(zoo_dir: Path, tmp_path: Path) -> None:
    """bigbird's fp32 fails at 1x128 (the export froze the wrong attention path); its fp16 and int8, made from
    the same export, land inside their looser tolerances, and fail with fp32's cause, their own numbers kept.
    The DB's cells, ``db status``, the card and the publisher's file list see them failed."""
    from zoo_convert.publish import load_candidates
    from zoo_convert.publish.card import model_card
    from zoo_convert.publish.files import repo_files
    from zoo_convert.store import ResultStore, queries

    settings = Settings(out_dir=str(tmp_path / "out"), benchmark=False)
    result = convert_one(ManifestEntry(source=str(zoo_dir / "bigbird"), task="fill-mask"), settings)
    fp32 = result.variant("fp32")
    assert (result.status, result.failure_kind, result.stage) == ("failed", "verify_numerics", "verify")
    assert result.message == f"fp32: {fp32.message}" and fp32.message.startswith(LONG_INPUTS_ONLY)
    for name in ("fp16", "int8"):
        v = result.variant(name)
        assert (v.status, v.failure_kind) == ("failed", "verify_numerics"), v.message
        from zoo_convert.errors import STRUCTURE_FAILED

        assert v.message.startswith(f"{STRUCTURE_FAILED} ({name}'s own checks passed: max abs ")
        assert v.message.endswith(f"): {fp32.message}")
        # its own numbers: every check inside its tolerance, the 1x128 ones included
        assert v.outputs and all(o.passed for o in v.outputs) and {o.shape for o in v.outputs} >= {"1x128"}
        assert v.max_abs == max(o.max_abs for o in v.outputs) and v.max_abs <= settings.tolerances[name].max_abs
        assert result.failed_stage(v) == "verify"

    with ResultStore(tmp_path / "results.duckdb") as store:
        store.start_run("r", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
        store.record("r", "k", result)
        store.finish_run("r")
        with store.connect() as con:
            cells = con.execute("SELECT variant, passed, failure_kinds FROM compat_matrix ORDER BY variant").fetchall()
            checks = con.execute("SELECT bool_and(passed) FROM verification WHERE variant <> 'fp32'").fetchone()
        assert cells == [("fp16", 0, ["verify_numerics"]), ("fp32", 0, ["verify_numerics"]), ("int8", 0, ["verify_numerics"])]
        assert checks == (True,)  # the verification rows keep the variant's own verdicts
        info = queries.status(store)
        assert info is not None and (info["converted"], info["variants_verified"], info["variants"]) == (0, 0, 3)
        (candidate,) = load_candidates(store, "r")
    assert not candidate.passed and {v.status for v in candidate.variants} == {"failed"}
    card = model_card(candidate, "org/bigbird")
    assert card.count("| failed |") == 3 and "| passed |" not in card
    with pytest.raises(PublishError, match="no verified ONNX graph"):
        repo_files(candidate)


def test_a_model_that_fails_in_fetch_keeps_the_model_type_its_config_names(minilm_dir: Path, tmp_path: Path) -> None:
    """The dashboard's matrix and table file it under bert, not under "unknown"."""
    src = tmp_path / "minilm"
    shutil.copytree(minilm_dir, src)
    (src / "tokenizer.json").write_text((src / "tokenizer.json").read_text()[:500])
    result = convert_one(ManifestEntry(source=str(src), variants=("fp32",)), Settings(out_dir=str(tmp_path / "out")))
    assert (result.status, result.failure_kind, result.stage) == ("failed", "fetch_error", "fetch")
    assert result.model_type == "bert" and result.opset is None


def test_a_model_that_fails_before_export_keeps_the_model_type_its_config_declares(tmp_path: Path) -> None:
    """A pickle-only checkpoint is refused in fetch; its config.json still says what it is, for the DB and the dashboard."""
    from zoo_convert.pipeline import convert_one as convert

    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "bert", "architectures": ["BertForMaskedLM"]}')
    (folder / "pytorch_model.bin").write_bytes(b"not read")
    result = convert(ManifestEntry(source=str(folder)), Settings(out_dir=str(tmp_path / "out")))
    assert (result.status, result.failure_kind, result.stage) == ("failed", "fetch_unsafe", "fetch")
    assert result.model_type == "bert"
    (folder / "config.json").write_text("not json")  # unreadable: nothing to say, and no second failure
    assert convert(ManifestEntry(source=str(folder)), Settings(out_dir=str(tmp_path / "out"))).model_type is None


def test_a_model_without_a_fuser_ships_onnx_runtime_s_optimized_graph(zoo_dir: Path, tmp_path: Path) -> None:
    """resnet has no transformers optimizer fuser: ORT's offline optimization of its export (weights beside it
    in ``model.onnx_data`` for the whole job) is the fp32 graph, weights inside, checked against PyTorch."""
    result = convert_one(ManifestEntry(source=str(zoo_dir / "resnet")), Settings(out_dir=str(tmp_path), benchmark=False))
    assert result.passed, result.message
    fp32 = result.variant("fp32")
    part = fp32.optimizer["components"]["model"]
    assert (part["method"], part["checked_against_pytorch"]) == ("ort_offline", True), part.get("note")
    assert part["note"] == "model_type 'resnet' has no transformers optimizer fuser"
    assert fp32.status == "passed" and fp32.max_abs <= 1e-4
    graph = Path(result.artifacts_dir, "onnx", "model.onnx")
    assert not onnx_graph.data_path(graph).exists()  # a model this small ships its weights inside
    census = _census(graph)
    assert census["FusedConv"] > 0 and sum(census.values()) < result.node_count  # Conv+Relu fused: fewer nodes
    assert result.variant("fp16").optimizer["components"]["model"]["source"] == "fp32 (ort_offline)"


def _remote_code_bert(zoo_dir: Path, dest: Path) -> Path:
    """The zoo bert as a remote-code checkpoint: its config and model classes live in the folder's own .py files."""
    shutil.copytree(zoo_dir / "bert", dest)
    (dest / "configuration_mybert.py").write_text(
        "from transformers import BertConfig\n\n\nclass MyBertConfig(BertConfig):\n    model_type = 'bert'\n"
    )
    (dest / "modeling_mybert.py").write_text(
        "from transformers import BertModel\n\nfrom .configuration_mybert import MyBertConfig\n\n\n"
        "class MyBertModel(BertModel):\n    config_class = MyBertConfig\n"
    )
    config = json.loads((dest / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_mybert.MyBertConfig", "AutoModel": "modeling_mybert.MyBertModel"}
    config["architectures"] = ["MyBertModel"]
    (dest / "config.json").write_text(json.dumps(config))
    return dest


@pytest.mark.slow
def test_a_remote_code_checkpoint_it_is_allowed_for_ships_its_code_beside_the_graph(zoo_dir: Path, tmp_path: Path) -> None:
    # Every remote-code row failed `internal`: the artifact folder, loaded back as users load it, lacked the .py files.
    src = _remote_code_bert(zoo_dir, tmp_path / "mybert")
    entry = ManifestEntry(source=str(src), task="feature-extraction", variants=("fp32",), allow_remote_code=True)
    result = convert_one(entry, Settings(out_dir=str(tmp_path / "out"), benchmark=False))
    assert result.status == "passed", result.message
    folder = Path(result.artifacts_dir)
    assert {"configuration_mybert.py", "modeling_mybert.py"} <= {p.name for p in folder.iterdir()}
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=True, local_files_only=True)
    assert type(config).__name__ == "MyBertConfig"
    # without the row's leave, the code is neither run nor copied
    refused = convert_one(replace(entry, allow_remote_code=False), Settings(out_dir=str(tmp_path / "out2"), benchmark=False))
    assert refused.status == "failed" and "allow_remote_code" in refused.message


@pytest.mark.slow
def test_a_one_model_process_freezes_the_toolchain_before_the_model_loads_and_thaws_it_after(
    zoo_dir: Path, tmp_path: Path
) -> None:
    # The CLI's convert: the toolchain's objects out of the collector's sight from the export on (every full collection
    # walked them: 0.23 s before optimize at any model size), the model loaded after the freeze so it is still
    # collected, and nothing left frozen once the job returns (a process that goes on collects its garbage again).
    import gc
    import weakref

    from zoo_convert.pipeline import toolchain_frozen
    from zoo_convert.stages import export as export_stage

    assert gc.get_freeze_count() == 0
    frozen: dict[str, int] = {}
    models: list[weakref.ref[Any]] = []
    load = export_stage._load_model

    def noted_load(ckpt: Any, task: str) -> Any:
        model, report = load(ckpt, task)
        models.append(weakref.ref(model))
        frozen["model_collected"] = int(any(model is o for o in gc.get_objects()))
        return model, report

    entry = ManifestEntry(source=str(zoo_dir / "bert"), variants=("fp32",))
    with pytest.MonkeyPatch.context() as mp, toolchain_frozen() as on_stage:
        mp.setattr(export_stage, "_load_model", noted_load)

        def noted(stage: str) -> None:
            on_stage(stage)
            frozen[stage] = gc.get_freeze_count()

        result = convert_one(entry, Settings(out_dir=str(tmp_path), benchmark=False, targets=()), on_stage=noted)
    assert result.passed, result.message
    assert frozen["fetch"] == 0 and frozen["export"] > 100_000, frozen  # torch, transformers, onnx, optimum
    assert frozen["optimize"] <= frozen["export"], frozen  # frozen once: nothing of the job joined it
    assert frozen["model_collected"] == 1  # gc.get_objects() lists the collected generations, not the frozen one
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert models and models[0]() is None  # released and collected, as before


@pytest.mark.parametrize(
    ("model", "ahead", "generated_ahead"),
    [("bert", {"model"}, False), ("whisper", {"encoder_model", "decoder_model_merged"}, True),
     ("gpt2", {"model"}, True), ("t5", {"encoder_model", "decoder_model_merged"}, False)],
)  # fmt: skip
def test_verifys_references_are_computed_beside_the_export_on_a_spare_cpu(
    zoo_dir: Path, tmp_path: Path, model: str, ahead: set[str], generated_ahead: bool
) -> None:
    # convert on 2 CPUs: a child forked before the export computes PyTorch's side of every verify case on the CPU the
    # export leaves idle, and the job takes those outputs (vit-base at real size: 2.6 s of verify hidden in its export).
    # Two decoders about to be merged are the merged decoder there already, and the decoder generates there too (not
    # t5's: its encoder is fed the real prompt only where its graph has input_ids, unknown before the export). The job
    # on 1 CPU forks nothing; both save the same references, and the decoder generates the same tokens on both.
    from zoo_convert.targets import reference

    entry = ManifestEntry(source=str(zoo_dir / model), variants=("fp32",))
    saved, details, generated = {}, {}, {}
    for threads in (1, 2):
        result = convert_one(entry, Settings(out_dir=str(tmp_path / str(threads)), benchmark=False, targets=(), threads=threads))
        assert result.passed, result.message
        assert result.artifacts_dir is not None
        details[threads] = next(s for s in result.stages if s.stage == "verify").details
        saved[threads] = reference.load(Path(result.artifacts_dir))
        fp32 = result.variants[0]
        generated[threads] = (fp32.generation_token_match, fp32.generation_steps, fp32.generation_max_abs)
    assert "references_ahead" not in details[1]
    assert details[2].get("generation_ahead") == ("taken" if generated_ahead else None), details[2]
    assert generated[1][:2] == generated[2][:2] and (generated[2][0] is not None) == (model != "bert"), generated
    cases = [c for c in saved[2].cases if c.component in ahead]
    assert details[2]["references_ahead"] == len(cases) == len(saved[2].cases), details[2]
    assert "references_ahead_unused" not in details[2], details[2]  # every case taken, none computed twice
    assert [(c.component, c.label) for c in saved[1].cases] == [(c.component, c.label) for c in saved[2].cases]
    for one, two in zip(saved[1].cases, saved[2].cases, strict=True):
        assert one.feed.keys() == two.feed.keys()
        assert all(np.array_equal(one.feed[k], two.feed[k]) for k in one.feed)
        for a, b in zip(one.outputs, two.outputs, strict=True):
            assert a.name == b.name
            np.testing.assert_allclose(a.values, b.values, rtol=1e-4, atol=1e-5)  # 1 or 2 threads: sums reordered


def test_outputs_computed_ahead_answer_only_the_very_case_they_were_computed_for() -> None:
    import torch

    from zoo_convert.job import Ahead, Branch, RuntimeCache
    from zoo_convert.verify.runtime import _digest, _made_ahead

    inputs = {"input_ids": torch.tensor([[5, 6, 7]]), "attention_mask": torch.ones(1, 3, dtype=torch.int64)}
    key = ("model", ("batch_size", 1), ("sequence_length", 3))
    made = Ahead(_digest(inputs), ("logits",), {"logits": np.ones((1, 3, 4), dtype=np.float32)}, None)

    def asked(fed: dict[str, Any], outputs: tuple[str, ...] = ("logits",), first: bool = False) -> Ahead | None:
        cache = RuntimeCache()
        cache.ahead[(key, Branch.WHOLE)] = made
        taken = _made_ahead(cache, key, Branch.WHOLE, fed, outputs, first)
        assert (not cache.ahead) == (taken is not None)  # taken, it leaves; refused, it stays (counted as unused)
        return taken

    assert asked({k: v.clone() for k, v in inputs.items()}) is made
    assert asked({**inputs, "input_ids": torch.tensor([[5, 6, 8]])}) is None  # other tokens
    assert asked({**inputs, "attention_mask": inputs["attention_mask"].to(torch.int32)}) is None  # another dtype
    assert asked(inputs, outputs=("logits", "hidden_states")) is None  # the job's config checks more outputs
    assert asked(inputs, first=True) is None  # the job's first case: the repeat forward was not run ahead


def test_a_generation_computed_ahead_answers_only_its_own_decoder_and_inputs() -> None:
    from types import SimpleNamespace

    import torch

    from zoo_convert.job import GenerationAhead, RuntimeCache
    from zoo_convert.verify.generation import STEPS, _made_ahead
    from zoo_convert.verify.runtime import _digest

    prompt = torch.tensor([[464, 2068, 7586]])
    fed = {"input_ids": prompt, "attention_mask": torch.ones_like(prompt)}
    made = GenerationAhead("decoder_model_merged", _digest(fed), np.zeros(STEPS, np.int64), np.zeros((STEPS, 8), np.float32))

    def asked(name: str = "decoder_model_merged", **inputs: torch.Tensor) -> object:
        exported = SimpleNamespace(cache=RuntimeCache(generation_ahead=made))
        taken = _made_ahead(exported, SimpleNamespace(name=name), {**fed, **inputs})  # type: ignore[arg-type]
        assert (exported.cache.generation_ahead is None) == (taken is not None)  # taken once; refused, it stays
        return taken

    taken = asked()
    assert isinstance(taken, tuple) and taken[0] is made.tokens and taken[1] is made.logits
    assert asked(input_ids=prompt[:, :2]) is None  # another prompt
    assert asked(attention_mask=torch.ones_like(prompt, dtype=torch.int32)) is None
    assert asked(decoder_input_ids=torch.tensor([[0]])) is None  # an encoder-decoder's inputs
    assert asked(name="decoder_with_past_model") is None  # another component
