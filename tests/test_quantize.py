"""The streaming quantizer against ONNX Runtime's own ``quantize_dynamic``, its memory, and its refusals."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from zoo_convert import node, onnx_graph, zoo
from zoo_convert.variants import REGISTRY
from zoo_convert.variants import quantize as quantize_module
from zoo_convert.errors import FailureKind, QuantizeError, is_our_bug
from zoo_convert.variants.quantize import (
    WeightType,
    default_exclude,
    embedding_gathers,
    post_gelu_matmuls,
    probability_matmuls,
    quantize,
    unsigned_twin,
)
from zoo_convert.records import ManifestEntry, Settings
from zoo_convert.verify.compare import compare
from zoo_convert.stages import Checkpoint

from graph_feeds import feeds as graph_feeds

pytestmark = pytest.mark.timeout(300)

# bert: MatMuls and an embedding Gather; gpt2: Gemm (Conv1D); resnet: Convs; t5: a merged decoder,
# its layers inside the branches of an If, reading weights of the outer graph.
MODELS = ("bert", "gpt2", "resnet", "t5")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[Path], dict[str, object]]]:
    """Each model's exported graphs and its config."""
    from zoo_convert.stages.export import export

    root = tmp_path_factory.mktemp("quantize")
    zoo.build(root / "zoo", only=MODELS)
    out: dict[str, tuple[list[Path], dict[str, object]]] = {}
    for name in MODELS:
        folder = root / "zoo" / name
        config = json.loads((folder / "config.json").read_text())
        task = next(m.task for m in zoo.ZOO if m.name == name)
        ckpt = Checkpoint(
            path=folder, resolved_revision="x", model_type=config["model_type"], task=task, library="transformers", config=config
        )
        model = export(ckpt, ManifestEntry(source=str(folder)), Settings(), root / "export" / name)
        out[name] = ([c.path for c in model.components], config)
    return out


def _initializers(path: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(path))
    return {t.name: numpy_helper.to_array(t) for g in onnx_graph.graphs(model.graph) for t in g.initializer}


def _run(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize(
    ("weight_type", "per_channel"), [("int8", True), ("uint8", True), ("int8", False)], ids=["int8-pc", "uint8-pc", "int8-pt"]
)
@pytest.mark.parametrize("name", MODELS)
def test_same_graph_and_weights_as_quantize_dynamic(
    exported: dict[str, tuple[list[Path], dict[str, object]]],
    name: str,
    weight_type: WeightType,
    per_channel: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same operators, the same quantized bytes, scales and zero points, and the same outputs in ORT."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    monkeypatch.setattr(quantize_module, "LAZY_BYTES", 256)  # the tiny models' weights too are read from the file by offset

    graphs, config = exported[name]
    for src in graphs:
        ours, theirs = tmp_path / f"ours_{src.name}", tmp_path / f"ort_{src.name}"
        done = quantize(src, ours, weight_type=weight_type, per_channel=per_channel)
        quantize_dynamic(
            src,
            theirs,
            per_channel=per_channel,
            weight_type={"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}[weight_type],
            extra_options={"EnableSubgraph": True},
        )
        census = onnx_graph.op_census(onnx.load(str(ours)).graph)
        assert census == onnx_graph.op_census(onnx.load(str(theirs)).graph), src.name
        assert done.ops == {op: census[op] for op in done.ops}
        assert census["MatMulInteger"] + census["ConvInteger"] > 0, src.name
        mine, ref = _initializers(ours), _initializers(theirs)
        made = {k for k, v in ref.items() if k.endswith(("_quantized", "_scale", "_zero_point"))}
        assert made and made <= set(mine), src.name
        for key in made:
            assert mine[key].dtype == ref[key].dtype and mine[key].shape == ref[key].shape, key
            assert np.array_equal(mine[key], ref[key]), key
            if mine[key].dtype == np.int8 and key.endswith("_quantized"):  # symmetric, all 8 bits
                assert np.abs(mine[key].astype(np.int32)).max() == 127, key
        # No float copy of a quantized weight stays behind.
        assert {k for k, v in mine.items() if v.dtype == np.float32} == {k for k, v in ref.items() if v.dtype == np.float32}
        feeds = graph_feeds(src, config)
        for a, b in zip(_run(ours, feeds), _run(theirs, feeds), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def _saturating(path: Path, rows: int = 4, depth: int = 512) -> np.ndarray:
    """A MatMul whose int8 products overflow an int16 pairwise (255 x 127 x 2 > 2**15), quantized to ``path``; its input."""
    weight = np.ones((depth, 3), np.float32) * np.array([1.0, -1.0, 0.5], np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [rows, depth])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, 3])],
        [numpy_helper.from_array(weight, "w")],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path.with_suffix(".fp32.onnx")))
    quantize(path.with_suffix(".fp32.onnx"), path)
    return np.ones((rows, depth), np.float32)  # every activation quantizes to 255


@pytest.mark.parametrize("external", [False, True], ids=["inline", "external"])
def test_uint8_twin_computes_the_int8_graphs_exact_sums(tmp_path: Path, external: bool) -> None:
    """The twin gives the int8 graph's exact arithmetic on every CPU; the int8 graph itself only where nothing saturates.

    On x86 without VNNI or AMX, ONNX Runtime adds two uint8 x int8 products into an int16: 512 ones times +-127
    come out at about half their sum there, which is what :func:`zoo_convert.node.int8_saturates` predicts.
    """
    graph = tmp_path / "int8.onnx"
    a = _saturating(graph)
    if external:
        onnx_graph.save(onnx.load(str(graph)), graph, external=True)
    (tmp_path / "twin").mkdir()
    exact = a @ (np.ones((512, 3), np.float32) * np.array([1.0, -1.0, 0.5], np.float32))
    assert unsigned_twin(graph, tmp_path / "twin" / "int8.onnx") == 2  # the weight and its zero point
    assert onnx_graph.data_path(tmp_path / "twin" / "int8.onnx").exists() == external
    weights, twins = _initializers(graph), _initializers(tmp_path / "twin" / "int8.onnx")
    assert twins["w_quantized"].dtype == np.uint8
    assert np.array_equal(twins["w_quantized"].astype(np.int32) - 128, weights["w_quantized"].astype(np.int32))
    assert np.array_equal(twins["w_zero_point"], np.full(3, 128, np.uint8))
    (twin,) = _run(tmp_path / "twin" / "int8.onnx", {"a": a})
    np.testing.assert_allclose(twin, exact, rtol=0.01)
    (int8,) = _run(graph, {"a": a})
    if node.int8_saturates():
        assert np.abs(int8 - exact).max() > 0.3 * np.abs(exact).max(), int8
    else:
        np.testing.assert_allclose(int8, exact, rtol=0.01)


@pytest.mark.parametrize("name", ["bert", "t5"])
def test_activation_matmuls_all_as_quantize_dynamic_and_scores_without_the_probabilities(
    exported: dict[str, tuple[list[Path], dict[str, object]]], name: str, tmp_path: Path
) -> None:
    """``activations="all"``: every MatMul of two activations quantized, as ORT does with MatMulConstBOnly off;
    ``"scores"``: those reading a Softmax (probabilities times V) stay float, in every branch of a merged decoder."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graphs, config = exported[name]
    for src in graphs:
        ours, theirs, scores = (tmp_path / f"{how}_{src.name}" for how in ("ours", "ort", "scores"))
        plain = quantize(src, tmp_path / f"plain_{src.name}")
        done = quantize(src, ours, activations="all")
        quantize_dynamic(src, theirs, per_channel=True, weight_type=QuantType.QInt8,
                         extra_options={"EnableSubgraph": True, "MatMulConstBOnly": False})  # fmt: skip
        census = onnx_graph.op_census(onnx.load(str(ours)).graph)
        assert census == onnx_graph.op_census(onnx.load(str(theirs)).graph), src.name
        assert done.ops["MatMulInteger"] > plain.ops["MatMulInteger"] and census["MatMul"] == 0, src.name
        feeds = graph_feeds(src, config)
        for a, b in zip(_run(ours, feeds), _run(theirs, feeds), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)

        source = onnx.load(str(src), load_external_data=False)
        softmaxes = sum(n.op_type == "Softmax" for g in onnx_graph.graphs(source.graph) for n in g.node)
        kept = Counter(probability_matmuls(source))  # a merged decoder's branches share names
        some = quantize(src, scores, activations="scores")
        left = Counter(n.name for g in onnx_graph.graphs(onnx.load(str(scores)).graph) for n in g.node if n.op_type == "MatMul")
        assert softmaxes > 0 and left == kept and kept.total() == softmaxes == some.float_matmuls, (src.name, left, kept)
        # one Q.K^T quantized per softmax, where "all" quantized its probabilities times V too
        assert some.ops["MatMulInteger"] - plain.ops["MatMulInteger"] == softmaxes
        assert done.ops["MatMulInteger"] - plain.ops["MatMulInteger"] == 2 * softmaxes
        # judged as the farm judges an int8 graph, against the float one it was made from
        for i, (got, want) in enumerate(zip(_run(scores, feeds), _run(src, feeds), strict=True)):
            if got.dtype == np.float32:
                check = compare(f"output {i}", "", want, got, REGISTRY["int8"].tolerance)
                assert check.passed, (src.name, check)


def _attention(path: Path, length: int, heads: int = 4, dim: int = 32) -> Path:
    """softmax(Q.K^T / sqrt(d)) . V over ``length`` positions, as an export writes it: the inputs are Q, K^T, V."""
    nodes = [
        helper.make_node("MatMul", ["q", "kt"], ["scores"], "qk"),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"], "scale"),
        helper.make_node("Softmax", ["scaled"], ["probs"], "softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["context"], "pv"),
    ]
    shape = ["b", heads]
    graph = helper.make_graph(
        nodes,
        "attention",
        [helper.make_tensor_value_info("q", TensorProto.FLOAT, [*shape, length, dim]),
         helper.make_tensor_value_info("kt", TensorProto.FLOAT, [*shape, dim, length]),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, [*shape, length, dim])],
        [helper.make_tensor_value_info("context", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(dim**-0.5, np.float32), "scale")],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_quantized_probabilities_lose_what_quantized_scores_do_not(tmp_path: Path) -> None:
    """Why ``scores`` keeps probabilities . V float: one uint8 scale over a long row's probabilities rounds most to 0.

    Peaked heads (a few positions take most of the weight) beside diffuse ones, as real attention
    is: the probabilities' range is set by the peaks, the diffuse rows' ~1/512 fall below one step.
    """
    rng = np.random.default_rng(0)
    length, heads, dim = 512, 4, 32
    src = _attention(tmp_path / "attention.onnx", length, heads, dim)
    q = rng.normal(size=(1, heads, length, dim)).astype(np.float32)
    q[:, 0] *= 6.0  # head 0 peaked, the others near uniform
    kt = rng.normal(size=(1, heads, dim, length)).astype(np.float32)
    v = rng.normal(size=(1, heads, length, dim)).astype(np.float32)
    feeds = {"q": q, "kt": kt, "v": v}
    (want,) = _run(src, feeds)
    error = {}
    for how in ("scores", "all"):
        done = quantize(src, tmp_path / f"{how}.onnx", activations=how)
        assert done.ops["MatMulInteger"] == (1 if how == "scores" else 2)
        (got,) = _run(tmp_path / f"{how}.onnx", feeds)
        diffuse = slice(1, heads)
        error[how] = float(np.abs(got - want)[:, diffuse].max() / np.abs(want[:, diffuse]).max())
    assert error["scores"] < 0.1 and error["all"] > 2 * error["scores"], error


def test_merged_decoder_quantizes_inside_both_branches(
    exported: dict[str, tuple[list[Path], dict[str, object]]], tmp_path: Path
) -> None:
    graphs, _ = exported["t5"]
    merged = next(p for p in graphs if "merged" in p.name)
    quantize(merged, tmp_path / "q.onnx")
    model = onnx.load(str(tmp_path / "q.onnx"))
    branches = [g for node in model.graph.node if node.op_type == "If" for _, g in onnx_graph.subgraphs(node)]
    assert len(branches) == 2
    for branch in branches:
        assert onnx_graph.op_census(branch)["MatMulInteger"] > 0
        assert not branch.initializer or all(t.data_type != TensorProto.FLOAT or len(t.dims) < 2 for t in branch.initializer)


def _optimized_census(path: Path, tmp_path: Path) -> dict[str, int]:
    """Op counts of the graph ONNX Runtime runs after its CPU fusions."""
    opts = ort.SessionOptions()
    opts.optimized_model_filepath = str(tmp_path / f"{path.stem}.ort.onnx")
    ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return dict(onnx_graph.op_census(onnx.load(opts.optimized_model_filepath).graph))


def test_ort_fuses_ours_as_it_fuses_quantize_dynamics(
    exported: dict[str, tuple[list[Path], dict[str, object]]], tmp_path: Path
) -> None:
    """The source's shapes are kept: ORT's fusions (SkipLayerNormalization needs them) make the same graph of both."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    (src,), _ = exported["bert"]
    quantize(src, tmp_path / "ours.onnx")
    quantize_dynamic(src, tmp_path / "ort.onnx", per_channel=True, weight_type=QuantType.QInt8)
    ours = _optimized_census(tmp_path / "ours.onnx", tmp_path)
    assert ours == _optimized_census(tmp_path / "ort.onnx", tmp_path)
    assert ours["SkipLayerNormalization"] > 0


def test_excluded_and_external(exported: dict[str, tuple[list[Path], dict[str, object]]], tmp_path: Path) -> None:
    """``exclude`` keeps nodes float like ``nodes_to_exclude``; ``external`` writes the same graph beside a data file."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    (src,), config = exported["bert"]
    model = onnx_graph.load(src)
    gelu, tables = post_gelu_matmuls(model), default_exclude(model)
    assert len(gelu) == 2  # the FFN down-projections of both layers
    assert tables == embedding_gathers(model) and len(tables) == 3  # word, position and token type embeddings
    skip = gelu | tables
    done = quantize(src, tmp_path / "ours.onnx", exclude=skip, external=True)
    assert done.float_matmuls >= len(gelu) and "DequantizeLinear" not in done.ops
    assert onnx_graph.data_path(tmp_path / "ours.onnx").stat().st_size > 0
    quantize_dynamic(src, tmp_path / "ort.onnx", per_channel=True, weight_type=QuantType.QInt8,
                     nodes_to_exclude=sorted(skip))  # fmt: skip
    graph = onnx.load(str(tmp_path / "ours.onnx")).graph
    assert gelu <= {n.name for n in graph.node if n.op_type == "MatMul"}
    floats = {t.name for t in graph.initializer if t.data_type == TensorProto.FLOAT}
    assert all(n.input[0] in floats for n in graph.node if n.name in tables)
    feeds = graph_feeds(src, config)
    for a, b in zip(_run(tmp_path / "ours.onnx", feeds), _run(tmp_path / "ort.onnx", feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


# --- memory ---------------------------------------------------------------------------------------------------

LAYERS, WIDTH = 16, 2048  # 16 MB of float32 per weight, 256 MB in all


def _big_model(folder: Path, inline: bool = False) -> Path:
    """A chain of MatMuls with their weights in one external data file, written one weight at a time (or inline)."""
    folder.mkdir()
    data = folder / "big.onnx_data"
    rng = np.random.default_rng(0)
    inits, nodes = [], []
    with data.open("wb") as f:
        for i in range(LAYERS):
            weight = rng.standard_normal((WIDTH, WIDTH), dtype=np.float32)
            tensor = helper.make_tensor_value_info(f"w{i}", TensorProto.FLOAT, [WIDTH, WIDTH])  # for the name only
            init = TensorProto(name=tensor.name, data_type=TensorProto.FLOAT, dims=[WIDTH, WIDTH])
            init.data_location = TensorProto.EXTERNAL
            for key, value in (("location", data.name), ("offset", str(f.tell())), ("length", str(weight.nbytes))):
                entry = init.external_data.add()
                entry.key, entry.value = key, value
            f.write(weight.tobytes())
            inits.append(init)
            nodes.append(helper.make_node("MatMul", [f"h{i}", f"w{i}"], [f"h{i + 1}"], f"mm{i}"))
    graph = helper.make_graph(
        nodes,
        "big",
        [helper.make_tensor_value_info("h0", TensorProto.FLOAT, ["n", WIDTH])],
        [helper.make_tensor_value_info(f"h{LAYERS}", TensorProto.FLOAT, ["n", WIDTH])],
        inits,
    )
    path = folder / "big.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if inline:
        onnx.external_data_helper.load_external_data_for_model(model, str(folder))
        data.unlink()
    onnx.save_model(model, str(path))
    return path


# Peak resident memory a call adds to a process that already imported what it needs.
_MEASURE = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from zoo_convert.variants.quantize import quantize

    def status(key):
        return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key + ":"))

    src, dst, how = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    before = status("VmRSS")
    if how == "ours":
        quantize(src, dst, external=True)
    else:
        quantize_dynamic(src, dst, per_channel=True, weight_type=QuantType.QInt8, use_external_data_format=True)
    print(status("VmHWM") - before)
    """
)


def _peak(src: Path, dst: Path, how: str) -> int:
    done = subprocess.run([sys.executable, "-c", _MEASURE, str(src), str(dst), how], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


@pytest.mark.parametrize("inline", [False, True], ids=["external-source", "inline-source"])
def test_peak_memory_is_a_fraction_of_the_weights(tmp_path: Path, inline: bool) -> None:
    """Ours adds far less than the weights to the process; ``quantize_dynamic`` adds more than 1.3x of them.

    Inline weights too are read from the graph file by offset, never the whole file at once.
    """
    src = _big_model(tmp_path / "src", inline)
    weights = LAYERS * WIDTH * WIDTH * 4
    ours = _peak(src, tmp_path / "ours.onnx", "ours")
    theirs = _peak(src, tmp_path / "ort.onnx", "ort")
    assert ours < 0.5 * weights, (ours, weights)
    assert theirs > 1.3 * weights, (theirs, weights)
    x = np.random.default_rng(1).standard_normal((2, WIDTH), dtype=np.float32) * 0.02
    a, b = _run(tmp_path / "ours.onnx", {"h0": x}), _run(tmp_path / "ort.onnx", {"h0": x})
    np.testing.assert_allclose(a[0], b[0], rtol=1e-4, atol=1e-5)


# --- refusals -------------------------------------------------------------------------------------------------


def _tiny(folder: Path, opset: int = 17, location: str | None = None) -> Path:
    """One MatMul over a 64x64 weight, inline or at ``location`` (relative to the graph's folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    weight = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    if location is not None:
        weight.ClearField("raw_data")
        weight.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", "0"), ("length", str(64 * 64 * 4))):
            entry = weight.external_data.add()
            entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], "mm")],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [weight],
    )
    path = folder / "tiny.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return path


def test_refuses_an_opset_without_dynamic_quantize_linear(tmp_path: Path) -> None:
    src = _tiny(tmp_path, opset=10)
    with pytest.raises(QuantizeError, match=r"tiny\.onnx: opset 10 < 11") as raised:
        quantize(src, tmp_path / "q.onnx")
    assert raised.value.kind is FailureKind.OPTIMIZE_ERROR and not is_our_bug(raised.value)  # the model's, not ours
    assert not (tmp_path / "q.onnx").exists()


def test_refuses_to_overwrite_its_source(tmp_path: Path) -> None:
    src = _tiny(tmp_path)
    before = src.read_bytes()
    with pytest.raises(QuantizeError, match="cannot overwrite its source"):
        quantize(src, tmp_path / "." / "tiny.onnx")
    assert src.read_bytes() == before


@pytest.mark.parametrize("dst", ["w.onnx", "w.onnx_data"])
def test_refuses_to_overwrite_its_source_data(tmp_path: Path, dst: str) -> None:
    """An output whose graph or data file is the source's data file (``w.onnx`` writes ``w.onnx_data``)."""
    (tmp_path / "w.onnx_data").write_bytes(np.ones(64 * 64, np.float32).tobytes())
    src = _tiny(tmp_path, location="w.onnx_data")
    with pytest.raises(QuantizeError, match=r"holds the source's weights"):
        quantize(src, tmp_path / dst, external=True)
    assert (tmp_path / "w.onnx_data").stat().st_size == 64 * 64 * 4


@pytest.mark.parametrize("location", ["../secret.bin", "/etc/passwd", "sub/../../secret.bin"])
def test_refuses_external_data_outside_the_graph_folder(tmp_path: Path, location: str) -> None:
    (tmp_path / "secret.bin").write_bytes(np.ones(64 * 64, np.float32).tobytes())
    src = _tiny(tmp_path / "model", location=location)
    with pytest.raises(QuantizeError, match=r"tiny\.onnx: external data .* lies outside the graph's folder"):
        quantize(src, tmp_path / "model" / "q.onnx", external=True)
    assert not (tmp_path / "model" / "q.onnx").exists()


def test_external_data_that_ends_early_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "w.bin").write_bytes(b"\0" * 100)
    src = _tiny(tmp_path / "model", location="w.bin")
    with pytest.raises(QuantizeError, match=r"tiny\.onnx: tensor 'w': its external data ends early"):
        quantize(src, tmp_path / "model" / "q.onnx")


def test_a_file_that_is_not_a_whole_model_is_an_error(tmp_path: Path) -> None:
    src = _tiny(tmp_path)
    whole = src.read_bytes()
    src.write_bytes(whole[: len(whole) - 100])
    with pytest.raises(QuantizeError, match=r"tiny\.onnx: truncated"):
        quantize(src, tmp_path / "q.onnx")
