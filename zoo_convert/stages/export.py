"""Export stage: a checkpoint folder in, ONNX graphs under ``out_dir/onnx/`` out.

Two exporters share one shape of result:

* ``optimum``: optimum-onnx's own export path (submodel split, OnnxConfig,
  decoder merging), so the layout is exactly what transformers.js and
  ``ORTModel`` load: ``onnx/model.onnx``, or ``onnx/encoder_model.onnx`` +
  ``onnx/decoder_model_merged.onnx`` for encoder-decoders.
* ``torch``: ``torch.onnx.export(dynamo=True)`` of the whole model as one
  ``onnx/model.onnx``, for single-graph (encoder-style) models.

Both keep the loaded torch module and optimum's OnnxConfig on each
:class:`Component`, so verify can regenerate inputs and run PyTorch without
reloading the checkpoint.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from .. import onnx_graph
from ..errors import ExportError, FailureKind, first_line, is_our_bug
from ..records import MAX_OPSET, MIN_OPSET, ManifestEntry, Settings
from ..runtime import ModuleState, processor_fallback, shape_kwargs
from ..sources import sentence_transformers_files, side_files
from . import Checkpoint, Component, ExportedModel

_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
# Tasks whose inputs are images or audio, sized by a processor config.
_IMAGE_AUDIO_TASKS = frozenset(
    {
        "image-classification",
        "object-detection",
        "semantic-segmentation",
        "image-segmentation",
        "depth-estimation",
        "keypoint-detection",
        "masked-im",
        "image-to-text",
        "image-to-image",
        "zero-shot-image-classification",
        "zero-shot-object-detection",
        "automatic-speech-recognition",
        "audio-classification",
        "audio-frame-classification",
        "audio-xvector",
    }
)
# Graphs optimum writes before merging them into decoder_model_merged.onnx.
_UNMERGED = ("decoder_model.onnx", "decoder_with_past_model.onnx")


def export(ckpt: Checkpoint, entry: ManifestEntry, settings: Settings, out_dir: Path) -> ExportedModel:
    """Export ``ckpt`` with the entry's exporter into ``out_dir/onnx``; raise ExportError on failure."""
    if entry.opset is not None and not MIN_OPSET <= entry.opset <= MAX_OPSET:
        raise ExportError(f"opset {entry.opset} is outside {MIN_OPSET}..{MAX_OPSET}", kind=FailureKind.EXPORT_UNSUPPORTED)
    sides = side_files(ckpt.path)  # before the export: a checkpoint that links out of itself is refused first
    onnx_dir = Path(out_dir) / "onnx"
    if onnx_dir.exists():
        shutil.rmtree(onnx_dir)
    onnx_dir.mkdir(parents=True)
    task = _resolve_task(ckpt, entry)
    try:
        with processor_fallback():
            if entry.exporter == "optimum":
                components, details = _export_optimum(ckpt, task, entry.opset, onnx_dir)
            elif entry.exporter == "torch":
                components, details = _export_torch(ckpt, task, entry.opset, onnx_dir)
            else:
                raise ExportError(f"unknown exporter {entry.exporter!r}", kind=FailureKind.EXPORT_UNSUPPORTED)
    except ExportError:
        raise
    except Exception as exc:  # noqa: BLE001 - every exporter failure is recorded as export_error
        if is_our_bug(exc):
            raise
        note = _missing_processor(ckpt, task)
        raise ExportError(f"{first_line(exc)}{note}" if note else f"{type(exc).__name__}: {exc}") from exc
    weights = _param_bytes(components)
    # Weights out of the graph for the whole job: every later read of a graph's structure
    # (check, census, input names, the fusers' and quantizers' walks) skips them.
    for comp in components:
        onnx_graph.externalize(comp.path)
    _copy_side_files(ckpt.path, sides, Path(out_dir))
    modules, left_out = sentence_transformers_files(ckpt.path)
    if modules:
        details["sentence_transformers"] = {"files": modules, "not_copied": left_out}
    return _describe(ckpt, Path(out_dir), components, {**details, "task": task, "weights_bytes": weights})


def _missing_processor(ckpt: Checkpoint, task: str) -> str:
    """What an export failure of an image or audio model may owe to its missing processor config."""
    if any((ckpt.path / name).is_file() for name in _PROCESSOR_FILES):
        return ""
    config = ckpt.config
    pixels = task.removesuffix("-with-past") in _IMAGE_AUDIO_TASKS or any(
        key in config for key in ("image_size", "num_channels", "num_mel_bins", "vision_config")
    )
    if not pixels:
        return ""
    return (
        f" (the checkpoint has no {_PROCESSOR_FILES[0]}: input sizes came from config.json and optimum's"
        " defaults; add the processor config the model was trained with)"
    )


def _resolve_task(ckpt: Checkpoint, entry: ManifestEntry) -> str:
    """The task to export; decoders get ``-with-past`` unless a task was asked for explicitly."""
    import optimum.exporters.onnx.model_configs  # noqa: F401 - registers the ONNX configs with the TasksManager
    from optimum.exporters.tasks import TasksManager

    task: str = TasksManager.map_from_synonym(ckpt.task)
    if ckpt.library != "transformers":
        # optimum keys other libraries by its own model types ("transformer" for
        # sentence-transformers); as in main_export, their support shows at load time.
        return task
    try:
        supported = TasksManager.get_supported_tasks_for_model_type(ckpt.model_type, "onnx", library_name=ckpt.library)
    except KeyError as exc:
        raise ExportError(
            f"optimum cannot export model_type {ckpt.model_type!r} (library {ckpt.library}) for task {task!r}: "
            f"{exc.args[0] if exc.args else exc}",
            kind=FailureKind.EXPORT_UNSUPPORTED,
        ) from exc
    # optimum lists some tasks for a model type that no transformers class of that type
    # serves (trocr's feature-extraction: AutoModel has no trocr model); those are no choice.
    loadable = [t for t in supported if _loadable(t, ckpt.model_type)]
    if task not in loadable:
        unloadable = [t for t in supported if t not in loadable]
        raise ExportError(
            f"optimum cannot export model_type {ckpt.model_type!r} for task {task!r}; "
            + (f"supported tasks: {', '.join(loadable)}" if loadable else "it supports no task for it")
            + (f" (optimum also lists {', '.join(unloadable)}, which no transformers class of that type serves)"
               if unloadable else ""),
            kind=FailureKind.EXPORT_UNSUPPORTED,
        )
    if entry.task is None and not task.endswith("-with-past") and f"{task}-with-past" in supported:
        task = f"{task}-with-past"
    return task


def _loadable(task: str, model_type: str) -> bool:
    """Whether the class optimum loads for ``task`` has a model of ``model_type`` (True where it cannot tell)."""
    from optimum.exporters.tasks import TasksManager
    from transformers import CONFIG_MAPPING

    try:
        cls = TasksManager.get_model_class_for_task(task, model_type=model_type, library="transformers")
    except (KeyError, ValueError):
        return True
    mapping = getattr(cls, "_model_mapping", None)  # auto classes only: a concrete class is its own answer
    if mapping is None or model_type not in CONFIG_MAPPING:
        return True
    return CONFIG_MAPPING[model_type] in mapping


def _load_model(ckpt: Checkpoint, task: str) -> Any:
    """Load the torch model the way optimum's main_export does (fp32, eval, cache per task)."""
    import torch
    from optimum.exporters.tasks import TasksManager

    model = TasksManager.get_model_from_task(
        task,
        str(ckpt.path),
        framework="pt",
        torch_dtype=torch.float32,
        device="cpu",
        library_name=ckpt.library,
        trust_remote_code=ckpt.trust_remote_code,
        local_files_only=True,
    )
    model.eval()
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "use_cache"):
        config.use_cache = task.endswith("-with-past")
    if config is not None and task == "text-classification" and getattr(config, "pad_token_id", None) is None:
        # optimum needs a pad id to pick the last token; the tokenizer's is the real one
        config.pad_token_id = _tokenizer_pad_id(ckpt)
    return model


def _tokenizer_pad_id(ckpt: Checkpoint) -> int:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ckpt.path), trust_remote_code=ckpt.trust_remote_code)
    pad: int | None = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    if pad is None:
        raise ExportError("text-classification export needs a pad_token_id and the tokenizer has none")
    return pad


def _export_optimum(ckpt: Checkpoint, task: str, opset: int | None, onnx_dir: Path) -> tuple[list[Component], dict[str, Any]]:
    """optimum-onnx's submodel split, export and post-processing (decoder merge), keeping the configs.

    This is the body of ``onnx_export_from_model`` minus config saving and
    validation: calling the pieces directly is the only way to keep the
    per-component OnnxConfig that post-processing has adjusted.
    """
    from optimum.exporters.onnx.convert import export_models
    from optimum.utils import DEFAULT_DUMMY_SHAPES

    model = _load_model(ckpt, task)
    main_config, models_and_configs = _submodels(ckpt, model, task)
    opset = opset if opset is not None else main_config.DEFAULT_ONNX_OPSET
    subpaths = [f"{name}.onnx" for name in models_and_configs]
    as_loaded = ModuleState(model)
    export_models(
        models_and_onnx_configs=models_and_configs,
        output_dir=onnx_dir,
        opset=opset,
        output_names=subpaths,
        input_shapes={**DEFAULT_DUMMY_SHAPES, **_dummy_shapes(ckpt, main_config)},
        device="cpu",
        dtype="fp32",
    )
    models_and_configs, subpaths = main_config.post_process_exported_models(onnx_dir, models_and_configs, subpaths)
    # The last (module, config) per file wins: for a merged decoder that is the
    # with-past branch, and verify derives the no-past branch from it.
    by_file: dict[str, tuple[Any, Any]] = {}
    for (module, config), sub in zip(models_and_configs.values(), subpaths):
        by_file[str(sub)] = (module, config)
    if "decoder_model_merged.onnx" in by_file:
        for name in _UNMERGED:
            onnx_graph.delete(onnx_dir / name)
    components = [
        Component(name=Path(sub).stem, path=onnx_dir / sub, onnx_config=config, torch_module=module, as_loaded=as_loaded)
        for sub, (module, config) in by_file.items()
    ]
    return components, {"exporter": "optimum"}


def _dummy_shapes(ckpt: Checkpoint, config: Any) -> dict[str, int]:
    """optimum's default dummy shapes as this checkpoint's processor and config have them (filterbank frames)."""
    from optimum.utils import DEFAULT_DUMMY_SHAPES

    batch, seq = DEFAULT_DUMMY_SHAPES["batch_size"], DEFAULT_DUMMY_SHAPES["sequence_length"]
    return shape_kwargs(ckpt.path, config, batch, seq, DEFAULT_DUMMY_SHAPES["audio_sequence_length"])


def _submodels(ckpt: Checkpoint, model: Any, task: str) -> tuple[Any, dict[str, tuple[Any, Any]]]:
    """optimum's split of a model into the graphs it exports (encoder, decoders), each with its OnnxConfig."""
    from optimum.exporters.onnx.utils import _get_submodels_and_onnx_configs
    from optimum.exporters.tasks import TasksManager
    from optimum.utils.save_utils import maybe_load_preprocessors

    TasksManager.standardize_model_attributes(model)
    preprocessors = maybe_load_preprocessors(str(ckpt.path), trust_remote_code=ckpt.trust_remote_code)
    submodels: tuple[Any, dict[str, tuple[Any, Any]]] = _get_submodels_and_onnx_configs(
        model=model,
        task=task,
        monolith=False,
        custom_onnx_configs={},
        custom_architecture=False,
        _variant="default",
        library_name=ckpt.library,
        preprocessors=preprocessors,
    )
    return submodels


def _export_torch(ckpt: Checkpoint, task: str, opset: int | None, onnx_dir: Path) -> tuple[list[Component], dict[str, Any]]:
    """``torch.onnx.export(dynamo=True)`` of single-graph models, with optimum's inputs and axes.

    Whether a model is one graph is optimum's split that decides, not ``config.is_encoder_decoder``:
    DETR-style detectors have an encoder and a decoder inside and export as one graph.
    """
    import torch

    if task.endswith("-with-past"):
        raise ExportError(
            f"the torch exporter handles single-graph models only; {ckpt.model_type} for task {task!r} "
            "needs past key values (use exporter optimum)",
            kind=FailureKind.EXPORT_UNSUPPORTED,
        )
    model = _load_model(ckpt, task)
    _, parts = _submodels(ckpt, model, task)
    if len(parts) != 1:
        raise ExportError(
            f"the torch exporter exports one graph; {ckpt.model_type!r} for task {task!r} is {len(parts)} "
            f"({', '.join(parts)}): use exporter optimum",
            kind=FailureKind.EXPORT_UNSUPPORTED,
        )
    ((model, config),) = parts.values()
    inputs = config.generate_dummy_inputs(framework="pt")
    names = [n for n in config.inputs if n in inputs]
    # AUTO: an axis the model fixes (DETR's channels) becomes static instead of failing the export
    # and sending torch.onnx through its slower fallback strategies; the axes get optimum's names after.
    dynamic_shapes = {n: {axis: torch.export.Dim.AUTO for axis in config.inputs[n]} for n in names}
    path = onnx_dir / "model.onnx"
    as_loaded = ModuleState(model)
    with torch.no_grad(), config.patch_model_for_export(model):
        program = torch.onnx.export(
            model,
            (),
            kwargs={n: inputs[n] for n in names},
            dynamo=True,
            input_names=names,
            output_names=list(config.outputs),
            dynamic_shapes=dynamic_shapes,
            opset_version=opset,
            external_data=False,
        )
    if program is None:  # only with dynamo=False, which is not asked for
        raise ExportError("torch.onnx.export returned no ONNX program")
    program.save(str(path), external_data=False)
    _name_dynamic_axes(path, {n: config.inputs[n] for n in names})
    component = Component(name="model", path=path, onnx_config=config, torch_module=model, as_loaded=as_loaded)
    return [component], {"exporter": "torch"}


def _name_dynamic_axes(path: Path, axes: dict[str, dict[int, str]]) -> None:
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


def _param_bytes(components: list[Component]) -> int:
    seen: set[int] = set()
    total = 0
    for comp in components:
        if comp.torch_module is None:
            continue
        for p in comp.torch_module.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel() * p.element_size()
    return total


def _copy_side_files(src: Path, sides: list[Path], out_dir: Path) -> None:
    """Config, tokenizer and processor files go beside onnx/, as transformers.js and ORTModel expect."""
    for path in sides:
        dest = out_dir / path.relative_to(src)
        dest.parent.mkdir(parents=True, exist_ok=True)  # sentence-transformers module folders
        dest.unlink(missing_ok=True)
        shutil.copyfile(path, dest)  # the contents only: set_modes gives every artifact one mode


def set_modes(out_dir: Path) -> None:
    """Every artifact file gets mode 0644 less the umask (onnx writes external data 0600, copies kept any mode)."""
    mode = 0o644 & ~_umask()
    for path in Path(out_dir).rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(mode)


def _umask() -> int:
    """This process's umask, read without setting it (os.umask would change it for other threads meanwhile)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _describe(ckpt: Checkpoint, out_dir: Path, components: list[Component], details: dict[str, Any]) -> ExportedModel:
    """Read opset, IR version, node count and op census from the written graphs."""
    census: Counter[str] = Counter()
    opset = ir_version = 0
    for comp in components:
        model = comp.graph
        ir_version = max(ir_version, model.ir_version)
        opset = max(opset, next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0))
        census.update(onnx_graph.op_census(model.graph))
    files = {
        str(p.relative_to(out_dir)): p.stat().st_size for p in sorted((out_dir / "onnx").rglob("*")) if p.is_file()
    }
    return ExportedModel(
        checkpoint=ckpt,
        out_dir=out_dir,
        components=components,
        opset=opset,
        ir_version=ir_version,
        node_count=sum(census.values()),
        op_census=dict(sorted(census.items())),
        files=files,
        details=details,
    )
