"""Encoder-decoders through ``torch.onnx.export(dynamo=True)``, in the layout optimum writes.

optimum splits an encoder-decoder into ``encoder_model``, ``decoder_model`` (no past: it
makes the first cache) and ``decoder_with_past_model`` (one step on a cache), each with its
OnnxConfig. Here each of those graphs is exported by the dynamo exporter instead of
TorchScript, from a wrapper module (:func:`_wrapper`) whose flat tensor arguments and
outputs are the graph's, named as optimum names them (``input_ids``,
``encoder_hidden_states``, ``past_key_values.0.decoder.key`` ... ``present.0.encoder.value``).
The wrapper regroups the flat past into transformers' ``EncoderDecoderCache`` (self-attention
and cross-attention ``DynamicCache``) and flattens the cache the model returns; then
optimum's own post-processing merges the two decoders into ``decoder_model_merged.onnx``
(an If on ``use_cache_branch``), so ORTModelForSeq2SeqLM, ORTModelForSpeechSeq2Seq and
transformers.js load the folder as they load optimum's.

Each component keeps the loaded module and its (post-processed) OnnxConfig, exactly as
the optimum exporter's components do: verify and the generation check run unchanged, and
the PyTorch reference is the model as loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ExportError
from . import torch_onnx

if TYPE_CHECKING:
    import torch

# Dummy lengths of the export, distinct so that no two axes are traced as one: a decoder step
# of more than one token (assisted decoding feeds several) and a past unlike the encoder's length.
_DECODER_TOKENS = 3
_PAST_TOKENS = 5


def export(parts: dict[str, tuple[Any, Any]], opset: int | None, onnx_dir: Path, shapes: dict[str, int]) -> list[str]:
    """Export every graph of optimum's split (encoder, decoders) with the dynamo exporter; return their file names.

    ``parts``: optimum's {graph name: (module, OnnxConfig)}. The caller merges the decoders with
    optimum's post-processing, as it does optimum's own export's.
    """
    subpaths = []
    for name, (module, config) in parts.items():
        _export_graph(module, config, opset, onnx_dir / f"{name}.onnx", shapes)
        subpaths.append(f"{name}.onnx")
    return subpaths


def _wrapper(module: Any, config: Any, names: list[str], model_kwargs: dict[str, Any]) -> torch.nn.Module:
    """An nn.Module whose positional tensors are the graph's inputs ``names`` and whose outputs are ``config.outputs``.

    optimum's patched forward does the rest of what its TorchScript export does: the flat past
    becomes an ``EncoderDecoderCache`` (``DynamicCache`` for a past without cross-attention
    keys), ``encoder_hidden_states`` a ``BaseModelOutput``, and the returned cache a tuple again.
    """
    import torch

    inverse = {onnx: torch_name for torch_name, onnx in config.torch_to_onnx_input_map.items()}
    patcher = config.patch_model_for_export(module, model_kwargs=model_kwargs)
    outputs = list(config.outputs)

    class Graph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = module

        def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
            kwargs: dict[str, Any] = {}
            layers: dict[int, list[torch.Tensor]] = {}
            for name, tensor in zip(names, tensors):
                if name.startswith("past_key_values."):
                    layers.setdefault(int(name.split(".")[1]), []).append(tensor)
                elif inverse.get(name, name) == "encoder_outputs":
                    kwargs["encoder_outputs"] = (tensor,)
                else:
                    kwargs[inverse.get(name, name)] = tensor
            if layers:
                # past_key_values.{i}.decoder.key/value, then .encoder.key/value: the legacy
                # (self k, self v, cross k, cross v) tuple optimum turns into EncoderDecoderCache
                kwargs["past_key_values"] = tuple(tuple(layers[i]) for i in sorted(layers))
            result = patcher.patched_forward(**kwargs)
            flat: dict[str, torch.Tensor] = {}
            for key, value in result.items():
                if key == "past_key_values":
                    flat.update(config.flatten_output_collection_property("present", value))
                else:
                    flat[config.torch_to_onnx_output_map.get(key, key)] = value
            missing = [n for n in outputs if n not in flat]
            if missing:
                raise ExportError(f"{type(module).__name__} returned no {', '.join(missing)} (it gave {', '.join(flat)})")
            return tuple(flat[n] for n in outputs)

    return Graph().eval()  # the module as loaded is in eval mode: its wrapper too


def _export_graph(module: Any, config: Any, opset: int | None, path: Path, shapes: dict[str, int]) -> None:
    """One graph of the split: its dummy inputs flattened in the graph's order, every named axis dynamic."""
    import inspect

    import torch

    module.config.return_dict = True
    for key, value in (config.values_override or {}).items():
        setattr(module.config, key, value)
    model_kwargs: dict[str, Any] = {}
    if "logits_to_keep" in inspect.signature(module.forward).parameters:
        model_kwargs["logits_to_keep"] = 0  # every position's logits, as optimum exports them
    axes: dict[str, dict[int, str]] = dict(config.ordered_inputs(module))
    dummy = config.rename_ambiguous_inputs(config.generate_dummy_inputs(framework="pt", **shapes))
    flat = _flat_inputs(config, dummy)
    names = [n for n in axes if n in flat]
    unfed = [n for n in axes if n not in flat]
    if unfed:
        raise ExportError(f"{path.name}: optimum's dummy inputs have no {', '.join(unfed)}")
    tensors = tuple(_resized(flat[n], axes[n]) for n in names)
    dynamic = tuple({axis: torch.export.Dim.AUTO for axis in axes[n]} for n in names)
    wrapper = _wrapper(module, config, names, model_kwargs)
    with torch.no_grad(), config.patch_model_for_export(module, model_kwargs=model_kwargs):
        # (Exporting without optimum's patcher, which is made for TorchScript, gets moonshine's encoder past
        # torch.export, but into a graph ONNX Runtime cannot run at another length: not worth a second export.)
        torch_onnx.export(
            wrapper,
            tensors,
            path,
            what=path.name,
            input_names=names,
            output_names=list(config.outputs),
            dynamic_shapes=(dynamic,),
            opset=opset,
        )
    _name_axes(path, {n: axes[n] for n in names}, config.outputs)


def _name_axes(path: Path, inputs: dict[str, dict[int, str]], outputs: dict[str, dict[int, str]]) -> None:
    """optimum's axis names on the graph: inputs' symbols renamed everywhere, outputs declared afresh.

    The exporter names an output's axes by the expressions it traced (``s44 + s89``,
    ``((s0*s26)//s87)``) and annotates its value infos; the decoders' merge needs the two
    graphs' common outputs to be the same declaration, as TorchScript's export writes them.
    """
    import onnx

    from .. import onnx_graph

    torch_onnx.name_dynamic_axes(path, inputs)
    model = onnx_graph.load(path)
    declared = []
    for out in model.graph.output:
        labels = outputs.get(out.name, {})
        dims: list[str | int | None] = []
        for axis, dim in enumerate(out.type.tensor_type.shape.dim):
            dims.append(labels.get(axis, dim.dim_param) if not dim.HasField("dim_value") else dim.dim_value)
        declared.append(onnx.helper.make_tensor_value_info(out.name, out.type.tensor_type.elem_type, dims))
    del model.graph.output[:]
    model.graph.output.extend(declared)
    onnx_graph.save(model, path, external=False)


def _flat_inputs(config: Any, dummy: dict[str, Any]) -> dict[str, torch.Tensor]:
    """optimum's dummy inputs under the graph's names (past flattened, encoder outputs unwrapped)."""
    flat: dict[str, torch.Tensor] = {}
    for name, value in dummy.items():
        onnx_name = config.torch_to_onnx_input_map.get(name, name)
        if name == "past_key_values":
            flat.update(config.flatten_output_collection_property("past_key_values", value))
        elif isinstance(value, (list, tuple)):  # encoder_outputs: (last_hidden_state, None, ...)
            flat[onnx_name] = value[0]
        else:
            flat[onnx_name] = value
    return flat


def _resized(tensor: torch.Tensor, axes: dict[int, str]) -> torch.Tensor:
    """A dummy input with its decoder and past lengths set to :data:`_DECODER_TOKENS` and :data:`_PAST_TOKENS`.

    optimum's generator gives a one-token decoder step (which the exporter would fix at 1)
    and the same length to every sequence (which it could trace as one axis).
    """
    import torch

    for axis, label in axes.items():
        target = _PAST_TOKENS if label.startswith("past_") else _DECODER_TOKENS if label.startswith("decoder_") else None
        if target is None or tensor.shape[axis] == target:
            continue
        reps = -(-target // tensor.shape[axis])
        tensor = torch.cat([tensor] * reps, dim=axis).narrow(axis, 0, target)
    return tensor
