"""The torch exporter's one torch.onnx.export call: a failure says which step failed and its cause."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from zoo_convert.exporters import torch_onnx
from zoo_convert.errors import ExportError


def test_a_torch_export_failure_is_recorded_with_its_cause_not_the_boilerplate() -> None:
    said = (
        "Failed to export the model with torch.export. \x1b[96mThis is step 1/3\x1b[0m of exporting the model to ONNX."
        " Next steps:\n- Modify the model code\n\n## Exception summary\n\n<class 'RuntimeError'>: The size of tensor a"
        " (s89) must match the size of tensor b (s89 + 1) at non-singleton dimension 3)\n\n(Refer to the full stack trace)"
    )
    assert torch_onnx.export_cause(RuntimeError(said)) == (
        "<class 'RuntimeError'>: The size of tensor a (s89) must match the size of tensor b (s89 + 1) at non-singleton dimension 3)"
    )
    assert torch_onnx.export_cause(RuntimeError("\x1b[96mno summary\x1b[0m here\nmore")) == "no summary here"


class _Branches(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent control flow: torch.export cannot trace it
            return x + 1
        return x - 1


@torch.library.custom_op("zoo_convert_test::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_twice.register_fake
def _twice_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class _CustomOp(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _twice(x)  # traced, but no ONNX function translates it


@pytest.mark.slow  # the first dynamo export in a process: seconds of first-call costs
@pytest.mark.parametrize(
    ("module", "step", "cause"),
    [(_Branches(), "torch.export", "data-dependent"), (_CustomOp(), "the ONNX translation", "No ONNX function found")],
)
def test_a_failed_export_is_an_export_error_naming_the_step_and_the_cause(
    module: torch.nn.Module, step: str, cause: str, tmp_path: Path
) -> None:
    with pytest.raises(ExportError) as err:
        torch_onnx.export(
            module, (torch.ones(2, 3),), tmp_path / "model.onnx", what=type(module).__name__,
            input_names=["x"], output_names=["y"], dynamic_shapes=None, opset=None,
        )  # fmt: skip
    message = err.value.message
    assert message.startswith(f"{type(module).__name__}: {step} failed: "), message
    assert cause.lower() in message.lower() and "Failed to" not in message.split(": ", 2)[2][:20], message
    assert not (tmp_path / "model.onnx").exists()
