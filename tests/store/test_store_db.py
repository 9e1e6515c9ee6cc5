"""ResultStore against real DuckDB files: rows, transactions, migrations, views, locks, SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import duckdb
import pytest
from synthetic import HISTORY, fill, good, result, variant

from zoo_convert.errors import StoreError
from zoo_convert.records import VariantResult
from zoo_convert.store import ResultStore
from zoo_convert.store.schema import LATEST_VERSION, MIGRATIONS


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> ResultStore:
    return fill(tmp_path_factory.mktemp("history") / "results.duckdb")


def rows(store: ResultStore, sql: str) -> list[tuple]:
    with store.connect() as con:
        return con.execute(sql).fetchall()


def test_fresh_file_gets_every_migration_once(tmp_path: Path) -> None:
    path = tmp_path / "r.duckdb"
    ResultStore(path)
    ResultStore(path)  # reopening applies nothing twice
    with duckdb.connect(str(path), read_only=True) as con:
        versions = con.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()
    assert [v for (v,) in versions] == list(range(1, LATEST_VERSION + 1)) == [m.version for m in MIGRATIONS]


# sha256 of each released migration's SQL: a migration applied to a DB is never edited, only appended to.
RELEASED = {
    1: "5d3b497257dc2455b66b43410a3e60cfe1e0ba85dd1f27621d4a57769bd1ae31",
    2: "eb9ec617cbc8c69254236794a624bc210b27b1c52571238055bc044fb44539d8",
    3: "343fd15ca31ce94b4f233288bc9a0d90f66fa24c8e81f7f52bdf340f6c35c144",
    4: "eb1948989d46f71817568efc41d3fbf66bfcd6163d1ff938f19038c35073b149",
    5: "f12db486bc5573f5653a1997fec8b6a5782f7cd45ee079eeb7b40ee0081ce7ea",
    6: "468a7331d4d01fb4d0d85d89bc605fbdf1a7f6dccc41e1a6a6470c7ba839cbaa",
    7: "4b8ed12c296b79d80139b2da129ba2ab07ee1670a48d383daa3887bc6a1e2512",
}


def test_released_migrations_never_change() -> None:
    """Migration 2's views once read records.VARIANTS: a new variant must not rewrite them."""
    import hashlib

    got = {m.version: hashlib.sha256(m.sql.encode()).hexdigest() for m in MIGRATIONS if m.version in RELEASED}
    assert got == RELEASED


def test_a_pre_artifact_failure_counts_in_the_default_variants_only(tmp_path: Path) -> None:
    from zoo_convert.records import ConversionResult, VariantResult

    store = ResultStore(tmp_path / "r.duckdb")
    store.start_run("r", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
    store.record("r", "broken", ConversionResult(source="zoo/broken", status="failed", model_type="bert",
                                                  failure_kind="export_error", stage="export", message="no"))
    store.record("r", "q4", ConversionResult(source="zoo/q4", status="passed", model_type="bert", variants=(
        VariantResult("fp32", "passed"), VariantResult("q4", "passed"))))
    store.finish_run("r")
    got = rows(store, "SELECT variant, models, passed FROM compat_matrix ORDER BY variant")
    assert got == [("fp16", 1, 0), ("fp32", 2, 1), ("int8", 1, 0), ("q4", 1, 1)]


def test_read_only_needs_an_existing_db(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no results database"):
        ResultStore(tmp_path / "missing.duckdb", read_only=True)
    ResultStore(tmp_path / "r.duckdb")
    reader = ResultStore(tmp_path / "r.duckdb", read_only=True)
    with pytest.raises(StoreError, match="read-only"):
        reader.start_run("x", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})


def test_record_writes_variant_output_and_census_rows(history: ResultStore) -> None:
    got = rows(history, "SELECT variant, status, verify_s, benchmark_s, fetch_s, versions['torch'], tags FROM results"
                        " WHERE job_key = 'k-bert-2' ORDER BY variant")
    assert got == [
        ("fp16", "passed", 0.2, 0.6, 0.5, "2.13.0", ["nightly"]),
        ("fp32", "failed", 0.2, 0.6, 0.5, "2.13.0", ["nightly"]),
        ("int8", "passed", 0.2, 0.6, 0.5, "2.13.0", ["nightly"]),
    ]
    assert rows(history, "SELECT count(*) FROM verification WHERE job_key = 'k-bert-2'") == [(12,)]
    assert rows(history, "SELECT sum(n) FROM op_census WHERE job_key = 'k-bert-2'") == [(56,)]


def test_verify_seconds_are_the_shared_references_plus_each_variants_checks(tmp_path: Path) -> None:
    """The references are computed once per job; each variant's ORT checks ran in its optimize child."""
    from dataclasses import replace

    from zoo_convert.records import StageResult

    job = result("zoo/bert", "bert", variants=(variant("fp32"), variant("int8")))
    job = replace(job, stages=(
        StageResult("verify", "passed", 1.25),
        StageResult("verify", "passed", 0.01, details={"variant": "fp32", "checks_seconds": 0.5}),
        StageResult("verify", "passed", 0.02, details={"variant": "int8", "checks_seconds": 0.75}),
    ))  # fmt: skip
    store = ResultStore(tmp_path / "r.duckdb")
    store.start_run("r", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
    store.record("r", "k", job)
    assert rows(store, "SELECT variant, verify_s FROM results ORDER BY variant") == [("fp32", 1.76), ("int8", 2.02)]


def test_a_bug_of_ours_while_timing_keeps_its_traceback_on_the_verified_row(tmp_path: Path) -> None:
    from dataclasses import replace

    timed = replace(variant("fp32"), ort_p50_ms=None, bench_note="internal: TypeError: x", traceback="Traceback (...)")
    store = ResultStore(tmp_path / "r.duckdb")
    store.start_run("r", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
    store.record("r", "k", result("zoo/bert", "bert", variants=(timed, variant("int8"))))
    got = rows(store, "SELECT variant, status, bench_note, traceback FROM results ORDER BY variant")
    assert got == [("fp32", "passed", "internal: TypeError: x", "Traceback (...)"), ("int8", "passed", None, None)]


def test_a_job_without_artifacts_is_one_null_variant_row(history: ResultStore) -> None:
    got = rows(history, "SELECT variant, status, failure_kind, stage, traceback IS NOT NULL FROM results"
                        " WHERE job_key = 'k-vit-2'")
    assert got == [(None, "failed", "export_error", "export", True)]


def test_recording_a_job_twice_raises_and_writes_nothing(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r.duckdb")
    store.start_run("r", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
    res = result("zoo/x", "bert", variants=good("x"))
    store.record("r", "k", res)
    with pytest.raises(StoreError, match="already recorded"):
        store.record("r", "k", res)
    with pytest.raises(StoreError, match="unknown run"):
        store.record("nope", "k2", res)
    assert rows(store, "SELECT count(*) FROM results") == [(3,)]
    assert rows(store, "SELECT count(*) FROM verification") == [(12,)]


def test_finish_run_counts_jobs_by_status(history: ResultStore) -> None:
    got = rows(history, "SELECT run_id, status, n_jobs, n_passed, n_failed, finished_at >= started_at FROM runs"
                        " ORDER BY run_seq")
    assert got == [
        ("run-1", "completed", 5, 5, 0, True),
        ("run-2", "completed", 5, 2, 3, True),
        ("run-3", "completed", 1, 0, 1, True),
    ]


def test_terminal_keys(history: ResultStore) -> None:
    every = {k for jobs in HISTORY.values() for k, _ in jobs}
    assert history.terminal_keys() == every
    assert history.terminal_keys(include_failed=False) == {
        "k-bert-1", "k-gpt2-1", "k-roberta-1", "k-t5-1", "k-vit-1", "k-gpt2-2", "k-roberta-2"
    }


def test_latest_results_takes_each_models_latest_job(history: ResultStore) -> None:
    got = rows(history, "SELECT source, run_id, count(*) FROM latest_results GROUP BY ALL ORDER BY source")
    assert got == [
        ("", "run-2", 1),
        ("zoo/bert-a", "run-2", 3),
        ("zoo/gpt2-b", "run-2", 3),
        ("zoo/roberta-c", "run-2", 3),
        ("zoo/t5-d", "run-3", 1),
        ("zoo/vit-e", "run-2", 1),
    ]


def test_compat_matrix_counts_a_failed_export_in_every_variant(history: ResultStore) -> None:
    got = rows(history, "SELECT model_type, opset, variant, models, pass_rate FROM compat_matrix"
                        " WHERE model_type IN ('bert', 'vit') ORDER BY ALL")
    assert got == [
        ("bert", 17, "fp16", 1, 1.0),
        ("bert", 17, "fp32", 1, 0.0),
        ("bert", 17, "int8", 1, 1.0),
        ("vit", 17, "fp16", 1, 0.0),
        ("vit", 17, "fp32", 1, 0.0),
        ("vit", 17, "int8", 1, 0.0),
    ]
    assert rows(history, "SELECT count(*) FROM compat_matrix WHERE model_type = 'unknown'") == [(0,)]


def test_regressions_compare_with_the_latest_earlier_result(history: ResultStore) -> None:
    got = rows(history, "SELECT run_id, previous_run_id, source, variant, regression FROM regressions ORDER BY ALL")
    broke_all = [("zoo/vit-e", v, "broke") for v in ("fp16", "fp32", "int8")]
    expected = [
        ("run-2", "run-1", "zoo/bert-a", "fp32", "broke"),
        ("run-2", "run-1", "zoo/bert-a", "fp32", "error_grew"),
        *[("run-2", "run-1", "zoo/gpt2-b", v, "error_grew") for v in ("fp16", "fp32", "int8")],
        *[("run-2", "run-1", "zoo/roberta-c", v, "slower") for v in ("fp16", "fp32", "int8")],
        *[("run-2", "run-1", *b) for b in broke_all],
        # run-2 skipped t5-d: run-3 is compared with run-1
        *[("run-3", "run-1", "zoo/t5-d", v, "broke") for v in ("fp16", "fp32", "int8")],
    ]
    assert got == sorted(expected)


def test_failure_signatures_strip_numbers_paths_hex_and_names(history: ResultStore) -> None:
    got = rows(history, "SELECT failure_kind, signature, n, models, sample_models FROM failure_signatures"
                        " WHERE failure_kind = 'export_error'")
    assert got == [
        ("export_error", "Could not export <path>: unsupported op <name> at <hex>", 2, 2, ["zoo/t5-d", "zoo/vit-e"])
    ]


def test_a_reader_waits_for_the_writer_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "r.duckdb"
    ResultStore(path)
    # holds the file until it reads a line: the lock is let go when the test says so, not after a guessed time
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import duckdb, sys; c = duckdb.connect({str(path)!r}); print('held', flush=True);"
                               " sys.stdin.readline()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(StoreError, match="held by another process"):
            ResultStore(path, read_only=True, lock_timeout_s=0.2)
        turned_away = threading.Semaphore(0)
        real_connect = duckdb.connect

        def connect(*args: Any, **kwargs: Any) -> duckdb.DuckDBPyConnection:  # the real one, counting refusals
            try:
                return real_connect(*args, **kwargs)
            except duckdb.IOException:
                turned_away.release()
                raise

        monkeypatch.setattr(duckdb, "connect", connect)
        with ThreadPoolExecutor(1) as pool:
            reader = pool.submit(ResultStore, path, read_only=True, lock_timeout_s=60)
            reader.add_done_callback(lambda _: turned_away.release())  # a reader that gives up wakes the test at once
            # turned away six times, its back-off (20 ms doubling) has kept it waiting over a second: it still waits
            for _ in range(6):
                assert turned_away.acquire(timeout=60) and not reader.done(), "the reader stopped waiting"
            holder.stdin.write("let go\n")
            holder.stdin.flush()
            assert reader.result(timeout=60).terminal_keys() == set()
    finally:
        if holder.stdin is not None:
            holder.stdin.close()
        holder.wait(timeout=30)

WRITER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    from synthetic import good, result
    from zoo_convert.store import ResultStore

    store = ResultStore({path!r})
    store.start_run("killed", manifest="m", manifest_hash="h", versions={{}}, resources={{}}, settings={{}})
    for i in range(100_000):
        store.record("killed", f"k{{i}}", result(f"zoo/m{{i}}", "bert", variants=good("m")))
        print(i + 1, flush=True)
    """
)


def test_a_driver_killed_mid_run_leaves_a_readable_file(tmp_path: Path) -> None:
    path = tmp_path / "r.duckdb"
    code = WRITER.format(tests=str(Path(__file__).parent), path=str(path))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    committed = 0
    deadline = time.monotonic() + 120
    while committed < 5 and time.monotonic() < deadline:
        committed = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert committed >= 5
    reader = ResultStore(path, read_only=True)
    got = rows(reader, "SELECT count(DISTINCT job_key), count(*), count(*) FILTER (WHERE variant IS NULL),"
                       " (SELECT status FROM runs) FROM results")
    jobs, n_rows, nulls, run_status = got[0]
    assert jobs >= committed  # every job it reported committed is there ...
    assert n_rows == 3 * jobs and nulls == 0  # ... and no job is half written
    assert run_status == "running"
    ResultStore(path).record("killed", "after", result("zoo/after", "bert", variants=good("after")))


def test_record_many_is_one_transaction(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r.duckdb")
    store.start_run("r1", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
    a = result("zoo/a", "bert", variants=good("a"))
    b = result("zoo/b", "gpt2", variants=good("b"))
    store.record_many("r1", [("k-a", a), ("k-b", b)])
    # a batch holding one already-recorded job writes nothing at all
    with pytest.raises(StoreError, match="already recorded"):
        store.record_many("r1", [("k-c", result("zoo/c", "vit", variants=good("c"))), ("k-a", a)])
    assert rows(store, "SELECT DISTINCT job_key FROM results ORDER BY 1") == [("k-a",), ("k-b",)]
    # a model twice in one batch: the second job's predecessor is the first
    store.start_run("r2", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
    store.record_many("r2", [("k-a2", a), ("k-a3", a)])
    got = rows(store, "SELECT job_key, job_seq, previous_job_seq FROM results WHERE variant = 'fp32' ORDER BY job_seq")
    assert [(k, p) for k, _, p in got] == [("k-a", None), ("k-b", None), ("k-a2", got[0][1]), ("k-a3", got[2][1])]


def test_last_durations_are_each_models_latest_job(tmp_path: Path) -> None:
    from dataclasses import replace

    store = ResultStore(tmp_path / "r.duckdb")
    store.start_run("r1", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
    old = replace(result("zoo/a", "bert", variants=good("a")), finished_at="2026-01-01T00:00:09.000+00:00")
    new = replace(old, finished_at="2026-01-01T00:00:02.500+00:00")
    other_opset = replace(result("zoo/a", "bert", variants=good("a"), opset=14), finished_at="2026-01-01T00:01:00.000+00:00")
    store.record_many("r1", [("k1", old), ("k2", new), ("k3", other_opset)])
    assert store.last_durations() == {("zoo/a", "optimum", 17): 2.5, ("zoo/a", "optimum", 14): 60.0}


# Real messages, as recorded: the torch exporter's refusals of the zoo's decoders and encoder-decoders
# (today's wording, and the old one with the model type in parentheses), and a load failure naming a
# model class. Each group is one cause.
REFUSED_WITH_PAST = (
    "the torch exporter handles single-graph models only; {m} for task '{t}' needs past key values"
    " (use exporter optimum)"
)
REFUSED_ENCODER_DECODER = "the torch exporter does not split encoder-decoder models ({m}); use exporter optimum"
LOAD_FAILED = (
    "RuntimeError: Error(s) in loading state_dict for {c}Embeddings: (the checkpoint has no preprocessor_config.json:"
    " input sizes came from config.json and optimum's defaults; add the processor config the model was trained with)"
)
CAUSES = {
    REFUSED_WITH_PAST: [
        (m, t)
        for t, models in {
            "text-generation-with-past": ("gpt2", "llama", "qwen2", "gemma", "opt", "gpt_neox"),
            "text2text-generation-with-past": ("t5", "bart", "marian", "m2m_100"),
            "automatic-speech-recognition-with-past": ("whisper",),
        }.items()
        for m in models
    ],
    REFUSED_ENCODER_DECODER: [(m, None) for m in ("t5", "bart", "mt5", "detr", "table-transformer", "deberta-v2")],
    LOAD_FAILED: [("dinov2", "Dinov2"), ("vit", "ViT"), ("m2m_100", "M2M100")],
}


def test_one_cause_is_one_signature_whatever_model_it_names(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r.duckdb")
    store.start_run("r", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
    for i, (message, models) in enumerate(CAUSES.items()):
        for model_type, extra in models:
            text = message.format(m=model_type, t=extra, c=extra)
            source = f"org-{model_type}/{model_type.replace('_', '-')}-tiny-{i}"
            store.record("r", f"k-{i}-{model_type}", result(source, model_type, failure=("export_unsupported", "export", text)))
    got = rows(store, "SELECT signature, n, models FROM failure_signatures ORDER BY n DESC")
    assert [(n, m) for _, n, m in got] == [(len(v), len(v)) for v in CAUSES.values()], got
    assert got[0][0] == (
        "the torch exporter handles single-graph models only; <model> for task <name> needs past key values"
        " (use exporter optimum)"
    )
    assert got[1][0] == "the torch exporter does not split encoder-decoder models (<model>); use exporter optimum"
    assert got[2][0].startswith("RuntimeError: Error(s) in loading state_dict for <model>Embeddings: (the checkpoint")


def test_signatures_replace_the_rows_own_source_and_nothing_inside_other_words(tmp_path: Path) -> None:
    with duckdb.connect() as con:
        ResultStore(tmp_path / "r.duckdb")
        con.execute(f"ATTACH '{tmp_path / 'r.duckdb'}' AS r (READ_ONLY)")
        con.execute("USE r")

        def sig(msg: str, model_type: str | None, source: str | None) -> str:
            return con.execute("SELECT failure_signature(?, model_type := ?, source := ?)", [msg, model_type, source]).fetchone()[0]

        hub = "org-a/model-b@main: HTTP 404: Repository Not Found for url: https://hub.example/api/models/org-a/model-b"
        assert sig(hub, None, "org-a/model-b") == sig(hub.replace("org-a/model-b", "x/y"), None, "x/y")
        assert sig("optimizer failed for opt", "opt", "o/p") == "optimizer failed for <model>"
        assert sig("roberta weights missing", "bert", "b/c") == "roberta weights missing"
        assert sig("Could not export /tmp/x.onnx at 0xdeadbeef", None, None) == "Could not export <path> at <hex>"
        numerics = "1/2 output checks failed; worst logits at 3x19: max abs 0.000557 (tolerance inf), cosine 0.977683"
        assert sig(numerics, "hubert", "z/hubert").startswith("<ratio> output checks failed; worst logits at 3x19: max abs <n>")


def test_the_machines_faults_are_not_terminal_and_timeouts_keep_their_limit(tmp_path: Path) -> None:
    from dataclasses import replace

    store = ResultStore(tmp_path / "r.duckdb")
    store.start_run("r1", manifest="m", manifest_hash="h", versions={}, resources={}, settings={"timeout_s": 600.0})
    disk = result("zoo/a", "bert", failure=("storage_error", "export", "OSError: [Errno 28] No space left on device"))
    gpu = result("zoo/b", "bert", failure=("gpu_unavailable", "job", "the job needs a GPU and no node offers one"))
    hung = replace(result("zoo/c", "bert", failure=("timeout", "job", "no answer after 2 s")), timeout_s=2.0)
    # a variant failed for the disk's sake beside a passing fp32 (made before the fix that fails the job then)
    half = replace(result("zoo/d", "bert", variants=good("d")), variants=(
        *good("d")[:2], replace(good("d")[2], status="failed", failure_kind="storage_error")))  # fmt: skip
    store.record_many("r1", [("k-disk", disk), ("k-gpu", gpu), ("k-hung", hung), ("k-half", half), ("k-ok", result("zoo/e", "bert", variants=good("e")))])
    assert store.terminal_keys() == {"k-hung", "k-ok"}
    assert store.timeouts() == {"k-hung": 2.0}
    store.start_run("r2", manifest="m", manifest_hash="h", versions={}, resources={}, settings={"timeout_s": 600.0})
    store.record_many("r2", [("k-disk", result("zoo/a", "bert", variants=good("a"))), ("k-hung", replace(hung, timeout_s=None))])
    assert store.terminal_keys() == {"k-disk", "k-hung", "k-ok"}  # the redone job answers now
    assert store.timeouts() == {"k-hung": 600.0}  # no limit of its own recorded: its run's --timeout


def test_a_batch_mixing_early_failures_and_variants_keeps_every_column(tmp_path: Path) -> None:
    """The farm records whatever is ready in one batch; a job with no variant first must not blank the others'."""
    store = ResultStore(tmp_path / "r.duckdb")
    store.start_run("r1", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
    early = result("zoo/a", "bert", failure=("timeout", "job", "no answer"))
    store.record_many("r1", [("k-early", early), ("k-ok", result("zoo/b", "bert", variants=good("b")))])
    store.record_many("r1", [("k-ok2", result("zoo/c", "bert", variants=good("c"))), ("k-early2", early)])
    got = rows(store, "SELECT job_key, count(max_abs), count(verify_s), count(ort_p50_ms) FROM results"
                      " WHERE variant IS NOT NULL GROUP BY 1 ORDER BY 1")  # fmt: skip
    assert got == [("k-ok", 3, 3, 3), ("k-ok2", 3, 3, 3)]


def _timed(ort_ms: float, *, noisy: bool) -> VariantResult:
    from dataclasses import replace

    from synthetic import variant

    # PyTorch's reference at 5 ms whatever ONNX Runtime's figure: a change in ONNX Runtime's alone.
    return replace(variant("fp32", ort_ms=ort_ms, torch_ms=5.0), ort_runs=20, ort_spread=0.4 if noisy else 0.03, torch_runs=20,
                   torch_spread=0.05, bench_threads=1, bench_shape="1x128", bench_cpu="Xeon (avx512_vnni)",
                   bench_load=3.5 if noisy else 0.4, bench_noisy=noisy)  # fmt: skip


def test_migration_8_stores_each_latencys_conditions(tmp_path: Path) -> None:
    from dataclasses import replace

    from zoo_convert.records import ConversionResult

    store = ResultStore(tmp_path / "r.duckdb")
    store.start_run("r", manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
    unmeasured = replace(_timed(2.0, noisy=False), variant="int8", ort_p50_ms=None, ort_runs=None, ort_spread=None,
                         bench_noisy=False, bench_note="not timed: no kernel")  # fmt: skip
    store.record("r", "k", ConversionResult(source="zoo/bert", status="passed", model_type="bert",
                                             variants=(_timed(2.0, noisy=True), unmeasured)))  # fmt: skip
    got = rows(store, "SELECT variant, ort_runs, ort_spread, torch_runs, torch_spread, bench_threads, bench_shape,"
                      " bench_cpu, bench_load, bench_noisy, bench_note FROM results ORDER BY variant")
    assert got == [
        ("fp32", 20, 0.4, 20, 0.05, 1, "1x128", "Xeon (avx512_vnni)", 3.5, True, None),
        ("int8", None, None, 20, 0.05, 1, "1x128", "Xeon (avx512_vnni)", 0.4, False, "not timed: no kernel"),
    ]
    assert (8,) in rows(store, "SELECT version FROM schema_migrations")


@pytest.mark.parametrize(("before", "after", "slower"), [(False, False, True), (True, False, False), (False, True, False)])
def test_a_noisy_latency_is_never_a_slower_regression(tmp_path: Path, before: bool, after: bool, slower: bool) -> None:
    from zoo_convert.records import ConversionResult

    store = ResultStore(tmp_path / "r.duckdb")
    for run, ms, noisy in (("r1", 2.0, before), ("r2", 3.0, after)):  # 50 % slower
        store.start_run(run, manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
        store.record(run, "k-" + run, ConversionResult(source="zoo/bert", status="passed", model_type="bert",
                                                        variants=(_timed(ms, noisy=noisy),)))  # fmt: skip
        store.finish_run(run)
    got = rows(store, "SELECT regression FROM regressions")
    assert got == ([("slower",)] if slower else [])


@pytest.mark.parametrize(
    ("torch_after", "revision_after", "slower"),
    [
        (5.0, "a" * 40, True),  # ONNX Runtime 1.5x, its PyTorch reference as before: the conversion got slower
        (7.5, "a" * 40, False),  # both sides 1.5x on the same weights: the machine ran slower for the whole job
        (6.0, "a" * 40, True),  # PyTorch 1.2x, ONNX Runtime 1.5x: 1.25x beyond the machine's share
        (7.5, "b" * 40, True),  # a new checkpoint: its PyTorch figure is another model's, ONNX Runtime's alone decides
    ],
)
def test_slower_asks_the_jobs_own_pytorch_figure_for_the_same_checkpoint(
    tmp_path: Path, torch_after: float, revision_after: str, slower: bool
) -> None:
    from dataclasses import replace

    from zoo_convert.records import ConversionResult

    store = ResultStore(tmp_path / "r.duckdb")
    for run, ort_ms, torch_ms, revision in (("r1", 2.0, 5.0, "a" * 40), ("r2", 3.0, torch_after, revision_after)):
        store.start_run(run, manifest="m", manifest_hash="h", versions={}, resources={}, settings={})
        timed = replace(_timed(ort_ms, noisy=False), torch_p50_ms=torch_ms)
        store.record(run, "k-" + run, ConversionResult(source="zoo/bert", status="passed", model_type="bert",
                                                        resolved_revision=revision, variants=(timed,)))  # fmt: skip
        store.finish_run(run)
    got = rows(store, "SELECT regression, previous_torch_p50_ms, torch_p50_ms FROM regressions")
    assert got == ([("slower", 5.0, torch_after)] if slower else [])
