"""sentence-transformers checkpoints keep their head: SentenceTransformer(out, backend="onnx") == PyTorch.

The ONNX backend runs onnx/model.onnx as the Transformer module and builds every other
module listed in modules.json (Pooling, Dense, Normalize) from its folder, so the
artifact folder must carry modules.json, the module folders and the configs. Without
them it builds Transformer + mean Pooling and returns unnormalized embeddings.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hubserver import HubServer
from zoo_convert.pipeline import convert_one
from zoo_convert.records import ConversionResult, ManifestEntry, Settings
from zoo_convert.verify.runtime import SENTENCES
from zoo_convert.sources import sentence_transformers_files

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]  # sentence-transformers and the real MiniLM

TOKEN = "hf_sentenceTransformers0123456"


def _embeddings(folder: Path, **onnx: str) -> tuple[np.ndarray, list[str]]:
    """Embeddings of the fixed sentences, and the module classes that made them."""
    from sentence_transformers import SentenceTransformer

    kwargs = {"backend": "onnx", "model_kwargs": {"file_name": onnx["file_name"]}} if onnx else {}
    model = SentenceTransformer(str(folder), device="cpu", **kwargs)
    return model.encode(list(SENTENCES)), [type(m).__name__ for m in model]


def _assert_same_embeddings(source: Path, result: ConversionResult, *, min_cosine: float = 0.9999,
                            file_name: str = "onnx/model.onnx") -> None:
    assert result.passed, result.message
    want, want_modules = _embeddings(source)
    got, got_modules = _embeddings(Path(result.artifacts_dir), file_name=file_name)
    assert got_modules == want_modules
    cosine = (got * want).sum(axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cosine.min() >= min_cosine, cosine
    if min_cosine >= 0.9999:
        assert np.allclose(np.linalg.norm(got, axis=1), np.linalg.norm(want, axis=1), atol=1e-4)


@pytest.fixture(scope="module")
def with_dense(zoo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint saved by sentence-transformers itself: Transformer, Pooling, Dense (weights), Normalize."""
    import torch
    from sentence_transformers import SentenceTransformer, models

    torch.manual_seed(0)
    transformer = models.Transformer(str(zoo_dir / "sentence-bert"))
    dim = transformer.get_word_embedding_dimension()
    modules = [transformer, models.Pooling(dim, "mean"), models.Dense(dim, 16, activation_function=torch.nn.Tanh()),
               models.Normalize()]
    folder = tmp_path_factory.mktemp("st") / "st-dense"
    SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    assert (folder / "2_Dense" / "model.safetensors").is_file()
    return folder


def test_the_real_minilm_embeds_as_in_pytorch(minilm_dir: Path, tmp_path: Path) -> None:
    """all-MiniLM-L6-v2: Transformer, mean Pooling, Normalize; q4 within its tolerance on real text too."""
    settings = Settings(out_dir=str(tmp_path), benchmark=False)
    result = convert_one(ManifestEntry(source=str(minilm_dir), variants=("fp32", "q4")), settings)
    _assert_same_embeddings(minilm_dir, result)
    out = Path(result.artifacts_dir)
    assert json.loads((out / "modules.json").read_text()) == json.loads((minilm_dir / "modules.json").read_text())
    for name in ("1_Pooling/config.json", "sentence_bert_config.json", "config_sentence_transformers.json"):
        assert (out / name).read_bytes() == (minilm_dir / name).read_bytes(), name
    # 4-bit weights: the sentence embeddings stay within the tolerance verify applied to the raw output.
    q4 = result.variant("q4")
    assert q4.status == "passed" and q4.min_cosine >= settings.tolerances["q4"].min_cosine
    _assert_same_embeddings(minilm_dir, result, min_cosine=settings.tolerances["q4"].min_cosine,
                            file_name="onnx/model_q4.onnx")


def test_the_zoo_sentence_bert_embeds_as_in_pytorch(zoo_dir: Path, tmp_path: Path) -> None:
    source = zoo_dir / "sentence-bert"
    result = convert_one(ManifestEntry(source=str(source), variants=("fp32",)), Settings(out_dir=str(tmp_path),
                                                                                      benchmark=False))
    _assert_same_embeddings(source, result)
    got, modules = _embeddings(Path(result.artifacts_dir), file_name="onnx/model.onnx")
    assert modules == ["Transformer", "Pooling", "Normalize"]
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_a_dense_module_travels_with_its_weights(with_dense: Path, tmp_path: Path) -> None:
    result = convert_one(ManifestEntry(source=str(with_dense), variants=("fp32",)), Settings(out_dir=str(tmp_path),
                                                                                         benchmark=False))
    _assert_same_embeddings(with_dense, result)
    out = Path(result.artifacts_dir)
    assert (out / "2_Dense" / "model.safetensors").read_bytes() == (with_dense / "2_Dense" / "model.safetensors").read_bytes()
    export = next(s for s in result.stages if s.stage == "export")
    assert "2_Dense/model.safetensors" in export.details["sentence_transformers"]["files"]
    assert export.details["sentence_transformers"]["not_copied"] == []


@pytest.fixture(scope="module")
def hub(with_dense: Path) -> Iterator[HubServer]:
    with HubServer(token=TOKEN) as server, pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_TOKEN", TOKEN)
        server.seed_repo("st/dense", with_dense)
        yield server


def test_a_hub_checkpoint_keeps_its_modules(hub: HubServer, with_dense: Path, tmp_path: Path) -> None:
    settings = Settings(out_dir=str(tmp_path / "out"), hf_endpoint=hub.url, hf_cache=str(tmp_path / "cache"),
                        benchmark=False)
    result = convert_one(ManifestEntry(source="st/dense", variants=("fp32",)), settings)
    _assert_same_embeddings(with_dense, result)
    assert hub.requests("GET", r"/st/dense/resolve/[0-9a-f]+/2_Dense/model.safetensors")


def test_a_published_repo_keeps_its_modules(hub: HubServer, with_dense: Path, tmp_path: Path) -> None:
    """Publish the converted folder, download the repo, and load it with the ONNX backend."""
    from huggingface_hub import snapshot_download

    from zoo_convert.publish import PublicationStatus, PublishOptions, publish_run
    from zoo_convert.store import ResultStore

    result = convert_one(ManifestEntry(source=str(with_dense), variants=("fp32",)),
                         Settings(out_dir=str(tmp_path / "out"), benchmark=False))
    store = ResultStore(tmp_path / "results.duckdb")
    store.start_run("st", manifest="m.parquet", manifest_hash="-", versions={}, resources={}, settings={})
    store.record_many("st", [("job", result)])
    store.finish_run("st")
    (pub,) = publish_run(store, PublishOptions(namespace="acme", endpoint=hub.url, backoff_s=0.01), token=TOKEN)
    assert pub.status == PublicationStatus.PUBLISHED, pub.message
    files = hub.commits(pub.repo_id)[0].files
    assert {"modules.json", "sentence_bert_config.json", "config_sentence_transformers.json", "1_Pooling/config.json",
            "2_Dense/config.json", "2_Dense/model.safetensors"} <= set(files)
    local = Path(snapshot_download(pub.repo_id, endpoint=hub.url, token=TOKEN, cache_dir=tmp_path / "dl"))
    assert f'SentenceTransformer("{pub.repo_id}", backend="onnx"' in (local / "README.md").read_text()
    want, _ = _embeddings(with_dense)
    got, modules = _embeddings(local, file_name="onnx/model.onnx")
    assert modules == ["Transformer", "Pooling", "Dense", "Normalize"]
    assert np.allclose(got, want, atol=1e-4)


def test_a_module_file_linked_out_of_the_checkpoint_is_refused(zoo_dir: Path, tmp_path: Path) -> None:
    """The side-file rule holds for module folders too: nothing from elsewhere on the machine is copied."""
    from zoo_convert.errors import UnsafeCheckpointError
    from zoo_convert.stages.fetch import fetch

    ckpt = tmp_path / "ckpt"
    shutil.copytree(zoo_dir / "sentence-bert", ckpt)
    secret = tmp_path / "secret.json"
    secret.write_text('{"not": "for publishing"}')
    (ckpt / "1_Pooling" / "config.json").unlink()
    (ckpt / "1_Pooling" / "config.json").symlink_to(secret)
    with pytest.raises(UnsafeCheckpointError, match=f"side file 1_Pooling/config.json links to {secret}"):
        fetch(ManifestEntry(source=str(ckpt)), Settings())


def test_pickled_module_weights_and_paths_outside_the_checkpoint_are_not_copied(tmp_path: Path) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
        {"idx": 3, "name": "3", "path": "../outside", "type": "sentence_transformers.models.Dense"},
        {"idx": 4, "name": "4", "path": "4_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    for name in ("1_Pooling/config.json", "2_Dense/config.json", "2_Dense/pytorch_model.bin", "sentence_bert_config.json",
                 "config_sentence_transformers.json", "config.json", "model.safetensors"):
        (tmp_path / "ckpt" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "ckpt" / name).write_text("{}")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.json").write_text("{}")
    (tmp_path / "ckpt" / "modules.json").write_text(json.dumps(modules))
    files, left_out = sentence_transformers_files(tmp_path / "ckpt")
    assert files == ["modules.json", "config_sentence_transformers.json", "sentence_bert_config.json",
                     "1_Pooling/config.json", "2_Dense/config.json"]
    assert left_out == ["2_Dense/pytorch_model.bin"]
    # A Transformer kept in a subfolder: our root graph cannot stand in for it, so nothing is copied.
    modules[0]["path"] = "0_Transformer"
    (tmp_path / "ckpt" / "modules.json").write_text(json.dumps(modules))
    assert sentence_transformers_files(tmp_path / "ckpt") == ([], [])
    shutil.rmtree(tmp_path / "ckpt")
