"""Fetch stage: local folders vetted, bad input becomes a clear, typed failure."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from zoo_convert.errors import FailureKind, ZooConvertError
from zoo_convert.records import ManifestEntry, Settings
from zoo_convert.stages.fetch import fetch, folder_hash, resolve_revision


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37)
    path = tmp_path_factory.mktemp("bert")
    BertModel(cfg).save_pretrained(path)
    return path


def _fails(source: str | Path, **kw: object) -> ZooConvertError:
    with pytest.raises(ZooConvertError) as info:
        fetch(ManifestEntry(source=str(source), **kw), Settings())
    return info.value


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def test_local_folder_is_vetted_and_task_inferred(bert_dir: Path) -> None:
    ckpt = fetch(ManifestEntry(source=str(bert_dir)), Settings())
    assert ckpt.model_type == "bert"
    assert ckpt.task == "feature-extraction"
    assert ckpt.library == "transformers"
    assert ckpt.resolved_revision == folder_hash(bert_dir) == resolve_revision(ManifestEntry(source=str(bert_dir)), Settings())


def test_decoder_task_is_inferred_with_past(tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=99)).save_pretrained(tmp_path)
    assert fetch(ManifestEntry(source=str(tmp_path)), Settings()).task == "text-generation-with-past"


def test_content_hash_changes_with_the_weights(bert_dir: Path, tmp_path: Path) -> None:
    ckpt = _copy(bert_dir, tmp_path)
    before = folder_hash(ckpt)
    (ckpt / "config.json").write_text((ckpt / "config.json").read_text() + " ")
    assert folder_hash(ckpt) != before


def test_missing_path() -> None:
    err = _fails("/nonexistent/checkpoint")
    assert err.kind == FailureKind.FETCH_NOT_FOUND and "/nonexistent/checkpoint" in str(err)


def test_folder_without_config(tmp_path: Path) -> None:
    err = _fails(tmp_path)
    assert err.kind == FailureKind.FETCH_ERROR and "no config.json" in str(err)


def test_unknown_model_type(bert_dir: Path, tmp_path: Path) -> None:
    ckpt = _copy(bert_dir, tmp_path)
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**cfg, "model_type": "no-such-arch"}))
    err = _fails(ckpt)
    assert err.kind == FailureKind.EXPORT_UNSUPPORTED and "no-such-arch" in str(err)


def test_truncated_safetensors(bert_dir: Path, tmp_path: Path) -> None:
    ckpt = _copy(bert_dir, tmp_path)
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    err = _fails(ckpt)
    assert err.kind == FailureKind.FETCH_ERROR and "truncated" in str(err)


def test_pickle_only_needs_permission(bert_dir: Path, tmp_path: Path) -> None:
    ckpt = _copy(bert_dir, tmp_path)
    (ckpt / "model.safetensors").rename(ckpt / "pytorch_model.bin")
    err = _fails(ckpt)
    assert err.kind == FailureKind.FETCH_UNSAFE and "pickle" in str(err)
    assert fetch(ManifestEntry(source=str(ckpt), allow_pickle=True), Settings()).model_type == "bert"


def test_remote_code_needs_permission(bert_dir: Path, tmp_path: Path) -> None:
    ckpt = _copy(bert_dir, tmp_path)
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**cfg, "auto_map": {"AutoModel": "modeling.Evil"}}))
    assert _fails(ckpt).kind == FailureKind.FETCH_UNSAFE


@pytest.mark.parametrize("bad", ["org/../../etc/passwd", "../escape", "a/b/c", "org--x/name", "name with space"])
def test_invalid_repo_ids_are_refused_before_any_network(bad: str) -> None:
    err = _fails(bad)
    assert err.kind == FailureKind.FETCH_UNSAFE and "valid hub repo id" in str(err)


def test_seq2seq_task_is_the_generative_one(tmp_path: Path) -> None:
    from transformers import BartConfig, BartForConditionalGeneration

    cfg = BartConfig(vocab_size=99, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                     decoder_attention_heads=2, encoder_ffn_dim=8, decoder_ffn_dim=8)
    BartForConditionalGeneration(cfg).save_pretrained(tmp_path)
    assert fetch(ManifestEntry(source=str(tmp_path)), Settings()).task == "text2text-generation-with-past"


@pytest.mark.parametrize("broken", ["truncated", "not a tokenizer"])
def test_a_tokenizer_json_that_cannot_be_loaded_is_the_checkpoints_fault(
    zoo_dir: Path, tmp_path: Path, broken: str
) -> None:
    """Verification fell back to random ids, passed, and the broken file was published."""
    ckpt = _copy(zoo_dir / "bert", tmp_path)
    tokenizer = ckpt / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text()[:500] if broken == "truncated" else '{"version": "1.0"}')
    err = _fails(ckpt)
    assert err.kind == FailureKind.FETCH_ERROR
    assert str(err).startswith(f"{ckpt}: tokenizer.json cannot be loaded: ")
    assert fetch(ManifestEntry(source=str(zoo_dir / "bert")), Settings()).model_type == "bert"
