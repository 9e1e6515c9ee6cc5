"""onnx_graph and runtime.ort_session on small hand-built graphs: subgraphs, external data, providers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from zoo_convert import onnx_graph
from zoo_convert.verify.runtime import ort_session


def _branch(name: str, op: str) -> onnx.GraphProto:
    out = helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [2])
    return helper.make_graph([helper.make_node(op, ["x"], [f"{name}_y"])], name, [], [out])


def _merged_like() -> onnx.ModelProto:
    """A graph whose work sits in an If's two branches, as in optimum's merged decoders, plus a big weight."""
    weight = numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(2, 2048), "w")
    nodes = [
        helper.make_node("Relu", ["x0"], ["x"]),
        helper.make_node(
            "If", ["flag"], ["y"], then_branch=_branch("then", "Neg"), else_branch=_branch("else", "Abs")
        ),
        helper.make_node("Reshape", ["y", "shape"], ["y2"]),
        helper.make_node("MatMul", ["y2", "w"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes,
        "merged",
        [
            helper.make_tensor_value_info("x0", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 2048])],
        initializer=[weight, numpy_helper.from_array(np.array([1, 2], dtype=np.int64), "shape")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_census_counts_both_branches_of_an_if() -> None:
    census = onnx_graph.op_census(_merged_like().graph)
    assert census == {"Relu": 1, "If": 1, "Neg": 1, "Abs": 1, "Reshape": 1, "MatMul": 1}
    assert sorted(g.name for g in onnx_graph.graphs(_merged_like().graph)) == ["else", "merged", "then"]


def test_inputs_leave_out_initializers_listed_as_inputs(tmp_path: Path) -> None:
    model = _merged_like()
    model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 2048]))  # older exporters
    assert [i.name for i in onnx_graph.fed_inputs(model.graph)] == ["x0", "flag"]


def test_external_data_lives_in_file_data_and_moves_with_its_graph(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    onnx_graph.save(_merged_like(), path, external=True)
    data = onnx_graph.data_path(path)
    assert data == tmp_path / "model.onnx_data" and data.stat().st_size >= 4096 * 4
    assert onnx_graph.disk_size(path) == path.stat().st_size + data.stat().st_size

    written = data.stat().st_mtime_ns, data.stat().st_ino
    moved = onnx_graph.move(path, tmp_path / "model_fp16.onnx")
    assert onnx_graph.data_path(moved).is_file() and not path.exists() and not data.exists()
    # A rename, not a rewrite of the weights (a > 2 GB model's data file is moved as it is).
    assert (onnx_graph.data_path(moved).stat().st_mtime_ns, onnx_graph.data_path(moved).stat().st_ino) == written
    x = np.array([1.0, -2.0], dtype=np.float32)
    session = ort_session(moved, threads=1)
    (z,) = session.run(None, {"x0": x, "flag": np.array(True)})
    assert np.allclose(z, -np.maximum(x, 0) @ np.arange(4096, dtype=np.float32).reshape(2, 2048))

    onnx_graph.save(_merged_like(), path, external=False)  # inline again: the stale data file goes
    assert not data.exists()
    onnx_graph.delete(moved)
    assert not moved.exists() and not onnx_graph.data_path(moved).exists()


def test_a_graph_alone_in_its_folder_moves_without_being_read(tmp_path: Path) -> None:
    """A variant's scratch folder holding only its graph: the weights are inside, so a rename does."""
    src, dst = tmp_path / "work" / "model.onnx", tmp_path / "model_fp16.onnx"
    src.parent.mkdir()
    src.write_bytes(b"not a protobuf: parsing it would raise")
    onnx_graph.save(_merged_like(), dst, external=True)  # a stale variant with a data file goes
    assert onnx_graph.move(src, dst) == dst
    assert dst.read_bytes().startswith(b"not a protobuf") and not onnx_graph.data_path(dst).exists() and not src.exists()


def test_externalize_renames_the_inline_file_into_its_data_file_and_points_into_it(tmp_path: Path) -> None:
    """The weights are neither read nor copied: the exported file becomes the data file, found by offset."""
    model = _merged_like()
    model.graph.initializer[0].data_location = TensorProto.DEFAULT  # torch writes it explicitly
    nested = numpy_helper.from_array(np.ones(512, dtype=np.float32), "nested")  # 2 KB inside a branch
    model.graph.node[1].attribute[0].g.initializer.append(nested)
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    exported = path.stat().st_ino

    onnx_graph.externalize(path)
    data = onnx_graph.data_path(path)
    assert data.stat().st_ino == exported and path.stat().st_size < 4096  # the 16 KB weight is out
    structure = onnx_graph.load(path)
    big, small = structure.graph.initializer
    assert big.data_location == TensorProto.EXTERNAL and not big.HasField("raw_data")
    assert {e.key: e.value for e in big.external_data}["location"] == "model.onnx_data"
    assert small.data_location == TensorProto.DEFAULT and small.raw_data  # 16 bytes stay inside
    assert structure.graph.node[1].attribute[0].g.initializer[0].raw_data  # nested graphs stay inline
    full = onnx.load(str(path))
    assert all(
        np.array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))
        for a, b in zip(full.graph.initializer, model.graph.initializer, strict=True)
    )
    onnx.checker.check_model(str(path), full_check=True)
    x = np.array([1.0, -2.0], dtype=np.float32)
    (z,) = ort_session(path, threads=1).run(None, {"x0": x, "flag": np.array(False)})
    assert np.allclose(z, np.maximum(x, 0) @ np.arange(4096, dtype=np.float32).reshape(2, 2048))

    rewritten = path.read_bytes()
    onnx_graph.externalize(path)  # already external: left alone
    assert path.read_bytes() == rewritten and data.stat().st_ino == exported
    onnx_graph.internalize(path)
    assert not data.exists() and onnx.load(str(path)).graph.initializer[0].raw_data


def test_externalize_refuses_a_file_that_is_no_protobuf_and_leaves_it_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x3a\xff\xff\xff\x0f")  # a graph field longer than the file
    with pytest.raises(ValueError, match=r"model.onnx: not a protobuf onnx can read: .*runs past"):
        onnx_graph.externalize(path)
    assert path.read_bytes() == b"\x3a\xff\xff\xff\x0f" and not onnx_graph.data_path(path).exists()


def test_moving_a_graph_renames_a_data_file_of_another_name(tmp_path: Path) -> None:
    """The quantizer writes ``<file>.data``: placing its graph renames the file and rewrites only the graph."""
    src = tmp_path / "work" / "model_int8.onnx"
    src.parent.mkdir()
    onnx.save(_merged_like(), str(src), save_as_external_data=True, location="model_int8.onnx.data", size_threshold=1024)
    moved = onnx_graph.move(src, tmp_path / "model_int8.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model_int8.onnx", "model_int8.onnx_data", "work"]
    assert not any((tmp_path / "work").iterdir())
    x = np.array([1.0, -2.0], dtype=np.float32)
    (z,) = ort_session(moved, threads=1).run(None, {"x0": x, "flag": np.array(True)})
    assert np.allclose(z, -np.maximum(x, 0) @ np.arange(4096, dtype=np.float32).reshape(2, 2048))


def test_sessions_run_on_the_providers_this_build_has(tmp_path: Path) -> None:
    onnx.save(_merged_like(), tmp_path / "m.onnx")
    session = ort_session(tmp_path / "m.onnx", threads=1, providers=("NoSuchExecutionProvider", "CPUExecutionProvider"))
    assert session.get_providers() == ["CPUExecutionProvider"]
    assert ort_session(tmp_path / "m.onnx", threads=1, providers=("NoSuchExecutionProvider",)).get_providers() == [
        "CPUExecutionProvider"
    ]


def _merged_decoder_like() -> onnx.ModelProto:
    """optimum's merged decoder in miniature: the cache branch answers the cross-attention cache with an empty
    placeholder (a Constant of shape [0, 2, 1, 4]), hands the past straight through, and (as ONNX Runtime writes
    it once optimized) returns a branch initializer; the other branch computes all three."""
    empty = numpy_helper.from_array(np.zeros((0, 2, 1, 4), dtype=np.float32), "empty")
    ones = numpy_helper.from_array(np.ones((1, 2, 3, 4), dtype=np.float32), "kept")
    then = helper.make_graph(
        [helper.make_node("Constant", [], ["enc"], value=empty)],
        "cache",
        [],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("enc", "past", "kept")],
        initializer=[ones],
    )
    other = helper.make_graph(
        [
            helper.make_node("Relu", ["past"], ["enc2"]),
            helper.make_node("Neg", ["past"], ["past2"]),
            helper.make_node("Abs", ["past"], ["kept2"]),
        ],
        "no_cache",
        [],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("enc2", "past2", "kept2")],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["use_cache_branch"], ["present.enc", "present.past", "present.kept"],
                          then_branch=then, else_branch=other)],
        "merged",
        [
            helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1]),
            helper.make_tensor_value_info("past", TensorProto.FLOAT, [1, 2, 3, 4]),
        ],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("present.enc", "present.past", "present.kept")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_branch_outputs_get_an_operation_and_openvino_compiles_what_it_did_not(tmp_path: Path) -> None:
    """OpenVINO resolves neither a branch initializer nor an outer-scope value as a branch output, and reads an
    empty Constant as a scalar ("If with dynamic rank"); the rewrite computes the same on ONNX Runtime."""
    ov = pytest.importorskip("openvino")
    before, after = tmp_path / "before.onnx", tmp_path / "after.onnx"
    onnx.save(_merged_decoder_like(), before)
    onnx.save(_merged_decoder_like(), after)
    with pytest.raises(RuntimeError, match="not produced by any operation|dynamic rank|Non-existent connection"):
        ov.Core().compile_model(str(before), "CPU")

    assert onnx_graph.portable_branches(after) == 3
    assert onnx_graph.portable_branches(after) == 0  # nothing left to rewrite
    ops = onnx_graph.op_census(onnx_graph.load(after).graph)
    assert ops["ConstantOfShape"] == 1 and ops["Identity"] == 1 and ops["Constant"] == 2  # the shape, the initializer
    compiled = ov.Core().compile_model(str(after), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    past = np.random.default_rng(0).standard_normal((1, 2, 3, 4)).astype(np.float32)
    expected = {True: [np.zeros((0, 2, 1, 4), np.float32), past, np.ones((1, 2, 3, 4), np.float32)],
                False: [np.maximum(past, 0), -past, np.abs(past)]}  # fmt: skip
    for flag, want in expected.items():
        feed = {"use_cache_branch": np.array([flag]), "past": past}
        got = ort_session(after, threads=1).run(None, feed)  # ONNX Runtime refuses the outer-scope one before
        answer = compiled.create_infer_request().infer(feed)
        for w, g, o in zip(want, got, answer.values(), strict=True):
            assert w.shape == g.shape == o.shape and np.array_equal(w, g) and np.array_equal(w, o)


def test_contrib_ops_counts_only_ops_outside_the_standard_domains() -> None:
    graph = helper.make_graph(
        [helper.make_node("FusedMatMul", ["a", "b"], ["c"], domain="com.microsoft"), helper.make_node("Relu", ["c"], ["d"])],
        "g", [], [],
    )  # fmt: skip
    assert onnx_graph.contrib_ops(graph) == {"com.microsoft.FusedMatMul": 1}


def test_an_inline_save_streams_the_very_bytes_onnx_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The weights go into the file one by one instead of through one serialized copy of the whole model; a loader
    # must not tell: the file is byte for byte onnx.save_model's, whatever the tensors hold besides raw_data.
    model = _merged_like()
    big = numpy_helper.from_array(np.linspace(0, 1, 3000, dtype=np.float32), "after_doc")
    big.doc_string = "a field numbered after raw_data"
    listed = helper.make_tensor("listed", TensorProto.FLOAT, [600], np.ones(600, dtype=np.float32).tolist())  # float_data
    inner = numpy_helper.from_array(np.full(512, 3.0, dtype=np.float32), "inside_a_branch")
    model.graph.node[1].attribute[0].g.initializer.append(inner)  # nested: stays in the structure
    model.graph.initializer.extend([big, listed])
    expected = tmp_path / "onnx.onnx"
    onnx.save_model(model, str(expected))
    onnx_graph.save(model, tmp_path / "ours.onnx", external=False)
    assert (tmp_path / "ours.onnx").read_bytes() == expected.read_bytes()
    assert not model.graph.initializer[0].raw_data  # written and discarded: the caller's copy is emptied
    loaded = onnx.load(str(tmp_path / "ours.onnx"))
    assert np.array_equal(numpy_helper.to_array(loaded.graph.initializer[2]), np.linspace(0, 1, 3000, dtype=np.float32))
    # Past the protobuf limit it refuses as onnx does, and writes nothing.
    monkeypatch.setattr(onnx_graph, "_PROTOBUF_LIMIT", 1000)
    with pytest.raises(ValueError, match="2 GB limit"):
        onnx_graph.save(_merged_like(), tmp_path / "big.onnx", external=False)
    assert not (tmp_path / "big.onnx").exists()


def test_an_inline_save_copies_weights_left_in_their_data_file_as_a_load_and_a_save_would_write_them(
    tmp_path: Path,
) -> None:
    # The fusers work on a graph read without its weights; the ones they never touched go from the export's data
    # file into the fused graph file to file. The file must be what loading them all and saving would write.
    model = _merged_like()
    model.graph.initializer.append(numpy_helper.from_array(np.linspace(0, 1, 3000, dtype=np.float32), "second"))
    inner = numpy_helper.from_array(np.full(512, 3.0, dtype=np.float32), "inside_a_branch")
    model.graph.node[1].attribute[0].g.initializer.append(inner)  # nested: onnx puts it in the data file too
    source = tmp_path / "src" / "model.onnx"
    source.parent.mkdir()
    onnx.save_model(model, str(source), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx_data", size_threshold=1024)  # fmt: skip
    written_over = np.full(3000, 7.0, dtype=np.float32).tobytes()  # as a fuser that changes a weight in place

    expected_model = onnx.load(str(source))
    expected_model.graph.initializer[2].raw_data = written_over
    onnx.save_model(expected_model, str(tmp_path / "onnx.onnx"))
    ours = onnx_graph.load(source)
    assert ours.graph.initializer[0].data_location == TensorProto.EXTERNAL and not ours.graph.initializer[0].raw_data
    ours.graph.initializer[2].raw_data = written_over
    onnx_graph.save(ours, tmp_path / "ours.onnx", external=False, weights=source.parent)
    assert (tmp_path / "ours.onnx").read_bytes() == (tmp_path / "onnx.onnx").read_bytes()
    assert not onnx_graph.data_path(tmp_path / "ours.onnx").exists()
    # Written external (a model over the protobuf limit), the weights are read, the one written over kept.
    ours = onnx_graph.load(source)
    ours.graph.initializer[2].raw_data = written_over
    (tmp_path / "external").mkdir()
    onnx_graph.save(ours, tmp_path / "external" / "model.onnx", external=True, weights=source.parent)
    back, want = onnx.load(str(tmp_path / "external" / "model.onnx")), onnx.load(str(tmp_path / "onnx.onnx"))
    assert {t.name: numpy_helper.to_array(t).tobytes() for t in onnx_graph.tensors(back.graph)} == {
        t.name: numpy_helper.to_array(t).tobytes() for t in onnx_graph.tensors(want.graph)
    }

    # A data file shorter than a tensor's offset + length: named, nothing half-written passed off as a graph.
    onnx.save_model(_merged_like(), str(source), save_as_external_data=True, location="cut.onnx_data")
    data = source.with_name("cut.onnx_data")
    data.write_bytes(data.read_bytes()[:-100])
    with pytest.raises(ValueError, match="cut.onnx_data: 16384 bytes at 0 run past its end"):
        onnx_graph.save(onnx_graph.load(source), tmp_path / "cut.onnx", external=False, weights=source.parent)
    assert not (tmp_path / "cut.onnx").exists()
    # A location that leaves the folder is refused, as onnx.load refuses it.
    outside = onnx_graph.load(source)
    next(e for e in outside.graph.initializer[0].external_data if e.key == "location").value = "../cut.onnx_data"
    with pytest.raises(ValueError, match="'../cut.onnx_data' is outside"):
        onnx_graph.save(outside, tmp_path / "outside.onnx", external=False, weights=source.parent)


def test_a_graphs_structure_is_read_without_its_inline_weights(tmp_path: Path) -> None:
    # Counting a written variant's ops parsed all its weights (0.2 GB for whisper-tiny's optimized decoder): the
    # structure leaves the top-level weights' bytes out and keeps everything else, nested graphs' weights included.
    model = _merged_like()
    model.graph.node[1].attribute[0].g.initializer.append(numpy_helper.from_array(np.ones(300, np.float32), "inner"))
    onnx.save_model(model, str(tmp_path / "m.onnx"))
    read = onnx_graph.structure(tmp_path / "m.onnx")
    full = onnx.load(str(tmp_path / "m.onnx"))
    assert [t.raw_data for t in read.graph.initializer] == [b"", b""]
    assert [(t.name, list(t.dims), t.data_type) for t in read.graph.initializer] == \
        [(t.name, list(t.dims), t.data_type) for t in full.graph.initializer]  # fmt: skip
    for t in [*read.graph.initializer, *full.graph.initializer]:
        t.ClearField("raw_data")
    assert read == full  # nothing else differs: nodes, both branches (with their weight), inputs, outputs, opsets
    assert onnx_graph.op_census(read.graph) == onnx_graph.op_census(full.graph)
    (tmp_path / "bad.onnx").write_bytes(b"\x0f" * 16)
    with pytest.raises(ValueError, match="not a protobuf"):
        onnx_graph.structure(tmp_path / "bad.onnx")


def _tied(table: np.ndarray, copy: np.ndarray) -> onnx.ModelProto:
    """An embedding ``Gather`` and an output projection ``MatMul`` by ``copy``, as torch.onnx writes a tied lm_head."""
    nodes = [helper.make_node("Gather", ["wte", "ids"], ["h"]), helper.make_node("MatMul", ["h", "lm_head"], ["logits"])]
    graph = helper.make_graph(
        nodes, "tied", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 3, table.shape[0]])],
        [numpy_helper.from_array(table, "wte"), numpy_helper.from_array(copy, "lm_head")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _logits(model: onnx.ModelProto | Path) -> np.ndarray:
    import onnxruntime as ort

    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, {"ids": np.array([[1, 5, 9]])})[0]


def test_a_tied_embeddings_transposed_copy_is_kept_once(tmp_path: Path) -> None:
    """The copy goes, its MatMul reads a Transpose of the table; a copy off by one bit (-0.0 for 0.0) stays."""
    table = np.random.default_rng(0).standard_normal((5000, 16)).astype(np.float32)
    table[7, 3] = 0.0
    model = _tied(table, np.ascontiguousarray(table.T))
    want = _logits(model)
    assert onnx_graph.share_tied(model) == {"lm_head": "wte"}
    onnx.checker.check_model(model)
    assert [t.name for t in model.graph.initializer] == ["wte"] and model.graph.node[0].op_type == "Transpose"
    assert np.array_equal(_logits(model), want)
    off = np.ascontiguousarray(table.T)
    off[3, 7] = -0.0  # equal as floats, another tensor as bits
    assert onnx_graph.share_tied(_tied(table, off)) == {}

    # A graph whose weights are in a data file (as a job keeps them): compared there, written back inline without it.
    onnx.save_model(_tied(table, np.ascontiguousarray(table.T)), str(tmp_path / "m.onnx"), save_as_external_data=True,
                    location="m.onnx_data")  # fmt: skip
    structure = onnx_graph.load(tmp_path / "m.onnx")
    assert onnx_graph.share_tied(structure, tmp_path) == {"lm_head": "wte"}
    onnx_graph.save(structure, tmp_path / "out.onnx", external=False, weights=tmp_path)
    assert (tmp_path / "out.onnx").stat().st_size < table.nbytes * 1.01
    assert np.array_equal(_logits(tmp_path / "out.onnx"), want)
