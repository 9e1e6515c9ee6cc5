"""Publishing part of a run, a Hub that is down, the time budget and repo-name collisions.

One real conversion of the zoo's BERT (fp32) is recorded as four models of one run, each
with its own copy of the artifacts; they are published with the real huggingface_hub
client to the local Hub (tests/hubserver.py), or to an endpoint nobody listens on.
"""

from __future__ import annotations

import dataclasses
import shutil
import socket
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from hubserver import HubServer
from zoo_convert.cli import cli
from zoo_convert.publish import PublicationStatus, PublishOptions, publish_run
from zoo_convert.records import ConversionResult, ManifestEntry, Settings
from zoo_convert.store import ResultStore

TOKEN = "hf_selectTestToken0123456789"
# source, tags, model_type: orgA/bert and orgB/bert share a name (the default template's repo).
MODELS = (
    ("orgA/bert", ("text", "nightly"), "bert"),
    ("orgB/bert", ("text",), "bert"),
    ("orgA/vit", ("vision",), "vit"),
    ("orgA/gpt2", ("text",), "gpt2"),
)


@pytest.fixture(scope="module")
def converted(zoo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> ConversionResult:
    """The zoo's BERT converted once (fp32, no benchmark)."""
    from zoo_convert.pipeline import convert_one

    out = tmp_path_factory.mktemp("converted")
    result = convert_one(ManifestEntry(source=str(zoo_dir / "bert"), variants=("fp32",)),
                         Settings(out_dir=str(out), benchmark=False, verify_long=False))
    assert result.passed, result.message
    return result


def _db(converted: ConversionResult, tmp_path: Path, models: tuple[tuple[str, tuple[str, ...], str], ...] = MODELS) -> Path:
    """A results DB with one run ("sel") of ``models``, each a copy of the real artifacts."""
    assert converted.artifacts_dir is not None
    db = tmp_path / "results.duckdb"
    store = ResultStore(db)
    store.start_run("sel", manifest="m.parquet", manifest_hash="-", versions={}, resources={}, settings={})
    jobs = []
    for i, (source, tags, model_type) in enumerate(models):
        folder = shutil.copytree(converted.artifacts_dir, tmp_path / f"artifacts{i}")
        jobs.append((f"job{i}", dataclasses.replace(converted, source=source, tags=tags, model_type=model_type,
                                                    artifacts_dir=str(folder))))
    store.record_many("sel", jobs)
    store.finish_run("sel")
    return db


def _free_port_url() -> str:
    """An endpoint on this machine that nobody listens on: connections to it are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("dry_run", [False, True], ids=["publish", "dry-run"])
def test_a_hub_that_is_down_stops_the_publish_at_once_with_one_line(
    converted: ConversionResult, tmp_path: Path, dry_run: bool
) -> None:
    db = _db(converted, tmp_path)
    with HubServer(token=TOKEN) as hub:
        endpoint = hub.url
    # The server is gone: its port refuses connections (a dry run without a token first asks for model info).
    args = ["publish", "--db", str(db), "--namespace", "acme", "--endpoint", endpoint,
            *(["--dry-run"] if dry_run else ["--token", TOKEN])]
    started = time.monotonic()
    res = CliRunner().invoke(cli, args, env={"HF_TOKEN": None})
    took = time.monotonic() - started
    assert res.exit_code == 1, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert errors == [f"Error: cannot reach the Hub at {endpoint}: connection refused"], res.output
    assert "Traceback" not in res.output and took < 10, (took, res.output)
    if not dry_run:
        with ResultStore(db).connect() as con:  # nothing was attempted, so nothing is recorded as failed
            assert con.execute("SELECT count(*) FROM publications").fetchone() == (0,)


def test_a_host_without_an_address_is_said_as_a_dns_failure(converted: ConversionResult, tmp_path: Path) -> None:
    db = _db(converted, tmp_path)
    endpoint = "http://hub.zoo-convert-test.invalid"  # .invalid never resolves (RFC 2606)
    res = CliRunner().invoke(cli, ["publish", "--db", str(db), "--namespace", "acme", "--endpoint", endpoint,
                                   "--token", TOKEN], env={"HF_TOKEN": None})
    assert res.exit_code == 1, res.output
    assert f"Error: cannot reach the Hub at {endpoint}: DNS lookup failed" in res.output, res.output


def test_a_rate_limited_hub_is_waited_for_and_said_so(
    converted: ConversionResult, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = _db(converted, tmp_path, MODELS[:1])
    with HubServer(token=TOKEN) as hub:
        hub.fail_next(r"^/api/whoami-v2", 429, retry_after=0.05)
        with caplog.at_level("WARNING"):
            (pub,) = publish_run(ResultStore(db), PublishOptions(namespace="acme", endpoint=hub.url), token=TOKEN)
    assert pub.status == PublicationStatus.PUBLISHED, pub.message
    assert "check the token: rate limited (HTTP 429); retrying" in caplog.text


@pytest.mark.alone  # one model published within --max-time 1 s, the next deferred
def test_the_time_budget_defers_what_is_left_instead_of_waiting(converted: ConversionResult, tmp_path: Path) -> None:
    db = _db(converted, tmp_path, MODELS[2:])
    with HubServer(token=TOKEN) as hub:
        # A slow Hub: the first model's first request takes 1.5 s, past the publish's 1 s budget.
        hub.stall_next(r"^/api/models/acme/vit-ONNX", 1.5)
        options = PublishOptions(namespace="acme", endpoint=hub.url, max_time_s=1.0)
        first = publish_run(ResultStore(db), options, token=TOKEN)
        assert [(p.repo_id, p.status) for p in first] == [
            ("acme/vit-ONNX", PublicationStatus.PUBLISHED), ("acme/gpt2-ONNX", PublicationStatus.DEFERRED)]
        assert first[1].message == "the time budget (--max-time 1 s) is spent; the next publish takes it first"
        assert "acme/gpt2-ONNX" not in hub.repos
        # The next publish takes the deferred model first; a 503 asking for 30 s is not waited for past its 5 s.
        hub.fail_next(r"^/api/models/acme/gpt2-ONNX", 503, retry_after=30)
        started = time.monotonic()
        second = publish_run(ResultStore(db), dataclasses.replace(options, max_time_s=5.0), token=TOKEN)
        assert time.monotonic() - started < 5
    assert [(p.repo_id, p.status) for p in second] == [
        ("acme/gpt2-ONNX", PublicationStatus.FAILED), ("acme/vit-ONNX", PublicationStatus.UNCHANGED)]
    assert "HTTP 503; not retried, the publish's time budget is spent" in (second[0].message or "")


def test_only_and_where_select_part_of_a_run_and_the_dry_run_says_so(converted: ConversionResult, tmp_path: Path) -> None:
    db = _db(converted, tmp_path)
    with HubServer(token=TOKEN) as hub:
        base = ["publish", "--db", str(db), "--namespace", "acme", "--endpoint", hub.url, "--dry-run"]

        def dry(*extra: str) -> tuple[int, list[str]]:
            res = CliRunner().invoke(cli, [*base, *extra], env={"HF_TOKEN": None})
            return res.exit_code, res.output.splitlines()

        code, out = dry("--only", "vit,nightly")  # a name and a tag
        assert code == 0, out
        assert out[0] == "would publish 2 of 4 model(s) of run sel, selected by --only vit,nightly"
        assert sorted(line.split()[1] for line in out[1:-1]) == ["acme/bert-ONNX", "acme/vit-ONNX"]
        code, out = dry("--only", "orgB/bert")  # a source
        assert code == 0 and [line.split()[1] for line in out[1:-1]] == ["acme/bert-ONNX"], out
        code, out = dry("--where", "model_type = 'gpt2' OR source LIKE '%vit'", "--only", "text")
        assert code == 0, out
        assert out[0] == ("would publish 1 of 4 model(s) of run sel, selected by --only text"
                          " --where \"model_type = 'gpt2' OR source LIKE '%vit'\"")
        assert [line.split()[1] for line in out[1:-1]] == ["acme/gpt2-ONNX"]
        assert hub.repos == {}

        code, out = dry("--only", "vit,nope")
        assert code == 2 and "--only nope: no model of run sel has that source, name or tag" in out[-1], out
        code, out = dry("--where", "no_such_column = 1")
        assert code == 2 and out[-1].startswith("Error: bad --where 'no_such_column = 1': "), out
        code, out = dry("--where", "1 = 1); DROP TABLE results; SELECT (1")
        assert code == 2, out
    with ResultStore(db).connect() as con:
        assert con.execute("SELECT count(DISTINCT job_key) FROM results").fetchone() == (4,)


def test_a_repo_name_collision_exits_1_with_a_template_that_keeps_them_apart(
    converted: ConversionResult, tmp_path: Path
) -> None:
    db = _db(converted, tmp_path, MODELS[:2])
    with HubServer(token=TOKEN) as hub:
        args = ["publish", "--db", str(db), "--namespace", "acme", "--endpoint", hub.url, "--token", TOKEN]
        res = CliRunner().invoke(cli, args, env={"HF_TOKEN": None})
        assert res.exit_code == 1, res.output
        (line,) = [line for line in res.output.splitlines() if line.startswith("conflict   acme/")]
        hint = "--repo-template '{namespace}/{owner}-{name}-ONNX'"
        assert "acme/bert-ONNX is already taken by orgA/bert in this run; " + hint + " keeps them apart" in line
        # The hint, as given, publishes both.
        again = CliRunner().invoke(cli, [*args, "--repo-template", "{namespace}/{owner}-{name}-ONNX"],
                                   env={"HF_TOKEN": None})
        assert again.exit_code == 0, again.output
        assert {"acme/orgA-bert-ONNX", "acme/orgB-bert-ONNX"} <= set(hub.repos)


def test_a_collision_of_the_same_model_twice_says_to_select_one(converted: ConversionResult, tmp_path: Path) -> None:
    db = _db(converted, tmp_path, (MODELS[0], MODELS[0]))
    with HubServer(token=TOKEN) as hub:
        pubs = publish_run(ResultStore(db), PublishOptions(namespace="acme", endpoint=hub.url, dry_run=True))
    assert [p.status for p in pubs] == [PublicationStatus.DRY_RUN, PublicationStatus.CONFLICT]
    assert "same source, revision, exporter and opset; publish one of them with --only or --where" in (pubs[1].message or "")
