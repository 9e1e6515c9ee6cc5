"""Verify stage: ONNX Runtime against PyTorch, per output, at several input shapes.

Inputs come from each component's optimum OnnxConfig (the same generators
optimum's own validation uses), at every ``settings.verify_shapes`` (batch,
sequence) pair rather than the export's dummy shape, so dynamic axes are
exercised. Text inputs are replaced by real tokenized English when the
checkpoint ships a tokenizer: random ids understate quantization error.
Decoders run with a populated past (past length = sequence), and a merged
decoder is checked on both of its branches.

The PyTorch side runs once per component, branch and shape; its outputs and
the ORT sessions are memoized on ``ExportedModel.cache`` so verifying and
benchmarking several variants never repeats a forward pass or a session load.
"""

from __future__ import annotations

import contextlib
import copy
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import VerifyError
from ..records import OutputCheck, Settings, Tolerance
from . import Artifact, Component, ExportedModel, Verification
from .export import processor_shapes

# Fixed text, so every run and every variant sees the same tokens.
SENTENCES = (
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "ONNX Runtime executes exported transformer models on many kinds of hardware.",
    "She sells sea shells by the sea shore, and the shells she sells are surely seashells.",
    "In 1969, two astronauts walked on the Moon while millions watched on television.",
    "Please translate this sentence into French before the meeting starts tomorrow.",
)
# Raw-audio models see ``sequence * AUDIO_SAMPLES_PER_STEP`` samples at a verify shape.
AUDIO_SAMPLES_PER_STEP = 1000
_NO_CACHE, _CACHE = "/no-cache", "/cache"
_ORT_FLOAT = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


@dataclass
class Case:
    """One component's inputs at one shape, and PyTorch's outputs for them.

    Attributes:
        label: the shape label recorded in OutputCheck.shape (``3x19``, ``1x7/cache``).
        torch_inputs: keyword arguments of the torch module's forward.
        feed: ONNX Runtime inputs by graph input name (fp32 / int64 numpy).
        reference: PyTorch outputs by ONNX output name.
        outputs: the graph outputs this case checks (a merged decoder's cache branch
            passes the constant cross-attention cache through unchecked, as optimum does).
        config: the OnnxConfig (branch) that generated it; its patcher wraps the torch module.
    """

    label: str
    torch_inputs: dict[str, Any]
    feed: dict[str, np.ndarray]
    reference: dict[str, np.ndarray]
    outputs: tuple[str, ...]
    config: Any


def verify(exported: ExportedModel, artifact: Artifact, settings: Settings) -> Verification:
    """Compare ``artifact`` against PyTorch at every verify shape; numbers decide, errors raise VerifyError."""
    tol = settings.tolerances.get(artifact.variant)
    if tol is None:
        raise VerifyError(f"no tolerance configured for variant {artifact.variant!r}")
    prefix = len(exported.components) > 1
    checks: list[OutputCheck] = []
    for comp in exported.components:
        session = ort_session(exported, artifact, comp, settings)
        for batch, seq in settings.verify_shapes:
            for case in cases(exported, comp, batch, seq, settings, audio_samples=seq * AUDIO_SAMPLES_PER_STEP):
                got = _run_ort(session, case, comp)
                for name, ort_value in got.items():
                    output = f"{comp.name}/{name}" if prefix else name
                    checks.append(compare(output, case.label, case.reference[name], ort_value, tol))
    failed = [c for c in checks if not c.passed]
    if not failed:
        return Verification(passed=True, checks=tuple(checks))
    worst = max(failed, key=lambda c: (np.nan_to_num(c.max_abs, nan=np.inf), -c.cosine))
    message = (
        f"{len(failed)}/{len(checks)} output checks failed; worst {worst.output} at {worst.shape}: "
        f"max abs {worst.max_abs:.3g} (tolerance {tol.max_abs:g}), cosine {worst.cosine:.6f} "
        f"(min {tol.min_cosine:g}), nan {worst.nan}, inf {worst.inf}"
    )
    return Verification(passed=False, checks=tuple(checks), message=message)


def compare(output: str, shape: str, ref: np.ndarray, got: np.ndarray, tol: Tolerance) -> OutputCheck:
    """Error statistics of one ONNX output against its PyTorch reference, judged against ``tol``."""
    got = np.asarray(got)
    floating = got.dtype.kind == "f"
    nan = int(np.isnan(got).sum()) if floating else 0
    inf = int(np.isinf(got).sum()) if floating else 0
    if ref.shape != got.shape:
        return OutputCheck(output, shape, float("inf"), float("inf"), float("inf"), 0.0, nan, inf, passed=False)
    r, g = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
    finite_r, finite_g = np.isfinite(r), np.isfinite(g)
    # Non-finite values only count against ORT where PyTorch had a finite value.
    finite_mismatch = int((finite_r != finite_g).sum())
    both = finite_r & finite_g
    r, g = r[both], g[both]
    diff = np.abs(r - g)
    max_abs = float(diff.max()) if diff.size else 0.0
    mean_abs = float(diff.mean()) if diff.size else 0.0
    max_rel = float((diff / np.maximum(np.abs(r), 1e-6)).max()) if diff.size else 0.0
    norms = float(np.linalg.norm(r) * np.linalg.norm(g))
    cosine = float(r @ g / norms) if norms > 0 else (1.0 if max_abs == 0.0 else 0.0)
    passed = finite_mismatch == 0 and max_abs <= tol.max_abs and cosine >= tol.min_cosine
    return OutputCheck(output, shape, max_abs, max_rel, mean_abs, cosine, nan, inf, passed=passed)


def ort_session(exported: ExportedModel, artifact: Artifact, comp: Component, settings: Settings) -> Any:
    """The (memoized) ONNX Runtime session of ``comp`` in ``artifact``, with the job's thread budget."""
    import onnxruntime as ort

    path = artifact.files.get(comp.name)
    if path is None:
        raise VerifyError(f"{artifact.variant} artifact has no graph for component {comp.name!r}")
    sessions = exported.cache.setdefault("ort", {})
    key = (str(path), settings.threads, tuple(settings.providers))
    if key not in sessions:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = settings.threads
        opts.inter_op_num_threads = 1
        try:
            # A GPU row that lands on a CPU-only build runs on what is there rather than failing.
            providers = [p for p in settings.providers if p in ort.get_available_providers()] or ["CPUExecutionProvider"]
            sessions[key] = ort.InferenceSession(str(path), sess_options=opts, providers=providers)
        except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
            raise VerifyError(f"ONNX Runtime cannot load {Path(path).name}: {exc}") from exc
    return sessions[key]


def cases(
    exported: ExportedModel, comp: Component, batch: int, seq: int, settings: Settings, *, audio_samples: int
) -> list[Case]:
    """Inputs and PyTorch outputs of ``comp`` at one shape, one Case per decoder branch (memoized)."""
    memo = exported.cache.setdefault("cases", {})
    key = (comp.name, batch, seq, audio_samples)
    if key not in memo:
        if comp.onnx_config is None or comp.torch_module is None:
            raise VerifyError(f"component {comp.name} carries no OnnxConfig/torch module to generate inputs from")
        seq = _clamp_sequence(comp.onnx_config, seq)
        found = []
        for suffix, config, outputs in _branches(comp.onnx_config):
            label = f"{batch}x{seq}{suffix}"
            found.append(_make_case(exported, comp, config, outputs, label, batch, seq, audio_samples, settings))
        memo[key] = found
    return memo[key]


def _branches(config: Any) -> list[tuple[str, Any, tuple[str, ...]]]:
    """(label suffix, config, outputs to check) per branch: a merged decoder is two graphs in one."""
    if not getattr(config, "is_merged", False):
        return [("", config, tuple(config.outputs))]
    no_cache = copy.copy(config)
    no_cache.use_cache_branch = False
    with_cache = copy.copy(config)
    with_cache.use_cache_branch = True
    # The cache branch's outputs are those of the decoder-with-past graph before
    # merging; the merge pads the rest (the constant cross-attention cache) with placeholders.
    unmerged = copy.copy(config)
    unmerged.is_merged = False
    return [(_NO_CACHE, no_cache, tuple(config.outputs)), (_CACHE, with_cache, tuple(unmerged.outputs))]


def _clamp_sequence(config: Any, seq: int) -> int:
    """Keep sequence (+ an equally long past) within the model's position table."""
    model_config = getattr(config, "_config", None)
    # Multimodal configs (CLIP, OWL-ViT) keep the text position table in text_config.
    scopes = [model_config, getattr(model_config, "text_config", None)]
    limits = [
        getattr(scope, name)
        for scope in scopes
        for name in ("n_positions", "max_position_embeddings", "max_target_positions")
        if isinstance(getattr(scope, name, None), int)
    ]
    if not limits:
        return seq
    limit = min(limits) // (2 if getattr(config, "use_past_in_inputs", False) else 1)
    return max(1, min(seq, limit))


def _make_case(
    exported: ExportedModel,
    comp: Component,
    config: Any,
    outputs: tuple[str, ...],
    label: str,
    batch: int,
    seq: int,
    audio_samples: int,
    settings: Settings,
) -> Case:
    import torch

    _seed(batch * 1000 + seq)
    inputs = config.generate_dummy_inputs(framework="pt", **_shape_kwargs(exported, batch, seq, audio_samples))
    _use_real_text(exported, config, inputs)
    torch_inputs = config.rename_ambiguous_inputs(copy.deepcopy(inputs))
    try:
        with torch_threads(settings.threads), config.patch_model_for_export(comp.torch_module), torch.inference_mode():
            result = comp.torch_module(**copy.deepcopy(torch_inputs))
    except Exception as exc:  # noqa: BLE001 - any PyTorch failure is a verify error
        raise VerifyError(f"PyTorch forward of {comp.name} at {label} failed: {type(exc).__name__}: {exc}") from exc
    onnx_names = [i.name for i in ort_session_inputs(exported, comp)]
    feed_inputs = config.generate_dummy_inputs_for_validation(dict(inputs), onnx_names)
    feed = _flatten_inputs(config, feed_inputs)
    return Case(label, torch_inputs, feed, _flatten_outputs(config, result), outputs, config)


def ort_session_inputs(exported: ExportedModel, comp: Component) -> list[Any]:
    """Input descriptions of the fp32 graph as exported (all variants share its input names)."""
    import onnx

    memo = exported.cache.setdefault("inputs", {})
    if comp.name not in memo:
        graph = onnx.load(str(comp.path), load_external_data=False).graph
        initializers = {i.name for i in graph.initializer}
        memo[comp.name] = [i for i in graph.input if i.name not in initializers]
    return memo[comp.name]


def _seed(seed: int) -> None:
    """optimum's dummy generators draw from python, numpy and torch RNGs: pin all three."""
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _shape_kwargs(exported: ExportedModel, batch: int, seq: int, audio_samples: int) -> dict[str, int]:
    """Dummy-generator shape arguments; image size and mel frames come from the checkpoint's processor."""
    kwargs = {"batch_size": batch, "sequence_length": seq, "audio_sequence_length": audio_samples}
    return {**kwargs, **processor_shapes(exported.checkpoint.path)}


def _use_real_text(exported: ExportedModel, config: Any, inputs: dict[str, Any]) -> None:
    """Overwrite token-id inputs with real tokenized text, keeping every shape as generated."""
    tokenizer = _tokenizer(exported)
    if tokenizer is None:
        return
    vocab = getattr(getattr(config, "_normalized_config", None), "vocab_size", None)
    stream = [t for s in SENTENCES for t in tokenizer(s)["input_ids"]]
    if not stream or (isinstance(vocab, int) and max(stream) >= vocab):
        return  # a tokenizer that does not match the model: keep optimum's ids
    for name in ("input_ids", "decoder_input_ids"):
        ids = inputs.get(name)
        if ids is None or ids.dim() != 2 or ids.dtype.is_floating_point:
            continue
        rows, length = ids.shape
        # Each row is a different window of the text, wrapping around, so no row is padding.
        table = [[stream[(r * 7 + i) % len(stream)] for i in range(length)] for r in range(rows)]
        inputs[name] = ids.new_tensor(table)


def _tokenizer(exported: ExportedModel) -> Any:
    memo = exported.cache
    if "tokenizer" not in memo:
        from transformers import AutoTokenizer

        ckpt = exported.checkpoint
        try:
            memo["tokenizer"] = AutoTokenizer.from_pretrained(str(ckpt.path), trust_remote_code=ckpt.trust_remote_code)
        except Exception:  # noqa: BLE001 - no usable tokenizer means optimum's random ids
            memo["tokenizer"] = None
    return memo["tokenizer"]


def _flatten_inputs(config: Any, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
    """Nested past_key_values become past_key_values.N.key/value, as named in the graph."""
    feed: dict[str, np.ndarray] = {}
    for name, value in inputs.items():
        if isinstance(value, (list, tuple)):
            value = config.flatten_output_collection_property(name, value)
        if isinstance(value, dict):
            feed.update({k: v.detach().cpu().numpy() for k, v in value.items()})
        else:
            feed[name] = value.detach().cpu().numpy()
    return feed


def _flatten_outputs(config: Any, outputs: Any) -> dict[str, np.ndarray]:
    """PyTorch outputs under their ONNX names (past_key_values -> present.N.key/value), as optimum validates."""
    flat: dict[str, np.ndarray] = {}
    to_onnx = config.torch_to_onnx_output_map
    for name, value in outputs.items():
        name = "present" if name == "past_key_values" else name
        if isinstance(value, (list, tuple)):
            value = config.flatten_output_collection_property(to_onnx.get(name, name), value)
            flat.update({k: v.detach().float().cpu().numpy() for k, v in value.items()})
        elif hasattr(value, "detach"):
            flat[to_onnx.get(name, name)] = value.detach().float().cpu().numpy()
    return flat


def feed_for(session: Any, case: Case, comp: Component) -> dict[str, np.ndarray]:
    """The case's inputs for ``session``, cast to its declared float types (fp16 graphs without fp32 IO)."""
    feed = {}
    for spec in session.get_inputs():
        if spec.name not in case.feed:
            raise VerifyError(f"{comp.name}: graph input {spec.name!r} has no generated value at {case.label}")
        value = case.feed[spec.name]
        target = _ORT_FLOAT.get(spec.type)
        feed[spec.name] = value.astype(target) if target is not None and value.dtype != target else value
    return feed


def _run_ort(session: Any, case: Case, comp: Component) -> dict[str, np.ndarray]:
    graph_outputs = {o.name for o in session.get_outputs()}
    missing = [n for n in case.outputs if n not in case.reference or n not in graph_outputs]
    if missing:
        raise VerifyError(f"{comp.name}: outputs {missing} missing from the graph or from PyTorch at {case.label}")
    names = list(case.outputs)
    try:
        values = session.run(names, feed_for(session, case, comp))
    except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
        raise VerifyError(f"ONNX Runtime failed on {comp.name} at {case.label}: {exc}") from exc
    return dict(zip(names, values))


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run PyTorch with ``n`` intra-op threads, restoring the previous setting afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
