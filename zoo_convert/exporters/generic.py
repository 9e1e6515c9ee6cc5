"""The generic export path: an OnnxConfig built from the model itself, for model types optimum has no config for.

optimum's OnnxConfig is the farm's one description of a graph: its input and output
names and dynamic axes, and the dummy generators verify and benchmark draw their inputs
from (:mod:`zoo_convert.verify.runtime`). For a model type without one, :func:`onnx_config`
builds it from what the model says of itself:

* the inputs: its ``main_input_name`` (``input_ids`` or ``pixel_values``) and, for
  text, the ``attention_mask`` / ``token_type_ids`` its forward takes; tokens come from
  its own tokenizer at verify time, image sizes from its image processor (or the
  config's ``image_size``), as for every other artifact;
* the outputs: the tensors of its ``ModelOutput`` on one dummy forward, with the batch
  axis (and the sequence axis of a text model) dynamic.

Refused here (``export_unsupported``), with the reason: a main input that is neither
(audio, video, multimodal-first models), a model that generates (it needs past key
values, which only optimum's configs export today), and an encoder-decoder.
"""

from __future__ import annotations

import copy
import inspect
from typing import TYPE_CHECKING, Any

from ..errors import ExportError, FailureKind
from ..job import ModuleState

if TYPE_CHECKING:
    from optimum.exporters.onnx import OnnxConfig

# The sub-configs a composite model keeps its sizes in (DepthAnything's backbone, CLIPSeg's towers).
_SUBCONFIGS = ("backbone_config", "vision_config", "text_config")
TEXT_EXTRA_INPUTS = ("attention_mask", "token_type_ids")


def onnx_config(model: Any, task: str, shapes: dict[str, int]) -> OnnxConfig:
    """An OnnxConfig for ``model`` (a transformers module) built from its forward and one dummy forward at ``shapes``."""
    import torch
    from optimum.exporters.onnx.base import OnnxConfig as Base
    from optimum.utils import (
        DummyTextInputGenerator,
        DummyVisionInputGenerator,
        NormalizedConfig,
    )

    config = model.config
    kind = type(model).__name__
    if getattr(config, "is_encoder_decoder", False):
        raise ExportError(
            f"the generic torch export exports one graph; {kind} is an encoder-decoder (needs optimum's split)",
            kind=FailureKind.EXPORT_UNSUPPORTED,
        )
    if task.endswith("-with-past") or (hasattr(model, "can_generate") and model.can_generate()):
        raise ExportError(
            f"the generic torch export has no past key values; {kind} generates (export it as feature-extraction, "
            "or wait for decoders with past through the torch exporter)",
            kind=FailureKind.EXPORT_UNSUPPORTED,
        )
    params = inspect.signature(model.forward).parameters
    main = getattr(model, "main_input_name", "input_ids")
    wanted: dict[str, dict[int, str]]
    if main == "input_ids":
        wanted = {"input_ids": {0: "batch_size", 1: "sequence_length"}}
        wanted.update({n: {0: "batch_size", 1: "sequence_length"} for n in TEXT_EXTRA_INPUTS if n in params})
        generators: tuple[type, ...] = (DummyTextInputGenerator,)
    elif main == "pixel_values":
        wanted = {"pixel_values": {0: "batch_size", 1: "num_channels", 2: "height", 3: "width"}}
        generators = (DummyVisionInputGenerator,)
    else:
        raise ExportError(
            f"the generic torch export handles text (input_ids) and image (pixel_values) models; "
            f"{kind} takes {main!r} first",
            kind=FailureKind.EXPORT_UNSUPPORTED,
        )

    class Normalized(NormalizedConfig):  # type: ignore[misc]
        """Sizes from the config, else from its sub-configs (a DepthAnything's image size is its backbone's)."""

        def __getattr__(self, name: str) -> Any:
            try:
                return super().__getattr__(name)
            except AttributeError:
                for sub in _SUBCONFIGS:
                    value = getattr(getattr(self.config, sub, None), name, None)
                    if value is not None:
                        return value
                raise

    class Generic(Base):  # type: ignore[misc]
        NORMALIZED_CONFIG_CLASS = Normalized
        DUMMY_INPUT_GENERATOR_CLASSES = generators
        _inputs: dict[str, dict[int, str]] = wanted
        _outputs: dict[str, dict[int, str]] = {}

        @property
        def inputs(self) -> dict[str, dict[int, str]]:
            return copy.deepcopy(self._inputs)

        @property
        def outputs(self) -> dict[str, dict[int, str]]:
            return copy.deepcopy(self._outputs)

    Generic.__name__ = Generic.__qualname__ = f"Generic{type(config).__name__.removesuffix('Config')}OnnxConfig"
    built = Generic(config, task=task)
    dummy = built.generate_dummy_inputs(framework="pt", **shapes)
    state = ModuleState(model)
    try:
        with torch.no_grad():
            result = model(**dummy)
    finally:
        state.restore()
    found = result.items() if isinstance(result, dict) else []
    outputs = {name: _axes(value, dummy, main) for name, value in found if isinstance(value, torch.Tensor)}
    if not outputs:
        raise ExportError(
            f"the generic torch export found no tensor among {kind}'s outputs ({type(result).__name__})",
            kind=FailureKind.EXPORT_UNSUPPORTED,
        )
    Generic._outputs = outputs
    return built


def _axes(value: Any, dummy: dict[str, Any], main: str) -> dict[int, str]:
    """An output's dynamic axes: the batch, and the axes as long as the input's sequence (text) or height / width."""
    axes = {0: "batch_size"}
    given = dummy[main].shape
    labels = [("sequence_length", given[1])] if main == "input_ids" else [("height", given[2]), ("width", given[3])]
    for axis in range(1, value.dim()):
        if labels and value.shape[axis] == labels[0][1]:
            axes[axis] = labels.pop(0)[0]
    return axes
