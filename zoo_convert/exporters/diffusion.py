"""diffusers pipelines: one job per pipeline folder (``model_index.json`` at its root, no ``config.json``).

A pipeline is exported as optimum exports it (``optimum-cli export onnx`` on a diffusers
repo): optimum's own split (``get_diffusion_models_for_export``: text encoder(s), UNet or
transformer, the VAE as an encoder returning its latent distribution's parameters and a
decoder), each with optimum's OnnxConfig, written by ``export_models`` in the layout
``ORTDiffusionPipeline.from_pretrained`` loads::

    model_index.json  scheduler/  tokenizer/  feature_extractor/     (copied from the pipeline)
    text_encoder/model.onnx  unet/model.onnx  vae_encoder/model.onnx  vae_decoder/model.onnx
    <component>/config.json                                           (each component's config)

(``transformer/model.onnx`` in place of the UNet for SD3 and Flux, ``text_encoder_2/``
and ``text_encoder_3/`` for their CLIP and T5 encoders.) Each component is then one
:class:`~zoo_convert.stages.Component` of the job: check, optimize (its variants beside
it: ``unet/model_fp16.onnx``) and verify (ORT against the component's PyTorch forward at
optimum's dummy inputs, a transformer's made what its pipeline feeds it:
:func:`use_pipeline_inputs`) treat it as any other graph.

Only light imports at module level: fetch calls :func:`is_pipeline` in the farm driver.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ExportError, FailureKind, FetchError, UnsafeCheckpointError
from ..records import ManifestEntry
from ..sources import read_json, vetted_file

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from ..job import Checkpoint, Component

INDEX = "model_index.json"
# Folders of a pipeline that hold no model and are copied as they are (optimum re-saves the same files).
COPIED = ("scheduler", "tokenizer", "tokenizer_2", "tokenizer_3", "feature_extractor")
# Libraries a pipeline's components may come from without running code of the checkpoint's.
_LIBRARIES = ("diffusers", "transformers")
# What optimum's split names each component's model type (the optimize stage picks its fuser by it).
_VAE_TYPES = {"vae_encoder": "vae-encoder", "vae_decoder": "vae-decoder"}


def is_pipeline(path: Path) -> bool:
    """A diffusers pipeline folder: ``model_index.json`` at its root and no ``config.json`` beside it."""
    return (path / INDEX).is_file() and not (path / "config.json").is_file()


def is_pipeline_repo(files: tuple[str, ...]) -> bool:
    """The same for a Hub snapshot's file list."""
    return INDEX in files and "config.json" not in files


def tokenizer_folder(component: str) -> str | None:
    """The folder of the tokenizer that feeds a text encoder: ``text_encoder_2`` reads ``tokenizer_2``."""
    if component == "text_encoder" or component.startswith("text_encoder_"):
        return "tokenizer" + component.removeprefix("text_encoder")
    return None


def read_index(path: Path, source: str) -> dict[str, Any]:
    """``model_index.json``, once it names a diffusers pipeline class; else a FetchError naming the file."""
    index = read_json(path / INDEX)  # looked at before opened: a FIFO or /dev/zero is refused, not read
    if not isinstance(index, dict) or not isinstance(index.get("_class_name"), str):
        raise FetchError(f"{source}: {INDEX} names no pipeline class (_class_name)")
    return index


def components(index: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """The pipeline's components that are there: folder -> (library, class)."""
    found = {}
    for key, value in index.items():
        if key.startswith("_") or not isinstance(value, list) or len(value) != 2:
            continue
        library, cls = value
        if library is not None and cls is not None:
            found[key] = (str(library), str(cls))
    return found


def vet(path: Path, resolved: str, entry: ManifestEntry) -> Checkpoint:
    """The pipeline as a Checkpoint: its class is diffusers', its components need no remote code, its weights are safe."""
    from .. import job

    index = read_index(path, entry.source)
    pipeline_class = index["_class_name"]
    parts = components(index)
    custom = sorted(f"{k} ({lib}.{cls})" for k, (lib, cls) in parts.items() if lib not in _LIBRARIES)
    if custom and not entry.allow_remote_code:
        raise UnsafeCheckpointError(
            f"{entry.source}: {INDEX} loads components from outside diffusers and transformers: "
            f"{', '.join(custom)}; set allow_remote_code to run their code"
        )
    import diffusers

    if not hasattr(diffusers, pipeline_class):
        raise ExportError(
            f"{entry.source}: pipeline class {pipeline_class!r} is unknown to diffusers {diffusers.__version__}",
            kind=FailureKind.EXPORT_UNSUPPORTED,
        )
    for folder, (library, _) in parts.items():
        if folder not in COPIED and library in _LIBRARIES:
            _check_weights(path / folder, entry)
    return job.Checkpoint(
        path=path,
        resolved_revision=resolved,
        model_type=pipeline_class,
        task=entry.task or infer_task(pipeline_class, entry.source),
        library="diffusers",
        config=index,
        trust_remote_code=entry.allow_remote_code,
    )


def _check_weights(folder: Path, entry: ManifestEntry) -> None:
    """A model component has safetensors weights, or pickles the entry allows."""
    if not folder.is_dir():
        raise FetchError(f"{entry.source}: {INDEX} lists {folder.name} but the pipeline has no {folder.name}/ folder")
    if any(folder.glob("*.safetensors")):
        return
    pickled = sorted(p.name for pattern in ("*.bin", "*.pt", "*.pth", "*.ckpt") for p in folder.glob(pattern))
    if not pickled:
        raise FetchError(f"{entry.source}: {folder.name}/ has no weights (*.safetensors)")
    if not entry.allow_pickle:
        raise UnsafeCheckpointError(
            f"{entry.source}: {folder.name}/ has only pickle weights ({', '.join(pickled)}); "
            "loading them can run arbitrary code — set allow_pickle to accept them"
        )


def infer_task(pipeline_class: str, source: str) -> str:
    """text-to-image, image-to-image or inpainting: the diffusers auto-pipeline mapping that lists the class."""
    from diffusers.pipelines.auto_pipeline import (
        AUTO_IMAGE2IMAGE_PIPELINES_MAPPING,
        AUTO_INPAINT_PIPELINES_MAPPING,
        AUTO_TEXT2IMAGE_PIPELINES_MAPPING,
    )

    for task, mapping in (
        ("text-to-image", AUTO_TEXT2IMAGE_PIPELINES_MAPPING),
        ("image-to-image", AUTO_IMAGE2IMAGE_PIPELINES_MAPPING),
        ("inpainting", AUTO_INPAINT_PIPELINES_MAPPING),
    ):
        if any(cls.__name__ == pipeline_class for cls in mapping.values()):
            return task
    raise ExportError(
        f"{source}: optimum exports text-to-image, image-to-image and inpainting pipelines; "
        f"{pipeline_class} is none of them",
        kind=FailureKind.EXPORT_UNSUPPORTED,
    )


def hub_files(files: tuple[str, ...], allow_pickle: bool) -> list[str]:
    """What a pipeline's export needs of a Hub snapshot: the index, every component folder's
    configs and processor files, and each model's own weights.

    Not the single-file checkpoints at the root (``v1-5-pruned.ckpt``), nor the weight
    variants beside the main weights (``diffusion_pytorch_model.fp16.safetensors``,
    ``.non_ema``), nor other exports (``onnx/``, flax ``*.msgpack``).
    """
    side = (".json", ".txt", ".model")
    by_folder: dict[str, list[str]] = {}
    for name in files:
        folder, _, base = name.rpartition("/")
        if folder and "/" not in folder:
            by_folder.setdefault(folder, []).append(base)
    wanted = [INDEX] if INDEX in files else []
    for folder, names in sorted(by_folder.items()):
        weights = [n for n in names if _main_weights(n, (".safetensors",))]
        if not weights and allow_pickle:
            weights = [n for n in names if _main_weights(n, (".bin",))]
        keep = [n for n in names if n.endswith(side) and not n.startswith(".")] + weights
        wanted += [f"{folder}/{n}" for n in sorted(keep)]
    return wanted


def _main_weights(name: str, suffixes: tuple[str, ...]) -> bool:
    """``diffusion_pytorch_model.safetensors`` or one of its shards, not a variant (``.fp16.``, ``.non_ema.``)."""
    stem = next((name[: -len(s)] for s in suffixes if name.endswith(s)), None)
    return stem is not None and "." not in stem


def pipeline_files(path: Path) -> list[Path]:
    """The files copied beside the graphs: model_index.json and the scheduler, tokenizer and processor folders.

    Each one vetted as the checkpoint's side files are: a regular file inside the pipeline.
    """
    root = path.resolve()
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith("models--"):
        root = root.parent.parent
    found = [vetted_file(path, INDEX, root)]
    for folder in COPIED:
        if (path / folder).is_dir():
            found += [vetted_file(path, f"{folder}/{p.name}", root) for p in sorted((path / folder).iterdir())]
    return [p for p in found if p is not None]


def export(
    ckpt: Checkpoint, task: str, opset: int | None, out_dir: Path
) -> tuple[list[Component], dict[str, Any], dict[str, PreTrainedTokenizerBase]]:
    """optimum's export of every component of the pipeline, in ORTDiffusionPipeline's layout under ``out_dir``.

    Also the tokenizers the pipeline loaded, by folder (``tokenizer_2``): the ones its ``__call__``
    feeds its text encoders with, so verify tokenizes with them.
    """
    import torch
    from optimum.exporters.onnx.convert import export_models
    from optimum.exporters.tasks import TasksManager
    from optimum.exporters.utils import get_diffusion_models_for_export
    from optimum.utils import DEFAULT_DUMMY_SHAPES
    from transformers import PreTrainedTokenizerBase

    from ..job import Component, ModuleState

    sources = pipeline_files(ckpt.path)  # before loading: a file linked out of the pipeline is refused first
    with _quiet_loader():
        pipeline = TasksManager.get_model_from_task(
            task,
            str(ckpt.path),
            framework="pt",
            torch_dtype=torch.float32,
            device="cpu",
            library_name="diffusers",
            local_files_only=True,
        )
    parts = get_diffusion_models_for_export(pipeline, int_dtype="int64", float_dtype="fp32", exporter="onnx")
    for name in parts:
        _clear(out_dir / name)
    subpaths = [f"{name}/model.onnx" for name in parts]
    for name, (module, _) in parts.items():
        # optimum saves each component's config beside its graph; ORTDiffusionPipeline reads it there
        if hasattr(module, "save_config"):
            module.save_config(out_dir / name)
        else:
            module.config.save_pretrained(out_dir / name)
    states = {name: ModuleState(module) for name, (module, _) in parts.items()}
    for module, _ in parts.values():
        module.eval()
    export_models(
        models_and_onnx_configs=parts,
        output_dir=out_dir,
        opset=opset,  # None: each component's own default, as optimum's main_export leaves it for diffusers
        output_names=subpaths,
        input_shapes=dict(DEFAULT_DUMMY_SHAPES),
        device="cpu",
        dtype="fp32",
    )
    for src in sources:
        dest = out_dir / src.relative_to(ckpt.path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.unlink(missing_ok=True)
        shutil.copyfile(src, dest)
    comps = [
        Component(
            name=name,
            path=out_dir / sub,
            onnx_config=config,
            torch_module=module,
            as_loaded=states[name],
            model_type=_VAE_TYPES.get(name) or getattr(module.config, "export_model_type", None),
        )
        for (name, (module, config)), sub in zip(parts.items(), subpaths)
    ]
    tokenizers = {name: part for name, part in pipeline.components.items() if isinstance(part, PreTrainedTokenizerBase)}
    return comps, {"exporter": "optimum", "pipeline": ckpt.model_type, "components": list(parts)}, tokenizers


@contextlib.contextmanager
def _quiet_loader() -> Iterator[None]:
    """diffusers' loader without its progress bar and notices (accelerate missing), which land between our lines."""
    from diffusers.utils import logging as diffusers_logging

    bar, level = diffusers_logging.is_progress_bar_enabled(), diffusers_logging.get_verbosity()
    diffusers_logging.disable_progress_bar()
    diffusers_logging.set_verbosity_error()
    try:
        yield
    finally:
        diffusers_logging.set_verbosity(level)
        if bar:
            diffusers_logging.enable_progress_bar()


def _clear(folder: Path) -> None:
    """A component folder from an earlier run of the same job goes: its graphs and variants are redone."""
    if folder.is_dir() and not folder.is_symlink():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)


# The timesteps each pipeline's __call__ hands its UNet or transformer, by optimum's name of the model,
# as the (low, high) of a uniform draw: FluxPipeline passes sigma (its ``timestep / 1000``; the model
# scales it by 1000 inside), StableDiffusion3Pipeline sigma * 1000, the UNet pipelines the scheduler's
# step (below its 1000 training steps). optimum's dummy timestep is below attention_head_dim (a UNet's:
# norm_num_groups): for Flux, times that 1000, angles no pipeline feeds (its fp16 graph failed on them).
_TIMESTEPS = {"flux-transformer-2d": (0.0, 1.0), "sd3-transformer-2d": (0.0, 1000.0), "unet-2d-condition": (0.0, 1000.0)}
# FluxPipeline's guidance is its guidance_scale (3.5 by default); optimum's is below 1.
_GUIDANCE = (1.0, 5.0)


def use_pipeline_inputs(model_type: str | None, inputs: dict[str, Any], height: int, width: int) -> None:
    """A diffusion UNet's or transformer's inputs become what its pipeline feeds it, in place, keeping every shape.

    optimum's dummy ``img_ids`` are all zeros, which makes Flux's rotary embedding the
    identity and leaves it unverified: they become the packed latent grid's (row, column)
    positions, as FluxPipeline makes them for a ``height`` x ``width`` latent; its
    ``txt_ids`` are zeros there too. Timesteps and guidance are drawn from the range
    the pipeline sends (:data:`_TIMESTEPS`), from the generators :func:`zoo_convert.verify.runtime.seeded` pins.
    """
    span = _TIMESTEPS.get(model_type or "")
    if span is None:
        return
    import torch

    timestep = inputs.get("timestep")
    if isinstance(timestep, torch.Tensor) and timestep.dtype.is_floating_point:
        low, high = span
        inputs["timestep"] = low + (high - low) * torch.rand_like(timestep)
    guidance = inputs.get("guidance")
    if isinstance(guidance, torch.Tensor) and guidance.dtype.is_floating_point:
        inputs["guidance"] = _GUIDANCE[0] + (_GUIDANCE[1] - _GUIDANCE[0]) * torch.rand_like(guidance)
    ids = inputs.get("img_ids")
    rows, cols = height // 2, width // 2  # Flux packs 2x2 latent patches into one token
    if isinstance(ids, torch.Tensor) and ids.shape[-2:] == (rows * cols, 3):
        grid = torch.zeros(rows, cols, 3, dtype=ids.dtype)
        grid[..., 1] = torch.arange(rows, dtype=ids.dtype)[:, None]
        grid[..., 2] = torch.arange(cols, dtype=ids.dtype)[None, :]
        inputs["img_ids"] = grid.reshape(rows * cols, 3).expand_as(ids).clone()
