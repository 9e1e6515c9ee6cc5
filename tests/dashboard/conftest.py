"""A results DB holding the synthetic three-run history plus one real pipeline run, and its built site."""

from __future__ import annotations

import sys
import threading
from dataclasses import asdict
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "store"))

from chrome import Chrome, chromium_binary  # noqa: E402
from synthetic import VERSIONS, fill, good, result, variant  # noqa: E402

from zoo_convert.dashboard.site import build_site, serve  # noqa: E402
from zoo_convert.records import ManifestEntry, Settings  # noqa: E402
from zoo_convert.store import ResultStore  # noqa: E402


@pytest.fixture(scope="session")
def real_result(tmp_path_factory: pytest.TempPathFactory):
    """The real pipeline on the zoo's tiny bert: fetch, export, optimize, verify, benchmark."""
    from zoo_convert import zoo
    from zoo_convert.pipeline import convert_one

    root = tmp_path_factory.mktemp("real")
    zoo.build(root / "zoo", only=["bert"])
    entry = ManifestEntry(source=str(root / "zoo" / "bert"), variants=("fp32", "int8", "q4"), opset=17)
    return convert_one(entry, Settings(out_dir=str(root / "artifacts"), bench_warmup=1, bench_runs=3))


# Beside the real bert, run-4 holds a partial model (fp16 failed), a model that broke under a newer torch
# and one that got slower with a new checkpoint.
FP16_CRASH = ("fp16 optimize crashed: onnxruntime's CPU layout optimizer segfaulted while it rewrote"
              " the NCHWc convolutions of the feature encoder (signal 11)")
RUN_4 = {
    "k-wavlm-4": result("zoo/wavlm-f", "wavlm", variants=(
        good("wavlm")[0], variant("fp16", passed=False, message=FP16_CRASH), good("wavlm")[2])),
    "k-gpt2-4": result("zoo/gpt2-b", "gpt2", versions={**VERSIONS, "torch": "2.14.0"},
                       variants=(variant("fp32", passed=False, max_abs=0.5, message="drifted"),) + good("gpt2-b")[1:]),
    "k-roberta-4": result("zoo/roberta-c", "roberta", revision="sha256:" + "cd" * 32,
                          variants=good("roberta-c", ort_ms=9.0)),
}


@pytest.fixture(scope="session")
def results_db(tmp_path_factory: pytest.TempPathFactory, real_result) -> Path:
    path = tmp_path_factory.mktemp("dash") / "results.duckdb"
    store = fill(path)
    store.start_run("run-4", manifest="zoo.parquet", manifest_hash="h4", versions=real_result.versions,
                    resources={"CPU": 2.0}, settings=asdict(Settings()), name="nightly-4")
    store.record("run-4", "k-real-bert", real_result)
    for key, res in RUN_4.items():
        store.record("run-4", key, res)
    store.finish_run("run-4")
    store.record_publication({"run_id": "run-4", "job_key": "k-real-bert", "source": real_result.source,
                              "repo_id": "my-org/bert-ONNX", "status": "published", "commit_sha": "c0ffee",
                              "commit_url": "https://hub.example/my-org/bert-ONNX/commit/c0ffee", "files": 7,
                              "uploaded_files": 7, "uploaded_bytes": 1000, "message": None})
    return path


@pytest.fixture(scope="session")
def site(results_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_site(results_db, tmp_path_factory.mktemp("site")).parent


@pytest.fixture(scope="session")
def site_url(site: Path) -> Iterator[str]:
    server = serve(site, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/index.html"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def browser() -> Iterator[Chrome]:
    binary = chromium_binary()
    assert binary, "chromium is not installed: run `make chromium` (Debian's chromium package)"
    chrome = Chrome(binary)
    yield chrome
    chrome.close()


@pytest.fixture(scope="session")
def targets_db(tmp_path_factory: pytest.TempPathFactory, real_result) -> Path:
    """A real run with deployment-target rows: the real bert (checked on every installed target by the pipeline)
    and a real data2vec-text, a model type transformers.js has no architecture for (``unsupported``)."""
    from zoo_convert import zoo
    from zoo_convert.pipeline import convert_one

    assert {t.target for t in real_result.targets} >= {"ort-cpu", "openvino", "transformers.js"}, real_result.targets
    root = tmp_path_factory.mktemp("targets")
    zoo.build(root / "zoo", only=["data2vec-text"])
    data2vec = convert_one(ManifestEntry(source=str(root / "zoo" / "data2vec-text"), variants=("fp32",)),
                           Settings(out_dir=str(root / "artifacts"), benchmark=False,
                                    targets=("ort-cpu", "openvino", "transformers.js")))  # fmt: skip
    assert data2vec.passed, data2vec.message
    path = root / "results.duckdb"
    store = ResultStore(path)
    store.start_run("run-1", manifest="zoo.parquet", manifest_hash="h", versions=real_result.versions,
                    resources={"CPU": 2.0}, settings=asdict(Settings()), name="targets-1")
    store.record("run-1", "k-bert", real_result)
    store.record("run-1", "k-data2vec", data2vec)
    store.finish_run("run-1")
    return path
