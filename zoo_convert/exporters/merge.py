"""optimum's merge of a decoder and its with-past twin into one graph (``decoder_model_merged.onnx``), at less cost.

``optimum.onnx.merge_decoders`` puts both decoders in the branches of one ``If`` on ``use_cache_branch``, their
weights shared at the top level where they are equal. It is most of the time a seq2seq export spends after its
traces (whisper-tiny: 3.2-3.5 s of one CPU, with nothing to run beside it), spent three ways that add nothing to the
graph: every weight converted to a numpy array and hashed with SHA-512 to find the equal ones, the whole merged model
serialized once for ``onnx.checker.check_model`` (the check stage runs the full checker on the file next) and once
more to save it. :func:`merge_decoders` makes the same graph (the same bytes: tests/stages/test_export.py compares it
with optimum's) from optimum's own steps, with those three replaced: the weights' bytes hashed as they are stored
(SHA-256: ~1.3 GB/s on the AMD EPYC it was measured on, OpenSSL using its SHA extensions), no checker
(:mod:`zoo_convert.stages.check`), and the file written by :func:`zoo_convert.onnx_graph.save`, which never copies
the weights into one buffer.

:func:`post_process` is optimum's ``post_process_exported_models`` of an encoder-decoder with this merge, and
optimum's own for every other config.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import onnx

from .. import onnx_graph

# What optimum names the files it merges and the one it writes.
DECODER, WITH_PAST, MERGED = "decoder_model", "decoder_with_past_model", "decoder_model_merged"
# The most weight bytes written inside the graph: the protobuf limit (2 GiB), less room for the graph's structure.
_INLINE_AT_MOST = (1 << 31) - (64 << 20)


def post_process(main_config: Any, onnx_dir: Path, parts: dict[str, Any], subpaths: list[str]) -> tuple[Any, list[str]]:
    """``main_config.post_process_exported_models(onnx_dir, parts, subpaths)`` with :func:`merge_decoders` as its merge.

    Only an encoder-decoder config whose post-processing is optimum's seq2seq one takes this way (the merge, then
    flags on the two branches' configs, as optimum sets them), when that merge is due; any other is optimum's own.
    """
    from optimum.exporters.onnx.base import OnnxConfig, OnnxSeq2SeqConfigWithPast

    no_past, with_past = onnx_dir / f"{DECODER}.onnx", onnx_dir / f"{WITH_PAST}.onnx"
    ours = type(main_config).post_process_exported_models is OnnxSeq2SeqConfigWithPast.post_process_exported_models
    if not ours or main_config.use_past is not True or not (no_past.is_file() and with_past.is_file()):
        theirs: tuple[Any, list[str]] = main_config.post_process_exported_models(onnx_dir, parts, subpaths)
        return theirs
    # optimum's base post-processing first (it dedupes tied weights where accelerate is installed), as theirs does.
    parts, subpaths = OnnxConfig.post_process_exported_models(main_config, onnx_dir, parts, subpaths)
    merged = onnx_dir / f"{MERGED}.onnx"
    try:
        # The decoder with past does not output the cross-attention cache (it is constant): not strict.
        merge_decoders(no_past, with_past, merged, strict=False)
    except Exception as exc:
        raise RuntimeError("Unable to merge decoders") from exc  # optimum's words, which the export stage catches
    # Both branches are validated on the merged file, each through its config, flagged as optimum flags them.
    parts[DECODER][1].is_merged = True
    parts[DECODER][1].use_cache_branch = False
    parts[DECODER][1].use_past_in_inputs = True  # the no-past branch still takes (empty) past inputs
    parts[WITH_PAST][1].use_cache_branch = True
    parts[WITH_PAST][1].is_merged = True
    return parts, [subpaths[0], merged.name, merged.name, *subpaths[3:]]


def merge_decoders(decoder: Path, with_past: Path, out: Path, *, strict: bool) -> None:
    """``optimum.onnx.merge_decoders(decoder, with_past, save_path=out, strict=strict)``'s graph, written to ``out``.

    The same steps on the same protos: outputs unified (constant empty outputs where the with-past decoder leaves
    some out, when not ``strict``), the weights equal in both graphs shared at the top level under one new name,
    scalars and int64 shapes kept in their branch.
    """
    # optimum-onnx's own private steps (the pinned 0.1.0): a version that changes them fails the test that compares
    # this merge's file with optimum's byte for byte.
    from optimum.onnx.transformations_utils import (
        _create_name_sharing_dict,
        _get_all_inputs,
        _get_onnx_opset,
        _replace_input_names,
        _unify_onnx_outputs,
    )

    models = [onnx.load(str(decoder)), onnx.load(str(with_past))]
    no_past, past = models
    if _get_onnx_opset(no_past) != _get_onnx_opset(past):
        raise ValueError(
            f"Decoder's opset is {_get_onnx_opset(no_past)}, but decoder with past's opset is {_get_onnx_opset(past)}."
            " Make sure having the same opset before merging."
        )
    _unify_onnx_outputs(no_past, past, strict=strict)
    inputs = _get_all_inputs(models)
    sharing = _create_name_sharing_dict(_duplicates(models), suffix="merged")
    _replace_input_names(models, sharing)
    shared: list[onnx.TensorProto] = []
    named: set[str] = set()
    for i, model in enumerate(models):
        for tensor in model.graph.initializer:
            new = sharing.get((tensor.name, i))
            if new is not None and new not in named:
                named.add(new)
                tensor.name = new
                shared.append(tensor)

    def branch(model: onnx.ModelProto, name: str) -> onnx.GraphProto:
        kept = [t for t in model.graph.initializer if not _shareable(t)]
        return onnx.helper.make_graph(nodes=model.graph.node, name=name, inputs=[], outputs=model.graph.output,
                                      initializer=kept)  # fmt: skip

    no_past_branch, with_past_branch = branch(no_past, "no_past"), branch(past, "with_past")
    use_cache_branch = onnx.helper.make_tensor_value_info("use_cache_branch", onnx.TensorProto.BOOL, [1])
    if_node = onnx.helper.make_node("If", inputs=["use_cache_branch"], outputs=[o.name for o in no_past_branch.output],
                                    name="optimum::if", then_branch=with_past_branch, else_branch=no_past_branch)  # fmt: skip
    opset_imports: dict[str, onnx.OperatorSetIdProto] = {}
    for opset in (*no_past.opset_import, *past.opset_import):
        opset_imports.setdefault(opset.domain, opset)
    # The graph is filled in place: make_graph / make_model would copy every shared weight into the new proto.
    merged = onnx.helper.make_model_gen_version(onnx.GraphProto(), producer_name="optimum-onnx",
                                                opset_imports=list(opset_imports.values()), ir_version=9)  # fmt: skip
    graph = merged.graph
    graph.node.append(if_node)
    graph.name = "merged"
    graph.input.extend([*inputs, use_cache_branch])
    graph.output.extend(no_past_branch.output)
    weights = [t.raw_data if t.HasField("raw_data") else b"" for t in shared]
    for tensor in shared:
        tensor.ClearField("raw_data")  # the light tensor is copied; its bytes are put back in the merged one
    graph.initializer.extend(shared)
    del models, no_past, past, shared
    size = sum(map(len, weights))  # stands for the file's size: ByteSize() walks it (0.25 s of whisper-tiny's)
    for tensor, raw in zip(graph.initializer, weights, strict=True):
        if raw:
            tensor.raw_data = raw
    del weights
    # Inside the file, as optimum writes it (the export stage moves every graph's weights out next, without copying
    # them); a data file where the weights are over the protobuf limit, which optimum's inline save cannot write.
    onnx_graph.save(merged, out, external=size > _INLINE_AT_MOST)


def _shareable(tensor: onnx.TensorProto) -> bool:
    """What optimum shares between the branches: every weight but scalars and 1-D int32 / int64 (shapes, indices),
    which ONNX Runtime needs inside the branch that reads them after its optimizations."""
    dims = len(tensor.dims)
    return dims > 1 or (dims == 1 and tensor.data_type not in (onnx.TensorProto.INT32, onnx.TensorProto.INT64))


def _duplicates(models: list[onnx.ModelProto]) -> defaultdict[tuple[int, str, tuple[int, ...]], set[tuple[str, int]]]:
    """optimum's ``_find_duplicate_initializers``: (data type, digest of the data, dims) -> {(name, model index)},
    in the same order (so that the same names come out), the digest taken of the bytes as stored."""
    found: defaultdict[tuple[int, str, tuple[int, ...]], set[tuple[str, int]]] = defaultdict(set)
    for i, model in enumerate(models):
        for tensor in model.graph.initializer:
            if _shareable(tensor):
                found[(tensor.data_type, _digest(tensor), tuple(tensor.dims))].add((tensor.name, i))
    return found


def _digest(tensor: onnx.TensorProto) -> str:
    """A digest of a tensor's values: its raw bytes where it has them (every exporter's weights), else its array's
    (the same bytes, as optimum hashes them)."""
    data = tensor.raw_data if tensor.HasField("raw_data") else onnx.numpy_helper.to_array(tensor).tobytes()
    return hashlib.sha256(data).hexdigest()
