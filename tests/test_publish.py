"""Publishing: a real farm run's DB, pushed with the real huggingface_hub client to a local Hub.

A farm run on a local Ray instance fetches a tiny BERT by hub id and tag from the
local Hub, converts it once (fp32 + int8, weights as external data) and records
it; the tests then publish it, download the published repo, load it with
optimum's ORTModel and compare against PyTorch.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hubserver import HubServer
from zoo_convert.cli import cli
from zoo_convert.farm.driver import FarmOptions, run_farm
from zoo_convert.manifest import write_manifest
from zoo_convert.records import Settings
from zoo_convert.publish import (
    PublicationStatus,
    PublishOptions,
    load_candidates,
    publish_candidate,
    publish_run,
)
from zoo_convert.store import ResultStore

TOKEN = "hf_publishTestToken9876543210"
SOURCE = "zoo/bert"


@dataclasses.dataclass
class World:
    server: HubServer
    db: Path
    settings: Settings
    run_id: str
    source_dir: Path


# every test here publishes the result of a farm run (Ray), made once by the `world` fixture
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world(zoo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """Local Hub holding the source checkpoint (MIT card, tag v1, then a newer main); one farm run of v1."""
    tmp = tmp_path_factory.mktemp("publish")
    source_dir = tmp / "bert"
    shutil.copytree(zoo_dir / "bert", source_dir)
    (source_dir / "README.md").write_text("---\nlicense: mit\n---\n# tiny bert\n")
    with HubServer(token=TOKEN) as server, pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_TOKEN", TOKEN)
        mp.setenv("HF_HOME", str(tmp / "hf_home"))
        v1 = server.seed_repo(SOURCE, source_dir, tag="v1")
        (tmp / "later").mkdir()
        (tmp / "later" / "notes.txt").write_text("a newer commit the run must not pick up")
        server.seed_repo(SOURCE, tmp / "later")
        manifest = write_manifest([{"source": SOURCE, "revision": "v1", "variants": ["fp32", "int8"]}], tmp / "m.parquet")
        # external_data_threshold=0 puts the weights in model.onnx_data, which must travel with the graph.
        settings = Settings(out_dir=str(tmp / "artifacts"), hf_endpoint=server.url, hf_cache=str(tmp / "cache"),
                            bench_warmup=1, bench_runs=3, external_data_threshold=0)
        db = tmp / "results.duckdb"
        report = run_farm(manifest, db_path=db, settings=settings, options=FarmOptions(num_cpus=1, max_attempts=1))
        assert report.by_status == {"passed": 1}, report
        with ResultStore(db).connect() as con:
            ((revision, artifacts),) = con.execute("SELECT DISTINCT resolved_revision, artifacts_dir FROM results").fetchall()
        assert revision == v1
        # `zoo-convert convert` leaves its record beside the artifacts; it must not be published.
        Path(artifacts, "result.json").write_text('{"traceback": "private"}')
        yield World(server, db, settings, report.run_id, source_dir)


def _options(server: HubServer, namespace: str = "acme", **kw: object) -> PublishOptions:
    return PublishOptions(namespace=namespace, endpoint=server.url, backoff_s=0.01, **kw)  # type: ignore[arg-type]


def test_publish_then_load_with_ortmodel(world: World, tmp_path: Path) -> None:
    import numpy as np
    import torch
    from huggingface_hub import ModelCard, snapshot_download
    from optimum.onnxruntime import ORTModelForMaskedLM
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    (pub,) = publish_run(ResultStore(world.db), _options(world.server), token=TOKEN)
    assert pub.status == PublicationStatus.PUBLISHED, pub.message
    repo = "acme/bert-ONNX"
    head = world.server.commits(repo)[0]
    assert pub.repo_id == repo and pub.commit_sha == head.sha
    assert pub.commit_url == f"{world.server.url}/{repo}/commit/{head.sha}"
    assert {"onnx/model.onnx", "onnx/model.onnx_data", "onnx/model_quantized.onnx", "config.json",
            "tokenizer.json", "README.md"} <= set(head.files)
    assert "result.json" not in head.files and head.files["onnx/model.onnx_data"].lfs
    # int8 under both transformers.js names (q8, int8), each graph naming its own data file: the data
    # is one LFS object, uploaded once.
    files = head.files
    assert {"onnx/model_int8.onnx", "onnx/model_int8.onnx_data", "onnx/model_quantized.onnx_data"} <= set(files)
    assert files["onnx/model_int8.onnx_data"].sha256 == files["onnx/model_quantized.onnx_data"].sha256
    puts = [path for m, path, _ in world.server.log if m == "PUT" and path.startswith("/lfs/acme/bert-ONNX/")]
    assert len(puts) == len(set(puts)) and f"/lfs/acme/bert-ONNX/objects/{files['onnx/model_int8.onnx_data'].sha256}" in puts
    sizes = {p: len(f.content) for p, f in files.items() if p != "README.md" and p != ".gitattributes"}
    assert pub.uploaded_bytes == sum(sizes.values()) - sizes["onnx/model_int8.onnx_data"] + len(files["README.md"].content)

    local = Path(snapshot_download(repo, endpoint=world.server.url, token=TOKEN, cache_dir=tmp_path / "dl"))
    card = ModelCard.load(local / "README.md")
    assert card.data.base_model == SOURCE and card.data.license == "mit"
    assert card.data.pipeline_tag == "fill-mask" and "onnx" in card.data.tags
    assert 'ORTModelForMaskedLM.from_pretrained("acme/bert-ONNX", subfolder="onnx")' in card.text
    assert "| `'q8'` | `onnx/model_quantized.onnx` | int8:" in card.text
    assert "| `'int8'` | `onnx/model_int8.onnx` | int8:" in card.text
    assert "SentenceTransformer" not in card.text  # not a sentence-transformers checkpoint

    tokenizer = AutoTokenizer.from_pretrained(local)
    inputs = tokenizer(["the farm converts models", "hello"], padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = AutoModelForMaskedLM.from_pretrained(world.source_dir).eval()(**inputs).logits.numpy()
    fp32 = ORTModelForMaskedLM.from_pretrained(local, subfolder="onnx")(**inputs).logits.numpy()
    assert np.abs(fp32 - expected).max() <= world.settings.tolerances["fp32"].max_abs
    int8 = ORTModelForMaskedLM.from_pretrained(local, subfolder="onnx", file_name="model_quantized.onnx")
    got = int8(**inputs).logits.numpy().ravel()
    cosine = float(got @ expected.ravel() / (np.linalg.norm(got) * np.linalg.norm(expected)))
    assert cosine >= world.settings.tolerances["int8"].min_cosine

    with ResultStore(world.db).connect() as con:
        rows = con.execute("SELECT status, commit_sha, commit_url FROM publications WHERE repo_id = ?", [repo]).fetchall()
    assert rows == [(PublicationStatus.PUBLISHED, head.sha, pub.commit_url)]


def test_second_publish_uploads_nothing(world: World) -> None:
    repo = "acme/bert-ONNX"
    if repo not in world.server.repos:
        publish_run(ResultStore(world.db), _options(world.server), token=TOKEN)
    commits, since = len(world.server.commits(repo)), time.monotonic()
    (pub,) = publish_run(ResultStore(world.db), _options(world.server), token=TOKEN)
    assert pub.status == PublicationStatus.UNCHANGED and pub.uploaded_bytes == 0
    assert pub.commit_sha == world.server.commits(repo)[0].sha
    assert len(world.server.commits(repo)) == commits
    # One request per unchanged model (its files' hashes), plus one token check per publish.
    assert world.server.counts(since=since) == {"model_info": 1, "whoami_v2": 1}


def test_429_and_500_are_survived_without_reuploading(world: World, caplog: pytest.LogCaptureFixture) -> None:
    repo = "flaky/bert-ONNX"
    world.server.fail_next(r"^/api/models/flaky/bert-ONNX/preupload/", 500)
    world.server.fail_next(r"^/api/models/flaky/bert-ONNX/commit/", 429, retry_after=0.05)
    with caplog.at_level(logging.DEBUG):
        (pub,) = publish_run(ResultStore(world.db), _options(world.server, "flaky"), token=TOKEN)
    assert pub.status == PublicationStatus.PUBLISHED, pub.message
    statuses = [s for _, path, s in world.server.log if path.startswith("/api/models/flaky/")]
    assert 500 in statuses and 429 in statuses
    assert len(world.server.commits(repo)) == 2  # the repo's initial commit + ours, nothing half-done
    puts = [path for m, path, _ in world.server.log if m == "PUT" and path.startswith("/lfs/flaky/")]
    assert puts and len(puts) == len(set(puts))  # the retried commit did not upload anything twice
    assert "retrying" in caplog.text
    # The token stays out of logs, the card and the DB.
    assert TOKEN not in caplog.text
    assert TOKEN.encode() not in world.server.commits(repo)[0].files["README.md"].content
    assert all(TOKEN.encode() not in p.read_bytes() for p in world.db.parent.glob("results.duckdb*"))


def test_failed_verification_is_refused(world: World) -> None:
    (candidate,) = load_candidates(ResultStore(world.db), world.run_id)
    failed = dataclasses.replace(candidate, job_status="failed")
    seen = len(world.server.log)
    pub = publish_candidate(None, failed, _options(world.server, "refused"))
    assert pub.status == PublicationStatus.REFUSED and "--include-failed" in (pub.message or "")
    assert len(world.server.log) == seen


def test_cli_dry_run_then_publish(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    args = ["publish", "--db", str(world.db), "--namespace", "cli", "--endpoint", world.server.url]
    dry = CliRunner().invoke(cli, [*args, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "dry_run" in dry.output and "cli/bert-ONNX" not in world.server.repos
    real = CliRunner().invoke(cli, [*args, "--private"])
    assert real.exit_code == 0, real.output
    assert "published" in real.output and world.server.repos["cli/bert-ONNX"].private
    assert TOKEN not in dry.output + real.output
    monkeypatch.delenv("HF_TOKEN")
    assert CliRunner().invoke(cli, args).exit_code == 2


def test_publish_names_its_run_by_name_or_id(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    import duckdb
    from click.testing import CliRunner

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    with duckdb.connect(str(world.db)) as con:
        con.execute("UPDATE runs SET name = 'nightly-pub' WHERE run_id = ?", [world.run_id])
    args = ["publish", "--db", str(world.db), "--namespace", "byname", "--endpoint", world.server.url, "--dry-run"]
    for ref in ("nightly-pub", world.run_id):
        res = CliRunner().invoke(cli, [*args, "--run", ref])
        assert res.exit_code == 0 and "dry_run" in res.output, res.output
    unknown = CliRunner().invoke(cli, [*args, "--run", "nightly-nope"])
    assert unknown.exit_code == 2 and "no run named 'nightly-nope'" in unknown.output, unknown.output


def test_a_bad_token_stops_before_any_repo_with_one_message(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    monkeypatch.delenv("HF_TOKEN")
    seen = len(world.server.log)
    args = ["publish", "--db", str(world.db), "--namespace", "badtoken", "--endpoint", world.server.url]
    bad = CliRunner().invoke(cli, [*args, "--token", "hf_notTheRightToken000"])
    assert bad.exit_code != 0
    # Counted as "HTTP 401", not "401": the local server's random port can hold those digits (40163 did in CI).
    assert bad.output.count("refuses the token (HTTP 401)") == 1 and bad.output.count("HTTP 401") == 1
    assert "hf_notTheRightToken000" not in bad.output
    assert [(m, p, s) for m, p, s in world.server.log[seen:]] == [("GET", "/api/whoami-v2", 401)]

    good = CliRunner().invoke(cli, [*args, "--token", TOKEN])  # --token alone, no HF_TOKEN
    assert good.exit_code == 0, good.output
    assert "published" in good.output and "badtoken/bert-ONNX" in world.server.repos
    assert TOKEN not in good.output


def _twelve_models(world: World, tmp_path: Path) -> ResultStore:
    """A results DB with one run of twelve verified models, each a copy of the world's real artifacts."""
    from zoo_convert.records import ConversionResult, VariantResult

    with ResultStore(world.db).connect() as con:
        ((artifacts,),) = con.execute("SELECT DISTINCT artifacts_dir FROM results").fetchall()
    store = ResultStore(tmp_path / "twelve.duckdb")
    store.start_run("twelve", manifest="m.parquet", manifest_hash="-", versions={}, resources={}, settings={})
    jobs = []
    for i in range(12):
        folder = shutil.copytree(artifacts, tmp_path / f"model{i:02d}")
        jobs.append((f"job{i:02d}", ConversionResult(
            source=f"zoo/model{i:02d}", status="passed", task="fill-mask", model_type="bert", opset=17,
            resolved_revision="ab" * 20, artifacts_dir=str(folder),
            variants=(VariantResult("fp32", "passed", file="onnx/model.onnx"),))))
    store.record_many("twelve", jobs)
    store.finish_run("twelve")
    return store


@pytest.mark.alone  # five commits must fit in the 3 s window
def test_publishing_stops_at_the_commit_budget_and_the_next_publish_takes_the_deferred_first(
    world: World, tmp_path: Path
) -> None:
    store = _twelve_models(world, tmp_path)
    options = _options(world.server, "budget", commits_per_hour=5, commit_window_s=3.0)
    with HubServer(token=TOKEN, limits={"commits": (5, 3.0)}) as hub:
        options = dataclasses.replace(options, endpoint=hub.url)
        names = [f"budget/model{i:02d}-ONNX" for i in range(12)]

        first = publish_run(store, options, token=TOKEN)
        assert [(p.repo_id, p.status) for p in first] == [
            *((n, PublicationStatus.PUBLISHED) for n in names[:5]),
            *((n, PublicationStatus.DEFERRED) for n in names[5:]),
        ]
        assert set(hub.repos) == set(names[:5])  # deferred means not even a repo yet

        time.sleep(3.2)  # the hour passes
        second = publish_run(store, options, token=TOKEN)
        # The deferred first, oldest first; the five already published are left alone while the budget is spent.
        assert [(p.repo_id, p.status) for p in second] == [
            *((n, PublicationStatus.PUBLISHED) for n in names[5:10]),
            *((n, PublicationStatus.DEFERRED) for n in names[10:]),
        ]

        time.sleep(3.2)
        third = publish_run(store, options, token=TOKEN)
        assert [(p.repo_id, p.status) for p in third][:2] == [(n, PublicationStatus.PUBLISHED) for n in names[10:]]
        assert {p.status for p in third[2:]} == {PublicationStatus.UNCHANGED} and len(third) == 12

        assert hub.counts(status=429) == {}
        assert all(len(hub.commits(n)) == 2 for n in names)  # the repo's initial commit + ours: never twice
    with store.connect() as con:
        published = con.execute("SELECT job_key, count(*) FROM publications WHERE status = 'published' GROUP BY ALL").fetchall()
    assert sorted(published) == [(f"job{i:02d}", 1) for i in range(12)]


@pytest.mark.parametrize(
    ("template", "said"),
    [
        ("{name.__class__.__mro__}", "{name.__class__.__mro__} is not one of"),
        ("{namespace}/{name[0]}", "{name[0]} is not one of"),
        ("{namespace}/{name!r}", "{name!r} is not one of"),
        ("{namespace}/{name:>200}", "{name:>200} is not one of"),
        ("{namespace}/{token}", "{token} is not one of"),
        ("{namespace}/{0}", "{0} is not one of"),
        ("{namespace}/{name", "expected '}' before end of string"),
    ],
)
def test_a_repo_template_fills_in_the_documented_fields_and_evaluates_nothing(template: str, said: str) -> None:
    """`{name.__class__.__mro__}` was looked up (str.format) before the result was rejected."""
    from zoo_convert.errors import UsageError
    from zoo_convert.publish.candidates import Candidate
    from zoo_convert.publish.publisher import repo_id_for

    c = Candidate(run_id="r", job_key="k", source="zoo/bert", revision=None, resolved_revision=None, task=None,
                  model_type="bert", exporter="optimum", opset=18, job_status="passed", artifacts_dir=None)  # fmt: skip
    assert repo_id_for(c, PublishOptions(namespace="me", repo_template="{namespace}/{name}-{model_type}-{exporter}-o{opset}")
                       ) == "me/bert-bert-optimum-o18"  # fmt: skip
    with pytest.raises(UsageError, match="bad --repo-template") as info:
        repo_id_for(c, PublishOptions(namespace="me", repo_template=template))
    assert said in str(info.value) and "__mro__" not in str(info.value).split("is not one of")[-1]
    assert "<class" not in str(info.value)
