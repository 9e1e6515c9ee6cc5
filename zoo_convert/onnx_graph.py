"""ONNX graph handling shared by the stages: subgraph walking, op census, external data, saving.

A graph keeps nested graphs in node attributes: an ``If`` has ``then_branch`` and
``else_branch`` (optimum's merged decoders keep both decoders there), ``Loop`` and
``Scan`` have a ``body``. Everything that counts, scans or rewrites a graph walks
those too, through :func:`graphs` (all of them) or :func:`subgraphs` (one node's).

Weights live in one external data file beside the graph, ``<file>_data``
(``model.onnx`` -> ``model.onnx_data``): the name optimum writes and transformers.js
and ``ORTModel`` look for (:func:`data_path`). Every graph of a job keeps its weights
there while the job works on it (:func:`externalize` after the export), so reading a
graph's structure (:func:`load`) reads only the structure; the artifacts are written
the way loaders expect them, weights inside the graph unless the model is over the
protobuf limit (``Settings.external_data_threshold``).
"""

from __future__ import annotations

import errno
import mmap
import os
import shutil
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

import numpy as np
import onnx

T = TypeVar("T")

# Tensors smaller than this stay inside the graph: some ops dislike external scalars.
EXTERNAL_MIN_BYTES = 1024


def subgraphs(node: onnx.NodeProto) -> Iterator[tuple[str, onnx.GraphProto]]:
    """The graphs a node holds, with the name of the attribute holding each (``then_branch``, ``body``)."""
    for attr in node.attribute:
        if attr.HasField("g"):
            yield attr.name, attr.g
        for graph in attr.graphs:
            yield attr.name, graph


def graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """A graph and every graph nested in it."""
    yield graph
    for node in graph.node:
        for _, sub in subgraphs(node):
            yield from graphs(sub)


def tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Initializers and constant tensors (node attributes) of a graph and of its subgraphs: all that may be external."""
    for sub in graphs(graph):
        yield from sub.initializer
        for node in sub.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors


def op_census(graph: onnx.GraphProto) -> Counter[str]:
    """Op type counts of a graph including its subgraphs (a merged decoder counts both branches)."""
    return Counter(node.op_type for sub in graphs(graph) for node in sub.node)


# The domains of ONNX's standard operators: every runtime that reads ONNX implements these (``""`` is ai.onnx).
STANDARD_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml"})


def contrib_ops(graph: onnx.GraphProto) -> Counter[str]:
    """Ops outside ONNX's standard domains, by ``domain.op_type`` (``com.microsoft.FusedMatMul``), subgraphs included.

    ONNX Runtime's fusions emit them (FusedMatMul, BiasGelu, SkipLayerNormalization, FusedConv);
    other runtimes translate them badly or not at all.
    """
    return Counter(f"{n.domain}.{n.op_type}" for sub in graphs(graph) for n in sub.node if n.domain not in STANDARD_DOMAINS)


def load(path: Path) -> onnx.ModelProto:
    """A graph's structure without its external weights: enough to count, name and inspect it."""
    return onnx.load(str(path), load_external_data=False)


def structure(path: Path) -> onnx.ModelProto:
    """A graph file's structure for reading only (ops, names, types): its top-level weights' bytes are not parsed.

    :func:`load` of a graph with its weights inside parses them all (ONNX Runtime's optimized whisper-tiny decoder:
    0.2 GB, 0.17-0.20 s); here the file is mapped and every top-level initializer's ``raw_data`` is left out at the
    protobuf wire level (its name, type and dims stay). Nested graphs' initializers are kept whole. Never save it.
    """

    def without_weights(buf: memoryview) -> bytes:
        out = bytearray()
        for field, wire, start, value, end in _fields(buf, 0, len(buf)):
            if field != _MODEL_GRAPH or wire != _LEN:
                out += buf[start:end]
                continue
            graph = bytearray()
            for number, kind, begin, inner, stop in _fields(buf, value, end):
                if number != _GRAPH_INITIALIZER or kind != _LEN:
                    graph += buf[begin:stop]
                    continue
                tensor = b"".join(bytes(buf[ts:te]) for tf, _, ts, _, te in _fields(buf, inner, stop)
                                  if tf != _TENSOR_RAW_DATA)  # fmt: skip
                graph += _tag(number, _LEN) + _varint_bytes(len(tensor)) + tensor
            out += _tag(field, _LEN) + _varint_bytes(len(graph)) + graph
        return bytes(out)

    model = onnx.ModelProto()
    model.ParseFromString(_read_mapped(path, without_weights))
    return model


def _read_mapped(path: Path, read: Callable[[memoryview], T]) -> T:
    """``read`` over the file's bytes, mapped; a malformed protobuf is a ValueError naming the file.

    ``read`` must return nothing that views the map: it is closed when this returns.
    """
    unreadable = ""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        buf = memoryview(mapped)
        try:
            return read(buf)
        except ValueError as exc:  # raised below: its frames would keep views of the map open
            unreadable = str(exc)
        finally:
            buf.release()
    raise ValueError(f"{path}: not a protobuf onnx can read: {unreadable}")


def fed_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs a caller feeds (older exporters also list initializers as inputs)."""
    initializers = {t.name for t in graph.initializer}
    return [i for i in graph.input if i.name not in initializers]


def data_path(graph: Path) -> Path:
    """Where a graph's external data lives: ``<file>_data`` beside it."""
    return graph.with_name(graph.name + "_data")


def disk_size(graph: Path) -> int:
    """Bytes of a graph file plus its external data."""
    data = data_path(graph)
    return graph.stat().st_size + (data.stat().st_size if data.exists() else 0)


def save(model: onnx.ModelProto, path: Path, *, external: bool, weights: Path | None = None) -> None:
    """Write a graph, its weights in :func:`data_path` when ``external``, else inside the file.

    ``weights``: the folder its external tensors' data files are in (a graph read with :func:`load` and worked on
    without its weights). Written inline, their bytes are copied from those files by the kernel
    (``copy_file_range``), never read into the process; written external, they are read first.
    """
    if weights is not None:
        _overwritten_kept(model)
        if external:
            onnx.load_external_data_for_model(model, str(weights))
    data = data_path(path)
    data.unlink(missing_ok=True)  # onnx appends to an existing data file
    if external:
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=data.name,
            size_threshold=EXTERNAL_MIN_BYTES,
        )
    else:
        _save_inline(model, path, weights)
    read_back(path, "onnx.save_model")


# The protobuf limit: a serialized message of 2 GiB or more cannot be parsed.
_PROTOBUF_LIMIT = 1 << 31


@dataclass(frozen=True)
class _Span:
    """A tensor's bytes in an external data file, copied from there as the file is written."""

    file: Path
    offset: int
    length: int

    def __len__(self) -> int:  # counted with the bytes pieces around it
        return self.length


def _external_span(tensor: onnx.TensorProto, weights: Path) -> _Span:
    """Where an external tensor's bytes are (its ``location`` is relative to ``weights``), its entries cleared."""
    info = onnx.external_data_helper.ExternalDataInfo(tensor)
    if Path(info.location).is_absolute() or ".." in Path(info.location).parts:  # as onnx.load refuses it
        raise ValueError(f"tensor {tensor.name!r}: external data location {info.location!r} is outside {weights}")
    file = weights / info.location
    offset = int(info.offset or 0)
    length = int(info.length) if info.length is not None else file.stat().st_size - offset
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT  # as onnx's load_external_data_for_model leaves it
    return _Span(file, offset, length)


def _save_inline(model: onnx.ModelProto, path: Path, weights: Path | None = None) -> None:
    """The bytes ``onnx.save_model`` writes for ``model``, streamed: the weights are never all copied into one buffer.

    ``SerializeToString`` builds the whole file in memory first (a fused ViT-Base: 0.35 GB, ~1 s of a 2.4 s child,
    most of it the kernel handing out fresh pages). Here each top-level initializer's ``raw_data`` is taken out,
    the rest serialized (a few MB), and the file written from that structure at the protobuf wire level, each
    weight's bytes put back in its tensor where ``SerializeToString`` puts them (field-number order: the same bytes,
    tests/test_onnx_graph.py checks). The model's large initializers are left empty: callers write and discard.
    With ``weights``, a top-level initializer still in an external data file there is written as if it had been
    loaded (the bytes ``onnx.load`` then this would write), copied file to file; one nested deeper is loaded.
    """
    if weights is None and any(t.data_location == onnx.TensorProto.EXTERNAL for t in tensors(model.graph)):
        onnx.save_model(model, str(path))  # writes those tensors to their data files as it goes: its way
        return
    moved: list[bytes | _Span | None] = []
    for tensor in model.graph.initializer:
        if weights is not None and tensor.data_location == onnx.TensorProto.EXTERNAL:
            moved.append(_external_span(tensor, weights))
            continue
        raw = tensor.raw_data if tensor.HasField("raw_data") else b""
        moved.append(raw if len(raw) >= EXTERNAL_MIN_BYTES else None)
        if len(raw) >= EXTERNAL_MIN_BYTES:
            tensor.ClearField("raw_data")
    if weights is not None and any(t.data_location == onnx.TensorProto.EXTERNAL for t in tensors(model.graph)):
        onnx.load_external_data_for_model(model, str(weights))  # nested ones (subgraphs, constants): small, loaded
    structure = memoryview(model.SerializeToString())
    pieces: list[bytes | memoryview | _Span] = []
    for field, wire, start, value, end in _fields(structure, 0, len(structure)):
        if field != _MODEL_GRAPH or wire != _LEN:
            pieces.append(structure[start:end])
            continue
        graph: list[bytes | memoryview | _Span] = []
        at = 0  # the next initializer's index
        for number, kind, begin, inner, stop in _fields(structure, value, end):
            initializer = number == _GRAPH_INITIALIZER and kind == _LEN
            raw = moved[at] if initializer else None
            at += initializer
            if raw is None:
                graph.append(structure[begin:stop])
                continue
            fields = [(tf, structure[ts:te]) for tf, _, ts, _, te in _fields(structure, inner, stop)]
            body: list[bytes | memoryview | _Span] = [*(b for tf, b in fields if tf < _TENSOR_RAW_DATA),
                    _tag(_TENSOR_RAW_DATA, _LEN) + _varint_bytes(len(raw)), raw,
                    *(b for tf, b in fields if tf > _TENSOR_RAW_DATA)]  # fmt: skip
            graph += [_tag(number, _LEN) + _varint_bytes(sum(len(b) for b in body)), *body]
        pieces += [_tag(field, _LEN) + _varint_bytes(sum(len(b) for b in graph)), *graph]
    if sum(len(b) for b in pieces) >= _PROTOBUF_LIMIT:
        raise ValueError("The proto size is larger than the 2 GB limit (as onnx.save_model says): save it external")
    try:
        with open(path, "wb") as f:
            for piece in pieces:
                if isinstance(piece, _Span):
                    _copy_span(piece, f)
                else:
                    f.write(piece)
    except BaseException:
        path.unlink(missing_ok=True)  # a graph cut short is no graph: nobody may find it and load it
        raise


def _overwritten_kept(model: onnx.ModelProto) -> None:
    """A tensor still marked external whose bytes someone set in memory (a fuser changing a weight in place) is
    marked inline: those bytes are its value, not the data file's, wherever it is written."""
    for tensor in tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL and tensor.HasField("raw_data"):
            del tensor.external_data[:]
            tensor.data_location = onnx.TensorProto.DEFAULT


def _copy_span(span: _Span, out: BinaryIO) -> None:
    """Append a span of a data file to ``out``, file to file in the kernel where it can (a page-cached 0.65 GB: ~0.3 s
    where a read and a write took 1.7 s), else through a buffer."""
    out.flush()
    with open(span.file, "rb") as src:
        if src.seek(0, os.SEEK_END) < span.offset + span.length:
            raise ValueError(f"{span.file}: {span.length} bytes at {span.offset} run past its end")
        offset, left = span.offset, span.length
        try:
            while left:
                done = os.copy_file_range(src.fileno(), out.fileno(), left, offset)
                if done == 0:
                    raise OSError(errno.EIO, f"{span.file}: copy_file_range copied nothing", str(span.file))
                offset, left = offset + done, left - done
            out.seek(0, os.SEEK_END)
            return
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL) or left != span.length:
                raise
        src.seek(offset)
        while left:
            chunk = src.read(min(left, 1 << 24))
            out.write(chunk)
            left -= len(chunk)


def unread(path: Path) -> str | None:
    """Why a graph just written does not read back whole, or None when it does: a file cut short.

    A writer that does not check its writes (onnx's and ONNX Runtime's C++ writers, an exporter
    on a full disk) leaves a file that ends inside a protobuf field, or whose external data ends
    before the bytes its tensors point at. The protobuf's top-level fields are walked without
    parsing them (each one's length must fit in the file), then each external tensor's data file
    must reach ``offset + length``. Bytes that are no protobuf at all are not a cut (their writer's
    fault, not the disk's): None, and whoever reads the file says what it is.
    """
    size = path.stat().st_size
    if size == 0:
        return "0 bytes"
    found: set[int] = set()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        view = memoryview(buf)
        try:
            found = {field for field, *_ in _fields(view, 0, size)}
        except IndexError:  # a varint running off the end
            return f"{size} bytes, ending inside a protobuf field"
        except ValueError as exc:
            if "runs past" not in str(exc):
                return None
            return f"{size} bytes, a protobuf field runs past the file's end"
        finally:
            view.release()
    if 0 in found:  # no protobuf has a field 0: these bytes are something else
        return None
    if _MODEL_GRAPH not in found or _MODEL_OPSET_IMPORT not in found:
        return f"{size} bytes, ending before its graph and opsets were written"
    if not data_path(path).exists():  # no data file of ours beside it: nothing to measure (and no inline weights parsed)
        return None
    try:
        model = load(path)
    except Exception:  # noqa: BLE001 - protobuf's DecodeError and others: not a cut (above), someone else's to name
        return None
    for tensor in (t for g in graphs(model.graph) for t in tensors(g)):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        where = {e.key: e.value for e in tensor.external_data}
        data = path.parent / where.get("location", "")
        if "length" not in where or not data.is_file():
            continue
        need = int(where.get("offset", 0)) + int(where["length"])
        if (have := data.stat().st_size) < need:
            return f"its data file {data.name} is {have} bytes, its tensor {tensor.name} ends at byte {need}"
    return None


def read_back(path: Path, writer: str) -> None:
    """Raise the disk's OSError when ``writer`` left ``path`` cut short (:func:`unread`); nothing when it reads back whole.

    ENOSPC when its file system has less room left than the file (or 1 MiB), EIO (a failing
    write) otherwise: either way ``storage_error``, the machine's fault, redone by the next run.
    """
    why = unread(path)
    if why is not None:
        raise cut_short(path, writer, why)


def cut_short(path: Path, writer: str, why: str) -> OSError:
    """The OSError a write cut short by its file system stands for (see :func:`read_back`)."""
    free = os.statvfs(path.parent)
    room = free.f_bavail * free.f_frsize
    code = errno.ENOSPC if room < max(1 << 20, path.stat().st_size) else errno.EIO
    return OSError(
        code, f"{os.strerror(code)}: {writer} wrote {path.name} cut short ({why}); {room} bytes free on its file system",
        str(path),
    )  # fmt: skip


def externalize(path: Path) -> None:
    """Move an inline graph's weights out of it without copying them: the file becomes its own data file.

    An inline graph already holds every weight's bytes contiguously (a ``raw_data``
    field), so the file is renamed to :func:`data_path` and a new graph file is
    written whose large initializers point into it by offset. Only the structure is
    parsed (at the protobuf wire level); the weights are neither read nor written,
    where a load and an external-data save read and write them all (1.5 s for
    bert-base's 0.5 GB, 2.3 s for gpt2's, on 2 cores). The data file keeps the old
    structure's bytes between the weights: a few KB to MB, never addressed.
    Initializers of nested graphs stay inline. A graph already external is left alone.
    """
    data = data_path(path)
    unreadable = ""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        try:
            rewritten = _externalized_model(memoryview(buf), data.name)
        except ValueError as exc:  # raised below: its frames would keep views of the map open
            unreadable = str(exc)
    if unreadable:
        raise ValueError(f"{path}: not a protobuf onnx can read: {unreadable}")
    if rewritten is None:
        return
    data.unlink(missing_ok=True)  # a stale one: nothing in this graph refers to it
    os.replace(path, data)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(rewritten)
    os.replace(tmp, path)


def outputs(path: Path) -> list[onnx.ValueInfoProto]:
    """A graph file's outputs (names, types, shapes), read at the protobuf wire level: no weight is parsed.

    For an inline graph that is the difference between mapping the file and parsing all of it (bert-base: 0.5 GB).
    """

    def graph_outputs(buf: memoryview) -> list[onnx.ValueInfoProto]:
        found: list[onnx.ValueInfoProto] = []
        for field, wire, _, value, end in _fields(buf, 0, len(buf)):
            if field == _MODEL_GRAPH and wire == _LEN:
                found = [onnx.ValueInfoProto.FromString(bytes(buf[v:e]))
                         for f_, w, _, v, e in _fields(buf, value, end) if f_ == _GRAPH_OUTPUT and w == _LEN]  # fmt: skip
        return found

    return _read_mapped(path, graph_outputs)


# Protobuf field numbers (onnx.proto): ModelProto.graph, GraphProto.initializer and output, and the
# TensorProto fields the rewrite reads or writes.
_MODEL_GRAPH, _MODEL_OPSET_IMPORT, _GRAPH_INITIALIZER, _GRAPH_OUTPUT = 7, 8, 5, 12
_TENSOR_RAW_DATA, _TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION = 9, 13, 14
_LEN = 2  # wire type of strings, bytes and messages


def _externalized_model(buf: memoryview, location: str) -> bytes | None:
    """The model with its graph's large initializers pointing into ``location``; None if one is external already."""
    out = bytearray()
    for field, wire, start, value, end in _fields(buf, 0, len(buf)):
        if field == _MODEL_GRAPH and wire == _LEN:
            graph = _externalized_graph(buf, value, end, location)
            if graph is None:
                return None
            out += _tag(field, _LEN) + _varint_bytes(len(graph)) + graph
        else:
            out += buf[start:end]
    return bytes(out)


def _externalized_graph(buf: memoryview, begin: int, stop: int, location: str) -> bytes | None:
    out = bytearray()
    for field, wire, start, value, end in _fields(buf, begin, stop):
        if field != _GRAPH_INITIALIZER or wire != _LEN:
            out += buf[start:end]
            continue
        raw: tuple[int, int] | None = None
        kept = bytearray()
        for f, w, s, v, e in _fields(buf, value, end):
            if f == _TENSOR_DATA_LOCATION:
                if _varint(buf, v)[0] == onnx.TensorProto.EXTERNAL:
                    return None
                continue  # torch writes DEFAULT explicitly; EXTERNAL is written below
            if f == _TENSOR_RAW_DATA and w == _LEN and e - v >= EXTERNAL_MIN_BYTES:
                raw = (v, e - v)
            else:
                kept += buf[s:e]
        if raw is None:
            out += buf[start:end]
            continue
        kept += _tag(_TENSOR_DATA_LOCATION, 0) + _varint_bytes(onnx.TensorProto.EXTERNAL)
        for key, val in (("location", location), ("offset", str(raw[0])), ("length", str(raw[1]))):
            entry = _string_field(1, key) + _string_field(2, val)
            kept += _tag(_TENSOR_EXTERNAL_DATA, _LEN) + _varint_bytes(len(entry)) + entry
        out += _tag(field, _LEN) + _varint_bytes(len(kept)) + kept
    return bytes(out)


def _fields(buf: memoryview, pos: int, stop: int) -> Iterator[tuple[int, int, int, int, int]]:
    """A message's fields as (number, wire type, start of the field, start of its value, end)."""
    while pos < stop:
        key, value = _varint(buf, pos)
        wire = key & 7
        if wire == 0:
            end = _varint(buf, value)[1]
        elif wire == 1:
            end = value + 8
        elif wire == _LEN:
            size, value = _varint(buf, value)
            end = value + size
        elif wire == 5:
            end = value + 4
        else:
            raise ValueError(f"protobuf wire type {wire} at byte {pos} (groups are not used by onnx)")
        if end > stop:
            raise ValueError(f"protobuf field at byte {pos} runs past its message's end")
        yield key >> 3, wire, pos, value, end
        pos = end


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _varint_bytes(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _tag(field: int, wire: int) -> bytes:
    return _varint_bytes(field << 3 | wire)


def _string_field(field: int, text: str) -> bytes:
    data = text.encode()
    return _tag(field, _LEN) + _varint_bytes(len(data)) + data


def internalize(path: Path) -> None:
    """Put a graph's weights back inside it (a model under the protobuf limit ships that way), copied file to file."""
    inline = path.with_name(path.name + ".inline")
    save(load(path), inline, external=False, weights=path.parent)
    data_path(path).unlink(missing_ok=True)
    os.replace(inline, path)


def move(src: Path, dst: Path) -> Path:
    """Move a graph to ``dst`` with its external data, renamed ``<dst>_data``: a rename, never a rewrite of the weights.

    A graph whose data file has another name (the quantizer's ``<file>.data``) is given
    the new name in its tensors' ``location`` (a weightless rewrite of the graph).
    """
    if src == dst:
        return dst
    if all(p == src for p in src.parent.iterdir()):
        # Nothing beside it, so no data file: its weights are inside (and not read to find that out).
        delete(dst)
        os.replace(src, dst)
        return dst
    model = load(src)
    locations = {e.value for t in tensors(model.graph) for e in t.external_data if e.key == "location"}
    delete(dst)
    if not locations:
        os.replace(src, dst)
        return dst
    if len(locations) > 1:  # several data files (not ours): gathered into one
        save(onnx.load(str(src)), dst, external=True)
        for name in locations:
            (src.parent / name).unlink(missing_ok=True)
        src.unlink()
        return dst
    (name,) = locations
    os.replace(src.parent / name, data_path(dst))
    if name == data_path(dst).name:
        os.replace(src, dst)
        return dst
    for tensor in tensors(model.graph):
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = data_path(dst).name
    onnx.save_model(model, str(dst))
    src.unlink()
    return dst


def link(src: Path, dst: Path) -> None:
    """Give a graph a second name without a second copy of its weights: a hard link (a copy where links fail).

    A graph with external data names its data file inside it, and transformers.js in a browser
    fetches ``<dst>_data`` for ``dst``; so ``dst`` is rewritten (structure only, small) to name
    its own data file, which is the hard link.
    """
    delete(dst)
    external = data_path(src)
    if not external.exists():
        _hardlink(src, dst)
        return
    _hardlink(external, data_path(dst))
    model = load(src)
    for tensor in tensors(model.graph):
        for entry in tensor.external_data:
            if entry.key == "location" and entry.value == external.name:
                entry.value = data_path(dst).name
    onnx.save_model(model, str(dst))


def _hardlink(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # a file system without hard links (some network mounts)
        shutil.copyfile(src, dst)


def delete(graph: Path) -> None:
    """Remove a graph and its external data, whichever exist."""
    data_path(graph).unlink(missing_ok=True)
    graph.unlink(missing_ok=True)


def produce_branch_outputs(graph: onnx.GraphProto) -> int:
    """Give every ``If`` branch output an operation of its branch that makes it, every empty constant one too.

    Returns how many were rewritten. optimum's merged decoder answers the cross-attention cache
    on its cache branch with empty placeholders (``present.N.encoder.key``, shape
    ``[0, heads, 1, head_dim]``): ``Constant`` nodes in the export (behind a ``Cast`` in fp16),
    branch initializers once ONNX Runtime has optimized the graph; a branch may also hand an
    outer-scope value straight through. ONNX allows all of them; OpenVINO's ONNX frontend
    resolves no initializer or outer-scope name as a branch output ("declared as a graph output
    but is not produced by any operation") and reads an empty constant as a scalar (then "If
    operation with dynamic rank"). The rewrite computes the same values: an empty constant
    becomes ``ConstantOfShape`` of its shape, an initializer output a ``Constant`` node holding
    it, an outer-scope value goes through an ``Identity``. Nested branches included.
    """
    rewritten = 0
    for parent in graphs(graph):
        for node in parent.node:
            if node.op_type == "If":
                for _, branch in subgraphs(node):
                    rewritten += _produce_outputs(branch)
    return rewritten


def portable_branches(path: Path) -> int:
    """:func:`produce_branch_outputs` on a graph file, rewritten in place (external weights untouched); returns the count."""
    model = onnx.load(str(path), load_external_data=False)
    rewritten = produce_branch_outputs(model.graph)
    if rewritten:
        onnx.save_model(model, str(path))
        read_back(path, "onnx.save_model")
    return rewritten


def _produce_outputs(branch: onnx.GraphProto) -> int:
    from onnx import helper

    rewritten = 0
    initializers = {t.name: t for t in branch.initializer}
    producers = {out for n in branch.node for out in n.output}
    taken = producers | set(initializers) | {o.name for o in branch.output}
    for output in branch.output:
        if output.name in producers:
            continue
        if output.name in initializers:
            tensor = initializers.pop(output.name)
            branch.initializer.remove(tensor)
            branch.node.append(helper.make_node("Constant", [], [output.name], name=f"{output.name}/constant", value=tensor))
        else:  # an outer-scope value: branch outputs bind by position, so the branch may name it otherwise
            alias = f"{output.name}/passed"
            while alias in taken:
                alias += "_"
            taken.add(alias)
            branch.node.append(helper.make_node("Identity", [output.name], [alias], name=alias))
            output.name = alias
        rewritten += 1
    for i, node in enumerate(list(branch.node)):
        value = next((a.t for a in node.attribute if a.name == "value" and a.HasField("t")), None)
        if node.op_type == "Constant" and value is not None and 0 in value.dims:
            branch.node.remove(node)
            for at, made in enumerate(_empty(node.output[0], value), start=i):
                branch.node.insert(at, made)
            rewritten += 1
    return rewritten


def _empty(name: str, value: onnx.TensorProto) -> list[onnx.NodeProto]:
    """Nodes that make the empty tensor ``value`` under ``name``: ``ConstantOfShape`` of its shape."""
    import numpy as np
    from onnx import helper, numpy_helper

    shape = f"{name}/shape"
    dims = numpy_helper.from_array(np.array(list(value.dims), dtype=np.int64))
    zero = helper.make_tensor("zero", value.data_type, [1], [0])
    return [
        helper.make_node("Constant", [], [shape], name=shape, value=dims),
        helper.make_node("ConstantOfShape", [shape], [name], name=f"{name}/empty", value=zero),
    ]


def share_tied(model: onnx.ModelProto, weights: Path | None = None) -> dict[str, str]:
    """Keep one copy of a tied embedding: a top-level weight that is an embedding table transposed (read by a
    ``Gather``, or ONNX Runtime's ``EmbedLayerNormalization``), bit for bit, is dropped and its readers take a
    ``Transpose`` of the table. Returns ``{dropped: table}``.

    A model whose output projection is its input embedding (gpt2's ``lm_head`` and ``wte``, BERT's MLM decoder and
    word embeddings, most small LLMs) holds one tensor; torch.onnx writes it twice, the second transposed for the
    ``MatMul``: gpt2's fp32 file 652 MB, 498 MB without it. optimum removes it the same way, only where accelerate is
    installed. ONNX Runtime folds the ``Transpose`` of a constant as it loads the graph (at every optimization level
    but none), so its session and latency are as before (gpt2 and bert-base side by side: docs/benchmarks.md);
    OpenVINO and transformers.js give the same verdicts on the demo's graphs. ``weights``: where the tensors' external data files are (read
    only for the few of the right shapes, once each).
    """
    from onnx import helper

    graph = model.graph
    tables = {t.name: t for t in graph.initializer}
    shared: dict[str, str] = {}
    for copy, table in tie_candidates(graph):
        if copy not in shared and _transposed(_matrix(tables[table], weights), _matrix(tables[copy], weights)):
            shared[copy] = table
    if not shared:
        return shared
    taken = {out for sub in graphs(graph) for n in sub.node for out in (*n.output, n.name)} | set(tables)
    taken |= {i.name for sub in graphs(graph) for i in sub.input}
    renamed: dict[str, str] = {}
    for copy, table in shared.items():
        out = f"{table}_transposed"
        while out in taken:
            out += "_"
        taken.add(out)
        renamed[copy] = out
        graph.node.insert(0, helper.make_node("Transpose", [table], [out], name=out, perm=[1, 0]))
    for sub in graphs(graph):
        for node in sub.node:
            for i, name in enumerate(node.input):
                if name in renamed:
                    node.input[i] = renamed[name]
    drop_named(graph, "initializer", shared)
    drop_named(graph, "value_info", shared)
    return shared


def drop_named(graph: onnx.GraphProto, field: str, names: Collection[str]) -> None:
    """Remove the entries of one of ``graph``'s repeated fields (``initializer``, ``input``, ``value_info``) named in
    ``names``."""
    kept = [entry for entry in getattr(graph, field) if entry.name not in names]
    graph.ClearField(field)
    getattr(graph, field).extend(kept)


def has_tied(path: Path) -> bool:
    """Whether :func:`share_tied` would drop a weight of the graph file ``path``: compared in its data file, or, for a
    graph with its weights inside, parsed whole only where the shapes allow one (every decoder's: vocab x hidden)."""
    inside = not data_path(path).exists()
    model = structure(path) if inside else load(path)
    if not tie_candidates(model.graph):
        return False
    return bool(share_tied(onnx.load(str(path)) if inside else model, path.parent))


def tie_candidates(graph: onnx.GraphProto) -> list[tuple[str, str]]:
    """``(copy, table)`` pairs :func:`share_tied` compares: a top-level weight of an embedding table's transposed
    shape and type. Read from the graph alone (:func:`structure` will do)."""
    tables = {t.name: t for t in graph.initializer}
    gathered = {
        n.input[_TABLES[n.op_type]] for sub in graphs(graph) for n in sub.node
        if n.op_type in _TABLES and len(n.input) > _TABLES[n.op_type] and n.input[_TABLES[n.op_type]] in tables
    }  # fmt: skip
    fed = {i.name for i in graph.input}  # an initializer listed as an input may be fed another value: not a constant
    return [
        (copy.name, name)
        for name in sorted(gathered - fed)
        if len(tables[name].dims) == 2 and tables[name].data_type in _MATRIX_TYPES
        for copy in graph.initializer
        if copy.name not in gathered and copy.name not in fed and copy.data_type == tables[name].data_type
        and list(copy.dims) == [tables[name].dims[1], tables[name].dims[0]]
    ]


# Where an embedding table is read: a Gather's data, ONNX Runtime's fused BERT embedding's word embedding.
_TABLES = {"Gather": 0, "EmbedLayerNormalization": 2}
_MATRIX_TYPES: dict[int, str] = {onnx.TensorProto.FLOAT: "<f4", onnx.TensorProto.FLOAT16: "<f2"}


def _matrix(tensor: onnx.TensorProto, weights: Path | None) -> np.ndarray:
    """A 2-D weight's values, mapped from its data file or viewed in the graph's bytes: never a copy of it."""
    dtype, shape = np.dtype(_MATRIX_TYPES[tensor.data_type]), tuple(tensor.dims)
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        info = onnx.external_data_helper.ExternalDataInfo(tensor)
        if weights is None or Path(info.location).is_absolute() or ".." in Path(info.location).parts:
            raise ValueError(f"tensor {tensor.name!r}: its data file {info.location!r} is not in {weights}")
        return np.memmap(weights / info.location, dtype=dtype, mode="r", offset=info.offset or 0, shape=shape)
    if tensor.raw_data:
        return np.frombuffer(tensor.raw_data, dtype=dtype).reshape(shape)
    from onnx import numpy_helper

    return numpy_helper.to_array(tensor)  # values in the typed fields: a small tensor


def _transposed(table: np.ndarray, copy: np.ndarray, rows: int = 4096) -> bool:
    """Whether ``copy`` is ``table`` transposed, bit for bit (-0.0 is not 0.0), compared a block of rows at a time."""
    unsigned = np.dtype(f"<u{table.dtype.itemsize}")
    if not np.array_equal(table[0, :8].view(unsigned), copy[:8, 0].view(unsigned)):
        return False  # most pairs of the same shapes by chance differ here: read no further
    return all(
        np.array_equal(table[i : i + rows].view(unsigned), copy[:, i : i + rows].T.view(unsigned))
        for i in range(0, table.shape[0], rows)
    )
