"""Check stage: the ONNX checker and shape inference on every exported graph.

Both run path-based, so graphs with external data (``model.onnx_data``) and
graphs over the 2 GB protobuf limit are checked without loading them whole.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from .. import onnx_graph
from ..errors import CheckError
from . import ExportedModel


def check(exported: ExportedModel) -> dict[str, Any]:
    """Run ``onnx.checker`` (full check) and shape inference per component; raise CheckError naming it."""
    import onnx

    details: dict[str, Any] = {}
    for comp in exported.components:
        try:
            onnx.checker.check_model(str(comp.path), full_check=True)
        except Exception as exc:  # noqa: BLE001 - the checker raises several unrelated types
            raise CheckError(f"{comp.name}: onnx.checker failed: {exc}") from exc
        details[comp.name] = {"value_infos": _inferred_value_infos(comp.path)}
    return details


def _inferred_value_infos(path: Path) -> int:
    """Run shape inference to a scratch file (never over the artifact) and count the inferred tensors."""
    import onnx

    # The inferred copy lands beside the graph so relative external-data paths resolve.
    with tempfile.NamedTemporaryFile(suffix=".onnx", dir=path.parent) as tmp:
        try:
            onnx.shape_inference.infer_shapes_path(str(path), tmp.name, check_type=True, strict_mode=True)
        except Exception as exc:  # noqa: BLE001 - inference errors surface as several types
            raise CheckError(f"{path.stem}: shape inference failed: {exc}") from exc
        # onnx's C++ writer reports no failed write: a copy cut short is the disk's, not a corrupt model of ours.
        onnx_graph.read_back(Path(tmp.name), "onnx shape inference")
        inferred = onnx_graph.load(Path(tmp.name))
    # A merged decoder keeps its layers in If branches: count theirs too.
    return sum(len(graph.value_info) for graph in onnx_graph.graphs(inferred.graph))
