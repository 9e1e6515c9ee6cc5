"""The export and check stages on real exports of tiny zoo checkpoints."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import onnx
import pytest
import torch

from zoo_convert import onnx_graph
from zoo_convert.job import ModuleState
from zoo_convert.errors import CheckError, ExportError, FailureKind, UnsafeCheckpointError
from zoo_convert.records import ManifestEntry, Settings
from zoo_convert.stages import Artifact, ExportedModel
from zoo_convert.stages.check import check
from zoo_convert.stages.export import export
from zoo_convert.stages.verify import verify

pytestmark = pytest.mark.timeout(300)


def _inputs(path: Path) -> set[str]:
    return {i.name for i in onnx.load(str(path), load_external_data=False).graph.input}


@pytest.mark.slow
def test_single_graph_layout_and_side_files(zoo_export) -> None:
    ex = zoo_export("bert")
    assert [c.name for c in ex.components] == ["model"]
    assert ex.components[0].path == ex.out_dir / "onnx" / "model.onnx"
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (ex.out_dir / name).is_file(), name
    assert not list((ex.out_dir / "onnx").glob("*.json")), "configs belong beside onnx/, not in it"
    assert ex.components[0].onnx_config is not None and ex.components[0].torch_module is not None


def test_decoder_is_exported_with_past(zoo_export) -> None:
    ex = zoo_export("gpt2")
    assert ex.details["task"] == "text-generation-with-past"
    assert [c.name for c in ex.components] == ["model"]
    assert {"input_ids", "attention_mask", "past_key_values.0.key", "past_key_values.0.value"} <= _inputs(
        ex.components[0].path
    )


@pytest.mark.slow
def test_encoder_decoder_layout_is_encoder_plus_merged_decoder(zoo_export) -> None:
    ex = zoo_export("t5")
    assert [c.name for c in ex.components] == ["encoder_model", "decoder_model_merged"]
    # Every graph's weights beside it for the whole job: reading a graph reads only its structure.
    assert sorted(ex.files) == [
        "onnx/decoder_model_merged.onnx",
        "onnx/decoder_model_merged.onnx_data",
        "onnx/encoder_model.onnx",
        "onnx/encoder_model.onnx_data",
    ]
    for comp in ex.components:
        assert ex.files[f"onnx/{comp.path.name}_data"] > ex.files[f"onnx/{comp.path.name}"]
    assert "use_cache_branch" in _inputs(ex.components[1].path)
    assert (ex.out_dir / "generation_config.json").is_file()


def test_graph_facts_are_read_from_the_files(zoo_export) -> None:
    ex = zoo_export("t5")
    census: Counter[str] = Counter()
    for comp in ex.components:
        model = onnx.load(str(comp.path))
        assert ex.opset == next(o.version for o in model.opset_import if o.domain == "")
        census.update(n.op_type for n in model.graph.node)
    # The merged decoder keeps its layers inside If branches: the census must count them.
    assert census["If"] >= 1 and ex.op_census["MatMul"] > census["MatMul"]
    assert ex.node_count == sum(ex.op_census.values())
    assert ex.ir_version >= 8
    assert ex.files == {str(p.relative_to(ex.out_dir)): p.stat().st_size for p in (ex.out_dir / "onnx").iterdir()}


def test_vision_export_and_check(zoo_export) -> None:
    ex = zoo_export("vit")
    details = check(ex)
    assert details["model"]["value_infos"] > 0
    assert (ex.out_dir / "preprocessor_config.json").is_file()


def test_check_counts_inferred_shapes_per_component(zoo_export) -> None:
    details = check(zoo_export("t5"))
    assert set(details) == {"encoder_model", "decoder_model_merged"}
    assert all(d["value_infos"] > 0 for d in details.values())


def test_check_names_the_broken_component(zoo_export, tmp_path: Path) -> None:
    ex = zoo_export("bert")
    model = onnx.load(str(ex.components[0].path))
    model.graph.node[0].input[0] = "no_such_tensor"
    broken = tmp_path / "model.onnx"
    onnx.save(model, str(broken))
    bad = ExportedModel(
        checkpoint=ex.checkpoint,
        out_dir=tmp_path,
        components=[type(ex.components[0])(name="model", path=broken)],
        opset=ex.opset,
        ir_version=ex.ir_version,
        node_count=ex.node_count,
        op_census=ex.op_census,
    )
    with pytest.raises(CheckError) as err:
        check(bad)
    assert err.value.kind is FailureKind.CHECK_ERROR
    assert "model" in err.value.message


def test_explicit_opset_and_external_data(zoo_dir: Path, tmp_path: Path, checkpoint) -> None:
    ckpt = checkpoint(zoo_dir / "bert", "feature-extraction")
    ex = export(ckpt, ManifestEntry(source=str(ckpt.path), opset=17), Settings(external_data_threshold=0), tmp_path)
    assert ex.opset == 17
    assert (tmp_path / "onnx" / "model.onnx_data").is_file()
    assert ex.files["onnx/model.onnx_data"] > ex.files["onnx/model.onnx"]
    check(ex)  # path-based: resolves the external data


@pytest.mark.slow
def test_torch_dynamo_exporter_verifies(zoo_dir: Path, tmp_path: Path, checkpoint) -> None:
    ckpt = checkpoint(zoo_dir / "bert", "feature-extraction")
    ex = export(ckpt, ManifestEntry(source=str(ckpt.path), exporter="torch"), Settings(), tmp_path)
    assert ex.details["exporter"] == "torch"
    assert [c.name for c in ex.components] == ["model"]
    assert ex.opset == 18  # optimum's default, not torch.onnx's 20
    check(ex)
    checks = verify(ex, Artifact("fp32", {"model": ex.components[0].path}), Settings())
    assert all(c.passed for c in checks)
    assert {c.shape for c in checks} == {"1x7", "3x19", "1x128"}


def test_unsupported_task_is_export_unsupported(zoo_dir: Path, tmp_path: Path, checkpoint) -> None:
    ckpt = checkpoint(zoo_dir / "vit", "text-generation")
    with pytest.raises(ExportError) as err:
        export(ckpt, ManifestEntry(source=str(ckpt.path), task="text-generation"), Settings(), tmp_path)
    assert err.value.kind is FailureKind.EXPORT_UNSUPPORTED
    assert "'vit'" in err.value.message and "'text-generation'" in err.value.message


def test_a_task_is_refused_with_the_tasks_the_type_accepts(zoo_dir: Path, tmp_path: Path, checkpoint) -> None:
    """A manifest row with a task its model type has no export for (the example manifest's trocr rows say text-to-image)."""
    ckpt = checkpoint(zoo_dir / "mgp-str", "text-to-image")
    with pytest.raises(ExportError) as err:
        export(ckpt, ManifestEntry(source=str(ckpt.path), task="text-to-image"), Settings(), tmp_path)
    assert err.value.kind is FailureKind.EXPORT_UNSUPPORTED
    assert err.value.message == (
        "optimum cannot export model_type 'mgp-str' for task 'text-to-image'; supported tasks: feature-extraction"
    )


def test_tasks_optimum_lists_that_no_class_of_the_type_serves_are_no_choice(tmp_path: Path, checkpoint) -> None:
    """trocr: optimum lists feature-extraction(-with-past), but transformers' AutoModel has no trocr model to load."""
    from zoo_convert.zoo import ZooModel, build_model
    from zoo_convert.zoo.tokenizers import roberta_bpe

    sizes = dict(d_model=32, decoder_layers=2, decoder_attention_heads=2, decoder_ffn_dim=64, max_position_embeddings=128)
    build_model(
        ZooModel("trocr", "decoder", "feature-extraction", "trocr", sizes, roberta_bpe(), model_class="TrOCRForCausalLM"),
        tmp_path / "trocr",
    )
    for task in ("text-to-image", "feature-extraction"):
        ckpt = checkpoint(tmp_path / "trocr", task)
        with pytest.raises(ExportError) as err:
            export(ckpt, ManifestEntry(source=str(ckpt.path), task=task), Settings(), tmp_path / "out")
        assert err.value.kind is FailureKind.EXPORT_UNSUPPORTED
        assert err.value.message == (
            f"optimum cannot export model_type 'trocr' for task '{task}'; it supports no task for it (optimum also "
            "lists feature-extraction, feature-extraction-with-past, which no transformers class of that type serves)"
        )


def test_unknown_model_type_is_export_unsupported(zoo_dir: Path, tmp_path: Path, checkpoint) -> None:
    src = tmp_path / "ckpt"
    shutil.copytree(zoo_dir / "bert", src)
    ckpt = checkpoint(src, "feature-extraction")
    ckpt = type(ckpt)(**{**ckpt.__dict__, "model_type": "no-such-arch"})
    with pytest.raises(ExportError) as err:
        export(ckpt, ManifestEntry(source=str(src)), Settings(), tmp_path / "out")
    assert err.value.kind is FailureKind.EXPORT_UNSUPPORTED
    assert "no-such-arch" in err.value.message


def test_broken_weights_are_export_error(zoo_dir: Path, tmp_path: Path, checkpoint) -> None:
    src = tmp_path / "ckpt"
    shutil.copytree(zoo_dir / "bert", src)
    weights = src / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ExportError) as err:
        export(checkpoint(src, "feature-extraction"), ManifestEntry(source=str(src)), Settings(), tmp_path / "out")
    assert err.value.kind is FailureKind.EXPORT_ERROR
    assert err.value.message


def _fp32(ex: ExportedModel) -> Artifact:
    return Artifact("fp32", {c.name: c.path for c in ex.components})


def test_a_vision_checkpoint_without_a_processor_config_uses_its_config(zoo_export) -> None:
    """optimum's dinov2 input generator indexed the processors it found: IndexError without one."""
    ex = zoo_export("dinov2-bare")
    assert not (ex.checkpoint.path / "preprocessor_config.json").exists()
    checks = verify(ex, _fp32(ex), Settings())
    assert checks and all(c.passed for c in checks)
    side = ex.checkpoint.config["image_size"]
    shapes = {case.feed["pixel_values"].shape[2:] for found in ex.cache.cases.values() for case in found.values()}
    assert shapes == {(side, side)}


def test_an_export_failure_names_the_missing_processor_config(zoo_dir: Path, tmp_path: Path, checkpoint) -> None:
    src = tmp_path / "ckpt"
    shutil.copytree(zoo_dir / "dinov2-bare", src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "hidden_act": "no-such-activation"}))
    with pytest.raises(ExportError) as err:
        export(checkpoint(src, "image-classification"), ManifestEntry(source=str(src)), Settings(), tmp_path / "out")
    assert err.value.kind is FailureKind.EXPORT_ERROR
    assert "the checkpoint has no preprocessor_config.json" in err.value.message
    # A config that no longer fits its own weights is said as such, not blamed on the processor config.
    (src / "config.json").write_text(json.dumps({**config, "image_size": 4}))
    with pytest.raises(ExportError) as err:
        export(checkpoint(src, "image-classification"), ManifestEntry(source=str(src)), Settings(), tmp_path / "out")
    assert err.value.kind is FailureKind.EXPORT_WEIGHTS_MISMATCH
    assert "1 tensor of another shape in the checkpoint" in err.value.message
    assert "(dinov2.embeddings.position_embeddings)" in err.value.message


@pytest.mark.slow
def test_torch_exporter_takes_a_detr_style_model_as_one_graph(zoo_dir: Path, tmp_path: Path, checkpoint) -> None:
    """config.is_encoder_decoder is true for DETR-style models; optimum's split says one graph."""
    ckpt = checkpoint(zoo_dir / "table-transformer", "object-detection")
    assert ckpt.config["is_encoder_decoder"] is True
    ex = export(ckpt, ManifestEntry(source=str(ckpt.path), exporter="torch"), Settings(), tmp_path)
    assert ex.details["exporter"] == "torch" and [c.name for c in ex.components] == ["model"]
    pixels = next(i for i in onnx.load(str(ex.components[0].path)).graph.input if i.name == "pixel_values")
    assert pixels.type.tensor_type.shape.dim[0].dim_param == "batch_size"  # optimum's axis names, not s17
    check(ex)
    checks = verify(ex, _fp32(ex), Settings())
    assert {c.output for c in checks} == {"logits", "pred_boxes"} and all(c.passed for c in checks)


@pytest.mark.slow
def test_torch_exporter_splits_an_encoder_decoder_without_past_as_optimum_does(
    zoo_dir: Path, tmp_path: Path, checkpoint
) -> None:
    """Without past key values: optimum's two graphs, the decoder taking no cache, and nothing to merge."""
    ckpt = checkpoint(zoo_dir / "t5", "text2text-generation")
    ex = export(ckpt, ManifestEntry(source=str(ckpt.path), task="text2text-generation", exporter="torch"), Settings(), tmp_path)
    assert ex.details["exporter"] == "torch" and ex.opset == 18
    assert [c.name for c in ex.components] == ["encoder_model", "decoder_model"]
    assert sorted(f for f in ex.files if f.endswith(".onnx")) == ["onnx/decoder_model.onnx", "onnx/encoder_model.onnx"]
    decoder = ex.components[1].graph.graph
    assert [i.name for i in decoder.input] == ["encoder_attention_mask", "input_ids", "encoder_hidden_states"]
    assert [o.name for o in decoder.output] == ["logits"]
    check(ex)
    checks = verify(ex, Artifact("fp32", {c.name: c.path for c in ex.components}), Settings())
    assert {c.output for c in checks} == {"encoder_model/last_hidden_state", "decoder_model/logits"}
    assert all(c.passed for c in checks)


def test_side_files_are_copied_only_from_inside_the_checkpoint(zoo_dir: Path, tmp_path: Path, checkpoint) -> None:
    """export() on a checkpoint fetch never vetted still copies no file from elsewhere."""
    ckpt_dir = tmp_path / "ckpt"
    shutil.copytree(zoo_dir / "bert", ckpt_dir)
    secret = tmp_path / "secret.txt"
    secret.write_text("not for publishing")
    (ckpt_dir / "merges.txt").symlink_to(secret)
    with pytest.raises(UnsafeCheckpointError, match=f"side file merges.txt links to {secret}"):
        export(checkpoint(ckpt_dir, "feature-extraction"), ManifestEntry(source=str(ckpt_dir)), Settings(), tmp_path / "out")
    assert not any(p.read_bytes() == secret.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file())


def _bert_copy(zoo_dir: Path, tmp_path: Path, **config: object) -> Path:
    """The zoo's bert (a masked-LM checkpoint) copied, with ``config`` set in its config.json."""
    src = tmp_path / "ckpt"
    shutil.copytree(zoo_dir / "bert", src)
    path = src / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return src


def _refused(src: Path, task: str, tmp_path: Path, checkpoint) -> str:
    with pytest.raises(ExportError) as err:
        export(checkpoint(src, task), ManifestEntry(source=str(src)), Settings(), tmp_path / "out")
    assert err.value.kind is FailureKind.EXPORT_WEIGHTS_MISMATCH, err.value.message
    assert not list((tmp_path / "out" / "onnx").glob("*.onnx")), "refused before a graph is written"
    return err.value.message


def test_a_checkpoint_without_tensors_is_weights_mismatch(zoo_dir: Path, tmp_path: Path, checkpoint) -> None:
    """A safetensors file whose header is ``{}``: every tensor would be transformers' random init."""
    src = _bert_copy(zoo_dir, tmp_path)
    (src / "model.safetensors").write_bytes(len(b"{}").to_bytes(8, "little") + b"{}")
    message = _refused(src, "fill-mask", tmp_path, checkpoint)
    assert "BertForMaskedLM (task fill-mask): 44 tensors missing from the checkpoint" in message
    assert "bert.embeddings.LayerNorm.bias, bert.embeddings.LayerNorm.weight, bert.embeddings.position_embeddings.weight, ..." in message


def test_a_head_the_checkpoint_has_not_is_weights_mismatch_with_the_task_it_fits(
    zoo_dir: Path, tmp_path: Path, checkpoint
) -> None:
    """The masked-LM bert as text-classification: a random classifier head and pooler, its own head unused."""
    message = _refused(zoo_dir / "bert", "text-classification", tmp_path, checkpoint)
    assert message.startswith("the checkpoint's weights do not cover BertForSequenceClassification (task text-classification): ")
    assert "4 tensors missing from the checkpoint, left as initialised at random (bert.pooler.dense.bias, " in message
    assert "5 tensors of the checkpoint unused by it (cls.predictions.bias, " in message
    assert message.endswith("; the checkpoint's weights are for BertForMaskedLM: try task fill-mask")


def test_checkpoint_tensors_the_model_never_uses_are_weights_mismatch(zoo_dir: Path, tmp_path: Path, checkpoint) -> None:
    """``num_hidden_layers: -1``: a zero-layer model, every layer weight of the checkpoint ignored."""
    src = _bert_copy(zoo_dir, tmp_path, num_hidden_layers=-1)
    message = _refused(src, "fill-mask", tmp_path, checkpoint)
    assert "32 tensors of the checkpoint unused by it (bert.encoder.layer.0." in message
    assert "try task" not in message  # the weights are for this task: no other to suggest


def test_a_base_checkpoints_unused_layers_are_no_head_left_out(zoo_dir: Path, tmp_path: Path, checkpoint) -> None:
    """A BertModel checkpoint (sentence-transformers) with zero layers: its unprefixed layer tensors are unused, not a head."""
    src = tmp_path / "ckpt"
    shutil.copytree(zoo_dir / "sentence-bert", src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "num_hidden_layers": -1}))
    message = _refused(src, "feature-extraction", tmp_path, checkpoint)
    assert "32 tensors of the checkpoint unused by it (encoder.layer.0." in message


def test_tensors_of_another_shape_are_weights_mismatch(zoo_dir: Path, tmp_path: Path, checkpoint) -> None:
    """A config that no longer fits its weights (vocab_size grown) is refused, not an exporter traceback."""
    vocab = json.loads((zoo_dir / "bert" / "config.json").read_text())["vocab_size"]
    src = _bert_copy(zoo_dir, tmp_path, vocab_size=vocab + 3)
    message = _refused(src, "fill-mask", tmp_path, checkpoint)
    assert "2 tensors of another shape in the checkpoint, left as initialised at random" in message
    assert "bert.embeddings.word_embeddings.weight" in message


def test_a_base_model_export_leaves_out_the_checkpoints_head_and_unused_pooler(zoo_export) -> None:
    """bert's masked-LM checkpoint as feature-extraction: its ``cls`` head is not the base model's, and the
    base model's pooler (not in the checkpoint) reaches no exported output; both recorded, not refused."""
    ex = zoo_export("bert")
    assert ex.details["weights"] == {
        "unused_head": [
            "cls.predictions.bias",
            "cls.predictions.transform.LayerNorm.bias",
            "cls.predictions.transform.LayerNorm.weight",
            "cls.predictions.transform.dense.bias",
            "cls.predictions.transform.dense.weight",
        ],
        "missing_unused": ["pooler.dense.bias", "pooler.dense.weight"],
    }
    assert "weights" not in zoo_export("gpt2").details  # a checkpoint saved for its task: nothing to excuse


def test_a_missing_tensor_an_output_depends_on_is_not_excused(zoo_dir: Path, tmp_path: Path, checkpoint) -> None:
    """A tensor is excused only while no exported output depends on it: a backbone that lost a layer's bias is refused."""
    from safetensors.torch import load_file, save_file

    src = _bert_copy(zoo_dir, tmp_path)
    tensors = load_file(src / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if k != "bert.encoder.layer.1.output.dense.bias"}, src / "model.safetensors",
              metadata={"format": "pt"})  # fmt: skip
    message = _refused(src, "feature-extraction", tmp_path, checkpoint)
    assert "1 tensor missing from the checkpoint, left as initialised at random (encoder.layer.1.output.dense.bias)" in message
    assert "unused" not in message  # the masked-LM head left out of a base model is no fault


class _CachesInADict(torch.nn.Module):
    """timm LeViT's pattern: a plain dict attribute a forward in eval mode fills in place."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.arange(4.0))
        self.bias_cache: dict[str, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = str(x.device)
        if key not in self.bias_cache:
            self.bias_cache[key] = self.bias * 2
        return x + self.bias_cache[key]


def test_the_model_as_loaded_gets_back_a_cache_its_export_filled_in_place() -> None:
    model = _CachesInADict().eval()
    cache = model.bias_cache
    as_loaded = ModuleState(model)
    # torch.export traces with fake tensors and leaves one in the cache: a reference forward after it
    # reads the fake tensor (levit failed `internal` through the torch exporter this way).
    torch.export.export(model, (torch.ones(2, 4),), strict=False)
    assert cache, "the export did not fill the cache: this test no longer shows anything"
    as_loaded.restore()
    assert model.bias_cache is cache and cache == {}
    assert torch.equal(model(torch.zeros(1, 4)), torch.arange(4.0)[None] * 2)


class _Payload:
    """What a hostile pickle carries: a call made when it is unpickled."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("the payload ran",))


def test_a_pickle_the_safe_loader_refuses_is_named_unsafe_not_a_missing_tensorflow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """transformers' weights-only torch.load refuses the payload; optimum then retried it as a TensorFlow checkpoint,
    and the job said "No module named 'tensorflow'" (issue 33, item 4). allow_pickle or not, no code of it runs."""
    from safetensors.torch import load_file

    from zoo_convert import zoo
    from zoo_convert.pipeline import convert_one

    zoo.build(tmp_path / "zoo", only=["bert"])
    folder = tmp_path / "zoo" / "bert"
    state: dict[str, object] = dict(load_file(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    state["extra"] = _Payload()
    torch.save(state, folder / "pytorch_model.bin")
    entry = ManifestEntry(source=str(folder), task="feature-extraction", allow_pickle=True, variants=("fp32",))
    result = convert_one(entry, Settings(out_dir=str(tmp_path / "out"), benchmark=False))
    assert (result.failure_kind, result.stage) == ("fetch_unsafe", "export"), result.message
    assert result.message is not None and "tensorflow" not in result.message
    assert result.message.startswith("pytorch_model.bin: refused as unsafe by torch's weights-only loader"), result.message
    assert "GLOBAL builtins.print" in result.message or "GLOBAL print" in result.message
    assert "the payload ran" not in capsys.readouterr().out


@pytest.mark.slow
def test_dynamic_axes_are_fixed_where_optimum_would_fix_them_asked_without_a_session(
    zoo_dir: Path, checkpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # optimum opens each exported graph in a session to find output axes to fix (0.9 s of bert-base's export at real
    # size); ours reads the graph's outputs. For every graph of an encoder-decoder (its decoder without past is the
    # one with an axis to fix), both answers must agree.
    import onnxruntime as ort

    from zoo_convert.stages import export as export_stage

    asked: list[tuple[str, bool, bool]] = []
    ours = export_stage._axes_to_fix

    def compared(config, path: Path) -> bool:
        allowed = {axis for axes in (*config.inputs.values(), *config.outputs.values()) for axis in axes.values()}
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        theirs = any(isinstance(a, str) and a not in allowed for out in session.get_outputs() for a in out.shape)
        asked.append((path.name, ours(config, path), theirs))
        return asked[-1][1]

    monkeypatch.setattr(export_stage, "_axes_to_fix", compared)
    ckpt = checkpoint(zoo_dir / "bart", "text2text-generation-with-past")
    export(ckpt, ManifestEntry(source=str(ckpt.path)), Settings(), tmp_path / "bart")
    assert [name for name, _, _ in asked] == ["encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx"]
    assert all(mine == theirs for _, mine, theirs in asked), asked
    assert [name for name, mine, _ in asked if mine] == ["decoder_model.onnx"]


@pytest.mark.slow
def test_a_graphs_dynamic_axes_are_fixed_in_a_child_while_the_next_graph_is_exported(
    zoo_dir: Path, checkpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # bart's decoder without past has output axes optimum fixes; the fix runs in a forked child beside the export of
    # the decoder with past, and what it wrote is what the merge reads: the merged decoder declares every axis.
    import os

    from optimum.exporters.onnx.convert import export as export_graph

    from zoo_convert.stages import export as export_stage

    seen = tmp_path / "seen"
    fix = export_stage._fix_axes

    def noted_fix(config, path: Path, shapes) -> None:
        with open(seen, "a") as f:
            f.write(f"fix {path.name} {os.getpid()}\n")
        fix(config, path, shapes)

    def noted_export(**kwargs) -> object:
        with open(seen, "a") as f:
            f.write(f"export {kwargs['output'].name} {os.getpid()}\n")
        return export_graph(**kwargs)

    monkeypatch.setattr(export_stage, "_fix_axes", noted_fix)
    monkeypatch.setattr("optimum.exporters.onnx.convert.export", noted_export)
    ckpt = checkpoint(zoo_dir / "bart", "text2text-generation-with-past")
    exported = export(ckpt, ManifestEntry(source=str(ckpt.path)), Settings(), tmp_path / "bart")
    lines = [line.split() for line in seen.read_text().splitlines()]
    assert [(what, name) for what, name, _ in lines if what == "export"] == [
        ("export", "encoder_model.onnx"), ("export", "decoder_model.onnx"), ("export", "decoder_with_past_model.onnx")
    ]  # fmt: skip
    assert {int(pid) for what, _, pid in lines if what == "export"} == {os.getpid()}
    fixed = [(name, int(pid)) for what, name, pid in lines if what == "fix"]
    assert [name for name, _ in fixed] == ["decoder_model.onnx"] and fixed[0][1] != os.getpid()
    merged = next(c for c in exported.components if c.name == "decoder_model_merged")
    assert merged.onnx_config is not None
    declared = {a for axes in (*merged.onnx_config.inputs.values(), *merged.onnx_config.outputs.values())
                for a in axes.values()}  # fmt: skip
    graph = onnx.load(str(merged.path), load_external_data=False)
    named = {d.dim_param for o in graph.graph.output for d in o.type.tensor_type.shape.dim if d.dim_param}
    assert named and named <= declared, named - declared


@pytest.mark.parametrize(("name", "task", "exporter"), [
    ("whisper", "automatic-speech-recognition-with-past", "optimum"),
    ("bart", "text2text-generation-with-past", "torch"),
])  # fmt: skip
def test_the_decoders_merge_into_optimums_graph_with_optimums_flags(
    zoo_dir: Path, checkpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, task: str, exporter: str
) -> None:
    # The merge is ours (optimum's costs 2-3x more at real size): given the decoders the export wrote, it must write
    # optimum's merged graph to the byte (both in this process: optimum names the shared weights in set order) and
    # leave the configs and file list as optimum's post-processing does, for both exporters' decoders.
    import copy

    from zoo_convert.exporters import merge

    compared: list[str] = []
    ours = merge.post_process

    def side_by_side(main_config, onnx_dir: Path, parts, subpaths):
        theirs_dir = tmp_path / "theirs"
        shutil.copytree(onnx_dir, theirs_dir)
        theirs_parts = {key: (module, copy.copy(config)) for key, (module, config) in parts.items()}
        theirs = main_config.post_process_exported_models(theirs_dir, theirs_parts, list(subpaths))
        got = ours(main_config, onnx_dir, parts, subpaths)
        assert [str(p) for p in got[1]] == [str(p) for p in theirs[1]]
        flags = ("is_merged", "use_cache_branch", "use_past_in_inputs")
        for key in parts:
            assert [getattr(got[0][key][1], f, None) for f in flags] == [getattr(theirs[0][key][1], f, None) for f in flags]
        mine, optimums = onnx_dir / "decoder_model_merged.onnx", theirs_dir / "decoder_model_merged.onnx"
        assert mine.read_bytes() == optimums.read_bytes()
        assert not onnx_graph.data_path(mine).exists()  # inside the file, as optimum writes it
        compared.append(mine.name)
        return got

    monkeypatch.setattr(merge, "post_process", side_by_side)
    ckpt = checkpoint(zoo_dir / name, task)
    exported = export(ckpt, ManifestEntry(source=str(ckpt.path), exporter=exporter), Settings(), tmp_path / name)
    assert compared == ["decoder_model_merged.onnx"]
    merged = next(c for c in exported.components if c.name == "decoder_model_merged")
    assert merged.onnx_config.is_merged and merged.onnx_config.use_cache_branch
    check(exported)
