"""Hub ids are fetched through the real huggingface_hub client, at the asked revision, from a local Hub."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from hubserver import HubServer
from zoo_convert.errors import ExportError, FailureKind, FetchError
from zoo_convert.pipeline import convert_one
from zoo_convert.records import HubSnapshot, ManifestEntry, Settings
from zoo_convert.stages.fetch import fetch, resolve_revision

TOKEN = "hf_fetchTestToken0123456789"
REPO = "zoo/bert"


@pytest.fixture(scope="module")
def hub(zoo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HubServer, dict[str, str]]]:
    """A private repo with two commits: v1 (tagged) and main, which changes config.json."""
    folder = zoo_dir / "bert"
    with HubServer(token=TOKEN) as server, pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_TOKEN", TOKEN)
        v1 = server.seed_repo(REPO, folder, tag="v1", private=True)
        v2_folder = tmp_path_factory.mktemp("v2")
        shutil.copytree(folder, v2_folder, dirs_exist_ok=True)
        config = json.loads((v2_folder / "config.json").read_text())
        (v2_folder / "config.json").write_text(json.dumps({**config, "zoo_revision": 2}))
        main = server.seed_repo(REPO, v2_folder)
        yield server, {"v1": v1, "main": main}


def _settings(server: HubServer, tmp_path: Path) -> Settings:
    return Settings(out_dir=str(tmp_path / "out"), hf_endpoint=server.url, hf_cache=str(tmp_path / "cache"),
                    bench_warmup=1, bench_runs=2)


def test_fetch_resolves_tag_and_default_branch(hub: tuple[HubServer, dict[str, str]], tmp_path: Path) -> None:
    server, sha = hub
    settings = _settings(server, tmp_path)
    old = fetch(ManifestEntry(source=REPO, revision="v1"), settings)
    new = fetch(ManifestEntry(source=REPO), settings)
    assert old.resolved_revision == sha["v1"] != new.resolved_revision == sha["main"]
    assert "zoo_revision" not in old.config and new.config["zoo_revision"] == 2
    assert resolve_revision(ManifestEntry(source=REPO, revision="v1"), settings) == sha["v1"]
    # A full sha pins exactly that commit, even after main moved on.
    assert fetch(ManifestEntry(source=REPO, revision=sha["v1"]), settings).path == old.path
    assert (old.path / "model.safetensors").is_file() and old.task == "fill-mask"


def test_offline_uses_the_cache_without_a_request(hub: tuple[HubServer, dict[str, str]], tmp_path: Path) -> None:
    server, sha = hub
    settings = _settings(server, tmp_path)
    online = fetch(ManifestEntry(source=REPO, revision="v1"), settings)
    before = len(server.log)
    offline = dataclasses.replace(settings, offline=True)
    again = fetch(ManifestEntry(source=REPO, revision="v1"), offline)
    assert (again.path, again.resolved_revision) == (online.path, sha["v1"])
    assert resolve_revision(ManifestEntry(source=REPO, revision="v1"), offline) == sha["v1"]
    assert len(server.log) == before
    with pytest.raises(FetchError, match="offline"):
        fetch(ManifestEntry(source="zoo/never-fetched"), offline)


def test_converted_result_records_the_commit_sha(hub: tuple[HubServer, dict[str, str]], tmp_path: Path) -> None:
    server, sha = hub
    result = convert_one(ManifestEntry(source=REPO, revision="v1", variants=("fp32",)), _settings(server, tmp_path))
    assert result.passed, result.message
    assert result.resolved_revision == sha["v1"]
    assert sha["v1"][:12] in Path(result.artifacts_dir).name
    assert server.requests("GET", rf"/{REPO}/resolve/{sha['v1']}/model.safetensors")


def test_private_repo_without_token_is_not_found(
    hub: tuple[HubServer, dict[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, _ = hub
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))  # no stored login either
    with pytest.raises(FetchError) as info:
        fetch(ManifestEntry(source=REPO), _settings(server, tmp_path))
    assert info.value.kind == FailureKind.FETCH_NOT_FOUND


def test_server_errors_are_transient(hub: tuple[HubServer, dict[str, str]], tmp_path: Path) -> None:
    server, _ = hub
    server.fail_next(rf"^/api/models/{REPO}", 503, times=1)
    with pytest.raises(FetchError) as info:
        fetch(ManifestEntry(source=REPO), _settings(server, tmp_path))
    assert info.value.kind == FailureKind.FETCH_TRANSIENT and info.value.kind.transient


@pytest.mark.slow
def test_convert_prints_no_download_progress_bars(hub: tuple[HubServer, dict[str, str]], tmp_path: Path) -> None:
    """huggingface_hub draws tqdm bars on stderr for every snapshot; our output is our lines only."""
    server, _ = hub
    env = {**os.environ, "HF_ENDPOINT": server.url, "HF_TOKEN": TOKEN, "HF_HUB_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("zoo-convert")), "convert", REPO, "--revision", "v1", "--out",
         str(tmp_path / "out"), "--variants", "fp32", "--no-optimize", "--no-benchmark"],
        capture_output=True, text=True, timeout=600, env=env, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASSED" in proc.stdout
    assert "Fetching" not in proc.stderr and "it/s]" not in proc.stderr, proc.stderr


def test_an_owners_listing_resolves_its_ids_in_fewer_requests_and_gives_up_when_it_does_not_pay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zoo_convert.farm.plan import keyed_jobs

    monkeypatch.delenv("HF_TOKEN", raising=False)
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "bert"}')
    with HubServer(page_size=2) as server:
        shas = {f"many/m{i}": server.seed_repo(f"many/m{i}", folder) for i in range(6)}
        shas |= {f"big/m{i}": server.seed_repo(f"big/m{i}", folder) for i in range(10)}
        # All six of many's models; two of big's ten, on its last page.
        wanted = [*(f"many/m{i}" for i in range(6)), "big/m8", "big/m9"]
        jobs, unresolved = keyed_jobs([ManifestEntry(source=s) for s in wanted], _settings(server, tmp_path))
        requests = server.counts()
    assert unresolved == []
    assert {j.entry.source: (j.resolved_revision, j.entry.snapshot) for j in jobs} == {
        s: (shas[s], HubSnapshot(sha=shas[s], files=(".gitattributes", "config.json"))) for s in wanted
    }
    # many: three pages for six models; big: one page that found nothing, then one model_info each.
    assert requests == {"list_models": 3 + 1, "model_info": 2}


@pytest.mark.parametrize("with_config", [True, False])
def test_a_hub_repo_that_is_an_adapter_or_gguf_says_so_as_a_folder_does(
    with_config: bool, zoo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not "no config.json in the repo": the same messages as a local folder's (tests/stages/test_fetch.py)."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    adapter, gguf = tmp_path / "adapter", tmp_path / "gguf"
    adapter.mkdir()
    gguf.mkdir()
    base = {"peft_type": "LORA", "base_model_name_or_path": "google-bert/bert-base-uncased", "r": 8}
    (adapter / "adapter_config.json").write_text(json.dumps(base))
    (adapter / "adapter_model.safetensors").write_bytes((zoo_dir / "bert" / "model.safetensors").read_bytes())
    if with_config:  # an adapter repo never has one; a GGUF repo sometimes does
        shutil.copy(zoo_dir / "bert" / "config.json", gguf / "config.json")
    (gguf / "model-Q4_K_M.gguf").write_bytes(b"GGUF" + bytes(60))
    with HubServer() as server:
        server.seed_repo("peft/lora", adapter)
        server.seed_repo("quant/gguf", gguf)
        settings = _settings(server, tmp_path)
        with pytest.raises(ExportError) as found:
            fetch(ManifestEntry(source="peft/lora"), settings)
        assert found.value.kind == FailureKind.EXPORT_UNSUPPORTED and "no config.json" not in found.value.message
        assert "a PEFT adapter (LORA), not a model: its base model is google-bert/bert-base-uncased" in found.value.message
        with pytest.raises(ExportError) as found:
            fetch(ManifestEntry(source="quant/gguf"), settings)
        assert found.value.kind == FailureKind.EXPORT_UNSUPPORTED and "no config.json" not in found.value.message
        assert "only GGUF weights (model-Q4_K_M.gguf): GGUF is llama.cpp's format, not a conversion source" in found.value.message
        # Nothing but the adapter's own small config was downloaded: no weights, no GGUF file.
        downloads = [path for method, path, _ in server.requests("GET", r"/resolve/")]
        assert downloads and all(p.endswith("/adapter_config.json") for p in downloads), downloads
