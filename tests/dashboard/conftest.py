"""A results DB holding the synthetic three-run history plus one real pipeline run, and its built site."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "store"))

from chrome import Chrome, chromium_binary  # noqa: E402
from synthetic import fill  # noqa: E402

from zoo_convert.dashboard import build_site, serve  # noqa: E402
from zoo_convert.records import ManifestEntry, Settings  # noqa: E402


@pytest.fixture(scope="session")
def real_result(tmp_path_factory: pytest.TempPathFactory):
    """The real pipeline on the zoo's tiny bert: fetch, export, optimize, verify, benchmark."""
    from zoo_convert import zoo
    from zoo_convert.pipeline import convert_one

    root = tmp_path_factory.mktemp("real")
    zoo.build(root / "zoo", only=["bert"])
    entry = ManifestEntry(source=str(root / "zoo" / "bert"), variants=("fp32", "int8"), opset=17)
    return convert_one(entry, Settings(out_dir=str(root / "artifacts"), bench_warmup=1, bench_runs=3))


@pytest.fixture(scope="session")
def results_db(tmp_path_factory: pytest.TempPathFactory, real_result) -> Path:
    path = tmp_path_factory.mktemp("dash") / "results.duckdb"
    store = fill(path)
    store.start_run("run-4", manifest="zoo.parquet", manifest_hash="h4", versions=real_result.versions,
                    resources={"CPU": 2.0}, settings={})
    store.record("run-4", "k-real-bert", real_result)
    store.finish_run("run-4")
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
