"""The torch exporter's one call of ``torch.onnx.export(dynamo=True)``, and the axis names every graph it writes gets.

Single graphs (:func:`zoo_convert.stages.export._torch_onnx`), decoders with past
(:mod:`zoo_convert.exporters.torch_decoder`) and each graph of an encoder-decoder (:mod:`zoo_convert.exporters.torch_seq2seq`)
are exported by :func:`export`: weights inline (the export stage moves them out afterwards), every
option torch.onnx's own default but the names, the axes and the opset. A failure is an
:class:`~zoo_convert.errors.ExportError` naming the step that failed (torch.export's trace, or the
translation of its program to ONNX) and the cause, not torch.onnx's page of advice.

What torch.onnx runs, and why none of it is cut (torch 2.14; measured in a warm process on the
tiny zoo with ``benchmarks/_trace_torch_export.py``): the capture (torch.export, non-strict; the
strict trace only after a failed one), the decompositions (a second trace of the captured program,
to the ops torchlib implements: torch.export has no public way to decompose in the first trace, and
torch.onnx retraces an ExportedProgram handed to it too), the op registry (built anew per call),
the translation, the opset conversion (torchlib writes opset 18, then converts) and onnxscript's
optimizer (``optimize=True``). Skipping the optimizer would save a tenth of the export but ship
another graph: on a one-layer BERT 186 nodes instead of 64, and 1 of its 9 MatMuls fed a weight
initializer instead of 7 (the others a Transpose of it), which int8's quantizer would leave float.
``verify``, ``report`` and ``profile`` are off already.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .. import onnx_graph
from ..errors import ExportError


def export(
    module: Any,
    args: tuple[Any, ...],
    path: Path,
    *,
    what: str,
    input_names: list[str],
    output_names: list[str],
    dynamic_shapes: Any,
    opset: int | None,
    kwargs: dict[str, Any] | None = None,
) -> None:
    """``torch.onnx.export(dynamo=True)`` of ``module`` into ``path``; ExportError (``what``: step: cause) on failure.

    The caller holds ``torch.no_grad()`` and optimum's patcher around it: which patcher, and
    with which model kwargs, is the caller's.
    """
    import torch

    try:
        program = torch.onnx.export(
            module,
            args,
            kwargs=kwargs,
            dynamo=True,
            input_names=input_names,
            output_names=output_names,
            dynamic_shapes=dynamic_shapes,
            opset_version=opset,
            external_data=False,
        )
    except torch.onnx.errors.OnnxExporterError as exc:
        step = "torch.export" if type(exc).__name__ == "TorchExportError" else "the ONNX translation"
        raise ExportError(f"{what}: {step} failed: {export_cause(exc)}") from exc
    if program is None:  # only with dynamo=False, which is not asked for
        raise ExportError("torch.onnx.export returned no ONNX program")
    program.save(str(path), external_data=False)


def export_cause(exc: BaseException) -> str:
    """The cause torch.onnx's errors name under "Exception summary" (their first line is boilerplate)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    found = re.search(r"## Exception summary\s+(.+)", text)
    return (found.group(1) if found else text.splitlines()[0] if text else type(exc).__name__).strip()


def name_dynamic_axes(path: Path, axes: dict[str, dict[int, str]]) -> None:
    """Rename the exporter's symbolic dimensions (``s17``) to optimum's axis names (``batch_size``) everywhere."""
    model = onnx_graph.load(path)
    by_input = {i.name: i.type.tensor_type.shape.dim for i in model.graph.input}
    names = {
        by_input[name][axis].dim_param: label
        for name, labels in axes.items()
        for axis, label in labels.items()
        if name in by_input and axis < len(by_input[name]) and by_input[name][axis].dim_param
    }
    for graph in onnx_graph.graphs(model.graph):
        for value in [*graph.input, *graph.output, *graph.value_info]:
            for dim in value.type.tensor_type.shape.dim:
                if dim.dim_param in names:
                    dim.dim_param = names[dim.dim_param]
    onnx_graph.save(model, path, external=False)
