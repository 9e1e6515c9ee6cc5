"""The optimize stage: fp32 optimized, fp16, int8, uint8 and q4 variants of every exported graph.

Per component, in this order (it matters):

1. int8  ``quantize_dynamic`` (per-channel QInt8) on the PLAIN export: it fails on
         a graph already run through the transformers optimizer. Convs whose weight is
         computed (weight norm: wav2vec2's positional conv) stay float32, and so do the
         MatMuls that read a GELU's output (FFN down-projections): see ``_GELU_OPS``.
         uint8 is the same with QUInt8 weights.
   q4    4-bit block-wise weight-only quantization of the plain export's MatMuls
         (``MatMulNBits``), as transformers.js's ``q4``: see :func:`_q4`.
2. fp32  the onnxruntime transformers optimizer where the model type maps to one of
         its fusers; else, or when it fused nothing, broke the graph or changed its
         outputs, ONNX Runtime's offline graph optimization (ORT_ENABLE_EXTENDED: ALL
         writes hardware-specific layouts); else the plain export, unchanged. With
         ``Settings.optimize`` off (``--no-optimize``) the plain export, untouched and unrun.
3. fp16  the optimized fp32 graph converted with float32 inputs and outputs kept; where
         ORT's converter cannot type it (ORT-optimized If branches: merged decoders),
         or with ``--no-optimize``, the plain export converted the same way.
4. the optimized fp32 graph replaces ``<component>.onnx``.

Each variant's graph is written under its transformers.js name and hard-linked under the
other names the same graph answers to (int8: ``model_quantized.onnx`` = ``model_int8.onnx``;
:data:`~zoo_convert.records.JS_DTYPES`), so a second name costs no disk.

Every candidate is written to a scratch folder and checked against the plain export
in ONNX Runtime on generated inputs before it is moved into ``onnx/``; fp16 and int8
graphs are also loaded in a child process, as ONNX Runtime can crash on them. A variant that
cannot be made is returned with ``details["error"]`` and no files; only fp32, which
the others are measured against, raises :class:`OptimizeError`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from .. import onnx_graph
from ..errors import FailureKind, OptimizeError, first_line, is_our_bug, storage_fault
from ..records import Settings, variant_files
from ..runtime import ort_session
from . import Artifact, Component, ExportedModel

# HF model_type -> onnxruntime.transformers.optimizer MODEL_TYPES key. Follows optimum's
# ORTConfigManager, limited to fusers ORT ships; unlisted types get ORT offline optimization.
FUSION_TYPES = {
    "albert": "bert",
    "bart": "bart",
    "bert": "bert",
    "camembert": "bert",
    "clip": "clip",
    "deberta": "bert",
    "deberta-v2": "bert",
    "dinov2": "vit",
    "distilbert": "bert",
    "electra": "bert",
    "gpt2": "gpt2",
    "gpt_neo": "gpt2",
    "gpt_neox": "gpt2",
    "gptj": "gpt2",
    "marian": "bart",
    "mbart": "bart",
    "modernbert": "bert",
    "mpnet": "bert",
    "roberta": "bert",
    "swin": "swin",
    "t5": "bert",  # the t5 fuser emits RelativePositionBias, which has no CPU kernel
    "vit": "vit",
    "whisper": "bart",
    "xlm-roberta": "bert",
}
# Contrib ops the fusers emit; fusion applied when the optimized graph has more of them.
_FUSED_OPS = (
    "Attention",
    "MultiHeadAttention",
    "GroupQueryAttention",
    "EmbedLayerNormalization",
    "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "SimplifiedLayerNormalization",
    "LayerNormalization",
    "BiasGelu",
    "FastGelu",
    "Gelu",
    "QuickGelu",
    "GemmFastGelu",
    "BiasAdd",
    "BiasSplitGelu",
    "RotaryEmbedding",
    "FusedMatMul",
    "FusedConv",
    "FusedGemm",
    "MatMulNBits",
)


def variant_file(component: str, variant: str) -> str:
    """File name of one component's graph in one variant (``encoder_model_fp16.onnx``)."""
    return variant_files(component, variant)[0]


def optimize(exported: ExportedModel, variants: tuple[str, ...], settings: Settings) -> dict[str, Artifact]:
    """Build the requested variants of every component; fp32 failing raises, others fail as data."""
    onnx_dir = exported.out_dir / "onnx"
    artifacts = {v: Artifact(variant=v, files={}, details={"components": {}}) for v in variants}
    with tempfile.TemporaryDirectory(dir=onnx_dir, prefix=".optimize-") as scratch:
        for component in exported.components:
            made = _component(exported, component, variants, settings, Path(scratch))
            for variant, (path, details) in made.items():
                art = artifacts[variant]
                art.details["components"][component.name] = details
                if path is None:
                    found = details.pop("traceback", None)  # kept on the artifact, not in the recorded details
                    art.traceback = art.traceback or found
                    art.details.setdefault("failure_kind", details["failure_kind"])
                    art.details.setdefault("error", f"{variant} of {component.name}: {details['error']}")
                else:
                    art.files[component.name] = path
    for art in artifacts.values():
        if "error" in art.details:
            _discard(art)
        _summarize(art)
        for component, path in art.files.items():
            for alias in variant_files(component, art.variant)[1:]:
                onnx_graph.link(path, path.with_name(alias))
    return artifacts


def _discard(art: Artifact) -> None:
    """Remove a failed variant's other components: half a variant would only mislead a loader."""
    for path in art.files.values():
        onnx_graph.delete(path)
    art.files.clear()


def _component(
    exported: ExportedModel, component: Component, variants: tuple[str, ...], settings: Settings, scratch: Path
) -> dict[str, tuple[Path | None, dict[str, Any]]]:
    """All variants of one graph; the plain export is overwritten last."""
    plain = component.path
    external = onnx_graph.disk_size(plain) > settings.external_data_threshold
    made: dict[str, tuple[Path | None, dict[str, Any]]] = {}
    work = scratch / component.name
    work.mkdir()
    final = {v: plain.with_name(variant_file(component.name, v)) for v in variants}

    for variant in ("int8", "uint8"):
        if variant in variants:
            made[variant] = _guarded(functools.partial(_int8, plain, work / f"{variant}.onnx", external, variant))
    if "q4" in variants:
        made["q4"] = _guarded(lambda: _q4(plain, work / "q4.onnx", external))
    if "fp32" in variants or "fp16" in variants:
        t0 = time.perf_counter()
        try:
            optimized, fp32_details = _fp32(exported, component, work, external, settings)
        except Exception as exc:  # noqa: BLE001 - re-raised as this variant's error
            if is_our_bug(exc):
                raise
            raise OptimizeError(f"fp32 of {component.name}: {first_line(exc)}") from exc
        fp32_details["seconds"] = round(time.perf_counter() - t0, 3)
        if "fp32" in variants:
            made["fp32"] = (optimized, fp32_details)
    if "fp16" in variants:
        made["fp16"] = _guarded(lambda: _fp16(optimized, plain, fp32_details["method"], work / "fp16.onnx", external))

    # Move into onnx/ last: the fp32 file replaces the plain export every other variant read.
    placed: dict[str, tuple[Path | None, dict[str, Any]]] = {}
    for variant in variants:
        path, details = made[variant]
        placed[variant] = (onnx_graph.move(path, final[variant], external=external) if path else None, details)
    return placed


def _guarded(make: Callable[[], tuple[Path, dict[str, Any]]]) -> tuple[Path | None, dict[str, Any]]:
    """Run one variant's builder; its failure becomes data instead of failing the model."""
    t0 = time.perf_counter()
    try:
        path, details = make()
    except Exception as exc:  # noqa: BLE001 - a variant that cannot be made is recorded, not raised
        if storage_fault(exc) is not None:
            raise  # a full disk is no fault of this variant: the whole job is redone
        kind = FailureKind.INTERNAL if is_our_bug(exc) else FailureKind.OPTIMIZE_ERROR
        path, details = None, {"error": first_line(exc), "failure_kind": kind.value}
        if kind is FailureKind.INTERNAL:
            details["traceback"] = traceback.format_exc()
    details["seconds"] = round(time.perf_counter() - t0, 3)
    return path, details


def _int8(plain: Path, out: Path, external: bool, variant: str = "int8") -> tuple[Path, dict[str, Any]]:
    """Dynamic 8-bit quantization of the plain export (per-channel: ~0.99 vs ~0.95 cosine per-tensor).

    int8 has signed weights, uint8 unsigned ones; activations are uint8 in both (dynamic quantization has no other).
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    weight_type = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}[variant]
    graph = onnx_graph.load(plain).graph
    computed = _computed_weight_convs(graph)
    post_gelu = _post_gelu_matmuls(graph)
    quantize_dynamic(
        plain,
        out,
        per_channel=True,
        weight_type=weight_type,
        nodes_to_exclude=computed + post_gelu,
        use_external_data_format=external,
        # Merged decoders keep their layers inside If branches.
        extra_options={"EnableSubgraph": True},
    )
    census = _census(out)
    quantized = {op: census[op] for op in ("DynamicQuantizeLinear", "MatMulInteger", "ConvInteger") if census[op]}
    if not quantized:
        raise OptimizeError("quantize_dynamic quantized no operator")
    _load(out)
    details: dict[str, Any] = {
        "quantization": "dynamic",
        "per_channel": True,
        "weight_type": weight_type.name,
        "quantized_ops": quantized,
        "float32_matmuls": len(post_gelu),
    }
    return out, {**details, "float32_convs": computed} if computed else details


# transformers.js's q4 (its scripts/quantize.py): symmetric blocks of 32 weights, ORT's default accuracy level.
Q4_BLOCK_SIZE = 32


def _q4(plain: Path, out: Path, external: bool) -> tuple[Path, dict[str, Any]]:
    """4-bit weight-only quantization of the plain export's MatMuls with a constant weight (``MatMulNBits``).

    Weight-only: activations stay float32, so the GELU exclusion of int8 does not apply. The
    plain export, not the fused one: the fusers fold the Q/K/V MatMuls into Attention nodes,
    which MatMulNBits cannot reach. Gather (embeddings), Gemm and Conv weights stay float32.
    """
    with _quiet_root(), _quiet(_NBITS_MODULE):  # it logs every node it visits at INFO
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        quantizer = MatMulNBitsQuantizer(onnx.load(str(plain)), bits=4, block_size=Q4_BLOCK_SIZE, is_symmetric=True)
        quantizer.process()
    onnx_graph.save(quantizer.model.model, out, external=external)
    census = _census(out)
    if not census["MatMulNBits"]:
        raise OptimizeError("MatMulNBits quantized no MatMul (none has a constant weight)")
    _load(out)
    return out, {
        "quantization": "weight-only",
        "bits": 4,
        "block_size": Q4_BLOCK_SIZE,
        "symmetric": True,
        "quantized_ops": {"MatMulNBits": census["MatMulNBits"]},
        "float32_matmuls": census["MatMul"],
    }


_NBITS_MODULE = "onnxruntime.quantization.matmul_nbits_quantizer"


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """Hold a library logger at WARNING or above for a while (its INFO lines would flood the job's log)."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(max(logging.WARNING, log.getEffectiveLevel()))
    try:
        yield
    finally:
        log.setLevel(level)


@contextlib.contextmanager
def _quiet_root() -> Iterator[None]:
    """Undo what importing the MatMulNBits quantizer does to the whole process: ``logging.basicConfig(level=INFO)``."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def _computed_weight_convs(graph: onnx.GraphProto, outer: frozenset[str] = frozenset()) -> list[str]:
    """Convs whose weight is computed, not stored: the quantizer needs it as an initializer."""
    stored = outer | {t.name for t in graph.initializer}
    names = []
    for node in graph.node:
        if node.op_type in ("Conv", "ConvTranspose") and node.input[1] not in stored:
            names.append(node.name)
        for _, sub in onnx_graph.subgraphs(node):
            names.extend(_computed_weight_convs(sub, stored))
    return names


# Activations whose output distribution is heavy-tailed: a long positive tail and a pile-up
# just below zero. One dynamic scale per tensor spends the int8 range on the tail and rounds
# most values to a few levels, so the MatMul reading them (a transformer's FFN down-projection)
# loses the most accuracy (all-MiniLM-L6-v2: token cosine 0.9896 quantized, 0.9941 float).
_GELU_OPS = frozenset({"Gelu", "FastGelu", "BiasGelu", "Erf", "Tanh"})  # Erf: exact GELU, Tanh: gelu_new
# Walked through back from a MatMul: the elementwise ops a decomposed GELU is spelled with
# (x * 0.5 * (1 + erf(x / sqrt 2))) and a GLU's gate product; six hops reach the Erf of a
# gated GELU (modernbert, gemma). Gemm is not looked at: dynamic quantization leaves it float.
_PASS_THROUGH = frozenset({"Mul", "Add", "Div", "Cast"})
_GELU_HOPS = 6


def _post_gelu_matmuls(graph: onnx.GraphProto, outer: dict[str, onnx.NodeProto] | None = None) -> list[str]:
    """MatMul nodes whose activation input comes from a GELU, in this graph and its branches."""
    producers = {**(outer or {}), **{o: node for node in graph.node for o in node.output}}
    names = []
    for node in graph.node:
        if node.op_type == "MatMul" and _after_gelu(node.input[0], producers):
            names.append(node.name)
        for _, sub in onnx_graph.subgraphs(node):
            names.extend(_post_gelu_matmuls(sub, producers))
    return names


def _after_gelu(tensor: str, producers: dict[str, onnx.NodeProto]) -> bool:
    """Whether a GELU op is found walking back from a tensor through a few elementwise ops."""
    frontier = [tensor]
    for _ in range(_GELU_HOPS):
        nodes = [producers[t] for t in frontier if t in producers]
        if any(n.op_type in _GELU_OPS for n in nodes):
            return True
        frontier = [t for n in nodes if n.op_type in _PASS_THROUGH for t in n.input]
    return False


def _fp32(
    exported: ExportedModel,
    component: Component,
    work: Path,
    external: bool,
    settings: Settings,
) -> tuple[Path, dict[str, Any]]:
    """The first candidate that loads and matches the plain export: fusion, ORT offline, unchanged."""
    if not settings.optimize:
        return component.path, {
            "model_type": exported.checkpoint.model_type,
            "method": "none",
            "fusion_applied": False,
            "fused_ops": {},
            "note": "optimization off (--no-optimize)",
        }
    feeds = _feeds(component.path, exported.checkpoint.config)
    tolerance = settings.tolerances["fp32"].max_abs if "fp32" in settings.tolerances else 1e-4
    reference = _run(component.path, feeds, settings)
    before = _census(component.path)
    notes: list[str] = []
    model_type = exported.checkpoint.model_type
    fusion_type = FUSION_TYPES.get(model_type)
    details: dict[str, Any] = {
        "model_type": model_type,
        "optimizer_model_type": fusion_type,
        "checked_against_plain": reference is not None,
    }
    if fusion_type is None:
        notes.append(f"model_type {model_type!r} has no transformers optimizer fuser")
    else:
        try:
            out, stats = _fuse(component.path, work / "fused.onnx", fusion_type, exported.checkpoint.config, external)
            details["fused_operator_statistics"] = stats
            gained = _gained(before, _census(out))
            if not gained:
                notes.append(f"transformers optimizer ({fusion_type}) fused nothing")
            elif (why := _mismatch(reference, _run(out, feeds, settings), tolerance)) is not None:
                notes.append(f"transformers optimizer ({fusion_type}) output changed: {why}")
            else:
                return out, {**details, "method": "transformers_optimizer", "fusion_applied": True, "fused_ops": gained}
        except Exception as exc:  # noqa: BLE001 - a broken fuser falls back to ORT's own optimizer
            if is_our_bug(exc):
                raise
            notes.append(f"transformers optimizer ({fusion_type}) failed: {first_line(exc)}")

    out = _ort_offline(component.path, work / "offline.onnx", external)
    why = _mismatch(reference, _run(out, feeds, settings), tolerance)
    if why is None:
        return out, {
            **details,
            "method": "ort_offline",
            "fusion_applied": False,
            "fused_ops": _gained(before, _census(out)),
            "note": "; ".join(notes),
        }
    notes.append(f"ORT offline optimization output changed: {why}")
    return component.path, {**details, "method": "none", "fusion_applied": False, "note": "; ".join(notes)}


def _fuse(plain: Path, out: Path, fusion_type: str, config: dict[str, Any], external: bool) -> tuple[Path, dict]:
    """The transformers optimizer's Python fusions only (opt_level 0): no hardware-specific ops."""
    from onnxruntime.transformers.optimizer import optimize_model

    heads, hidden = _heads_hidden(config)
    optimizer = optimize_model(
        str(plain), model_type=fusion_type, num_heads=heads, hidden_size=hidden, opt_level=0, use_gpu=False
    )
    stats = {op: n for op, n in optimizer.get_fused_operator_statistics().items() if n}
    onnx_graph.save(optimizer.model, out, external=external)
    return out, stats


def _ort_offline(plain: Path, out: Path, external: bool) -> Path:
    """ONNX Runtime's own graph optimizations, saved instead of run."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.optimized_model_filepath = str(out)
    if external:
        opts.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", onnx_graph.data_path(out).name
        )
        opts.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", str(onnx_graph.EXTERNAL_MIN_BYTES)
        )
    ort.InferenceSession(str(plain), opts, providers=["CPUExecutionProvider"])
    return out


def _fp16(source: Path, plain: Path, fp32_method: str, out: Path, external: bool) -> tuple[Path, dict[str, Any]]:
    """float16 weights and compute, float32 inputs and outputs so the same feeds work."""
    if source == plain:  # fp32 is the plain export (--no-optimize, or nothing applied): no second try
        onnx_graph.save(_to_fp16(plain), out, external=external)
        _load(out)
        return out, {"source": "plain export", "io": "keep_io_types"}
    try:
        onnx_graph.save(_to_fp16(source), out, external=external)
        _load(out)
        return out, {"source": f"fp32 ({fp32_method})", "io": "keep_io_types"}
    except Exception as exc:  # noqa: BLE001 - retried below from the plain export
        if is_our_bug(exc):
            raise
        first = first_line(exc)
    # ORT's converter cannot type ORT-optimized If branches (merged decoders): convert the plain export.
    onnx_graph.save(_to_fp16(plain), out, external=external)
    _load(out)
    return out, {"source": "plain export", "io": "keep_io_types", "note": f"from the fp32 graph failed: {first}"}


def _to_fp16(source: Path) -> onnx.ModelProto:
    """float16 weights and compute, float32 inputs and outputs kept."""
    from onnxruntime.transformers.onnx_model import OnnxModel

    proto = onnx.load(str(source))
    _unshadow_branch_outputs(proto.graph)
    model = OnnxModel(proto)
    # Symbolic shape inference types the contrib ops (Attention, SkipLayerNormalization) the fusers emit.
    # When it gives up it dumps sym_shape_infer_temp.onnx (+ uuid .data files) into the cwd: keep that out of ours.
    with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch):
        model.convert_float_to_float16(use_symbolic_shape_infer=True, keep_io_types=True)
    return model.model


def _unshadow_branch_outputs(graph: onnx.GraphProto, outer: frozenset[str] = frozenset()) -> None:
    """Rename If/Loop branch outputs that reuse an outer name (optimum's merged decoders do).

    ORT's fp16 cleanup maps value names to nodes across all graphs, so a branch's ``logits``
    hides the If node that makes the top-level ``logits`` and the If is pruned; it also drops
    Constants no node reads, so a branch output made by a Constant gets an Identity after it.
    Branch outputs bind to the If's outputs by position: renaming them changes nothing else.
    """
    names = outer | {v.name for v in [*graph.input, *graph.output, *graph.initializer]}
    names |= {o for node in graph.node for o in node.output}
    for node in graph.node:
        for attr_name, sub in onnx_graph.subgraphs(node):
            made = {o: n for n in sub.node for o in n.output}
            prefix = f"{node.name or node.op_type}/{attr_name}/"
            renamed = {o.name: prefix + o.name for o in sub.output if o.name in names and o.name in made}
            for n in sub.node:
                n.output[:] = [renamed.get(x, x) for x in n.output]
                n.input[:] = [renamed.get(x, x) for x in n.input]
            for value in sub.value_info:
                value.name = renamed.get(value.name, value.name)
            for out in sub.output:
                producer = made.get(out.name)
                out.name = renamed.get(out.name, out.name)
                if producer is not None and producer.op_type == "Constant":
                    producer.output[0] = out.name + "/constant"
                    sub.node.append(onnx.helper.make_node("Identity", [out.name + "/constant"], [out.name]))
            _unshadow_branch_outputs(sub, names)


LOAD_TIMEOUT_S = 300.0


def _open_session(path: str) -> None:
    ort_session(Path(path), threads=1)


def _load(path: Path, open_session: Callable[[str], None] = _open_session) -> None:
    """Fail now, not in verify, if ONNX Runtime's CPU kernels cannot load this graph.

    In a forked child: ORT's CPU graph transformers segfault on some fp16 graphs (wavlm),
    and that must fail this variant, not kill the whole job. A fork inherits the imported
    onnxruntime (~20 ms, where a fresh interpreter costs ~400 ms per graph); the child
    touches neither torch nor OpenMP, so forking a process that ran torch is safe here.
    """
    import onnxruntime  # noqa: F401 - imported before the fork, so the child pays nothing

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running any parent cleanup
        os.close(read)
        code = 0
        try:
            open_session(str(path))
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent as text
            os.write(write, str(exc).strip().encode()[-2000:])
            code = 1
        os._exit(code)
    os.close(write)
    status = _wait(pid, LOAD_TIMEOUT_S)  # before reading: a hung child never closes the pipe
    with os.fdopen(read, "rb") as pipe:
        message = pipe.read().decode(errors="replace")
    if status is None:
        raise OptimizeError(f"ONNX Runtime did not load {path.name} within {LOAD_TIMEOUT_S:g} s")
    if os.WIFSIGNALED(status):
        raise OptimizeError(f"ONNX Runtime crashed (signal {os.WTERMSIG(status)}) loading {path.name}")
    if os.WEXITSTATUS(status) != 0:
        lines = message.splitlines() or [f"exit status {os.WEXITSTATUS(status)}"]
        raise OptimizeError(f"ONNX Runtime cannot load {path.name}: {lines[-1]}")


def _wait(pid: int, timeout_s: float) -> int | None:
    """The child's wait status, or None after killing it at the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.005)


def _heads_hidden(config: dict[str, Any]) -> tuple[int, int]:
    """Attention heads and hidden size from an HF config; 0 lets the fuser detect them from the graph."""
    heads = _first_int(config, ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads", "n_heads"))
    hidden = _first_int(config, ("hidden_size", "n_embd", "d_model", "dim"))
    if "d_kv" in config and heads and hidden and config["d_kv"] * heads != hidden:
        hidden = config["d_kv"] * heads  # T5's attention width is heads * d_kv, not d_model
    return heads, hidden


def _first_int(config: dict[str, Any], keys: tuple[str, ...]) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if value is not None:
            return 0  # per-stage lists (swin): width varies, let the fuser detect it
    return 0


def _feeds(path: Path, config: dict[str, Any]) -> dict[str, np.ndarray]:
    """Inputs for a plain-vs-candidate check, built from the graph's declared inputs and the config."""
    rng = np.random.default_rng(0)
    sizes = _dim_sizes(config)
    feeds: dict[str, np.ndarray] = {}
    for inp in onnx_graph.inputs(path):
        tensor = inp.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else _dim(d.dim_param, sizes) for d in tensor.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        feeds[inp.name] = _values(inp.name, shape, dtype, config, rng)
    return feeds


def _dim_sizes(config: dict[str, Any]) -> dict[str, int]:
    image = config.get("image_size", 32)
    image = image[0] if isinstance(image, (list, tuple)) else image
    return {
        "batch_size": 2,
        "num_channels": int(config.get("num_channels", 3)),
        "height": int(image),
        "width": int(image),
        "feature_size": int(config.get("num_mel_bins", config.get("feature_size", 80))),
    }


def _dim(name: str, sizes: dict[str, int]) -> int:
    """A symbolic dimension's test size; past lengths differ from current ones to catch mix-ups."""
    if name in sizes:
        return sizes[name]
    if "+" in name:  # optimum writes e.g. "past_sequence_length + sequence_length"
        return sum(_dim(part.strip(), sizes) for part in name.split("+"))
    if "batch" in name:
        return 2
    return 3 if "past" in name else 5


def _values(
    name: str, shape: list[int], dtype: np.dtype, config: dict[str, Any], rng: np.random.Generator
) -> np.ndarray:
    if dtype == np.bool_:
        return np.ones(shape, dtype=bool)  # use_cache_branch: take the with-past branch
    if np.issubdtype(dtype, np.integer):
        if "mask" in name:
            return np.ones(shape, dtype=dtype)
        if "input_ids" in name:
            return rng.integers(0, min(int(config.get("vocab_size", 100)), 100), shape).astype(dtype)
        return np.zeros(shape, dtype=dtype)  # token types, positions: 0 is always valid
    return rng.standard_normal(shape).astype(dtype)


def _run(path: Path, feeds: dict[str, np.ndarray], settings: Settings) -> list[np.ndarray] | None:
    """Outputs of one graph on the feeds; None when the plain graph itself cannot run them."""
    # Load without further optimization: the check is of the graph as written.
    session = ort_session(path, threads=settings.threads, optimize=False)
    try:
        return session.run(None, feeds)
    except Exception:  # noqa: BLE001 - generated inputs don't fit every model; then only loading is checked
        return None


def _mismatch(reference: list[np.ndarray] | None, candidate: list[np.ndarray] | None, tolerance: float) -> str | None:
    """Why a candidate's outputs differ from the plain export's; None when they agree or can't be compared."""
    if reference is None or candidate is None:
        return None
    for i, (ref, got) in enumerate(zip(reference, candidate, strict=True)):
        if ref.shape != got.shape:
            return f"output {i} shape {got.shape} != {ref.shape}"
        if not np.issubdtype(ref.dtype, np.floating):
            continue
        worst = float(np.max(np.abs(ref.astype(np.float64) - got.astype(np.float64)), initial=0.0))
        if not worst <= tolerance:
            return f"output {i} max abs {worst:.3g} > {tolerance:g}"
    return None


def _census(path: Path) -> Counter[str]:
    return onnx_graph.op_census(onnx_graph.load(path).graph)


def _gained(before: Counter[str], after: Counter[str]) -> dict[str, int]:
    return {op: after[op] - before[op] for op in _FUSED_OPS if after[op] > before[op]}


def _summarize(art: Artifact) -> None:
    """Variant-level facts over all components, for the record."""
    parts = art.details["components"].values()
    art.details["seconds"] = round(sum(p.get("seconds", 0.0) for p in parts), 3)
    if art.variant == "fp32":
        art.details["fusion_applied"] = any(p.get("fusion_applied") for p in parts)
        art.details["fused_ops"] = dict(sum((Counter(p.get("fused_ops", {})) for p in parts), Counter()))
        art.details["methods"] = sorted({p["method"] for p in parts if "method" in p})
    if art.variant in ("int8", "uint8"):
        art.details["quantization"] = f"dynamic {'QInt8' if art.variant == 'int8' else 'QUInt8'} per-channel"
    if art.variant == "q4":
        art.details["quantization"] = f"weight-only 4-bit MatMulNBits, symmetric blocks of {Q4_BLOCK_SIZE}"
    if "error" in art.details:
        art.details.setdefault("failure_kind", FailureKind.OPTIMIZE_ERROR.value)
