"""The fp16 recipe: what to rewrite before ONNX Runtime's float16 converter, and what it must leave in fp32.

Two classes of silent fp16 drift, each measured on a real family:

* **Names shared between If branches.** optimum's merged decoders keep the
  no-cache and the cache decoder as the two branches of one ``If``, each with
  the same tensor names (``/model/decoder/Cast_5_output_0`` is made in both).
  The converter's cleanup maps tensor names to nodes across every graph, so a
  cascaded-Cast removal in one branch rewires a node of the other: in m2m_100's
  no-cache branch the encoder attention mask's ``Cast(Sub(1, mask))`` was
  rewired to read the raw mask, every encoder position became masked, and the
  output drifted from layer 1 on (cosine 0.973). :func:`unshadow_branches`
  gives every name made inside a branch a prefix of its own first.
* **Index arithmetic.** Some models compute integer indices with float ops:
  T5's relative-position buckets (``Cast(int->float) -> Div -> Log -> Div ->
  Mul -> Cast(->int)``). In fp16 the log lands on the other side of an integer
  boundary and positions move to a neighbouring bucket (mt5: max abs 0.135
  against 0.05). :func:`index_arithmetic` finds float nodes that compute only
  from integers and small constants and end in a cast back to an integer;
  the converter keeps them in fp32 (its ``node_block_list``, as transformers.js's
  float16 conversion does with its block lists). Float values that flow on as
  floats (attention masks) are not index arithmetic and are converted as before:
  keeping the mask's ``finfo(float32).min`` in fp32 would turn into -inf at the
  cast and NaN on a fully masked row.
* **Sinusoid angles.** Sinusoidal timestep embeddings and rotary positions take
  the sine and cosine of a position or timestep times a frequency table. In fp16
  the angle itself is rounded: a diffusion timestep near 1000 (or Flux's guidance
  3.5, which its transformer scales by 1000 too) has an fp16 spacing of 0.5 to 2
  radians, so the high-frequency half of the embedding is noise. A tiny Flux
  transformer with guidance embedding verified at max abs 0.053 against 0.05 in
  fp16 (0.0016 with its angles in fp32); SD3's at a timestep of 999, 0.0058
  (0.00095). :func:`angle_arithmetic` keeps in fp32 each Sin and Cos of an angle
  computed from the model's inputs, integers and frequency vectors alone, and
  that computation; what reads the sines is converted as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx

from .. import onnx_graph

_INTEGER = frozenset(
    {
        onnx.TensorProto.INT8,
        onnx.TensorProto.INT16,
        onnx.TensorProto.INT32,
        onnx.TensorProto.INT64,
        onnx.TensorProto.UINT8,
        onnx.TensorProto.UINT16,
        onnx.TensorProto.UINT32,
        onnx.TensorProto.UINT64,
        onnx.TensorProto.BOOL,
    }
)
_FLOAT = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE})
# A constant this small is a hyperparameter (a bucket count, a log scale), not a weight.
_SMALL_CONSTANT = 16
# Tensors above this many bytes are weights: shape inference reads their type and dims, never their values.
_SMALL_BYTES = 1024
_TRIG = frozenset({"Sin", "Cos"})
# A frequency table is a vector (a rotary inv_freq, half a timestep embedding's width) of at most this many values.
_FREQUENCIES = 8192


def prepare(model: onnx.ModelProto) -> list[str]:
    """The recipe, in place, before the converter: branches unshadowed, float tensors typed; returns
    the index-arithmetic and angle nodes the converter must keep in fp32 (its ``node_block_list``).

    Shape inference runs once, on the graph without its weights.
    """
    unshadow_branches(model.graph)
    inferred = infer(model)
    keep = index_arithmetic(model, inferred)
    keep += [n for n in angle_arithmetic(model, inferred) if n not in keep]
    annotate_types(model, inferred)
    return keep


@contextlib.contextmanager
def fast_clamp() -> Iterator[None]:
    """ORT's float16 converter with :func:`to_float16` as its clamp, for the duration.

    Its own ``convert_np_to_float16`` finds the smallest and largest positive and negative
    values of every tensor by boolean indexing, only for debug logging, then clamps in four
    more passes: 2.8 s of the 3.4 s it takes on gpt2's 124M weights.
    """
    from onnxruntime.transformers import float16 as ort_float16

    original = ort_float16.convert_np_to_float16
    ort_float16.convert_np_to_float16 = to_float16
    try:
        yield
    finally:
        ort_float16.convert_np_to_float16 = original


def to_float16(values: Any, min_positive_val: float = 5.96e-08, max_finite_val: float = 65504.0) -> Any:
    """ORT's ``convert_np_to_float16``, bit for bit: magnitudes strictly between 0 and
    ``min_positive_val`` become it, finite ones above ``max_finite_val`` become it, sign kept;
    0, inf and NaN unchanged.

    With the defaults this is a plain cast and a repair of the few values it sends to 0 or inf:
    below 2**-24 rounds to 2**-24 or 0, above 65504 rounds to 65504 or inf.
    """
    values = np.asarray(values)
    if (min_positive_val, max_finite_val) != (5.96e-08, 65504.0):
        return _clamped(values, min_positive_val, max_finite_val).astype(np.float16)
    with np.errstate(over="ignore"):  # repaired below
        half = values.astype(np.float16)
    flat, source = half.reshape(-1), values.reshape(-1)
    lost = np.flatnonzero(flat == 0)
    lost = lost[source[lost] != 0]
    flat[lost] = np.copysign(min_positive_val, source[lost])
    over = np.flatnonzero(np.isinf(flat))
    over = over[np.isfinite(source[over])]
    flat[over] = np.copysign(max_finite_val, source[over])
    return half


def _clamped(values: Any, min_positive_val: float, max_finite_val: float) -> Any:
    magnitude = np.abs(values)
    values = np.where((magnitude < min_positive_val) & (magnitude > 0), np.copysign(min_positive_val, values), values)
    return np.where((magnitude > max_finite_val) & np.isfinite(magnitude), np.copysign(max_finite_val, values), values)


def unshadow_branches(graph: onnx.GraphProto) -> None:
    """Give every tensor and node made inside an If/Loop branch a name no other graph uses.

    A branch's inputs and outputs bind by position, and its reads of outer names are
    left alone, so renaming what a branch makes changes nothing else. ORT's cleanup
    also drops Constants no node reads, so a branch output made by a Constant gets an
    Identity after it.
    """
    for node in graph.node:
        for attr_name, sub in onnx_graph.subgraphs(node):
            prefix = f"{node.name or node.op_type}/{attr_name}/"
            made = {o for n in sub.node for o in n.output if o}
            made |= {t.name for t in sub.initializer} | {i.name for i in sub.input}
            _rename(sub, {name: prefix + name for name in made})
            # Node names too, unique within the branch (the block list is by name; optimum's merge
            # names a Constant it adds like one already there).
            taken = {n.name for n in sub.node}
            seen: set[str] = set()
            for i, n in enumerate(sub.node):
                if not n.name or n.name in seen:
                    base = n.name or f"{n.op_type}_{i}"
                    n.name = base
                    while n.name in taken:
                        n.name += "_"
                    taken.add(n.name)
                seen.add(n.name)
                n.name = prefix + n.name
            producers = {o: n for n in sub.node for o in n.output}
            for out in sub.output:
                producer = producers.get(out.name)
                if producer is not None and producer.op_type == "Constant":
                    producer.output[0] = out.name + "/constant"
                    sub.node.append(
                        onnx.helper.make_node("Identity", [out.name + "/constant"], [out.name], name=out.name + "/identity")
                    )
            unshadow_branches(sub)


def _rename(graph: onnx.GraphProto, names: dict[str, str]) -> None:
    """Apply ``names`` to every reference in ``graph`` and the graphs nested in it."""
    for g in onnx_graph.graphs(graph):
        for n in g.node:
            n.input[:] = [names.get(x, x) for x in n.input]
            n.output[:] = [names.get(x, x) for x in n.output]
        for value in [*g.input, *g.output, *g.value_info]:
            value.name = names.get(value.name, value.name)
        for tensor in g.initializer:
            tensor.name = names.get(tensor.name, tensor.name)


def index_arithmetic(model: onnx.ModelProto, inferred: onnx.ModelProto | None = None) -> list[str]:
    """Names of the float nodes that compute integer indices (see the module docstring), in every graph.

    Needs unique tensor names across graphs (:func:`unshadow_branches` first); unnamed
    nodes it picks are given names. Types come from ONNX shape inference on the graph
    without its weights; where it cannot type a tensor (contrib ops) that tensor is not
    index arithmetic, so the recipe never keeps more in fp32 than it can justify.
    ``inferred``: :func:`infer` of ``model``, where the caller already has it.
    """
    types = _elem_types(model, inferred if inferred is not None else infer(model))
    nodes = [n for g in onnx_graph.graphs(model.graph) for n in g.node]
    small = {t.name for g in onnx_graph.graphs(model.graph) for t in g.initializer if _size(t) <= _SMALL_CONSTANT}
    small |= {o for n in nodes if n.op_type == "Constant" and _constant_size(n) <= _SMALL_CONSTANT for o in n.output}

    # Float tensors computed from integers and small constants alone, in graph order.
    derived: set[str] = set()
    candidates: list[onnx.NodeProto] = []
    for n in nodes:
        if n.op_type == "Constant" or not n.output or types.get(n.output[0]) not in _FLOAT:
            continue
        ins = [i for i in n.input if i]
        integer = [i for i in ins if types.get(i) in _INTEGER or i in derived]
        if integer and all(i in small or i in integer for i in ins):
            derived.update(n.output)
            candidates.append(n)

    # Of those, the ones whose values reach a cast back to an integer through derived tensors.
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in nodes:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    keep: set[int] = set()
    for n in reversed(candidates):  # consumers come later in a topologically sorted graph
        if any(_casts_to_integer(c) or id(c) in keep for o in n.output for c in consumers.get(o, ())):
            keep.add(id(n))
    # Only closed chains: the converter does not cast a kept node's fp32 output back to fp16
    # for a converted reader inside an If branch (an attention mask's 1 - mask feeds a bool
    # Cast and a Where: it stays fp16, where 0 and 1 are exact anyway).
    changed = True
    while changed:
        changed = False
        for n in candidates:
            readers = [c for o in n.output for c in consumers.get(o, ())]
            if id(n) in keep and not all(_casts_to_integer(c) or id(c) in keep for c in readers):
                keep.discard(id(n))
                changed = True
    casts = [c for n in candidates if id(n) in keep for o in n.output for c in consumers.get(o, ()) if _casts_to_integer(c)]
    chosen = [n for n in candidates if id(n) in keep] + casts
    return _names(model, chosen + _own_constants(model, chosen))


def angle_arithmetic(model: onnx.ModelProto, inferred: onnx.ModelProto | None = None) -> list[str]:
    """Names of the Sin and Cos nodes of angles computed from inputs alone, and of that computation, in the main graph.

    An angle is a float tensor computed from the model's inputs (a timestep, a guidance
    scale), integers (position ids, an arange) and frequency vectors (constants of one
    axis) alone: no weight matrix, nothing the layers compute. The nodes that read the
    sines stay fp16: the converter casts the kept outputs for them, but only in the main
    graph. Inside an If branch it casts nothing back (a merged decoder's rotary Mul then
    reads float and float16 and the graph does not load), so branches, and chains a
    branch reads, are left as they were.
    """
    graph = model.graph
    types = _elem_types(model, inferred if inferred is not None else infer(model))
    inputs = {i.name for i in graph.input}
    tables = {t.name for t in graph.initializer if _frequencies(t)}
    # a Constant without a tensor value holds a scalar or a short list (value_float, value_floats)
    tables |= {n.output[0] for n in _constants(graph) if _value(n) is None or _frequencies(_value(n))}
    made: dict[str, onnx.NodeProto] = {}  # angle-like float tensors -> the node computing each
    for n in graph.node:
        if n.op_type == "Constant" or not n.output or types.get(n.output[0]) not in _FLOAT:
            continue
        ins = [i for i in n.input if i]
        moving = [i for i in ins if i in made or i in inputs or types.get(i) in _INTEGER]
        if moving and all(i in moving or i in tables for i in ins):
            made.update(dict.fromkeys(n.output, n))
    in_branches = {i for n in graph.node for _, sub in onnx_graph.subgraphs(n) for g in onnx_graph.graphs(sub) for m in g.node for i in m.input}
    chosen: dict[int, onnx.NodeProto] = {}
    for trig in graph.node:
        if trig.op_type not in _TRIG or trig.input[0] not in made:
            continue
        chain, todo = {id(trig): trig}, [trig.input[0]]
        while todo:
            node = made[todo.pop()]
            if id(node) not in chain:
                chain[id(node)] = node
                todo += [i for i in node.input if i in made]
        if not any(o in in_branches for c in chain.values() for o in c.output):
            chosen.update(chain)
    kept = [n for n in graph.node if id(n) in chosen]  # in graph order
    return _names(model, kept + _own_constants(model, kept))


def _frequencies(tensor: onnx.TensorProto | None) -> bool:
    """A constant of at most one axis longer than 1 and at most _FREQUENCIES values: never a weight matrix."""
    return (
        tensor is not None
        and sum(d > 1 for d in tensor.dims) <= 1
        and _size(tensor) <= _FREQUENCIES
    )


def _value(node: onnx.NodeProto) -> onnx.TensorProto | None:
    return next((a.t for a in node.attribute if a.name == "value"), None)


def _own_constants(model: onnx.ModelProto, chosen: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """The Constant nodes the chosen nodes read, each given to them alone.

    The converter casts a kept node's fp16 inputs back to fp32 only where it has their
    types, which it lacks for Constants inside If branches: the kept nodes read a
    Constant that stays fp32 with them, copied where another node reads it too.
    """
    kept = {id(n) for n in chosen}
    found: list[onnx.NodeProto] = []
    for g in onnx_graph.graphs(model.graph):
        nodes = list(g.node)
        consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in nodes:
            for i in n.input:
                consumers.setdefault(i, []).append(n)
        order: list[onnx.NodeProto] = []
        for n in nodes:
            order.append(n)
            if n.op_type != "Constant" or not n.output or not any(id(c) in kept for c in consumers.get(n.output[0], ())):
                continue
            readers = consumers[n.output[0]]
            if all(id(c) in kept for c in readers):
                found.append(n)
                continue
            copy = onnx.NodeProto()
            copy.CopyFrom(n)
            copy.name = ""
            copy.output[0] = n.output[0] + "/fp32"
            for reader in readers:
                if id(reader) in kept:
                    reader.input[:] = [copy.output[0] if x == n.output[0] else x for x in reader.input]
            order.append(copy)
            found.append(copy)
        if len(order) != len(nodes):
            del g.node[:]
            g.node.extend(order)
    return found


def _names(model: onnx.ModelProto, chosen: list[onnx.NodeProto]) -> list[str]:
    """The chosen nodes' names, naming the unnamed ones uniquely first (the block list is by name)."""
    taken = {n.name for g in onnx_graph.graphs(model.graph) for n in g.node if n.name}
    names: list[str] = []
    for i, node in enumerate(chosen):
        if not node.name:
            name = f"fp32_index_{node.op_type}_{i}"
            while name in taken:
                name += "_"
            node.name = name
            taken.add(name)
        if node.name not in names:
            names.append(node.name)
    return names


def _casts_to_integer(node: onnx.NodeProto) -> bool:
    return node.op_type == "Cast" and any(a.name == "to" and a.i in _INTEGER for a in node.attribute)


def annotate_types(model: onnx.ModelProto, inferred: onnx.ModelProto | None) -> None:
    """Give the main graph's untyped tensors the element type ONNX shape inference finds (no shapes).

    What ORT's float16 converter needs to know which tensors are float, as its own symbolic
    shape inference would tell it: that copies the whole model, weights included, for every
    run; this infers on the graph without its weights once (``inferred``: :func:`infer` of
    ``model``; None, where inference refused it, leaves the types as they are).
    """
    if inferred is None:
        return
    known = {v.name for v in [*model.graph.input, *model.graph.output, *model.graph.value_info]}
    for value in inferred.graph.value_info:
        if value.name in known or not value.type.HasField("tensor_type") or not value.type.tensor_type.elem_type:
            continue
        typed = model.graph.value_info.add()
        typed.name = value.name
        typed.type.tensor_type.elem_type = value.type.tensor_type.elem_type


def infer(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """``model`` after ONNX shape inference, run on a copy without its weights; None where inference refuses it."""
    skeleton = _weightless(model)
    # The transformers optimizer writes com.microsoft ops without importing the domain; ONNX
    # inference then refuses the whole graph instead of skipping the ops it has no schema for.
    imported = {o.domain for o in skeleton.opset_import}
    missing = {n.domain for g in onnx_graph.graphs(skeleton.graph) for n in g.node} - imported - {"ai.onnx"}
    for domain in sorted(missing):
        skeleton.opset_import.add(domain=domain, version=1)
    try:
        return onnx.shape_inference.infer_shapes(skeleton)
    except (ValueError, onnx.shape_inference.InferenceError):  # a graph inference rejects
        return None


def _weightless(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose big main-graph initializers keep their name, type and dims but
    not their bytes: all shape inference reads. Never reads a big tensor's bytes (reading
    ``raw_data`` copies it: 0.4 s a call on gpt2's 650 MB)."""
    copy = onnx.ModelProto()
    for field, value in model.ListFields():
        if field.name != "graph":
            _copy_field(copy, field.name, value)
    for field, value in model.graph.ListFields():
        if field.name != "initializer":
            _copy_field(copy.graph, field.name, value)
    for tensor in model.graph.initializer:
        if _size(tensor) <= _SMALL_BYTES // 8:  # by dims: ByteSize() serializes the tensor to count it
            copy.graph.initializer.append(tensor)
        else:
            copy.graph.initializer.add(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
    return copy


def _copy_field(message: Any, name: str, value: Any) -> None:
    target = getattr(message, name)
    if isinstance(value, (str, bytes, int, float)):
        setattr(message, name, value)
    elif hasattr(target, "extend"):
        target.extend(value)
    else:
        target.CopyFrom(value)


def _elem_types(model: onnx.ModelProto, inferred: onnx.ModelProto | None) -> dict[str, int]:
    """Element type of every tensor ONNX shape inference can type, in every graph."""
    inferred = inferred or model
    types: dict[str, int] = {}
    for g in onnx_graph.graphs(inferred.graph):
        for value in [*g.input, *g.output, *g.value_info]:
            if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
                types[value.name] = value.type.tensor_type.elem_type
        for tensor in g.initializer:
            types[tensor.name] = tensor.data_type
        for n in _constants(g):
            value = next((a.t for a in n.attribute if a.name == "value"), None)
            if value is not None:
                types[n.output[0]] = value.data_type
    return types


def _constants(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    return (n for n in graph.node if n.op_type == "Constant" and n.output)


def _size(tensor: onnx.TensorProto) -> int:
    size = 1
    for d in tensor.dims:
        size *= d
    return size


def _constant_size(node: onnx.NodeProto) -> int:
    value = next((a.t for a in node.attribute if a.name == "value"), None)
    if value is not None:
        return _size(value)
    # value_float / value_int and friends are scalars; list forms are short by construction
    return 1
