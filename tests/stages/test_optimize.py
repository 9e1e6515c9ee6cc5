"""The optimize stage on real optimum exports of tiny random checkpoints."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from zoo_convert.variants import fp16 as fp16_recipe
from zoo_convert import onnx_graph
from zoo_convert.errors import OptimizeError
from zoo_convert.records import Settings
from zoo_convert.stages import Artifact, Checkpoint, Component, ExportedModel
from zoo_convert.stages.forked import Parked, run_forked, start_forked, step, wait_for_go
from zoo_convert.stages.optimize import _verified, optimize
from zoo_convert.stages.verify import verify

from graph_feeds import feeds as _feeds

pytestmark = pytest.mark.timeout(300)

VARIANTS = ("fp32", "fp16", "int8")


def _export(root: Path, name: str, model, task: str, processor=None) -> Path:
    """save_pretrained + optimum main_export into ``root/name/onnx``."""
    from optimum.exporters.onnx import main_export

    ckpt = root / name / "checkpoint"
    model.save_pretrained(ckpt)
    if processor is not None:
        processor.save_pretrained(ckpt)
    main_export(str(ckpt), output=root / name / "onnx", task=task, library_name="transformers", do_validation=False)
    return root / name


@pytest.fixture(scope="session")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One export per architecture family, shared; tests optimize copies of them."""
    import torch
    from transformers import (
        BertConfig,
        BertModel,
        ConvNextImageProcessor,
        ResNetConfig,
        ResNetModel,
        T5Config,
        T5ForConditionalGeneration,
    )

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("optimize_exports")
    bert = BertModel(
        BertConfig(
            vocab_size=128,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
        )
    )
    resnet = ResNetModel(ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic"))
    t5 = T5ForConditionalGeneration(
        T5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0)
    )
    return {
        "bert": _export(root, "bert", bert, "feature-extraction"),
        "resnet": _export(root, "resnet", resnet, "feature-extraction", ConvNextImageProcessor(size={"shortest_edge": 32})),
        "t5": _export(root, "t5", t5, "text2text-generation-with-past"),
    }


def _exported(src: Path, out: Path, components: tuple[str, ...] = ("model",), model_type: str | None = None) -> ExportedModel:
    """A private copy of an export, as the export stage would hand it over."""
    onnx_dir = out / "onnx"
    onnx_dir.mkdir(parents=True)
    for name in components:
        shutil.copy(src / "onnx" / f"{name}.onnx", onnx_dir / f"{name}.onnx")
        onnx_graph.externalize(onnx_dir / f"{name}.onnx")  # the export keeps the weights beside it for the job
    config = json.loads((src / "checkpoint" / "config.json").read_text())
    ckpt = Checkpoint(
        path=src / "checkpoint",
        resolved_revision="sha256:test",
        model_type=model_type or config["model_type"],
        task="feature-extraction",
        library="transformers",
        config=config,
    )
    return ExportedModel(
        checkpoint=ckpt,
        out_dir=out,
        components=[Component(name=n, path=onnx_dir / f"{n}.onnx") for n in components],
        opset=18,
        ir_version=8,
        node_count=0,
        op_census={},
    )


def _census(path: Path) -> Counter[str]:
    return Counter(n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node)


def _weights(model: onnx.ModelProto) -> dict[str, bytes]:
    return {t.name: onnx.numpy_helper.to_array(t).tobytes() for t in model.graph.initializer}


def _float32_bytes(path: Path) -> int:
    graph = onnx.load(str(path)).graph
    return sum(t.ByteSize() for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT)


def _outputs(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a.ravel(), b.ravel()) / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="session")
def bert_variants(exports: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    """All three variants of the tiny bert, plus the plain export kept aside for comparison."""
    out = tmp_path_factory.mktemp("bert_variants")
    exported = _exported(exports["bert"], out)
    return exported, optimize(exported, VARIANTS, Settings())


@pytest.mark.slow
def test_bert_variants_at_transformers_js_paths(bert_variants) -> None:
    exported, artifacts = bert_variants
    assert list(artifacts) == list(VARIANTS)
    onnx_dir = exported.out_dir / "onnx"
    assert {v: a.files for v, a in artifacts.items()} == {
        "fp32": {"model": onnx_dir / "model.onnx"},
        "fp16": {"model": onnx_dir / "model_fp16.onnx"},
        "int8": {"model": onnx_dir / "model_quantized.onnx"},
    }
    # transformers.js asks for int8 by two dtypes, q8 and int8: one graph, two names, one copy on disk.
    assert sorted(p.name for p in onnx_dir.iterdir()) == [
        "model.onnx", "model_fp16.onnx", "model_int8.onnx", "model_quantized.onnx"
    ]
    assert os.path.samefile(onnx_dir / "model_int8.onnx", onnx_dir / "model_quantized.onnx")
    assert all("error" not in a.details and a.details["seconds"] > 0 for a in artifacts.values())


@pytest.fixture(scope="session")
def bert_opt_in(exports: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    """The opt-in variants of the tiny bert: uint8 and q4."""
    out = tmp_path_factory.mktemp("bert_opt_in")
    exported = _exported(exports["bert"], out)
    return exported, optimize(exported, ("uint8", "q4"), Settings())


@pytest.mark.slow
def test_q4_is_4_bit_matmulnbits_of_every_weight_matmul(bert_opt_in, exports) -> None:
    exported, artifacts = bert_opt_in
    q4 = artifacts["q4"]
    assert "error" not in q4.details and q4.files == {"model": exported.out_dir / "onnx" / "model_q4.onnx"}
    graph = onnx.load(str(q4.files["model"])).graph
    plain = onnx.load(str(exports["bert"] / "onnx" / "model.onnx")).graph
    weights = {t.name for t in plain.initializer}
    weight_matmuls = [n for n in plain.node if n.op_type == "MatMul" and n.input[1] in weights]
    nbits = [n for n in graph.node if n.op_type == "MatMulNBits"]
    # Every MatMul with a stored weight, the FFN down-projections after GELU too (activations stay float).
    assert len(nbits) == len(weight_matmuls) == 12
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in nbits[0].attribute}
    assert attrs["bits"] == 4 and attrs["block_size"] == 32
    assert len(nbits[0].input) == 3  # symmetric: no zero points
    part = q4.details["components"]["model"]
    assert part["quantized_ops"] == {"MatMulNBits": 12} and part["block_size"] == 32
    assert q4.details["quantization"] == "weight-only 4-bit MatMulNBits, symmetric blocks of 32"
    feeds = _feeds(exports["bert"] / "onnx" / "model.onnx", exported.checkpoint.config)
    assert _cosine(_outputs(q4.files["model"], feeds), _outputs(exports["bert"] / "onnx" / "model.onnx", feeds)) > 0.95


def test_uint8_has_unsigned_weights(bert_opt_in) -> None:
    _, artifacts = bert_opt_in
    uint8 = artifacts["uint8"]
    assert uint8.files["model"].name == "model_uint8.onnx"
    graph = onnx.load(str(uint8.files["model"])).graph
    quantized = {t.data_type for t in graph.initializer if t.name.endswith("_quantized")}
    assert quantized == {onnx.TensorProto.UINT8}
    assert uint8.details["components"]["model"]["weight_type"] == "QUInt8"
    assert uint8.details["quantization"] == "dynamic QUInt8 per-channel"


def test_q4_leaves_the_process_logging_alone(exports, tmp_path: Path) -> None:
    """Importing onnxruntime's MatMulNBits quantizer calls logging.basicConfig(level=INFO) on the root logger."""
    import logging

    root = logging.getLogger()
    before = (root.handlers[:], root.level)
    exported = _exported(exports["bert"], tmp_path)
    assert "error" not in optimize(exported, ("q4",), Settings())["q4"].details
    assert (root.handlers, root.level) == before


def test_q4_of_a_model_without_weight_matmuls_is_a_failed_variant(exports, tmp_path: Path) -> None:
    exported = _exported(exports["resnet"], tmp_path)
    artifacts = optimize(exported, ("fp32", "q4"), Settings())
    assert artifacts["q4"].files == {} and artifacts["q4"].details["failure_kind"] == "optimize_error"
    assert "MatMulNBits quantized no MatMul" in artifacts["q4"].details["error"]
    assert "error" not in artifacts["fp32"].details


def test_bert_fp32_is_fused_and_matches_the_plain_export(bert_variants, exports) -> None:
    exported, artifacts = bert_variants
    fp32 = artifacts["fp32"]
    assert fp32.details["fusion_applied"] is True
    assert fp32.details["methods"] == ["transformers_optimizer"]
    stats = fp32.details["components"]["model"]["fused_operator_statistics"]
    assert stats["Attention"] == 2 and stats["SkipLayerNormalization"] == 4
    ops = _census(fp32.files["model"])
    assert ops["Attention"] == 2 and ops["MatMul"] < _census(exports["bert"] / "onnx" / "model.onnx")["MatMul"]

    plain = exports["bert"] / "onnx" / "model.onnx"
    feeds = _feeds(plain, exported.checkpoint.config)
    assert np.abs(_outputs(fp32.files["model"], feeds) - _outputs(plain, feeds)).max() <= 1e-4


def test_bert_fp16_keeps_fp32_io(bert_variants, exports) -> None:
    exported, artifacts = bert_variants
    path = artifacts["fp16"].files["model"]
    weights = Counter(t.data_type for t in onnx.load(str(path)).graph.initializer)
    assert weights[onnx.TensorProto.FLOAT16] > 0
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [o.type for o in session.get_outputs()] == ["tensor(float)"] * len(session.get_outputs())
    assert {i.name: i.type for i in session.get_inputs()} == dict.fromkeys(
        ["input_ids", "attention_mask", "token_type_ids"], "tensor(int64)"
    )
    plain = exports["bert"] / "onnx" / "model.onnx"
    feeds = _feeds(plain, exported.checkpoint.config)
    assert _cosine(session.run(None, feeds)[0], _outputs(plain, feeds)) > 0.999


def test_bert_int8_is_quantized_from_the_plain_export(bert_variants, exports) -> None:
    exported, artifacts = bert_variants
    int8 = artifacts["int8"]
    ops = _census(int8.files["model"])
    assert ops["DynamicQuantizeLinear"] > 0 and ops["MatMulInteger"] > 0
    assert ops["Attention"] == 0  # made from the plain export: fusion leaves no MatMul to quantize
    assert int8.details["components"]["model"]["per_channel"] is True
    # At this size per-channel scales outweigh the bytes saved, so compare the weights' types, not file sizes.
    assert _float32_bytes(int8.files["model"]) < _float32_bytes(artifacts["fp32"].files["model"]) / 2
    plain = exports["bert"] / "onnx" / "model.onnx"
    feeds = _feeds(plain, exported.checkpoint.config)
    assert _cosine(_outputs(int8.files["model"], feeds), _outputs(plain, feeds)) > 0.99


def test_bert_int8_quantizes_every_weighted_matmul_and_keeps_the_embeddings_float(bert_variants) -> None:
    """Per-channel int8 of every MatMul with a weight; the embedding tables stay float32."""
    _, artifacts = bert_variants
    int8 = artifacts["int8"]
    graph = onnx.load(str(int8.files["model"])).graph
    weights = {t.name for t in graph.initializer}
    assert not [n.name for n in graph.node if n.op_type == "MatMul" and n.input[1] in weights]
    part = int8.details["components"]["model"]
    # Q, K, V, attention output, FFN up- and down-projection of both layers.
    assert part["quantized_ops"]["MatMulInteger"] == 12
    assert part["float32_matmuls"] == 4  # the attention scores and context: two activations each
    embeddings = [n for n in graph.node if n.op_type == "Gather" and n.input[0] in weights]
    assert embeddings and all(graph.initializer[[t.name for t in graph.initializer].index(n.input[0])].data_type
                              == onnx.TensorProto.FLOAT for n in embeddings)


def test_no_optimize_keeps_the_plain_export_as_fp32(exports, tmp_path: Path) -> None:
    """--no-optimize: fp32 is the export's graph and weights, back inside it; fp16 is converted from it, int8 quantized as always."""
    exported = _exported(exports["bert"], tmp_path)
    plain = exports["bert"] / "onnx" / "model.onnx"
    artifacts = optimize(exported, VARIANTS, Settings(optimize=False))
    fp32 = artifacts["fp32"]
    got, want = onnx.load(str(fp32.files["model"])), onnx.load(str(plain))
    assert not onnx_graph.data_path(fp32.files["model"]).exists()
    assert list(got.graph.node) == list(want.graph.node)
    assert _weights(got) == _weights(want)
    assert fp32.details["fusion_applied"] is False and fp32.details["methods"] == ["none"]
    assert fp32.details["components"]["model"]["note"] == "optimization off (--no-optimize)"
    assert "fused_operator_statistics" not in fp32.details["components"]["model"]
    assert artifacts["fp16"].details["components"]["model"]["source"] == "plain export"
    fp16_ops = _census(artifacts["fp16"].files["model"])
    assert fp16_ops["Attention"] == fp16_ops["SkipLayerNormalization"] == 0
    assert _census(artifacts["int8"].files["model"])["MatMulInteger"] > 0
    assert all("error" not in a.details for a in artifacts.values())


@pytest.mark.parametrize("level", ["O1", "O3"])
def test_optimization_levels_as_optimum_cli_maps_them(exports, tmp_path: Path, level: str) -> None:
    """O1: ONNX Runtime's basic optimizations, no fusion; O3: the fusions plus FastGelu; both still match the export."""
    exported = _exported(exports["bert"], tmp_path)
    plain = exports["bert"] / "onnx" / "model.onnx"
    fp32 = optimize(exported, ("fp32",), Settings(optimization=level))["fp32"]
    assert fp32.details["level"] == fp32.details["components"]["model"]["level"] == level
    ops = _census(fp32.files["model"])
    if level == "O1":
        assert fp32.details["methods"] == ["ort_basic"] and fp32.details["fusion_applied"] is False
        assert ops["Attention"] == ops["FastGelu"] == 0
        # The export's weights are back inside the graph, not left pointing at the export's data file.
        assert not onnx_graph.data_path(fp32.files["model"]).exists()
    else:
        assert fp32.details["methods"] == ["transformers_optimizer"] and ops["Attention"] > 0
        assert ops["FastGelu"] > 0 and ops["Gelu"] == 0 and fp32.details["fused_ops"]["FastGelu"] > 0
    feeds = _feeds(plain, exported.checkpoint.config)
    assert np.abs(_outputs(fp32.files["model"], feeds) - _outputs(plain, feeds)).max() < 1e-4


def test_unknown_model_type_falls_back_to_ort_offline(exports, tmp_path: Path) -> None:
    exported = _exported(exports["resnet"], tmp_path)
    artifacts = optimize(exported, VARIANTS, Settings())
    fp32 = artifacts["fp32"]
    assert fp32.details["fusion_applied"] is False
    assert fp32.details["methods"] == ["ort_offline"]
    part = fp32.details["components"]["model"]
    assert part["optimizer_model_type"] is None and part["note"] == "model_type 'resnet' has no transformers optimizer fuser"
    # ORT wrote the weights it kept as references to the export's data file: they are back inside the graph
    assert not onnx_graph.data_path(fp32.files["model"]).exists()
    assert _census(fp32.files["model"])["FusedConv"] > 0
    ort.InferenceSession(str(fp32.files["model"]), providers=["CPUExecutionProvider"])
    assert part["checked_against_pytorch"] is False  # no references here: only loaded in ONNX Runtime
    # A float-input model: fp16 must still take and give float32.
    session = ort.InferenceSession(str(artifacts["fp16"].files["model"]), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].type == "tensor(float)" and session.get_outputs()[0].type == "tensor(float)"
    assert _census(artifacts["int8"].files["model"])["ConvInteger"] > 0


def test_a_top_level_if_that_is_no_merged_decoder_still_gets_the_fuser(tmp_path: Path) -> None:
    """deberta's export has a top-level If of its own (no use_cache_branch): its layers are outside it and fuse."""
    import torch
    from transformers import DebertaConfig, DebertaModel

    torch.manual_seed(0)
    # relative attention with both position terms, as the zoo's deberta: what puts the If in its graph
    model = DebertaModel(DebertaConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=64, max_position_embeddings=64, relative_attention=True,
                                       pos_att_type=["c2p", "p2c"], type_vocab_size=0))  # fmt: skip
    src = _export(tmp_path / "src", "deberta", model, "feature-extraction")
    exported = _exported(src, tmp_path / "job")
    assert any(n.op_type == "If" for n in onnx.load(str(exported.components[0].path), load_external_data=False).graph.node)
    fp32 = optimize(exported, ("fp32",), Settings())["fp32"].details["components"]["model"]
    assert (fp32["method"], fp32["optimizer_model_type"]) == ("transformers_optimizer", "bert"), fp32
    assert fp32["fused_ops"]["SkipLayerNormalization"] > 0 and "note" not in fp32


@pytest.mark.slow
def test_encoder_decoder_every_component_every_variant(exports, tmp_path: Path) -> None:
    exported = _exported(exports["t5"], tmp_path, ("encoder_model", "decoder_model_merged"))
    plain = {c.name: exports["t5"] / "onnx" / f"{c.name}.onnx" for c in exported.components}
    artifacts = optimize(exported, VARIANTS, Settings())
    onnx_dir = tmp_path / "onnx"
    assert artifacts["fp16"].files == {
        "encoder_model": onnx_dir / "encoder_model_fp16.onnx",
        "decoder_model_merged": onnx_dir / "decoder_model_merged_fp16.onnx",
    }
    assert artifacts["int8"].files["decoder_model_merged"] == onnx_dir / "decoder_model_merged_quantized.onnx"
    assert os.path.samefile(onnx_dir / "decoder_model_merged_int8.onnx", onnx_dir / "decoder_model_merged_quantized.onnx")
    # The merged decoder's layers live inside If branches: int8 must reach them.
    assert artifacts["int8"].details["components"]["decoder_model_merged"]["quantized_ops"]["MatMulInteger"] > 0
    fp32 = artifacts["fp32"].details["components"]
    assert fp32["encoder_model"]["method"] == "transformers_optimizer"
    assert fp32["decoder_model_merged"]["method"] == "ort_offline"
    # ... without a try of the fuser first: it matches nothing in the If branches (a graph made for nothing)
    assert "not tried" in fp32["decoder_model_merged"]["note"]
    # ORT's converter cannot type ORT-optimized If branches; fp16 from the plain export must
    # leave every output float32 and close to it, in both branches.
    assert artifacts["fp16"].details["components"]["decoder_model_merged"]["source"] == "plain export"
    # ... straight away: converting the optimized graph first only to fail loading it is wasted time
    assert "If outputs float" in artifacts["fp16"].details["components"]["decoder_model_merged"]["note"]
    feeds = _feeds(plain["decoder_model_merged"], exported.checkpoint.config)
    fp16 = ort.InferenceSession(str(artifacts["fp16"].files["decoder_model_merged"]), providers=["CPUExecutionProvider"])
    reference = ort.InferenceSession(str(plain["decoder_model_merged"]), providers=["CPUExecutionProvider"])
    for use_cache in (True, False):
        feeds["use_cache_branch"] = np.array([use_cache])
        got, want = fp16.run(None, feeds), reference.run(None, feeds)
        assert all(g.dtype == np.float32 for g in got)
        assert _cosine(got[0], want[0]) > 0.999
    for art in artifacts.values():
        assert "error" not in art.details
        for path in art.files.values():
            ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_variants_made_side_by_side_are_the_graphs_made_one_at_a_time(exports, tmp_path: Path) -> None:
    """A job with two threads makes int8 beside fp32 (then fp16, on both threads): the same graphs as one child at a
    time."""
    names = ("encoder_model", "decoder_model_merged")
    made = {}
    for threads in (1, 2):
        exported = _exported(exports["t5"], tmp_path / f"threads{threads}", names)
        made[threads] = optimize(exported, VARIANTS, Settings(threads=threads))
    for variant in VARIANTS:
        one, two = made[1][variant], made[2][variant]
        assert {c: p.name for c, p in one.files.items()} == {c: p.name for c, p in two.files.items()} and one.files
        for comp, path in one.files.items():
            assert _weights(onnx.load(str(path))) == _weights(onnx.load(str(two.files[comp])))
            assert _census(path) == _census(two.files[comp])
        parts = {t: made[t][variant].details["components"] for t in (1, 2)}
        assert [p["children_at_once"] for p in parts[1].values()] == [1, 1]
        assert [p["children_at_once"] for p in parts[2].values()] == [2, 2]
        # fp16 begins once fp32's or int8's child is done: it is checked on both threads, they on one each.
        assert [p["threads"] for p in parts[1].values()] == [1, 1]
        assert [p["threads"] for p in parts[2].values()] == [2 if variant == "fp16" else 1] * 2
        assert [p.get("method") for p in parts[1].values()] == [p.get("method") for p in parts[2].values()]


def test_an_fp32_job_with_a_cpu_to_spare_makes_the_next_components_graph_ahead(exports, tmp_path: Path) -> None:
    """fp32 alone on two threads is one child at a time per component: the decoder's first candidate is made beside
    the encoder's children, and it is the graph made in its turn (a bug would put it where fp32 does not look, or
    keep another method's)."""
    names = ("encoder_model", "decoder_model_merged")
    made = {}
    for threads in (1, 2):
        exported = _exported(exports["t5"], tmp_path / f"threads{threads}", names)
        made[threads] = optimize(exported, ("fp32",), Settings(threads=threads))["fp32"]
    parts = {t: made[t].details["components"] for t in (1, 2)}
    assert "made_ahead" not in parts[1]["decoder_model_merged"] and "made_ahead" not in parts[2]["encoder_model"]
    assert parts[2]["decoder_model_merged"]["made_ahead"] == parts[2]["decoder_model_merged"]["method"] == "ort_offline"
    assert [p["method"] for p in parts[1].values()] == [p["method"] for p in parts[2].values()]
    for comp, path in made[1].files.items():
        assert _weights(onnx.load(str(path))) == _weights(onnx.load(str(made[2].files[comp])))
        assert _census(path) == _census(made[2].files[comp])
    assert not list((tmp_path / "threads2").rglob(".optimize-*")), "the scratch folder goes, the graph made ahead with it"


def test_forked_children_run_side_by_side_and_each_answers_when_it_is_done() -> None:
    """Children forked from two threads run at once; a quick one's answer does not wait for a slow one's."""
    import threading

    done: dict[str, float] = {}
    t0 = time.perf_counter()

    def run(name: str, seconds: float) -> None:
        assert run_forked(lambda: time.sleep(seconds) or name, timeout_s=60) == name
        done[name] = time.perf_counter() - t0

    slow = threading.Thread(target=run, args=("slow", 3.0))
    slow.start()
    time.sleep(0.3)
    for _ in range(5):  # forks while the slow child runs
        run("quick", 0.0)
        assert done["quick"] < 2.5 and "slow" not in done
    slow.join()
    assert done["slow"] >= 3.0


def test_a_variant_that_cannot_be_made_is_data(tmp_path: Path, exports) -> None:
    """A second graph with nothing quantizable: int8 fails whole, fp32 and fp16 still ship."""
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch_size", 4])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch_size", 4])
    bias = onnx.numpy_helper.from_array(np.arange(4, dtype=np.float32), "bias")
    graph = onnx.helper.make_graph([onnx.helper.make_node("Add", ["x", "bias"], ["y"])], "add", [x], [y], [bias])
    exported = _exported(exports["bert"], tmp_path)
    head = tmp_path / "onnx" / "head.onnx"
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), head)
    exported.components.append(Component(name="head", path=head))
    artifacts = optimize(exported, VARIANTS, Settings())
    assert artifacts["int8"].files == {}
    assert artifacts["int8"].details["error"] == (
        "int8 of head: nothing to quantize: no MatMul, Gemm or Conv with a constant float32 weight"
    )
    assert artifacts["int8"].details["failure_kind"] == "optimize_error"
    assert not list((tmp_path / "onnx").glob("*_quantized.onnx"))  # no half-made variant left behind
    assert not list((tmp_path / "onnx").glob("*_int8.onnx"))
    assert set(artifacts["fp32"].files) == set(artifacts["fp16"].files) == {"model", "head"}


def test_large_models_keep_weights_in_external_data(exports, tmp_path: Path) -> None:
    exported = _exported(exports["bert"], tmp_path)
    artifacts = optimize(exported, VARIANTS, Settings(external_data_threshold=0))
    for art in artifacts.values():
        path = art.files["model"]
        assert path.with_name(path.name + "_data").stat().st_size > 0
        graph = onnx.load(str(path), load_external_data=False).graph
        assert any(onnx.external_data_helper.uses_external_data(t) for t in graph.initializer)
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert not list((tmp_path / "onnx").glob(".optimize-*"))
    # int8's second name: its own small graph naming its own data file, a hard link of the first's,
    # because transformers.js in a browser fetches <file>_data for the file it loads.
    onnx_dir = tmp_path / "onnx"
    alias = onnx.load(str(onnx_dir / "model_int8.onnx"), load_external_data=False)
    locations = {e.value for t in alias.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {"model_int8.onnx_data"}
    assert os.path.samefile(onnx_dir / "model_int8.onnx_data", onnx_dir / "model_quantized.onnx_data")
    feeds = _feeds(onnx_dir / "model_quantized.onnx", exported.checkpoint.config)
    assert np.array_equal(_outputs(onnx_dir / "model_int8.onnx", feeds), _outputs(onnx_dir / "model_quantized.onnx", feeds))


def test_fp32_failure_raises_naming_variant_and_component(tmp_path: Path, exports) -> None:
    exported = _exported(exports["bert"], tmp_path)
    exported.components[0].path.write_bytes(b"not an onnx graph")
    with pytest.raises(OptimizeError, match="fp32 of model"):
        optimize(exported, ("fp32",), Settings())


def _zoo_copy(exported: ExportedModel, out: Path, names: tuple[str, ...]) -> ExportedModel:
    """Some components of a shared zoo export, copied so optimize may overwrite them."""
    (out / "onnx").mkdir(parents=True)
    for c in exported.components:  # the export keeps every graph's weights beside it, in <file>_data
        if onnx_graph.data_path(c.path).exists():
            shutil.copy(onnx_graph.data_path(c.path), out / "onnx" / onnx_graph.data_path(c.path).name)
    parts = [Component(name=c.name, path=shutil.copy(c.path, out / "onnx" / c.path.name)) for c in exported.components]
    return ExportedModel(exported.checkpoint, out, [c for c in parts if c.name in names], 18, 8, 0, {})


@pytest.mark.slow
def test_merged_decoder_fp16_with_shadowed_branch_outputs(zoo_export, tmp_path: Path) -> None:
    """bart's If branches name their outputs like the If's own (logits); ORT's fp16 cleanup pruned the If."""
    plain = zoo_export("bart").out_dir / "onnx" / "decoder_model_merged.onnx"
    exported = _zoo_copy(zoo_export("bart"), tmp_path, ("decoder_model_merged",))
    fp16 = optimize(exported, ("fp16",), Settings())["fp16"]
    assert "error" not in fp16.details
    assert fp16.details["components"]["decoder_model_merged"]["io"] == "keep_io_types"
    got = ort.InferenceSession(str(fp16.files["decoder_model_merged"]), providers=["CPUExecutionProvider"])
    want = ort.InferenceSession(str(plain), providers=["CPUExecutionProvider"])
    feeds = _feeds(plain, exported.checkpoint.config)
    for use_cache in (True, False):
        feeds["use_cache_branch"] = np.array([use_cache])
        outs = got.run(None, feeds)
        assert [o.dtype for o in outs] == [np.float32] * len(outs)
        assert _cosine(outs[0], want.run(None, feeds)[0]) > 0.999


def test_a_tied_embedding_ships_once_and_int8_still_quantizes_its_copy(zoo_export, tmp_path: Path) -> None:
    """gpt2's lm_head is its wte; torch.onnx writes the table twice, the second transposed for the lm_head's MatMul.
    fp32, fp16 and their standard-ops graphs hold it once, read through a Transpose; int8 is made from the plain
    export and quantizes the copy as before; every graph computes what the plain export does."""
    src = zoo_export("gpt2")
    plain = src.out_dir / "onnx" / "model.onnx"
    wte = "transformer.wte.weight"
    (copy, table), = onnx_graph.share_tied(onnx_graph.load(plain), plain.parent).items()
    assert table == wte
    exported = _zoo_copy(src, tmp_path, ("model",))
    artifacts = optimize(exported, ("fp32", "fp16", "int8"), Settings(), standard=True)
    assert all("error" not in a.details for a in artifacts.values())
    feeds = _feeds(plain, exported.checkpoint.config)
    want = _outputs(plain, feeds)
    shipped = [artifacts["fp32"].files["model"], artifacts["fp32"].standard["model"], artifacts["fp16"].files["model"],
               artifacts["fp16"].standard["model"]]  # fmt: skip
    for path in shipped:
        model = onnx.load(str(path))
        names = {t.name for t in model.graph.initializer}
        assert wte in names and copy not in names, path
        assert any(n.op_type == "Transpose" and list(n.input) == [wte] for n in model.graph.node), path
        assert onnx_graph.share_tied(model) == {}, path  # nothing left to share
    # The standard fp32 graph is the plain export's, bit for bit in what it computes.
    assert np.array_equal(_outputs(artifacts["fp32"].standard["model"], feeds), want)
    assert np.abs(_outputs(artifacts["fp32"].files["model"], feeds) - want).max() <= 1e-4
    assert _cosine(_outputs(artifacts["fp16"].files["model"], feeds), want) > 0.999
    int8 = onnx.load(str(artifacts["int8"].files["model"]))
    assert f"{copy}_quantized" in {t.name for t in int8.graph.initializer}


def test_onnx_runtimes_offline_graph_ships_a_tied_embedding_once(zoo_export, tmp_path: Path) -> None:
    """gemma (no fuser: ORT's offline optimization) ties its lm_head to its embedding; llama does not: its graph is
    written as ORT writes it."""
    for name, tied in (("gemma", True), ("llama", False)):
        src = zoo_export(name)
        plain = src.out_dir / "onnx" / "model.onnx"
        assert onnx_graph.has_tied(plain) is tied and onnx_graph.tie_candidates(onnx_graph.load(plain).graph)
        fp32 = optimize(_zoo_copy(src, tmp_path / name, ("model",)), ("fp32",), Settings())["fp32"]
        assert fp32.details["methods"] == ["ort_offline"], fp32.details
        model = onnx.load(str(fp32.files["model"]))
        assert onnx_graph.share_tied(model) == {} and not onnx_graph.data_path(fp32.files["model"]).exists()
        transposed = [n for n in model.graph.node if n.op_type == "Transpose" and n.input[0] == "model.embed_tokens.weight"]
        assert len(transposed) == tied, name


def test_int8_keeps_convs_with_computed_weights_float(zoo_export, tmp_path: Path) -> None:
    """wav2vec2's weight-normed positional conv has no weight initializer for the quantizer."""
    exported = _zoo_copy(zoo_export("wav2vec2"), tmp_path, ("model",))
    int8 = optimize(exported, ("int8",), Settings())["int8"]
    assert "error" not in int8.details
    part = int8.details["components"]["model"]
    assert part["float32_convs"] == ["/wav2vec2/encoder/pos_conv_embed/conv/Conv"]
    assert part["quantized_ops"]["ConvInteger"] > 0 and part["quantized_ops"]["MatMulInteger"] > 0
    assert _census(int8.files["model"])["Conv"] == 1


def test_a_graph_onnx_runtime_crashes_on_fails_only_its_variant(zoo_export, tmp_path: Path) -> None:
    """ORT 1.32's CPU transformers segfault loading wavlm's fp16 graph: data, not a dead job."""
    exported = _zoo_copy(zoo_export("wavlm"), tmp_path, ("model",))
    artifacts = optimize(exported, ("fp32", "fp16"), Settings())
    assert artifacts["fp32"].files
    fp16 = artifacts["fp16"]
    assert fp16.files or "ONNX Runtime crashed (signal" in fp16.details["error"]


def test_a_crash_in_a_forked_child_is_an_optimize_error_naming_its_last_step() -> None:
    def segfault() -> None:
        step("ONNX Runtime", "loading model_fp16.onnx")
        os.kill(os.getpid(), signal.SIGSEGV)

    with pytest.raises(OptimizeError, match=r"ONNX Runtime crashed \(signal 11\) loading model_fp16.onnx"):
        run_forked(segfault, timeout_s=60)


def test_a_forked_child_returns_its_result_and_raises_with_its_kind() -> None:
    from zoo_convert.errors import FailureKind, ForkedError, VerifyError

    assert run_forked(lambda: {"big": b"x" * (1 << 21)}, timeout_s=60) == {"big": b"x" * (1 << 21)}

    def fails() -> None:
        raise VerifyError("no run", kind=FailureKind.VERIFY_ERROR)

    with pytest.raises(ForkedError, match="no run") as raised:
        run_forked(fails, timeout_s=60)
    assert raised.value.kind is FailureKind.VERIFY_ERROR and "fails" in raised.value.traceback_text


def test_a_parked_child_waits_half_way_until_its_result_is_asked_and_close_ends_it(tmp_path: Path) -> None:
    """The target checks' children (stages/target.py): checked, then parked with their runtimes loaded until go."""

    def job(name: str) -> str:
        (tmp_path / f"{name}-checked").touch()
        wait_for_go()
        (tmp_path / f"{name}-timed").touch()
        return name

    child = Parked(lambda: job("a"), timeout_s=60)
    assert child.parked and (tmp_path / "a-checked").exists() and not (tmp_path / "a-timed").exists()
    time.sleep(0.2)
    assert not (tmp_path / "a-timed").exists()  # still waiting
    assert child.result() == "a" and (tmp_path / "a-timed").exists()
    unasked = Parked(lambda: job("b"), timeout_s=60)
    assert unasked.parked
    unasked.close()  # the job failed before its latency phase: the child goes, never timed
    with pytest.raises(ChildProcessError):
        os.waitpid(unasked.pid, os.WNOHANG)
    assert not (tmp_path / "b-timed").exists()
    never = Parked(lambda: 7, timeout_s=60)  # a child that never parks is simply done
    assert not never.parked and never.result() == 7


def test_a_parked_child_that_answered_exits_only_once_let_go() -> None:
    """Its exit (the kernel tearing down its copy of the job, the runtime's allocations) is not for the job's latency
    phase, where its answer is asked: it waits, using no CPU, until the job closes it after the phase."""

    def job() -> bytes:
        wait_for_go()
        return bytes(range(256)) * (12 << 12)  # 12 MiB: an answer read in many chunks, its header before its body

    child = Parked(job, timeout_s=60)
    assert child.parked and child.result() == bytes(range(256)) * (12 << 12)
    time.sleep(0.2)
    assert os.waitpid(child.pid, os.WNOHANG) == (0, 0)  # answered, alive
    assert Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "S"  # blocked, not running
    assert len(child.result()) == 12 << 20  # asked again: the same answer, nothing more to wait for
    child.close()
    with pytest.raises(ChildProcessError):
        os.waitpid(child.pid, os.WNOHANG)  # reaped


def test_a_child_started_beside_the_caller_exits_when_done_not_when_asked() -> None:
    """start_forked's children (verify's references beside the export): a child whose answer outgrows the pipe would
    wait, holding its memory (0.33 GB for gpt2's references), until the caller asked for it after the export."""
    answer = bytes(range(256)) * (8 << 12)  # 8 MiB: far more than a pipe holds
    child = start_forked(lambda: answer, timeout_s=60)
    state = ""
    for _ in range(200):
        state = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":  # exited, not reaped yet: nobody asked for its answer
            break
        time.sleep(0.05)
    assert state == "Z"
    assert child.result() == answer and child.result() == answer  # asked again: the same answer
    child.close()
    with pytest.raises(ChildProcessError):
        os.waitpid(child.pid, os.WNOHANG)  # reaped
    unasked = start_forked(lambda: time.sleep(60), timeout_s=60)
    unasked.close()  # the job failed: killed and reaped
    with pytest.raises(ChildProcessError):
        os.waitpid(unasked.pid, os.WNOHANG)
    late = start_forked(lambda: time.sleep(60), timeout_s=60)
    late.timeout_s = 0.2
    with pytest.raises(OptimizeError, match="did not finish"):
        late.result()


def _squared(n: int) -> onnx.ModelProto:
    """y = x @ x on an n x n float input: a graph whose session has work for its thread pool."""
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [n, n])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [n, n])
    return onnx.helper.make_model(onnx.helper.make_graph([onnx.helper.make_node("MatMul", ["x", "x"], ["y"])], "g", [x], [y]))


def test_a_child_forked_after_torch_ran_its_thread_pool_finishes() -> None:
    """The children run ORT only: a fork after torch's OpenMP pool started must not deadlock them."""
    import torch

    with torch.inference_mode():
        torch.set_num_threads(2)
        (torch.randn(256, 256) @ torch.randn(256, 256)).sum().item()  # starts the intra-op pool

    def onnx_runtime_work() -> float:
        session = ort.InferenceSession(_squared(64).SerializeToString(), providers=["CPUExecutionProvider"])
        return float(session.run(None, {"x": np.ones((64, 64), np.float32)})[0].sum())

    assert run_forked(onnx_runtime_work, timeout_s=120) == 64.0 * 64 * 64


def test_load_reports_why_onnx_runtime_refused(exports, tmp_path: Path) -> None:
    exported = _exported(exports["bert"], tmp_path)
    path = tmp_path / "bad.onnx"
    path.write_bytes(b"not an onnx graph")
    with pytest.raises(OptimizeError, match="ONNX Runtime cannot load bad.onnx: .*INVALID_PROTOBUF"):
        _verified(exported, exported.components[0], "fp32", path, Settings(), None)


def _fp16_of(exported: ExportedModel, tmp_path: Path) -> Artifact:
    """The fp16 variant of every component of a zoo export, made from private copies."""
    copy = _zoo_copy(exported, tmp_path, tuple(c.name for c in exported.components))
    fp16 = optimize(copy, ("fp32", "fp16"), Settings())["fp16"]
    assert "error" not in fp16.details, fp16.details
    return fp16


@pytest.mark.slow
def test_t5_family_fp16_keeps_the_position_buckets_in_fp32(zoo_export, tmp_path: Path) -> None:
    """mt5's relative-position buckets (Log/Div/Mul/Cast on positions) moved in fp16: max abs 0.135 against 0.05."""
    exported = zoo_export("mt5")
    fp16 = _fp16_of(exported, tmp_path)
    kept = {name: part["fp32_nodes"] for name, part in fp16.details["components"].items()}
    assert kept["encoder_model"] > 0 and kept["decoder_model_merged"] > 0
    # The bucket's Log still computes in float32 in the fp16 graph: its input is cast back to fp32.
    graph = onnx.load(str(fp16.files["encoder_model"])).graph
    types = {v.name: v.type.tensor_type.elem_type for v in onnx.shape_inference.infer_shapes(
        onnx.load(str(fp16.files["encoder_model"]))).graph.value_info}
    logs = [n for n in graph.node if n.op_type == "Log"]
    assert logs and all(types.get(n.output[0]) == onnx.TensorProto.FLOAT for n in logs)
    checks = verify(exported, fp16, Settings())  # the default, strict fp16 tolerance
    assert all(c.passed for c in checks), max(checks, key=lambda c: c.max_abs)
    assert max(c.max_abs for c in checks if c.output.startswith("encoder_model/")) < 0.01


def test_fp16_index_arithmetic_is_the_closed_chain_back_to_integers() -> None:
    """Position math ending in a Cast to int stays fp32; a mask that flows on as a float is converted."""
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Cast", ["pos"], ["pos_f"], to=TensorProto.FLOAT, name="pos_cast"),
        helper.make_node("Constant", [], ["scale"], value=helper.make_tensor("v", TensorProto.FLOAT, [], [2.77]), name="c"),
        helper.make_node("Log", ["pos_f"], ["log"], name="log"),
        helper.make_node("Div", ["log", "scale"], ["ratio"], name="div"),
        helper.make_node("Cast", ["ratio"], ["bucket"], to=TensorProto.INT64, name="bucket_cast"),
        helper.make_node("Cast", ["mask"], ["mask_f"], to=TensorProto.FLOAT, name="mask_cast"),
        helper.make_node("Sub", ["one", "mask_f"], ["inverted"], name="sub"),
        helper.make_node("Cast", ["inverted"], ["masked"], to=TensorProto.BOOL, name="mask_bool"),
        helper.make_node("Add", ["x", "inverted"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, [2]) for n, t in (("pos", TensorProto.INT64), ("mask", TensorProto.INT64),
                                                                  ("x", TensorProto.FLOAT))],
        [helper.make_tensor_value_info(n, t, [2]) for n, t in (("bucket", TensorProto.INT64), ("masked", TensorProto.BOOL),
                                                                  ("y", TensorProto.FLOAT))],
        initializer=[onnx.numpy_helper.from_array(np.ones(1, np.float32), "one")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert sorted(fp16_recipe.index_arithmetic(model)) == ["bucket_cast", "c", "div", "log", "pos_cast"]


def test_fp16_keeps_sinusoid_angles_of_inputs_in_fp32() -> None:
    """A timestep embedding's angles (timestep * 1000 * frequencies) stay fp32 up to their Sin/Cos; a sine of a
    layer's output, and what reads the sines, are converted."""
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Constant", [], ["k"], value=helper.make_tensor("v", TensorProto.FLOAT, [], [1000.0]), name="c"),
        helper.make_node("Mul", ["t", "k"], ["scaled"], name="scale"),
        helper.make_node("Unsqueeze", ["scaled", "axis"], ["column"], name="unsqueeze"),
        helper.make_node("Mul", ["column", "freqs"], ["angle"], name="angle"),
        helper.make_node("Sin", ["angle"], ["sin"], name="sin"),
        helper.make_node("Cos", ["angle"], ["cos"], name="cos"),
        helper.make_node("Concat", ["sin", "cos"], ["emb"], axis=1, name="concat"),
        helper.make_node("MatMul", ["emb", "w"], ["hidden"], name="linear"),
        helper.make_node("Sin", ["hidden"], ["y"], name="snake"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        initializer=[
            onnx.numpy_helper.from_array(np.array([1], np.int64), "axis"),
            onnx.numpy_helper.from_array(np.exp(-np.arange(4, dtype=np.float32))[None, :], "freqs"),
            onnx.numpy_helper.from_array(np.ones((8, 8), np.float32), "w"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert sorted(fp16_recipe.prepare(model)) == ["angle", "c", "cos", "scale", "sin", "unsqueeze"]


def test_fp16_clamp_is_ort_s_bit_for_bit() -> None:
    """The fast clamp the converter runs with gives the same float16 bits as ORT's own."""
    from onnxruntime.transformers.float16 import convert_np_to_float16

    rng = np.random.default_rng(0)
    edges = [0.0, -0.0, 1e-9, -1e-9, 2**-25, -(2**-25), 2**-24, 5.96e-08, -5.96e-08, 3e-8, 6e-8, 6.1e-5,
             65504, 65505, -65519.9, 65520, 1e6, -1e6, np.inf, -np.inf, np.nan, 1.0, -3.5]  # fmt: skip
    for dtype in (np.float32, np.float64):  # raw_data and float_data tensors
        values = np.concatenate([np.array(edges, dtype), rng.standard_normal(50_000).astype(dtype)
                                 * 10.0 ** rng.integers(-10, 7, 50_000)])  # fmt: skip
        for args in ((), (1e-7, 1e4)):
            ours, theirs = fp16_recipe.to_float16(values, *args), convert_np_to_float16(values, *args)
            assert ours.dtype == theirs.dtype == np.float16
            assert np.array_equal(ours.view(np.uint16), theirs.view(np.uint16)), (dtype, args)


def test_fp16_types_are_inferred_without_reading_the_weights() -> None:
    """Shape inference sees a big weight's type and dims, a small shape constant's values, and the
    model keeps its bytes."""
    from onnx import TensorProto, helper

    weight = onnx.numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(64, 64), "w")
    shape = onnx.numpy_helper.from_array(np.array([8, 512], np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Reshape", ["h", "shape"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[weight, shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    inferred = fp16_recipe.infer(model)
    assert inferred is not None
    found = {v.name: v.type.tensor_type for v in inferred.graph.value_info}
    assert found["h"].elem_type == TensorProto.FLOAT
    assert [d.dim_value for d in inferred.graph.output[0].type.tensor_type.shape.dim] == [8, 512]
    assert not inferred.graph.initializer[0].raw_data and list(inferred.graph.initializer[0].dims) == [64, 64]
    assert onnx.numpy_helper.to_array(model.graph.initializer[0])[63, 63] == 4095


@pytest.mark.slow
def test_merged_decoder_branches_share_no_names_for_the_fp16_converter(zoo_export, tmp_path: Path) -> None:
    """m2m_100's no-cache branch lost its encoder mask in fp16 (cosine 0.973 from layer 1 on).

    ORT's converter maps tensor names to nodes across both branches of the merged decoder, whose
    nodes carry the same names: a cascaded-Cast cleanup in one rewired the mask's Cast in the other.
    """
    exported = zoo_export("m2m-100")
    model = onnx.load(str(exported.components[1].path))
    fp16_recipe.unshadow_branches(model.graph)
    made: Counter[str] = Counter(o for g in onnx_graph.graphs(model.graph) for n in g.node for o in n.output)
    assert [name for name, n in made.items() if n > 1] == []
    names: Counter[str] = Counter(n.name for g in onnx_graph.graphs(model.graph) for n in g.node)
    assert [name for name, n in names.items() if n > 1] == []
    fp16 = _fp16_of(exported, tmp_path)
    # The first step with half the encoder positions padded: the fp16 graph must mask the same ones.
    plain = exported.components[1].path
    feeds = _feeds(plain, exported.checkpoint.config)
    feeds["use_cache_branch"] = np.array([False])
    feeds["encoder_attention_mask"][:, feeds["encoder_attention_mask"].shape[1] // 2 :] = 0
    want = ort.InferenceSession(str(plain), providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0]
    got = ort.InferenceSession(str(fp16.files["decoder_model_merged"]), providers=["CPUExecutionProvider"])
    assert _cosine(got.run(["logits"], feeds)[0], want) > 0.999
    checks = verify(exported, fp16, Settings())
    assert all(c.passed and c.cosine > 0.99999 for c in checks if c.shape.endswith("/no-cache"))


def test_fusion_and_fp16_run_no_shape_inference_over_the_weights(
    exports, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ORT's symbolic shape inference copies the whole model per fusion (5 times for bert): fused without it, like O2."""
    import onnxruntime.transformers.float16 as ort_float16
    import onnxruntime.transformers.optimizer  # noqa: F401 - puts ORT's transformers folder on sys.path
    import shape_infer_helper

    from zoo_convert.stages.optimize import FUSION_OPT_LEVEL, _fuse, _to_fp16

    inferred: list[str] = []
    real_helper = shape_infer_helper.SymbolicShapeInferenceHelper.__init__

    def helper(self, *args, **kwargs):
        inferred.append("symbolic")
        real_helper(self, *args, **kwargs)

    monkeypatch.setattr(shape_infer_helper.SymbolicShapeInferenceHelper, "__init__", helper)
    for name in ("infer_shapes", "infer_shapes_path"):
        real = getattr(ort_float16, name)
        monkeypatch.setattr(ort_float16, name, lambda *a, real=real, name=name, **k: (inferred.append(name), real(*a, **k))[1])
    config = json.loads((exports["bert"] / "checkpoint" / "config.json").read_text())
    plain = exports["bert"] / "onnx" / "model.onnx"
    out, census, extra = _fuse(plain, tmp_path / "model.onnx", "bert", config, False, FUSION_OPT_LEVEL["bert"])
    assert census["Attention"] == 2 and census["SkipLayerNormalization"] > 0
    assert extra["fused_operator_statistics"]["Attention"] == 2 and extra["contrib_ops"]["com.microsoft.Attention"] == 2
    fp16_model, _ = _to_fp16(out)
    assert inferred == []
    fed = _feeds(plain, config)
    got = ort.InferenceSession(fp16_model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, fed)[0]
    assert _cosine(got, _outputs(plain, fed)) > 0.999


@pytest.mark.parametrize(
    ("family", "component", "fusion_type", "opt_level", "fused"),
    [("bert", "model", "bert", 1, "Attention"), ("t5", "encoder_model", "t5", 0, "SimplifiedLayerNormalization")],
)
def test_fusion_writes_optimize_models_graph_without_loading_the_weights(
    exports, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    family: str, component: str, fusion_type: str, opt_level: int, fused: str,
) -> None:  # fmt: skip
    """The fusers get the graph without its weights and read the few they fold (bert's Q, K, V) from the data file."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    from zoo_convert.stages.optimize import _fuse

    exported = _exported(exports[family], tmp_path / "job", (component,))
    plain = exported.components[0].path
    config = json.loads((exports[family] / "checkpoint" / "config.json").read_text())
    options = FusionOptions(fusion_type)
    options.enable_shape_inference = False
    whole = optimize_model(str(plain), model_type=fusion_type, num_heads=4, hidden_size=32, opt_level=opt_level,
                           use_gpu=False, optimization_options=options)  # fmt: skip
    onnx.save_model(whole.model, str(tmp_path / "optimize_model.onnx"))

    loads: list[str] = []
    real = onnx.external_data_helper.load_external_data_for_model
    for owner in (onnx, onnx.external_data_helper):
        monkeypatch.setattr(owner, "load_external_data_for_model", lambda m, d: (loads.append(d), real(m, d))[1])
    here = os.getcwd()
    (tmp_path / "fused").mkdir()
    out, census, _ = _fuse(plain, tmp_path / "fused" / "model.onnx", fusion_type, config, False, opt_level)
    assert loads == [] and os.getcwd() == here
    assert census[fused] > 0
    assert out.read_bytes() == (tmp_path / "optimize_model.onnx").read_bytes()
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.onnx"]  # ORT's basic pass's files are gone


def test_a_child_never_destroys_an_onnx_runtime_session_it_inherited() -> None:
    """A parent's session left in a garbage cycle, collected in a child, waited forever on its thread pool."""
    import gc

    model = _squared(256)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    gc.disable()  # the cycle must still be garbage when the child starts
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        session.run(None, {"x": np.ones((256, 256), np.float32)})  # its pool's threads are running
        time.sleep(1.0)  # and then asleep on the pool's condition variables
        cycle: list[object] = [session]
        cycle.append(cycle)
        del session, cycle
        assert run_forked(lambda: gc.collect() >= 0, timeout_s=30) is True
    finally:
        gc.enable()
        gc.collect()
