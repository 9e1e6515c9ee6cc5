"""Real conversions of a few tiny zoo models, with their references saved, for the target tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from zoo_convert.records import ConversionResult, ManifestEntry, Settings

# bert: every target passes; bart: optimum's merged decoder (OpenVINO compiles it once its branch outputs
# are made by operations); data2vec-text: a model type transformers.js has no architecture for; clip: its
# fused fp16 graph (QuickGelu) does not compile in OpenVINO, its standard one does; deberta: an If whose
# branches differ in rank, which OpenVINO's CPU plugin refuses in any graph.
MODELS = ("bert", "bart", "data2vec-text", "clip", "deberta")


@pytest.fixture(scope="session")
def small_zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from zoo_convert import zoo

    out = tmp_path_factory.mktemp("targets-zoo")
    zoo.build(out, only=MODELS)
    return out


@pytest.fixture(scope="session")
def converted(small_zoo: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, ConversionResult]:
    """Each model converted (fp32, fp16, int8), bert checked on ort-cpu, openvino and transformers.js by the pipeline, the others on openvino."""
    from zoo_convert.pipeline import convert_one

    out = tmp_path_factory.mktemp("targets-onnx")
    results = {}
    for name in MODELS:
        # openvino on every model: its graphs of standard ONNX ops are made only for a job with a target that reads them
        chosen = ("ort-cpu", "openvino", "transformers.js") if name == "bert" else ("openvino",)
        # bert is timed: its targets' latency is measured in the benchmark stage (the latency phase of a farm job)
        settings = Settings(out_dir=str(out), benchmark=name == "bert", targets=chosen)
        results[name] = convert_one(ManifestEntry(source=str(small_zoo / name)), settings)
        assert results[name].passed, results[name].message
    return results


@pytest.fixture(scope="session")
def folders(converted: dict[str, ConversionResult]) -> dict[str, Path]:
    return {name: Path(r.artifacts_dir or "") for name, r in converted.items()}
