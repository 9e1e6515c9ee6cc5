"""Fetch stage: local folders vetted, bad input becomes a clear, typed failure."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
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


def _fifo(path: Path) -> None:
    os.mkfifo(path)


@pytest.mark.parametrize(
    ("name", "plant", "problem"),
    [
        ("merges.txt", lambda p, outside: p.symlink_to(outside), "links to {outside}, outside the checkpoint"),
        ("chat_template.jinja", lambda p, outside: p.symlink_to("/proc/self/mem"), "links to /proc/"),
        ("tokenizer.json", lambda p, outside: p.symlink_to("../ckpt/./tokenizer.json"), "is not a regular file"),  # a loop
        ("vocab.txt", lambda p, outside: _fifo(p), "is not a regular file"),
        ("tokenizer_config.json", lambda p, outside: p.mkdir(), "is not a regular file"),
    ],
)  # fmt: skip
def test_a_side_file_leading_out_of_the_checkpoint_is_unsafe(
    name: str, plant, problem: str, bert_dir: Path, tmp_path: Path
) -> None:
    ckpt = _copy(bert_dir, tmp_path)
    outside = tmp_path / "secret.txt"
    outside.write_text("not for publishing")
    plant(ckpt / name, outside)
    err = _fails(ckpt)
    assert err.kind == FailureKind.FETCH_UNSAFE, err
    assert f"side file {name} {problem.format(outside=outside)}" in str(err)


def test_links_inside_the_checkpoint_or_into_its_hub_cache_blobs_are_fine(bert_dir: Path, tmp_path: Path) -> None:
    from zoo_convert.sources import side_files

    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (tmp_path / "vocab.txt").write_text("[PAD]\n")
    sources = {p.name: p for p in bert_dir.iterdir()} | {"vocab.txt": tmp_path / "vocab.txt"}
    for name, src in sources.items():
        blob = repo / "blobs" / hashlib.sha256(name.encode()).hexdigest()
        shutil.copyfile(src, blob)
        (snapshot / name).symlink_to(Path("../../blobs", blob.name))  # as huggingface_hub lays out its cache
    (snapshot / "sub").mkdir()
    (snapshot / "sub" / "template.jinja").write_text("{{ messages }}")
    (snapshot / "chat_template.jinja").symlink_to("sub/template.jinja")
    ckpt = fetch(ManifestEntry(source=str(snapshot)), Settings())
    assert ckpt.model_type == "bert"
    assert {p.name for p in side_files(snapshot)} == {"config.json", "vocab.txt", "chat_template.jinja"}


def _safetensors(header: bytes, data: bytes = b"\0" * 8) -> bytes:
    return struct.pack("<Q", len(header)) + header + data


_DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize(
    ("weights", "said"),
    [
        (_safetensors(b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": 8}}'), "tensor 'w' has no valid data_offsets"),
        (_safetensors(b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [8]}}'), "tensor 'w' has no valid data_offsets"),
        (_safetensors(b'{"w": [0, 8]}'), "tensor 'w' has no valid data_offsets"),
        (_safetensors(b'[{"data_offsets": [0, 8]}]'), "a JSON list, not an object"),
        (_safetensors(_DEEP), "RecursionError"),
    ],
    ids=["offsets-int", "offsets-short", "tensor-list", "header-list", "deep"],
)
def test_a_malformed_safetensors_header_is_fetch_error(weights: bytes, said: str, bert_dir: Path, tmp_path: Path) -> None:
    ckpt = _copy(bert_dir, tmp_path)
    (ckpt / "model.safetensors").write_bytes(weights)
    err = _fails(ckpt)
    assert err.kind == FailureKind.FETCH_ERROR and "model.safetensors has a corrupt header" in str(err) and said in str(err)


@pytest.mark.parametrize(
    ("config", "said"),
    [
        (b'[{"model_type": "bert"}]', "config.json holds a JSON list, not an object"),
        (_DEEP, "config.json is not valid JSON: RecursionError"),
        (b'{"model_type": ["bert"]}', "model_type is a JSON list, not a str"),
        (b'{"model_type": "bert", "architectures": "BertModel"}', "architectures is a JSON str, not a list"),
        (b'{"model_type": "bert", "architectures": [{"x": 1}]}', "architectures holds something other than names"),
        (b'{"model_type": "bert", "auto_map": 3}', "auto_map is a JSON int, not a dict"),
    ],
    ids=["list", "deep", "model-type-list", "architectures-str", "architectures-dicts", "auto-map-int"],
)
def test_a_malformed_config_is_fetch_error(config: bytes, said: str, bert_dir: Path, tmp_path: Path) -> None:
    ckpt = _copy(bert_dir, tmp_path)
    (ckpt / "config.json").write_bytes(config)
    err = _fails(ckpt)
    assert err.kind == FailureKind.FETCH_ERROR and said in str(err), err


@pytest.mark.parametrize("plant", ["fifo", "folder", "dangling", "proc-mem"])
def test_weights_that_are_no_readable_file_are_fetch_error(plant: str, bert_dir: Path, tmp_path: Path) -> None:
    ckpt = _copy(bert_dir, tmp_path)
    weights = ckpt / "extra.safetensors"
    {"fifo": lambda: os.mkfifo(weights), "folder": weights.mkdir, "dangling": lambda: weights.symlink_to(tmp_path / "gone"),
     "proc-mem": lambda: weights.symlink_to("/proc/self/mem")}[plant]()  # fmt: skip
    err = _fails(ckpt)
    # a FIFO is refused unopened as unsafe (tests/test_hostile_files.py); the rest cannot be read
    want = FailureKind.FETCH_UNSAFE if plant == "fifo" else FailureKind.FETCH_ERROR
    assert err.kind == want and "extra.safetensors" in str(err), err


def test_a_failed_fetch_still_reads_the_model_type_of_config_json(bert_dir: Path, tmp_path: Path) -> None:
    from zoo_convert.stages.fetch import config_model_type

    assert config_model_type(ManifestEntry(source=str(bert_dir)), Settings()) == "bert"
    # a Hub checkpoint's copy in the cache, found without a request
    sha = "a" * 40
    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / sha
    snapshot.mkdir(parents=True)
    shutil.copy(bert_dir / "config.json", snapshot / "config.json")
    entry = ManifestEntry(source="org/tiny", revision=sha)
    assert config_model_type(entry, Settings(hf_cache=str(tmp_path / "hub"))) == "bert"
    assert config_model_type(ManifestEntry(source="org/other"), Settings(hf_cache=str(tmp_path / "hub"))) is None


@pytest.mark.parametrize("plant", ["fifo", "dev-zero", "too-big", "folder", "not-json", "no-type"])
def test_a_config_json_that_is_no_small_regular_file_gives_no_model_type(plant: str, tmp_path: Path) -> None:
    from zoo_convert.stages.fetch import config_model_type

    config = tmp_path / "config.json"
    if plant == "fifo":
        os.mkfifo(config)  # a plain open() would wait for a writer forever
    elif plant == "dev-zero":
        config.symlink_to("/dev/zero")
    elif plant == "too-big":
        config.write_text(json.dumps({"model_type": "bert", "pad": "x" * 2 * 1024**2}))
    elif plant == "folder":
        config.mkdir()
    elif plant == "not-json":
        config.write_text("{model_type: bert")
    else:
        config.write_text(json.dumps({"model_type": ["bert"]}))
    assert config_model_type(ManifestEntry(source=str(tmp_path)), Settings()) is None


# Real forms of checkpoints that are no conversion source, or are missing a part: the message names the cause
# (issue 33, item 4), where transformers and optimum said "No module named 'tensorflow'", "QuantizeConfig is not
# defined", "no config.json" or "expected *.safetensors".


def test_a_shard_the_index_names_but_the_folder_lacks_is_named(bert_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    path = _copy(bert_dir, tmp_path)
    state = load_file(path / "model.safetensors")
    (path / "model.safetensors").unlink()
    keys = sorted(state)
    save_file({k: state[k] for k in keys[:5]}, path / "model-00001-of-00002.safetensors", metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: f"model-0000{1 if i < 5 else 2}-of-00002.safetensors" for i, k in enumerate(keys)}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    err = _fails(path)
    assert err.kind == FailureKind.FETCH_ERROR and "tensorflow" not in err.message
    assert "model.safetensors.index.json names 1 shard(s) that are not in the checkpoint: model-00002-of-00002.safetensors" in err.message


def test_a_quantized_checkpoint_says_so_and_names_its_method(bert_dir: Path, tmp_path: Path) -> None:
    path = _copy(bert_dir, tmp_path)
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    (path / "config.json").write_text(json.dumps(config))
    err = _fails(path)
    assert err.kind == FailureKind.EXPORT_UNSUPPORTED
    assert "has a quantization_config (gptq): a quantized checkpoint is not a conversion source" in err.message


def test_a_peft_adapter_folder_says_so_and_names_its_base_model(bert_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file
    import torch

    path = tmp_path / "adapter"
    path.mkdir()
    adapter = {"peft_type": "LORA", "base_model_name_or_path": "google-bert/bert-base-uncased", "r": 8, "target_modules": ["query"]}
    (path / "adapter_config.json").write_text(json.dumps(adapter))
    save_file({"base_model.model.encoder.layer.0.attention.self.query.lora_A.weight": torch.zeros(8, 32)},
              path / "adapter_model.safetensors")  # fmt: skip
    err = _fails(path)
    assert err.kind == FailureKind.EXPORT_UNSUPPORTED and "no config.json" not in err.message
    assert "a PEFT adapter (LORA), not a model: its base model is google-bert/bert-base-uncased" in err.message


@pytest.mark.parametrize("with_config", [True, False])
def test_a_gguf_only_folder_says_gguf_is_not_a_source(with_config: bool, bert_dir: Path, tmp_path: Path) -> None:
    path = _copy(bert_dir, tmp_path)
    (path / "model.safetensors").unlink()
    if not with_config:
        (path / "config.json").unlink()
    (path / "model-Q4_K_M.gguf").write_bytes(b"GGUF" + bytes(60))
    err = _fails(path)
    assert err.kind == FailureKind.EXPORT_UNSUPPORTED and "expected *.safetensors" not in err.message
    assert "only GGUF weights (model-Q4_K_M.gguf): GGUF is llama.cpp's format, not a conversion source" in err.message
