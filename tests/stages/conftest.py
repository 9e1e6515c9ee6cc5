"""Stage fixtures: real optimum exports of a few bundled zoo models, shared by the stage tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from zoo_convert.records import ManifestEntry, Settings
from zoo_convert.stages import Checkpoint, ExportedModel

# One per family: text encoder, decoder with past, encoder-decoder, vision, audio.
ZOO_TASKS = {
    "bert": "feature-extraction",
    "gpt2": "text-generation",
    "t5": "text2text-generation",
    "vit": "image-classification",
    "wav2vec2": "automatic-speech-recognition",
    "bart": "text2text-generation-with-past",
    "wavlm": "feature-extraction",
    # length-dependent models and a filterbank speech model
    "speech-to-text": "automatic-speech-recognition-with-past",
    "bigbird": "fill-mask",
    "qwen2-sliding-window": "text-generation-with-past",
    "phi3-longrope": "text-generation-with-past",
}


def _checkpoint(path: Path, task: str, library: str = "transformers") -> Checkpoint:
    """A Checkpoint for a local folder, as fetch would hand it over."""
    config = json.loads((path / "config.json").read_text())
    return Checkpoint(
        path=path,
        resolved_revision="sha256:test",
        model_type=config["model_type"],
        task=task,
        library=library,
        config=config,
    )


@pytest.fixture(scope="session")
def checkpoint() -> Callable[..., Checkpoint]:
    """``checkpoint(path, task, library="transformers")``: a Checkpoint without going through fetch."""
    return _checkpoint


@pytest.fixture(scope="session")
def zoo_export(zoo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], ExportedModel]:
    """``zoo_export(name)``: the optimum export of a zoo model, done once per session.

    Tests must not modify the returned export's files; copy them first.
    """
    from zoo_convert.stages.export import export

    root = tmp_path_factory.mktemp("exports")
    done: dict[str, ExportedModel] = {}

    def get(name: str) -> ExportedModel:
        if name not in done:
            ckpt = _checkpoint(zoo_dir / name, ZOO_TASKS[name])
            done[name] = export(ckpt, ManifestEntry(source=str(ckpt.path)), Settings(), root / name)
        return done[name]

    return get
