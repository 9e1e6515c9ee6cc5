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

import os
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import onnx

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


def load(path: Path) -> onnx.ModelProto:
    """A graph's structure without its external weights: enough to count, name and inspect it."""
    return onnx.load(str(path), load_external_data=False)


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


def save(model: onnx.ModelProto, path: Path, *, external: bool) -> None:
    """Write a graph, its weights in :func:`data_path` when ``external``, else inside the file."""
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
        onnx.save_model(model, str(path))


def externalize(path: Path) -> None:
    """Move an inline graph's weights into :func:`data_path` beside it; a graph already external is left alone."""
    from onnx.external_data_helper import uses_external_data

    model = onnx.load(str(path), load_external_data=False)
    if any(uses_external_data(t) for t in tensors(model.graph)):
        return
    save(model, path, external=True)


def internalize(path: Path) -> None:
    """Put a graph's weights back inside it (a model under the protobuf limit ships that way)."""
    save(onnx.load(str(path)), path, external=False)


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
