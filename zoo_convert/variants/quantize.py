"""Dynamic 8-bit quantization of an ONNX graph, streamed: one weight in memory at a time.

It writes the operators ``onnxruntime.quantization.quantize_dynamic`` writes
(IntegerOps mode, ``MatMulConstBOnly``), with the same weight values:

    MatMul(a, W)        DynamicQuantizeLinear(a) -> MatMulInteger(a_q, W_q, a_zp, W_zp)
                        -> Cast -> Mul(., a_scale * W_scale)
    Gemm(a, W, c)       the same (W transposed first when ``transB``), then Add(., c)
    Conv(x, W, b)       DynamicQuantizeLinear(x) -> ConvInteger -> Cast -> Mul(., x_scale * W_scale)
                        -> Add(., Reshape(b))
    Gather(E, i)        Gather(E_q, i) -> DequantizeLinear (embedding tables, per-tensor uint8)

ONNX Runtime's CPU optimizer fuses each MatMul pattern into ``MatMulIntegerToFloat`` or
``DynamicQuantizeMatMul`` with its bias, and a residual ``Add`` with ``LayerNormalization``
into ``SkipLayerNormalization`` only where it knows the shapes: so the shapes inferred on
the source graph are kept (as ``quantize_dynamic`` does). An activation read by several
MatMuls (Q, K and V) is quantized once.

Activations are uint8 (dynamic quantization has no other); weights int8, symmetric
over [-127, 127], or uint8, asymmetric over [0, 255]; per output channel (MatMul, Gemm)
or per tensor. An int8 graph's integer sums are exact on CPUs with VNNI, AMX or ARM's dot
products; x86 CPUs without them saturate some in ONNX Runtime's kernels, so such a node
checks the graph's :func:`unsigned_twin` (see :func:`_params`).
Conv weights and embedding tables are always per tensor (as ORT; ConvInteger takes one
weight zero point), embeddings always uint8.

Constant float32 weights are quantized, and with ``activations`` MatMuls of two float32
activations: ``"scores"`` those neither of whose inputs comes from a Softmax (attention's
Q.K^T), ``"all"`` every one (attention's probabilities times V too). A weight computed in
the graph (weight norm), a float16 weight or a node named in ``exclude`` stays float.
Subgraphs (``If`` branches of merged decoders, ``Loop`` bodies) are rewritten too; a weight
they read from an outer graph is quantized once, in the graph that holds it, whichever
branches read it.

Memory: the graph is loaded without its weights (:func:`load_lazily`: external data stays
in its file, large inline weights are located in the graph file and left there); each
weight is read by offset in blocks of rows, its scales computed in a first pass and its
quantized values in a second, and written out before the next weight is read. The peak
is the weightless graph plus one weight's 8-bit values plus a block, never the model
(``tests/test_quantize.py`` tracks it): with ``external`` the output's weights go to disk
as they are made; without, the output graph is held and serialized whole.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .. import onnx_graph
from ..errors import QuantizeError

WeightType = Literal["int8", "uint8"]
# Which MatMuls of two activations are quantized: none (quantize_dynamic's MatMulConstBOnly), the attention
# scores (inputs not read from a Softmax), or all (MatMulConstBOnly off, optimum's --avx512_vnni).
ActivationMatMuls = Literal["none", "scores", "all"]
# How far back (nodes) an input of a MatMul of two activations is traced to a Softmax; a product ends the trace.
_SOFTMAX_HOPS = 4
_PRODUCTS = frozenset({"MatMul", "Gemm", "Conv", "MatMulInteger", "ConvInteger"})
# Rows of a weight read at once: about this many bytes of float32.
BLOCK_BYTES = 16 * 1024**2
# DynamicQuantizeLinear is opset 11.
MIN_OPSET = 11
_FLOAT = TensorProto.FLOAT
_QTYPE: dict[str, int] = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8}
_NP: dict[int, np.dtype[Any]] = {TensorProto.INT8: np.dtype(np.int8), TensorProto.UINT8: np.dtype(np.uint8)}


@dataclass(frozen=True)
class Quantized:
    """What :func:`quantize` did.

    Attributes:
        ops: quantized operators written, by type (``MatMulInteger``, ``ConvInteger``,
            ``DynamicQuantizeLinear``, ``DequantizeLinear`` for embeddings), subgraphs included.
        float_matmuls: MatMuls left float: excluded, or reading no constant float32 weight.
        float_convs: names of the Convs left float (a computed or float16 weight, or excluded).
        weights: distinct weights quantized.
        bytes_written: bytes of the output graph and its data file.
    """

    ops: dict[str, int]
    float_matmuls: int
    float_convs: list[str]
    weights: int
    bytes_written: int


def quantize(
    src: Path,
    dst: Path,
    *,
    weight_type: WeightType = "int8",
    per_channel: bool = True,
    exclude: frozenset[str] = frozenset(),
    external: bool = False,
    activations: ActivationMatMuls = "none",
) -> Quantized:
    """Write the dynamically quantized graph of ``src`` to ``dst``; weights in ``<dst>_data`` when ``external``.

    ``activations``: which MatMuls of two float activations are quantized too, both sides with
    ``DynamicQuantizeLinear``. ``"none"``: as ``quantize_dynamic`` by default (``MatMulConstBOnly``).
    ``"scores"``: those with no input read from a Softmax (within a few nodes, no product between):
    attention's Q.K^T but not its probabilities times V, and any other product of two activations
    (SigLIP's image-by-text logits). ``"all"``: every one, as ``quantize_dynamic`` with
    ``MatMulConstBOnly`` off (optimum's ``--avx512_vnni``). The farm's int8 uses ``"none"``
    (:mod:`.int8` says why).
    """
    src, dst = Path(src), Path(dst)
    if dst.resolve() == src.resolve():
        raise QuantizeError(f"{dst}: the quantized graph cannot overwrite its source")
    model = load_lazily(src)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        raise QuantizeError(f"{src.name}: opset {opset} < {MIN_OPSET}, which DynamicQuantizeLinear needs")
    _add_shapes(model)
    source = _Source(src)
    for tensor in onnx_graph.tensors(model.graph):
        if _external(tensor):
            source.check(onnx.external_data_helper.ExternalDataInfo(tensor).location)
    if {dst.resolve(), onnx_graph.data_path(dst).resolve()} & source.paths:
        raise QuantizeError(f"{dst.name}: it or its data file {onnx_graph.data_path(dst).name} holds the source's weights")
    try:
        with source, _Sink(dst, external) as sink:
            rewriter = _Rewriter(model, source, sink, _QTYPE[weight_type], per_channel, exclude, activations)
            rewriter.rewrite(model.graph, ())
            rewriter.drop_replaced(model.graph)
            for sub in onnx_graph.graphs(model.graph):
                for tensor in sub.initializer:
                    if tensor.name not in rewriter.made:
                        sink.relocate(tensor, source)
                for tensor in _attribute_tensors(sub):  # Constant nodes' values: only external ones must move
                    if _external(tensor):
                        sink.relocate(tensor, source)
        size = model.ByteSize()
        if size >= 2**31:
            raise QuantizeError(f"{dst.name}: {size / 1e9:.2f} GB inline is over protobuf's 2 GB limit; write it external")
        dst.write_bytes(model.SerializeToString())
    except BaseException:
        onnx_graph.delete(dst)  # no half-written graph or data file is left to be mistaken for a result
        raise
    return Quantized(
        ops=dict(rewriter.ops),
        float_matmuls=rewriter.float_matmuls,
        float_convs=rewriter.float_convs,
        weights=len(rewriter.weights),
        bytes_written=onnx_graph.disk_size(dst),
    )


# --- reading a graph without its inline weights (protobuf wire format) ---------------------------------------

_GRAPH_FIELD = 7  # ModelProto.graph
_INITIALIZER_FIELD = 5  # GraphProto.initializer
_RAW_DATA_FIELD = 9  # TensorProto.raw_data
# Initializers at least this large are left in the file and read by offset when needed.
LAZY_BYTES = 64 * 1024


# The inputs of the integer products that hold the weight and its zero point.
_WEIGHT_INPUTS = {"MatMulInteger": (1, 3), "ConvInteger": (1, 3)}


def unsigned_twin(src: Path, dst: Path) -> int:
    """Write ``src`` with every int8 weight of its integer products (and its zero point) as uint8, shifted by 128.

    ``(w + 128) - (z + 128) = w - z``: every integer sum is the one the int8 graph defines, and the one
    CPUs with VNNI, AMX or ARM's dot products compute for it. ONNX Runtime's uint8 x uint8 kernels widen
    to 16 bits before they add; its uint8 x int8 kernels on x86 without VNNI add two products into an
    int16 that saturates. So a node without VNNI checks this twin to get the int8 graph's verdict (and
    times the int8 graph itself). Returns how many tensors it shifted.

    The twin keeps the source's layout: external data is copied to ``<dst>_data`` a block at a time, shifted
    where an int8 weight lies (same offsets), so a model of any size costs one block of memory.
    """
    model = onnx.load(str(src), load_external_data=False)
    weights: set[str] = set()
    others: set[str] = set()
    for sub in onnx_graph.graphs(model.graph):
        for node in sub.node:
            slots = _WEIGHT_INPUTS.get(node.op_type, ())
            for i, name in enumerate(node.input):
                (weights if i in slots else others).add(name)
    shifted: set[str] = set()
    ranges: dict[str, list[tuple[int, int]]] = {}  # data file -> (offset, length) of the bytes to shift
    for sub in onnx_graph.graphs(model.graph):
        for tensor in sub.initializer:
            if tensor.name not in weights or tensor.data_type != TensorProto.INT8:
                continue
            if tensor.name in others:
                raise QuantizeError(f"{src.name}: int8 weight {tensor.name!r} is also read as an activation")
            if _external(tensor):
                info = onnx.external_data_helper.ExternalDataInfo(tensor)
                size = info.length or int(np.prod(tensor.dims, dtype=np.int64))
                ranges.setdefault(info.location, []).append((info.offset or 0, size))
            else:
                flipped = numpy_helper.to_array(tensor).view(np.uint8) ^ np.uint8(0x80)  # + 128, two's complement
                tensor.CopyFrom(numpy_helper.from_array(flipped, tensor.name))
            tensor.data_type = TensorProto.UINT8
            shifted.add(tensor.name)
    for sub in onnx_graph.graphs(model.graph):
        for node in sub.node:
            if node.op_type in _WEIGHT_INPUTS and node.input[1] in shifted and (len(node.input) < 4 or not node.input[3]):
                zero = f"{node.output[0]}_twin_zero_point"  # an absent zero point is 0: 128 once shifted
                sub.initializer.append(numpy_helper.from_array(np.array(128, np.uint8), zero))
                node.input.extend([""] * (3 - len(node.input)) + [zero])
    source = _Source(src)
    moved: dict[str, str] = {}  # the source's data files -> the twin's
    for tensor in onnx_graph.tensors(model.graph):
        if _external(tensor):
            location = onnx.external_data_helper.ExternalDataInfo(tensor).location
            if location not in moved:
                source.check(location)
                moved[location] = onnx_graph.data_path(dst).name + (f".{len(moved)}" if moved else "")
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = moved[location]
    onnx_graph.save(model, dst, external=False)  # inline weights streamed; external tensors stay references
    for location, twin in moved.items():
        _copy_shifted(source.check(location), dst.with_name(twin), ranges.get(location, []))
    onnx_graph.read_back(dst, "unsigned_twin")
    return len(shifted)


def _copy_shifted(src: Path, dst: Path, ranges: list[tuple[int, int]]) -> None:
    """Copy a data file a block at a time, adding 128 (mod 256) to the bytes of ``ranges``."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        at = 0
        while chunk := fin.read(BLOCK_BYTES):
            block = np.frombuffer(bytearray(chunk), np.uint8)
            for offset, length in ranges:
                lo, hi = max(offset, at), min(offset + length, at + len(block))
                if lo < hi:
                    block[lo - at : hi - at] ^= np.uint8(0x80)
            fout.write(block.data)
            at += len(block)


def load_lazily(path: Path) -> onnx.ModelProto:
    """A graph file's model whose large inline weights stay in the file: external data pointing into the graph itself.

    ``onnx.load`` holds the file's bytes and the parsed model at once, twice the weights;
    this reads the outer graph field by field and, for each large initializer, only its
    name, type and dims, noting where its ``raw_data`` lies. Graphs whose weights are
    already external load as with ``onnx.load(load_external_data=False)``.
    """
    model = onnx.ModelProto()
    with path.open("rb") as f:
        end = os.fstat(f.fileno()).st_size
        for number, wire, key, value, stop in _fields(f, 0, end, path):
            if number == _GRAPH_FIELD and wire == 2:
                graph = onnx.GraphProto()
                for gfield, gwire, gkey, gvalue, gstop in _fields(f, value, stop, path):
                    if gfield == _INITIALIZER_FIELD and gwire == 2 and gstop - gvalue >= LAZY_BYTES:
                        graph.initializer.append(_lazy_tensor(f, gvalue, gstop, path))
                    else:
                        graph.MergeFromString(_read(f, gkey, gstop))
                model.graph.MergeFrom(graph)
            else:
                model.MergeFromString(_read(f, key, stop))
    return model


def _lazy_tensor(f: BinaryIO, start: int, end: int, path: Path) -> TensorProto:
    """A TensorProto record read without its raw_data, which becomes a reference to where it lies in ``path``."""
    tensor = TensorProto()
    raw: tuple[int, int] | None = None
    for number, wire, key, value, stop in _fields(f, start, end, path):
        if number == _RAW_DATA_FIELD and wire == 2:
            raw = (value, stop - value)
        else:
            tensor.MergeFromString(_read(f, key, stop))
    if raw is None or _external(tensor):  # typed fields (float_data): read as it is
        tensor.Clear()
        tensor.ParseFromString(_read(f, start, end))
        return tensor
    tensor.data_location = TensorProto.EXTERNAL
    for k, v in (("location", path.name), ("offset", str(raw[0])), ("length", str(raw[1]))):
        entry = tensor.external_data.add()
        entry.key, entry.value = k, v
    return tensor


def _fields(f: BinaryIO, start: int, end: int, path: Path) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, record start, value start, record end) of each field of a message in ``f[start:end]``."""
    pos = start
    while pos < end:
        key, after = _varint(f, pos, path)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, (_, stop) = after, _varint(f, after, path)
        elif wire == 1:
            value, stop = after, after + 8
        elif wire == 5:
            value, stop = after, after + 4
        elif wire == 2:
            length, value = _varint(f, after, path)
            stop = value + length
        else:
            raise QuantizeError(f"{path.name}: not an ONNX model (protobuf wire type {wire} at byte {pos})")
        if stop > end:
            raise QuantizeError(f"{path.name}: truncated (a field at byte {pos} runs past byte {end})")
        yield number, wire, pos, value, stop
        pos = stop


def _varint(f: BinaryIO, pos: int, path: Path) -> tuple[int, int]:
    f.seek(pos)
    result = shift = 0
    for _ in range(10):
        byte = f.read(1)
        if not byte:
            raise QuantizeError(f"{path.name}: truncated at byte {pos}")
        result |= (byte[0] & 0x7F) << shift
        pos += 1
        if not byte[0] & 0x80:
            return result, pos
        shift += 7
    raise QuantizeError(f"{path.name}: not an ONNX model (bad varint at byte {pos})")


def _read(f: BinaryIO, start: int, stop: int) -> bytes:
    f.seek(start)
    return f.read(stop - start)


def _add_shapes(model: onnx.ModelProto) -> None:
    """Add the value shapes ONNX infers to every graph, inferred on a copy without the weights' bytes.

    Clearing the bytes in place would not do: protobuf frees a parsed message's memory only
    with the whole message, so the weights would be held twice.
    """
    skeleton = onnx.ModelProto(ir_version=model.ir_version)
    skeleton.opset_import.extend(model.opset_import)
    skeleton.functions.extend(model.functions)
    skeleton.graph.CopyFrom(_skeleton(model.graph))
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        return  # as quantize_dynamic: the shapes help ORT's fusions, quantizing does not need them
    for graph, shaped in zip(onnx_graph.graphs(model.graph), onnx_graph.graphs(inferred.graph), strict=True):
        known = {v.name for v in graph.value_info}
        graph.value_info.extend(v for v in shaped.value_info if v.name not in known)


def _skeleton(graph: onnx.GraphProto) -> onnx.GraphProto:
    """A graph's copy whose large initializers have their type and dims only (small ones, shapes among them, whole)."""
    out = onnx.GraphProto(name=graph.name)
    out.input.extend(graph.input)
    out.output.extend(graph.output)
    out.value_info.extend(graph.value_info)
    out.node.extend(graph.node)  # subgraphs hold no large weights in exported models: the outer graph does
    for tensor in graph.initializer:
        if _external(tensor) or tensor.ByteSize() >= onnx_graph.EXTERNAL_MIN_BYTES:
            out.initializer.add(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
        else:
            out.initializer.append(tensor)
    return out


def _external(tensor: TensorProto) -> bool:
    return tensor.data_location == TensorProto.EXTERNAL


def _attribute_tensors(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    """The tensors held in one graph's node attributes (not its subgraphs')."""
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors


# --- reading weights -------------------------------------------------------------------------------------------


class _Source:
    """Reads a graph's tensors: inline bytes, or its external data files by offset, a block of rows at a time."""

    def __init__(self, graph: Path) -> None:
        self.name = graph.name
        self.folder = graph.resolve().parent
        self.paths: set[Path] = set()
        self.files: dict[str, BinaryIO] = {}

    def __enter__(self) -> _Source:
        return self

    def __exit__(self, *exc: object) -> None:
        for f in self.files.values():
            f.close()

    def check(self, location: str) -> Path:
        """The data file a location names; it must lie inside the graph's folder (a graph could name ``/etc/shadow``)."""
        path = (self.folder / location).resolve()
        if os.path.isabs(location) or not path.is_relative_to(self.folder):
            raise QuantizeError(f"{self.name}: external data {location!r} lies outside the graph's folder")
        self.paths.add(path)
        return path

    def _file(self, location: str) -> BinaryIO:
        if location not in self.files:
            self.files[location] = self.check(location).open("rb")
        return self.files[location]

    def matrix(self, tensor: TensorProto) -> _Matrix:
        """The tensor as a float32 matrix of ``dims[0]`` rows (one row for a scalar), read lazily."""
        dims = list(tensor.dims) or [1]
        rows = dims[0]
        cols = int(np.prod(dims[1:], dtype=np.int64)) if len(dims) > 1 else 1
        if _external(tensor):
            info = onnx.external_data_helper.ExternalDataInfo(tensor)
            label = f"{self.name}: tensor {tensor.name!r}"
            return _Matrix(rows, cols, file=self._file(info.location), offset=int(info.offset or 0), label=label)
        if tensor.HasField("raw_data"):
            data = np.frombuffer(tensor.raw_data, dtype="<f4")  # one copy of the bytes, kept while in use
        else:
            data = numpy_helper.to_array(tensor).astype(np.float32, copy=False).ravel()
        return _Matrix(rows, cols, array=data.reshape(rows, cols))

    def chunks(self, tensor: TensorProto) -> tuple[int, Iterator[bytes]]:
        """An external tensor's size and its stored bytes in blocks (located now: the caller may clear the tensor)."""
        info = onnx.external_data_helper.ExternalDataInfo(tensor)
        f = self._file(info.location)
        offset = int(info.offset or 0)
        size = int(info.length) if info.length is not None else os.fstat(f.fileno()).st_size - offset
        label = f"{self.name}: tensor {tensor.name!r}"

        def blocks() -> Iterator[bytes]:
            f.seek(offset)
            left = size
            while left > 0:
                block = f.read(min(left, BLOCK_BYTES))
                if not block:
                    raise QuantizeError(f"{label}: its external data ends early")
                left -= len(block)
                yield block

        return size, blocks()


@dataclass
class _Matrix:
    """A float32 matrix read in blocks of rows, from memory or from a file at an offset."""

    rows: int
    cols: int
    array: np.ndarray | None = None
    file: BinaryIO | None = None
    offset: int = 0
    label: str = ""

    def blocks(self) -> Iterator[tuple[int, np.ndarray]]:
        """(first row, rows) blocks of about :data:`BLOCK_BYTES`."""
        step = max(1, BLOCK_BYTES // max(1, 4 * self.cols))
        for start in range(0, self.rows, step):
            stop = min(self.rows, start + step)
            if self.array is not None:
                yield start, self.array[start:stop]
                continue
            assert self.file is not None
            self.file.seek(self.offset + 4 * start * self.cols)
            count = (stop - start) * self.cols
            block = np.fromfile(self.file, dtype="<f4", count=count)
            if block.size != count:
                raise QuantizeError(f"{self.label}: its external data ends early")
            yield start, block.reshape(stop - start, self.cols)


# --- the arithmetic (onnxruntime.quantization.quant_utils: compute_scale_zp, quantize_nparray) -----------------


def _params(lo: np.ndarray, hi: np.ndarray, qtype: int, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """float32 scales and zero points for the value ranges [lo, hi] (elementwise), as ORT computes them."""
    lo = np.minimum(lo, np.float32(0))
    hi = np.maximum(hi, np.float32(0))
    if symmetric:
        absmax = np.maximum(np.abs(lo), np.abs(hi))
        lo, hi = -absmax, absmax
        # 8 bits, as quantize_dynamic without reduce_range. Its 7 bits ([-64, 64]) fit the int16 in which x86's int8
        # product before VNNI (VPMADDUBSW, ONNX Runtime's U8S8 kernels on AVX2 and AVX-512) adds two uint8 x int8
        # products, but cost real weights their accuracy (all-MiniLM-L6-v2 on real text: cosine 0.823 min against
        # 0.934 at 8 bits, docs/benchmarks.md). With VNNI (Cascade Lake, Zen 4 and later), AMX or ARM's dot products
        # the sums are exact at 8 bits; a node without checks the graph's unsigned_twin, and uint8 serves such CPUs.
        qmin, qmax = -127, 127
    else:
        qmin, qmax = (0, 255) if qtype == TensorProto.UINT8 else (-128, 127)
    scale = (hi.astype(np.float64) - lo.astype(np.float64)) / float(qmax - qmin)
    degenerate = scale < np.finfo(np.float32).tiny  # an all-zero channel: scale 1, zero point 0
    safe = np.where(degenerate, 1.0, scale)
    zero = np.zeros(scale.shape) if symmetric else np.round(qmin - lo / safe)
    zero = np.where(degenerate, 0, zero).astype(_NP[qtype])
    return np.where(degenerate, 1.0, scale).astype(np.float32), zero


def _quantize_block(block: np.ndarray, scale: np.ndarray, zero: np.ndarray, qtype: int) -> np.ndarray:
    """round(x / scale) + zero (half to even, in float32 as ORT), saturated to the type's range."""
    info = np.iinfo(_NP[qtype])
    q = np.divide(block, scale, dtype=np.float32)
    np.round(q, out=q)
    q += zero.astype(np.float32)
    np.clip(q, info.min, info.max, out=q)
    quantized: np.ndarray = q.astype(_NP[qtype])
    return quantized


def _quantize_matrix(
    m: _Matrix, axis: int | None, qtype: int, symmetric: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values, scales, zero points) of a matrix: per column (axis 1), per row (axis 0) or per tensor (None).

    Two passes over the blocks: the ranges, then the values; only the 8-bit values are held whole.
    """
    lows, highs = [], []
    for _, block in m.blocks():
        reduce = {1: 0, 0: 1, None: None}[axis]
        lows.append(block.min(axis=reduce))
        highs.append(block.max(axis=reduce))
    if axis == 0:
        lo, hi = np.concatenate(lows), np.concatenate(highs)
    else:
        lo, hi = np.minimum.reduce(lows), np.maximum.reduce(highs)
    scale, zero = _params(np.asarray(lo, np.float32), np.asarray(hi, np.float32), qtype, symmetric)
    values = np.empty((m.rows, m.cols), dtype=_NP[qtype])
    for start, block in m.blocks():
        rows = slice(start, start + len(block))
        s, z = (scale[rows, None], zero[rows, None]) if axis == 0 else (scale, zero)
        values[rows] = _quantize_block(block, s, z, qtype)
    return values, scale, zero


# --- writing tensors -------------------------------------------------------------------------------------------


class _Sink:
    """Puts tensor bytes inline, or at the end of ``<graph>_data`` when external (tensors under 1 KB stay inline)."""

    def __init__(self, graph: Path, external: bool) -> None:
        self.path = onnx_graph.data_path(graph)
        self.external = external
        self.file: BinaryIO | None = None
        self.offset = 0

    def __enter__(self) -> _Sink:
        self.path.unlink(missing_ok=True)
        if self.external:
            self.file = self.path.open("wb")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.file is not None:
            self.file.close()

    def put(self, tensor: TensorProto, parts: Iterable[bytes | memoryview], nbytes: int) -> None:
        """Store ``nbytes`` of raw data, given in parts, as ``tensor``'s (its name, type and dims set)."""
        for name in ("raw_data", "external_data", *_TYPED_FIELDS):
            tensor.ClearField(name)
        if self.file is None or nbytes < onnx_graph.EXTERNAL_MIN_BYTES:
            tensor.data_location = TensorProto.DEFAULT
            tensor.raw_data = b"".join(parts)
            return
        start = self.offset
        for part in parts:
            self.offset += self.file.write(part)
        if self.offset - start != nbytes:
            raise QuantizeError(f"tensor {tensor.name!r}: {self.offset - start} bytes written, {nbytes} expected")
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", str(start)), ("length", str(nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value

    def put_array(self, tensor: TensorProto, array: np.ndarray) -> None:
        """Store an array as ``tensor`` (name set by the caller)."""
        array = np.ascontiguousarray(array) if array.ndim else array.copy()
        tensor.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
        tensor.ClearField("dims")
        tensor.dims.extend(array.shape)
        self.put(tensor, [array.reshape(-1).view(np.uint8).data], array.nbytes)

    def relocate(self, tensor: TensorProto, source: _Source) -> None:
        """Carry over an untouched tensor: external data copied block by block, large inline data externalized."""
        if _external(tensor):
            size, parts = source.chunks(tensor)
            self.put(tensor, parts, size)
        elif self.file is not None and tensor.HasField("raw_data") and tensor.ByteSize() >= onnx_graph.EXTERNAL_MIN_BYTES:
            data = tensor.raw_data
            self.put(tensor, [data], len(data))


_TYPED_FIELDS = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data")


# --- the rewrite -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _QWeight:
    """The names of a quantized weight's three initializers."""

    values: str
    scale: str
    zero: str


@dataclass
class _Scope:
    """One graph being rewritten: its initializers, who reads what, and the activations already quantized in it."""

    graph: onnx.GraphProto
    initializers: dict[str, TensorProto]
    readers: dict[str, list[onnx.NodeProto]]
    producers: dict[str, onnx.NodeProto]
    quantized: dict[str, tuple[str, str, str]] = field(default_factory=dict)


Scopes = tuple[_Scope, ...]


def probability_matmuls(model: onnx.ModelProto) -> list[str]:
    """Names of the MatMuls (subgraphs too) with an input read from a Softmax: those ``activations="scores"`` keeps float."""
    names = []
    for graph in onnx_graph.graphs(model.graph):
        producers = {name: node for node in graph.node for name in node.output}
        names += [n.name for n in graph.node if n.op_type == "MatMul" and any(_from_softmax(i, producers) for i in n.input[:2])]
    return names


def _from_softmax(name: str, producers: dict[str, onnx.NodeProto]) -> bool:
    """Whether ``name`` is computed from a Softmax's output within :data:`_SOFTMAX_HOPS` nodes of its graph,
    through any of their inputs (``Where(IsNaN(p), 0, p)``, a ``Cast``) but not through a product."""
    frontier, seen = [name], {name}
    for _ in range(_SOFTMAX_HOPS):
        nodes = [producers[n] for n in frontier if n in producers]
        if any(node.op_type == "Softmax" for node in nodes):
            return True
        frontier = [i for node in nodes if node.op_type not in _PRODUCTS for i in node.input if i and i not in seen]
        seen.update(frontier)
    return False


class _Rewriter:
    """Rewrites a model's graphs in place, node by node, quantizing each weight when a node first needs it."""

    def __init__(
        self,
        model: onnx.ModelProto,
        source: _Source,
        sink: _Sink,
        qtype: int,
        per_channel: bool,
        exclude: frozenset[str],
        activations: ActivationMatMuls,
    ) -> None:
        self.source, self.sink = source, sink
        self.qtype, self.per_channel, self.exclude = qtype, per_channel, exclude
        self.activations = activations
        self.names = _all_names(model.graph)
        # Values known to be float32 (shape inference's types): the only activations quantized.
        self.floats = _float_values(model.graph) if activations != "none" else set()
        self.weights: dict[tuple[str, int | None, int, bool], _QWeight] = {}
        self.made: set[str] = set()
        self.replaced: set[str] = set()
        self.ops: Counter[str] = Counter()
        self.float_matmuls = 0
        self.float_convs: list[str] = []

    def fresh(self, base: str) -> str:
        """A name used nowhere in the model (no graph, no subgraph), reserved from now on."""
        name, i = base, 0
        while name in self.names:
            i += 1
            name = f"{base}_{i}"
        self.names.add(name)
        return name

    def rewrite(self, graph: onnx.GraphProto, outer: Scopes) -> None:
        readers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                readers.setdefault(name, []).append(node)
        producers = {name: node for node in graph.node for name in node.output}
        scopes = (*outer, _Scope(graph, {t.name: t for t in graph.initializer}, readers, producers))
        nodes: list[onnx.NodeProto] = []
        for node in graph.node:
            for _, sub in onnx_graph.subgraphs(node):
                self.rewrite(sub, scopes)
            nodes.extend(self.node(node, scopes))
        graph.ClearField("node")
        graph.node.extend(nodes)

    def node(self, node: onnx.NodeProto, scopes: Scopes) -> list[onnx.NodeProto]:
        """The nodes that replace one node (itself when it stays float)."""
        excluded = node.name in self.exclude
        if node.op_type == "MatMul":
            weight = None if excluded else self.weight(node.input[1], scopes, rank=2)
            if weight is None and not excluded and self.two_activations(node, scopes):
                return self.matmul_activations(node, scopes)
            if weight is None:
                self.float_matmuls += 1
                return [node]
            return self.matmul(node.name, node.input[0], weight, node.output[0], scopes, transposed=False)
        if node.op_type == "Gemm" and not excluded:
            return self.gemm(node, scopes)
        if node.op_type == "Conv":
            weight = None if excluded else self.weight(node.input[1], scopes)
            if weight is None:
                self.float_convs.append(node.name)
                return [node]
            return self.conv(node, weight, scopes)
        if node.op_type == "Gather" and not excluded:
            weight = self.weight(node.input[0], scopes)
            if weight is not None:
                return self.gather(node, weight, scopes)
        return [node]

    def weight(self, name: str, scopes: Scopes, rank: int | None = None) -> TensorProto | None:
        """The non-empty float32 initializer ``name`` stands for in this graph (looking outward), else None."""
        found = _resolve(name, scopes)
        if found is None or found.data_type != _FLOAT or (rank is not None and len(found.dims) != rank):
            return None
        return found if all(found.dims) else None

    def quantized_weight(
        self, tensor: TensorProto, scopes: Scopes, *, axis: int | None, qtype: int, transpose: bool = False
    ) -> _QWeight:
        """Quantize a weight (once per scheme) into the graph that holds it: every branch reading it shares it."""
        key = (tensor.name, axis, qtype, transpose)
        if key in self.weights:
            return self.weights[key]
        values, scale, zero = _quantize_matrix(self.source.matrix(tensor), axis, qtype, qtype == TensorProto.INT8)
        values = values.T if transpose else values.reshape(tuple(tensor.dims))
        stem = tensor.name + ("_Transposed" if transpose else "")
        made = _QWeight(self.fresh(stem + "_quantized"), self.fresh(stem + "_scale"), self.fresh(stem + "_zero_point"))
        owner = next(s for s in reversed(scopes) if tensor.name in s.initializers).graph
        for name, array in ((made.values, values), (made.scale, scale), (made.zero, zero)):
            stored = owner.initializer.add()
            stored.name = name
            self.sink.put_array(stored, array)
            self.made.add(name)
        self.weights[key] = made
        self.replaced.add(tensor.name)
        return made

    def quantized_input(self, name: str, scopes: Scopes, out: list[onnx.NodeProto]) -> tuple[str, str, str]:
        """An activation's uint8 values, scale and zero point: one DynamicQuantizeLinear per graph, shared by its readers."""
        scope = scopes[-1]
        if name not in scope.quantized:
            made = (self.fresh(name + "_quantized"), self.fresh(name + "_scale"), self.fresh(name + "_zero_point"))
            out.append(helper.make_node("DynamicQuantizeLinear", [name], list(made), self.fresh(name + "_QuantizeLinear")))
            self.ops["DynamicQuantizeLinear"] += 1
            scope.quantized[name] = made
        return scope.quantized[name]

    def scaled(
        self, op: str, stem: str, inputs: list[str], a: tuple[str, str, str], w: _QWeight, output: str, **attrs: Any
    ) -> list[onnx.NodeProto]:
        """``op`` (MatMulInteger, ConvInteger), its int32 result cast to float and scaled by both scales, into ``output``."""
        name = self.fresh(stem + "_quant")
        product = self.fresh(output + "_output_quantized")
        cast = self.fresh(product + "_cast_output")
        scales = self.fresh(name + "_scales_mul:0")
        self.ops[op] += 1
        return [
            helper.make_node(op, inputs, [product], name, **attrs),
            helper.make_node("Cast", [product], [cast], self.fresh(product + "_cast"), to=_FLOAT),
            helper.make_node("Mul", [a[1], w.scale], [scales], self.fresh(name + "_scales_mul")),
            helper.make_node("Mul", [cast, scales], [output], self.fresh(name + "_output_scale_mul")),
        ]

    def matmul(
        self, name: str, a: str, weight: TensorProto, output: str, scopes: Scopes, *, transposed: bool
    ) -> list[onnx.NodeProto]:
        out: list[onnx.NodeProto] = []
        qa = self.quantized_input(a, scopes, out)
        # B is [K, N]: one scale per output column; a transposed Gemm weight is [N, K]: one per row.
        axis = (0 if transposed else 1) if self.per_channel else None
        w = self.quantized_weight(weight, scopes, axis=axis, qtype=self.qtype, transpose=transposed)
        out += self.scaled("MatMulInteger", name or output, [qa[0], w.values, qa[2], w.zero], qa, w, output)
        return out

    def two_activations(self, node: onnx.NodeProto, scopes: Scopes) -> bool:
        """Whether a MatMul of two float32 values computed in the graph (no initializer) is quantized."""
        if not all(name in self.floats and _resolve(name, scopes) is None for name in node.input[:2]):
            return False
        # Softmax's probabilities lose most: one scale for the whole tensor rounds the small ones of a
        # long row to 0 (all-MiniLM-L6-v2 on 512-token passages: cosine 0.987 with them float, 0.948
        # quantized); the scores' inputs are spread like the hidden states (docs/benchmarks.md).
        return self.activations == "all" or not any(_from_softmax(name, scopes[-1].producers) for name in node.input[:2])

    def matmul_activations(self, node: onnx.NodeProto, scopes: Scopes) -> list[onnx.NodeProto]:
        out: list[onnx.NodeProto] = []
        qa = self.quantized_input(node.input[0], scopes, out)
        qb = self.quantized_input(node.input[1], scopes, out)
        b = _QWeight(*qb)
        out += self.scaled("MatMulInteger", node.name or node.output[0], [qa[0], qb[0], qa[2], qb[2]], qa, b, node.output[0])
        return out

    def gemm(self, node: onnx.NodeProto, scopes: Scopes) -> list[onnx.NodeProto]:
        """Without scaling or a transposed A, Gemm is MatMul then Add of C (ORT's ``replace_gemm_with_matmul``)."""
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        weight = self.weight(node.input[1], scopes, rank=2)
        if attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0 or attrs.get("transA", 0) or weight is None:
            return [node]
        bias = node.input[2] if len(node.input) > 2 else ""
        product = self.fresh(node.output[0] + "_MatMul") if bias else node.output[0]
        stem = (node.name or node.output[0]) + "_MatMul"
        out = self.matmul(stem, node.input[0], weight, product, scopes, transposed=bool(attrs.get("transB", 0)))
        if bias:
            out.append(helper.make_node("Add", [product, bias], [node.output[0]], self.fresh(node.name + "_Add")))
        return out

    def conv(self, node: onnx.NodeProto, weight: TensorProto, scopes: Scopes) -> list[onnx.NodeProto]:
        out: list[onnx.NodeProto] = []
        qx = self.quantized_input(node.input[0], scopes, out)
        w = self.quantized_weight(weight, scopes, axis=None, qtype=self.qtype)
        bias = node.input[2] if len(node.input) > 2 else ""
        scaled = self.fresh(node.output[0] + "quant_scaled_output") if bias else node.output[0]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        out += self.scaled("ConvInteger", node.name or node.output[0], [qx[0], w.values, qx[2], w.zero], qx, w, scaled, **attrs)
        if bias:  # the bias is [C]: reshaped to [1, C, 1, ...] to broadcast over the output
            shape = self.fresh(node.output[0] + "_bias_reshape_shape")
            reshaped = self.fresh(node.output[0] + "_bias_reshape_output")
            target = np.ones(len(weight.dims), dtype=np.int64)
            target[1] = -1
            stored = scopes[-1].graph.initializer.add()
            stored.name = shape
            self.sink.put_array(stored, target)
            self.made.add(shape)
            out.append(helper.make_node("Reshape", [bias, shape], [reshaped], self.fresh(shape + "_Reshape")))
            out.append(helper.make_node("Add", [scaled, reshaped], [node.output[0]], self.fresh(node.output[0] + "_bias_add")))
        return out

    def gather(self, node: onnx.NodeProto, weight: TensorProto, scopes: Scopes) -> list[onnx.NodeProto]:
        """An embedding table in uint8 per tensor (ORT quantizes it as an activation), dequantized after the lookup."""
        w = self.quantized_weight(weight, scopes, axis=None, qtype=TensorProto.UINT8)
        looked_up = self.fresh(node.output[0] + "_quantized")
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        dq = self.fresh(node.output[0] + "_DequantizeLinear")
        self.ops["DequantizeLinear"] += 1
        return [
            helper.make_node("Gather", [w.values, node.input[1]], [looked_up], node.name, **attrs),
            helper.make_node("DequantizeLinear", [looked_up, w.scale, w.zero], [node.output[0]], dq),
        ]

    def drop_replaced(self, graph: onnx.GraphProto) -> None:
        """Remove the float weights no node reads any more (and their graph inputs: old exporters list weights there)."""
        read = set(_uses(graph))
        for sub in onnx_graph.graphs(graph):
            gone = {t.name for t in sub.initializer if t.name in self.replaced and t.name not in read}
            if not gone:
                continue
            onnx_graph.drop_named(sub, "initializer", gone)
            onnx_graph.drop_named(sub, "input", gone)


def _resolve(name: str, scopes: Scopes) -> TensorProto | None:
    """The initializer a name stands for, looked up from the innermost graph outward."""
    for scope in reversed(scopes):
        if name in scope.initializers:
            return scope.initializers[name]
    return None


def _all_names(graph: onnx.GraphProto) -> set[str]:
    """Every value and node name in a graph and its subgraphs."""
    names: set[str] = set()
    for sub in onnx_graph.graphs(graph):
        names.update(t.name for t in sub.initializer)
        names.update(v.name for v in (*sub.input, *sub.output, *sub.value_info))
        for node in sub.node:
            names.update(node.input)
            names.update(node.output)
            names.add(node.name)
    return names


def _float_values(graph: onnx.GraphProto) -> set[str]:
    """The values typed float32 in a graph and its subgraphs (inputs, outputs, inferred value_info)."""
    return {
        v.name
        for sub in onnx_graph.graphs(graph)
        for v in (*sub.input, *sub.output, *sub.value_info)
        if v.type.tensor_type.elem_type == _FLOAT
    }


def _uses(graph: onnx.GraphProto) -> Counter[str]:
    """How often each value is read, by nodes and as a graph output, in a graph and its subgraphs."""
    uses: Counter[str] = Counter()
    for sub in onnx_graph.graphs(graph):
        uses.update(o.name for o in sub.output)
        for node in sub.node:
            uses.update(node.input)
    return uses


# --- which MatMuls stay float ----------------------------------------------------------------------------------

# Activations whose output distribution is heavy-tailed: a long positive tail and a pile-up
# just below zero. One dynamic scale per tensor spends the uint8 range on the tail and rounds
# most values to a few levels, so the MatMul reading them (a transformer's FFN down-projection)
# loses the most accuracy.
_GELU_OPS = frozenset({"Gelu", "FastGelu", "BiasGelu", "Erf", "Tanh"})  # Erf: exact GELU, Tanh: gelu_new
# Walked through back from a MatMul: the elementwise ops a decomposed GELU is spelled with
# (x * 0.5 * (1 + erf(x / sqrt 2))) and a GLU's gate product; six hops reach the Erf of a
# gated GELU (modernbert, gemma).
_PASS_THROUGH = frozenset({"Mul", "Add", "Div", "Cast"})
_GELU_HOPS = 6


def default_exclude(model: onnx.ModelProto) -> frozenset[str]:
    """The nodes the farm's int8 keeps float: the embedding lookups (see ``benchmarks/bench_quantize.py``)."""
    return embedding_gathers(model)


def post_gelu_matmuls(model: onnx.ModelProto) -> frozenset[str]:
    """MatMuls reading a GELU's output (FFN down-projections), in the graph and its branches."""
    return frozenset(_post_gelu_matmuls(model.graph, {}))


def embedding_gathers(model: onnx.ModelProto) -> frozenset[str]:
    """Gathers from a float32 initializer table (embeddings), in the graph and its branches.

    Quantized, a table is one uint8 scale for every row (as ORT does it): a lookup saves no time,
    and the rare tokens' rows are what it rounds worst.
    """
    stored = {t.name for g in onnx_graph.graphs(model.graph) for t in g.initializer if t.data_type == _FLOAT}
    return frozenset(
        node.name
        for g in onnx_graph.graphs(model.graph)
        for node in g.node
        if node.op_type == "Gather" and node.input[0] in stored
    )


def _post_gelu_matmuls(graph: onnx.GraphProto, outer: dict[str, onnx.NodeProto]) -> Iterator[str]:
    producers = {**outer, **{o: node for node in graph.node for o in node.output}}
    for node in graph.node:
        if node.op_type == "MatMul" and _after_gelu(node.input[0], producers):
            yield node.name
        for _, sub in onnx_graph.subgraphs(node):
            yield from _post_gelu_matmuls(sub, producers)


def _after_gelu(tensor: str, producers: dict[str, onnx.NodeProto]) -> bool:
    """Whether a GELU op is found walking back from a tensor through a few elementwise ops."""
    frontier = [tensor]
    for _ in range(_GELU_HOPS):
        nodes = [producers[t] for t in frontier if t in producers]
        if any(n.op_type in _GELU_OPS for n in nodes):
            return True
        frontier = [t for n in nodes if n.op_type in _PASS_THROUGH for t in n.input]
    return False
