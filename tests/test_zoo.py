"""The bundled tiny zoo: breadth, determinism, size, loadability, and a few real exports."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from zoo_convert import zoo
from zoo_convert.errors import UsageError
from zoo_convert.zoo.builder import image_size

REPO = Path(__file__).resolve().parents[1]
# One per tokenizer algorithm, a vision and an audio model with processors, a composite, a sharded checkpoint and a pipeline.
# deberta-v2: transformers' module warns on import (torch.jit.script), which the build keeps off the user's screen.
REBUILT = ("bert", "gpt2", "llama", "t5", "vit", "whisper", "vision-encoder-decoder", "mpnet", "stable-diffusion",
           "deberta-v2")
SMOKE_EXPORTS = ("bert", "gpt2", "t5", "vit", "whisper")
AUDIO_PROCESSORS = ("wav2vec2", "wav2vec2-ctc", "whisper", "speech2text", "ast")
# Image-to-image processors keep the image's own size, padded to a multiple of the model's window.
SIZE_KEEPING_PROCESSORS = ("swin2sr",)


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _weights(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def test_zoo_is_broad() -> None:
    families = Counter(m.family for m in zoo.ZOO)
    # the zoo's page says how big it is: a model dropped from the zoo does not go unnoticed
    said = re.search(r"(\d+) checkpoints of (\d+) architectures", (REPO / "docs" / "zoo.md").read_text())
    assert said is not None
    # the README's sentence counts the transformers checkpoints; the timm ones are counted below
    transformers = [m for m in zoo.ZOO if m.library == "transformers"]
    assert (len(transformers), len({m.model_type for m in transformers})) == (int(said[1]), int(said[2])) >= (50, 48)
    assert len({m.name for m in zoo.ZOO}) == len(zoo.ZOO)
    assert {"encoder", "decoder", "encoder-decoder", "vision", "audio"} <= set(families)
    assert all(n >= 3 for f, n in families.items() if f != "multimodal"), families
    # a decoder optimum has no config for is exported without past, as a feature extractor (exporter auto)
    assert {m.task for m in zoo.ZOO if m.family == "decoder" and m.exporter != "auto"} == {"text-generation-with-past"}


def test_zoo_has_timm_models_of_a_dozen_timm_modules() -> None:
    """The largest share of the example manifest: timm test architectures and real ones made tiny, 12+ modules."""
    from timm.models._registry import _model_to_module  # the registry's architecture -> module map

    archs = [m.model_type for m in zoo.ZOO if m.library == "timm"]
    modules = {_model_to_module[a] for a in archs}
    assert len(modules) >= 12, modules
    assert sum(not a.startswith("test_") for a in archs) >= 6 and sum(a.startswith("test_") for a in archs) >= 6


def test_zoo_covers_every_family_the_farm_once_got_wrong() -> None:
    """Issue 13's classes: each has a zoo model, so the demo and the tests run it."""
    by_type = {m.model_type: m for m in zoo.ZOO}
    assert by_type["vision-encoder-decoder"].task.endswith("-with-past")  # a merged decoder inside a composite
    assert {"t5", "mt5"} <= set(by_type)  # relative-position buckets in fp16
    assert "m2m_100" in by_type  # a merged decoder whose branches share names
    detr_style = {"detr", "table-transformer", "conditional_detr"}
    assert any(m.model_type in detr_style and m.exporter == "torch" for m in zoo.ZOO)
    assert any(m.family == "vision" and m.processor is None for m in zoo.ZOO)
    assert any(m.max_shard_size for m in zoo.ZOO)


def test_manifest_lists_every_model(zoo_dir: Path, zoo_manifest: Path) -> None:
    from zoo_convert.manifest import SCHEMA, read_manifest

    table = pq.read_table(zoo_manifest)
    assert [(f.name, f.type) for f in table.schema] == [(f.name, f.type) for f in SCHEMA]
    assert table.column("source").to_pylist() == [m.name for m in zoo.ZOO]
    manifest = read_manifest(zoo_manifest)
    assert not manifest.problems, manifest.problems
    assert [Path(e.source) for e in manifest.entries] == [zoo_dir / m.name for m in zoo.ZOO]
    assert all(e.task for e in manifest.entries)
    assert [e.exporter for e in manifest.entries] == [m.exporter for m in zoo.ZOO]


def test_repo_manifest_is_in_sync() -> None:
    """manifests/zoo.parquet is regenerated with ``zoo.write_repo_manifest()`` when the zoo changes."""
    committed = pq.read_table(REPO / "manifests" / "zoo.parquet")
    assert committed.equals(zoo.manifest_table(zoo.ZOO, zoo.REPO_MANIFEST_PREFIX))


def test_zoo_is_small(zoo_dir: Path) -> None:
    total = sum(p.stat().st_size for p in zoo_dir.rglob("*") if p.is_file())
    assert total < 64 * 1024**2  # 139 checkpoints: 53 MB
    sizes = {m.name: sum(p.stat().st_size for p in _weights(zoo_dir / m.name)) for m in zoo.ZOO}
    biggest = max(sizes, key=sizes.__getitem__)
    assert sizes[biggest] < 5 * 1024**2, biggest


@pytest.mark.slow
def test_cli_rebuild_is_byte_identical(zoo_dir: Path, tmp_path: Path) -> None:
    """A fresh process builds the same bytes: seeds and tokenizer vocabularies do not drift; and says only what it built."""
    script = Path(sys.executable).with_name("zoo-convert")
    cmd = [str(script), "zoo", "build", str(tmp_path), "--only", ",".join(REBUILT)]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    assert done.stderr == ""  # no library's warnings between make demo's lines
    assert done.stdout.startswith(f"built {len(REBUILT)} models; manifest: ")
    for name in REBUILT:
        assert _files(tmp_path / name) == _files(zoo_dir / name), name
    built = pq.read_table(tmp_path / "manifest.parquet").column("source").to_pylist()
    assert built == [m.name for m in zoo.select(REBUILT)]


def test_unknown_name_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="nope"):
        zoo.build(tmp_path, ["bert", "nope"])


# transformers checkpoints; the diffusers pipeline's folder is tested in test_diffusion.py
@pytest.mark.parametrize("name", [m.name for m in zoo.ZOO if m.library == "transformers"])
def test_model_folder_loads(zoo_dir: Path, name: str) -> None:
    from transformers import AutoConfig, AutoFeatureExtractor, AutoImageProcessor, AutoTokenizer

    spec = next(m for m in zoo.ZOO if m.name == name)
    folder = zoo_dir / name
    if spec.library == "timm":
        _timm_folder_loads(spec, folder)
        return
    config = AutoConfig.from_pretrained(folder)
    assert config.model_type == spec.model_type
    assert not (folder / "pytorch_model.bin").exists()
    if spec.max_shard_size:
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        assert len(_weights(folder)) >= 2 and {p.name for p in _weights(folder)} == set(index["weight_map"].values())
    else:
        assert [p.name for p in _weights(folder)] == ["model.safetensors"]
    if spec.processor is None:
        assert not (folder / "preprocessor_config.json").exists()
    if spec.tokenizer is not None:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        assert type(tokenizer).__name__ == spec.tokenizer.cls
        text = getattr(config, "text_config", None) or getattr(config, "decoder", None) or config
        vocab_size = text.vocab_size
        assert len(tokenizer) == vocab_size
        ids = tokenizer("The river runs quietly to the ocean.")["input_ids"]
        assert 3 <= len(ids) and max(ids) < vocab_size
        assert tokenizer.unk_token_id not in ids
    if spec.processor in AUDIO_PROCESSORS:
        extractor = AutoFeatureExtractor.from_pretrained(folder)
        features = extractor(np.zeros(16000, dtype=np.float32), sampling_rate=16000, return_tensors="np")
        assert features[extractor.model_input_names[0]].shape[0] == 1
    elif spec.processor is not None:
        image = Image.new("RGB", (40, 40), color=(120, 30, 200))
        pixels = AutoImageProcessor.from_pretrained(folder)(image, return_tensors="np")["pixel_values"]
        if spec.processor in SIZE_KEEPING_PROCESSORS:
            side = pixels.shape[-1]
            assert pixels.shape[-2:] == (side, side) and 40 < side <= 40 + 2 * config.window_size, pixels.shape
            assert side % config.window_size == 0
        else:
            assert pixels.shape[-2:] == (image_size(config),) * 2
    if spec.sentence_transformers:
        assert (folder / "modules.json").is_file()


def _timm_folder_loads(spec: zoo.ZooModel, folder: Path) -> None:
    """As timm.models.save_for_hf writes it: timm loads it strictly, at its pretrained_cfg's input size."""
    import timm
    import torch

    config = json.loads((folder / "config.json").read_text())
    assert config["architecture"] == spec.model_type
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    model = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()  # strict: every key loaded
    with torch.inference_mode():
        logits = model(torch.randn(2, *config["pretrained_cfg"]["input_size"]))
    assert logits.shape == (2, config["num_classes"])


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in ("t5", "whisper") else n for n in SMOKE_EXPORTS]
)
def test_optimum_exports_and_validates(zoo_dir: Path, tmp_path: Path, name: str) -> None:
    from optimum.exporters.onnx import main_export

    spec = next(m for m in zoo.ZOO if m.name == name)
    main_export(
        model_name_or_path=str(zoo_dir / name),
        output=tmp_path,
        task=spec.task,
        library_name="transformers",
        do_validation=True,
    )
    onnx_files = {p.name for p in tmp_path.glob("*.onnx")}
    assert onnx_files & {"model.onnx", "decoder_model_merged.onnx"}, onnx_files
