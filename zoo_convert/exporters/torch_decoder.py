"""The torch exporter's decoders with past: ``torch.onnx.export(dynamo=True)`` of a causal LM's cached step.

The graph is the one optimum exports for ``text-generation-with-past`` (and
``feature-extraction-with-past``: the same without the past inputs), so ORTModelForCausalLM and transformers.js load it
unchanged: ``onnx/model.onnx`` fed ``input_ids``, ``attention_mask`` and ``position_ids``
where optimum's OnnxConfig has them, and the cache flattened as
``past_key_values.{i}.key`` / ``.value``, giving ``logits`` (or ``last_hidden_state``) and
``present.{i}.key`` / ``.value``. Axes ``batch_size``, ``sequence_length`` and
``past_sequence_length`` are dynamic; a past of length 0 (a prompt's first step) runs too.

:class:`_CachedStep` takes the graph's inputs as flat tensors, nests the past the way
optimum's dummy inputs nest it, and calls the model under optimum's patcher, which turns
the nested past into transformers' ``DynamicCache`` and the returned cache back into
tuples: the flattening and naming are optimum's own, only the tracer differs. The
:class:`~zoo_convert.stages.Component` keeps the model as loaded and the OnnxConfig, so
verify and :mod:`zoo_convert.verify.generation` treat the artifact as they treat optimum's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree

from ..errors import ExportError
from ..job import Component, ModuleState
from . import torch_onnx

# Dummy sizes all different (and above 1), so the tracer can tell batch, new tokens and past apart
# instead of merging equal sizes into one symbol or specializing a size of 1.
_BATCH, _SEQUENCE, _PAST = 2, 5, 7


def export(model: Any, config: Any, opset: int | None, onnx_dir: Path) -> Component:
    """Export ``model``'s cached forward into ``onnx_dir/model.onnx`` with ``config``'s (optimum's) names and axes."""
    inputs = _dummy_inputs(config)
    # feature-extraction-with-past: optimum's graph gives the cache (present.*) but takes no past.
    past = inputs.get("past_key_values") if getattr(config, "use_past_in_inputs", False) else None
    past_leaves, past_spec = _pytree.tree_flatten(past) if past is not None else ([], None)
    past_names = list(config.flatten_output_collection_property("past_key_values", past)) if past is not None else []
    names = [n for n in config.inputs if n in inputs or n in past_names]
    if len(past_names) != len(past_leaves) or not set(past_names) <= set(names):
        raise ExportError(f"{type(config).__name__}'s past inputs {past_names[:2]}... do not match its dummy cache")
    flat = {**{n: inputs[n] for n in names if n in inputs}, **dict(zip(past_names, past_leaves))}
    outputs = list(config.outputs)
    step = _CachedStep(model, names, past_names, past_spec, outputs)
    path = onnx_dir / "model.onnx"
    as_loaded = ModuleState(model)
    with torch.no_grad(), config.patch_model_for_export(model):
        torch_onnx.export(
            step,
            tuple(flat[n] for n in names),
            path,
            what=f"{type(model).__name__} with past",
            input_names=names,
            output_names=outputs,
            dynamic_shapes=(tuple(_axes(config.inputs[n]) for n in names),),  # one entry: forward's *args
            opset=opset,
        )
    torch_onnx.name_dynamic_axes(path, {n: config.inputs[n] for n in names})
    return Component(name="model", path=path, onnx_config=config, torch_module=model, as_loaded=as_loaded)


def _dummy_inputs(config: Any) -> dict[str, Any]:
    """optimum's dummy inputs at sizes the tracer keeps apart: a past of ``_PAST``, ``_SEQUENCE`` new tokens."""
    inputs: dict[str, Any] = config.generate_dummy_inputs(
        framework="pt", batch_size=_BATCH, sequence_length=_SEQUENCE, past_sequence_length=_PAST
    )
    past = inputs.get("past_key_values")
    if past is not None and {t.shape[-2] for t in _leaves(past)} != {_PAST}:  # optimum's generators make the past as long as the sequence: a new one of _PAST
        inputs["past_key_values"] = _resize_past(past, _PAST)
    start = _PAST if past is not None else 0
    if "attention_mask" in inputs:
        inputs["attention_mask"] = torch.ones(_BATCH, start + _SEQUENCE, dtype=inputs["attention_mask"].dtype)
    if "position_ids" in inputs:
        inputs["position_ids"] = torch.arange(start, start + _SEQUENCE, dtype=torch.int64).expand(_BATCH, -1).contiguous()
    return inputs


def _leaves(value: Any) -> list[torch.Tensor]:
    leaves: list[torch.Tensor] = _pytree.tree_leaves(value)
    return leaves


def _resize_past(past: Any, length: int) -> Any:
    def resize(t: torch.Tensor) -> torch.Tensor:
        shape = list(t.shape)
        shape[-2] = length
        return torch.randn(shape, dtype=t.dtype)

    return _pytree.tree_map(resize, past)


def _axes(labels: dict[int, str]) -> dict[int, Any]:
    """optimum's axes as one named dimension each, shared by every input (all 2 * layers pasts are one length).

    An axis optimum names by an expression (the mask's ``past_sequence_length + sequence_length``)
    is AUTO: the tracer derives it from the named ones.
    """
    return {axis: _DIMS.get(label, torch.export.Dim.AUTO) for axis, label in labels.items()}


_DIMS = {name: torch.export.Dim(name) for name in ("batch_size", "sequence_length", "past_sequence_length")}


class _CachedStep(torch.nn.Module):
    """The graph's flat inputs in, the model's outputs flattened as optimum names them out."""

    def __init__(self, model: Any, names: list[str], past_names: list[str], past_spec: Any, outputs: list[str]) -> None:
        super().__init__()
        self.model = model
        self.names = names
        self.past_index = [names.index(n) for n in past_names]
        self.past_spec = past_spec
        self.outputs = outputs

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        past = _pytree.tree_unflatten([args[i] for i in self.past_index], self.past_spec) if self.past_index else None
        kwargs = {n: a for i, (n, a) in enumerate(zip(self.names, args)) if i not in self.past_index}
        out = self.model(**kwargs, past_key_values=past, use_cache=True)  # the patcher's forward: cache in, tuples out
        present = _pytree.tree_leaves(out["past_key_values"])
        first = [out[n] for n in self.outputs if not n.startswith("present")]
        if len(first) + len(present) != len(self.outputs):
            raise ExportError(
                f"the model returned {len(present)} cache tensors and {len(first)} other outputs for "
                f"{len(self.outputs)} graph outputs ({', '.join(self.outputs[:3])}, ...)"
            )
        return (*first, *present)
