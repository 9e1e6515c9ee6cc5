"""Export stage: a checkpoint folder in, ONNX graphs under ``out_dir/onnx/`` out.

Two exporters share one shape of result:

* ``optimum``: optimum-onnx's own export path (submodel split, OnnxConfig,
  decoder merging), so the layout is exactly what transformers.js and
  ``ORTModel`` load: ``onnx/model.onnx``, or ``onnx/encoder_model.onnx`` +
  ``onnx/decoder_model_merged.onnx`` for encoder-decoders.
* ``torch``: ``torch.onnx.export(dynamo=True)`` in optimum's layout: the whole
  model as one ``onnx/model.onnx`` for single-graph models and for decoders with
  past (:mod:`zoo_convert.exporters.torch_decoder`), each graph of optimum's split for
  encoder-decoders (:mod:`zoo_convert.exporters.torch_seq2seq`); a model type
  optimum has no config for takes the generic path (:mod:`zoo_convert.exporters.generic`:
  the OnnxConfig is built from the model itself), recorded in the details as
  ``generic`` with the reason.
* ``auto``: optimum where it has a config for the model type and task, the
  torch exporter's generic path otherwise.

Both keep the loaded torch module and optimum's OnnxConfig on each
:class:`Component`, so verify can regenerate inputs and run PyTorch without
reloading the checkpoint.

Both export only a model the checkpoint's weights cover (:func:`check_weights`):
the PyTorch reference is the same in-memory model, so a tensor transformers
initialised at random would agree with itself and pass.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import shutil
import stat
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import onnx_graph
from ..errors import ExportError, FailureKind, UnsafeCheckpointError, ZooConvertError, first_line, is_our_bug
from ..exporters import diffusion, generic, merge, torch_onnx, torch_seq2seq
from ..job import ModuleState
from ..records import EXPORTERS, MAX_OPSET, MIN_OPSET, ManifestEntry, Settings
from ..sources import open_regular, sentence_transformers_files, side_files
from ..verify import loadable
from ..verify.runtime import branch_config, processor_fallback, processor_shapes, shape_kwargs, torch_threads
from . import Checkpoint, Component, ExportedModel
from .forked import Parked, start_forked, step

if TYPE_CHECKING:
    import torch

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
_MERGED = "decoder_model_merged.onnx"
# How many key names a weights_mismatch message lists of each kind (the counts are all there).
_NAMES_SHOWN = 3


def export(
    ckpt: Checkpoint, entry: ManifestEntry, settings: Settings, out_dir: Path,
    *, ahead: Callable[[ExportedModel], bool] | None = None,
) -> ExportedModel:
    """Export ``ckpt`` with the entry's exporter into ``out_dir/onnx`` (a diffusers pipeline: its component folders); raise ExportError on failure.

    ``ahead``: called with a provisional ExportedModel (its components' torch modules and OnnxConfigs, no graph yet)
    just before optimum's exporter runs them, from the thread that runs torch, between two of its calls; it answers
    whether it started a child that runs beside the export (which then keeps torch to one thread).
    """
    if entry.opset is not None and not MIN_OPSET <= entry.opset <= MAX_OPSET:
        raise ExportError(f"opset {entry.opset} is outside {MIN_OPSET}..{MAX_OPSET}", kind=FailureKind.EXPORT_UNSUPPORTED)
    if ckpt.library == "diffusers":
        return _export_diffusers(ckpt, entry, Path(out_dir))
    sides = side_files(ckpt.path, remote_code=ckpt.trust_remote_code)  # before the export: a checkpoint that links out of itself is refused first
    onnx_dir = Path(out_dir) / "onnx"
    if onnx_dir.exists():
        shutil.rmtree(onnx_dir)
    onnx_dir.mkdir(parents=True)
    if entry.exporter not in EXPORTERS:
        raise ExportError(f"unknown exporter {entry.exporter!r}", kind=FailureKind.EXPORT_UNSUPPORTED)
    task, no_config = _resolve_task(ckpt, entry)
    if no_config is not None and entry.exporter == "optimum":
        raise ExportError(no_config, kind=FailureKind.EXPORT_UNSUPPORTED)
    # The side files first, loaded back as users load them: a file that does not load fails the job before the export.
    _copy_side_files(ckpt.path, sides, Path(out_dir))
    loaded = loadable.load(ckpt, Path(out_dir), entry.source)
    try:
        with processor_fallback():
            if no_config is not None:  # torch or auto: the generic path, built from the model itself
                components, details = _export_generic(ckpt, task, entry.opset, onnx_dir, no_config)
            elif entry.exporter in ("optimum", "auto"):
                early = functools.partial(_provisional, ckpt, Path(out_dir), loaded.tokenizer, ahead) if ahead else None
                components, details = _export_optimum(ckpt, task, entry.opset, onnx_dir, settings.timeout_s, early)
            else:
                components, details = _export_torch(ckpt, task, entry.opset, onnx_dir)
    except ExportError:
        raise
    except Exception as exc:  # noqa: BLE001 - every exporter failure is recorded as export_error
        if is_our_bug(exc):
            raise
        _read_back(onnx_dir, entry.exporter, exc)  # a graph the exporter wrote cut short, read by its own post-processing
        _refused_pickle(exc)
        note = _missing_processor(ckpt, task)
        raise ExportError(f"{first_line(exc)}{note}" if note else f"{type(exc).__name__}: {exc}") from exc
    _read_back(onnx_dir, details.get("exporter", entry.exporter))
    weights = _param_bytes(components)
    # Weights out of the graph for the whole job: every later read of a graph's structure
    # (check, census, input names, the fusers' and quantizers' walks) skips them.
    for comp in components:
        onnx_graph.externalize(comp.path)
    modules, left_out = sentence_transformers_files(ckpt.path)
    if modules:
        details["sentence_transformers"] = {"files": modules, "not_copied": left_out}
    details.update(task=task, weights_bytes=weights, loaded=loaded.details)
    exported = _describe(ckpt, Path(out_dir), components, details)
    if loaded.tokenizer is not None:  # verify tokenizes with the artifacts' tokenizer: loaded once per job
        exported.cache.tokenizer, exported.cache.tokenizer_loaded = loaded.tokenizer, True
    return exported


def _export_diffusers(ckpt: Checkpoint, entry: ManifestEntry, out_dir: Path) -> ExportedModel:
    """A diffusers pipeline, component by component, in ORTDiffusionPipeline's layout (:mod:`zoo_convert.exporters.diffusion`)."""
    if entry.exporter not in ("optimum", "auto"):  # auto: optimum has a config for every component
        raise ExportError(
            f"diffusers pipelines are exported with optimum's split into components; exporter {entry.exporter!r} "
            "exports one graph (use exporter optimum)",
            kind=FailureKind.EXPORT_UNSUPPORTED,
        )
    try:
        components, details, tokenizers = diffusion.export(ckpt, ckpt.task, entry.opset, out_dir)
    except ZooConvertError:
        raise
    except Exception as exc:  # noqa: BLE001 - every exporter failure is recorded as export_error
        if is_our_bug(exc):
            raise
        raise ExportError(f"{type(exc).__name__}: {exc}") from exc
    for comp in components:
        if (why := onnx_graph.unread(comp.path)) is not None:
            raise onnx_graph.cut_short(comp.path, "the diffusers exporter", why)
    weights = _param_bytes(components)
    for comp in components:
        onnx_graph.externalize(comp.path)
    exported = _describe(ckpt, out_dir, components, {**details, "task": ckpt.task, "weights_bytes": weights})
    exported.cache.pipeline_tokenizers.update(tokenizers)  # verify's real text for the text encoders
    return exported


def _missing_processor(ckpt: Checkpoint, task: str) -> str:
    """What an export failure of an image or audio model may owe to its missing processor config."""
    if ckpt.library == "timm":  # sized by its pretrained_cfg: a timm checkpoint has no processor config
        return ""
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


def _resolve_task(ckpt: Checkpoint, entry: ManifestEntry) -> tuple[str, str | None]:
    """The task to export, and why optimum has no config for it (None where it has one).

    Decoders get ``-with-past`` unless a task was asked for explicitly. Without a config,
    exporters ``torch`` and ``auto`` take the generic path and ``optimum`` refuses the row.
    """
    import optimum.exporters.onnx.model_configs  # noqa: F401 - registers the ONNX configs with the TasksManager
    from optimum.exporters.tasks import TasksManager

    task: str = TasksManager.map_from_synonym(ckpt.task)
    if ckpt.library == "timm":
        return _timm_task(ckpt, task), None
    if ckpt.library != "transformers":
        # optimum keys other libraries by its own model types ("transformer" for
        # sentence-transformers); as in main_export, their support shows at load time.
        return task, None
    try:
        supported = TasksManager.get_supported_tasks_for_model_type(ckpt.model_type, "onnx", library_name=ckpt.library)
    except KeyError as exc:
        said = str(exc.args[0] if exc.args else exc)
        return task, (
            f"optimum cannot export model_type {ckpt.model_type!r} (library {ckpt.library}) for task {task!r}: "
            + said.split(". Only [")[0]  # not the list of every model type it has a config for, in every record
        )
    # optimum lists some tasks for a model type that no transformers class of that type
    # serves (trocr's feature-extraction: AutoModel has no trocr model); those are no choice.
    loadable = [t for t in supported if _loadable(t, ckpt.model_type)]
    if task not in loadable:
        unloadable = [t for t in supported if t not in loadable]
        return task, (
            f"optimum cannot export model_type {ckpt.model_type!r} for task {task!r}; "
            + (f"supported tasks: {', '.join(loadable)}" if loadable else "it supports no task for it")
            + (f" (optimum also lists {', '.join(unloadable)}, which no transformers class of that type serves)"
               if unloadable else "")
        )
    if entry.task is None and not task.endswith("-with-past") and f"{task}-with-past" in supported:
        task = f"{task}-with-past"
    return task, None


def _timm_task(ckpt: Checkpoint, task: str) -> str:
    """optimum exports timm models for image-classification alone; a model without a classifier is that graph too.

    A timm model built with ``num_classes=0`` (CLIP and SigLIP towers, backbones) returns its
    pooled features from the same forward: the graph's one output (optimum names it ``logits``) holds them.
    """
    if task == "image-classification":
        return task
    if task in ("feature-extraction", "image-feature-extraction") and ckpt.config.get("num_classes") == 0:
        return "image-classification"
    raise ExportError(
        f"optimum exports timm models for image-classification (and the features of one without a classifier, "
        f"num_classes 0); not {task!r}" + (f" of a model with {ckpt.config['num_classes']} classes" if "num_classes" in ckpt.config else ""),
        kind=FailureKind.EXPORT_UNSUPPORTED,
    )


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


def _load_model(ckpt: Checkpoint, task: str) -> tuple[Any, LoadingReport | None]:
    """Load the torch model the way optimum's main_export does (fp32, eval, cache per task), with its loading report.

    transformers hands its report back from the same ``from_pretrained`` call
    (``output_loading_info``), so the weights are read once; ``ignore_mismatched_sizes``
    makes a tensor of another shape a line of the report instead of an exception.
    timm's is made by :func:`_load_timm_weights`; the other libraries' loaders give none here (None).
    """
    import torch
    from optimum.exporters.tasks import TasksManager

    if ckpt.library == "timm":
        timm_model, timm_report = _load_timm(ckpt)
        return timm_model.to(torch.float32).eval(), timm_report
    with_report = ckpt.library == "transformers"
    loaded = TasksManager.get_model_from_task(
        task,
        str(ckpt.path),
        framework="pt",
        torch_dtype=torch.float32,
        device="cpu",
        library_name=ckpt.library,
        trust_remote_code=ckpt.trust_remote_code,
        local_files_only=True,
        **({"output_loading_info": True, "ignore_mismatched_sizes": True} if with_report else {}),
    )
    # transformers returns (model, report); optimum's standardize_model_attributes does nothing to a transformers model
    model, info = loaded if with_report else (loaded, None)
    report = None
    if info is not None:
        report = LoadingReport(
            missing=tuple(info["missing_keys"]),
            unexpected=tuple(info["unexpected_keys"]),
            mismatched=tuple(info["mismatched_keys"]),
        )
    model.eval()
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "use_cache"):
        config.use_cache = task.endswith("-with-past")
    if config is not None and task == "text-classification" and getattr(config, "pad_token_id", None) is None:
        # optimum needs a pad id to pick the last token; the tokenizer's is the real one
        config.pad_token_id = _tokenizer_pad_id(ckpt)
    return model, report


@dataclass(frozen=True)
class LoadingReport:
    """What loading a checkpoint's weights into the model to export left uncovered.

    transformers' report (``output_loading_info``) already leaves out what the model's class
    declares ignorable: ``_keys_to_ignore_on_load_missing`` / ``_unexpected``, non-persistent
    buffers, a tied weight saved once. A loader of another library (timm) fills the same fields.

    Attributes:
        missing: the model's tensors the checkpoint has none for (left as initialised).
        unexpected: the checkpoint's tensors the model has no place for.
        mismatched: tensors whose shape in the checkpoint is not the model's (left as initialised).
    """

    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    mismatched: tuple[str, ...] = ()


def check_weights(
    ckpt: Checkpoint,
    task: str,
    model: Any,
    report: LoadingReport | None,
    parts: Iterable[tuple[Any, Any]],
    shapes: dict[str, int],
) -> dict[str, Any]:
    """Refuse (``export_weights_mismatch``) a model its checkpoint's weights do not cover; returns what was tolerated.

    Tolerated, and recorded: the task head of a checkpoint exported as its base model (a
    masked-LM's ``cls.*`` under feature-extraction), and missing parameters no exported output
    depends on (BertModel's pooler under feature-extraction), found by a backward pass from
    the exported outputs (``parts``: optimum's (module, OnnxConfig) per graph, fed its dummy
    inputs at ``shapes``). Everything else missing, unused or of another shape is refused.
    """
    if report is None:
        return {}
    head = _dropped_head(ckpt.path, model, report.unexpected)
    unused = [k for k in report.unexpected if k not in head]
    params: dict[str, torch.nn.Parameter] = {}
    missing: list[str] = []
    for key in report.missing:
        try:
            params[key] = model.get_parameter(key)
        except AttributeError:  # a persistent buffer: it holds state the forward reads
            if not key.endswith("num_batches_tracked"):  # counts training steps; eval never reads it
                missing.append(key)
    reached = _reached(parts, params, shapes)
    missing += [k for k in params if k in reached]
    problems = [
        f"{_count(keys)} {what} ({_names(keys)})"
        for keys, what in (
            (missing, "missing from the checkpoint, left as initialised at random"),
            (unused, "of the checkpoint unused by it"),
            (report.mismatched, "of another shape in the checkpoint, left as initialised at random"),
        )
        if keys
    ]
    if problems:
        raise ExportError(
            f"the checkpoint's weights do not cover {type(model).__name__} (task {task}): "
            + "; ".join(problems)
            + _task_hint(ckpt, task, type(model).__name__),
            kind=FailureKind.EXPORT_WEIGHTS_MISMATCH,
        )
    tolerated = {"unused_head": sorted(head), "missing_unused": sorted(k for k in params if k not in reached)}
    return {k: v for k, v in tolerated.items() if v}


def _count(keys: Iterable[str]) -> str:
    n = len(list(keys))
    return f"{n} tensor" if n == 1 else f"{n} tensors"


def _names(keys: Iterable[str]) -> str:
    shown = list(keys)
    return ", ".join(shown[:_NAMES_SHOWN]) + (", ..." if len(shown) > _NAMES_SHOWN else "")


def _dropped_head(folder: Path, model: Any, unexpected: Iterable[str]) -> set[str]:
    """The unexpected keys that are a task head the export leaves out: the model is the checkpoint's base model.

    transformers names such a head by its checkpoint key (``cls.predictions.bias``), and the
    base model's own unused tensors without its prefix (``encoder.layer.0...`` of ``bert.encoder...``):
    the checkpoint's key names tell them apart.
    """
    prefix = getattr(model, "base_model_prefix", "")
    if not prefix or getattr(model, "base_model", None) is not model:
        return set()
    keys = _checkpoint_keys(folder)
    if not any(k.startswith(f"{prefix}.") for k in keys):
        return set()  # a base model's own checkpoint: it has no head to leave out
    return {k for k in unexpected if not k.startswith(f"{prefix}.") and k in keys and f"{prefix}.{k}" not in keys}


def _checkpoint_keys(folder: Path) -> set[str]:
    """The tensor names of a checkpoint's weight files, read from their headers (pickle files on the meta device)."""
    from safetensors import safe_open

    keys: set[str] = set()
    safe = sorted(folder.glob("*.safetensors"))
    for file in safe:
        with safe_open(str(file), framework="pt") as fh:
            keys.update(fh.keys())
    if not safe:  # fetch accepted pickle weights (allow_pickle): transformers read them the same way
        from transformers.modeling_utils import load_state_dict

        for file in sorted(folder.glob("pytorch_model*.bin")):
            keys.update(load_state_dict(str(file), map_location="meta", weights_only=True))
    return keys


def _reached(parts: Iterable[tuple[Any, Any]], params: dict[str, torch.nn.Parameter], shapes: dict[str, int]) -> set[str]:
    """The ``params`` some exported output depends on: a backward pass from every output on the dummy inputs.

    A forward that fails, or a parameter it cannot differentiate, counts as reached: what
    cannot be shown unused is not excused. The module's state is put back after the forward.
    """
    import torch

    reached: set[str] = set()
    for module, config in parts:
        mine = {id(p) for p in module.parameters()}
        wanted = {n: p for n, p in params.items() if id(p) in mine and n not in reached}
        reached.update(n for n, p in wanted.items() if not p.requires_grad)
        wanted = {n: p for n, p in wanted.items() if p.requires_grad}
        if not wanted:
            continue
        state = ModuleState(module)
        try:
            inputs = config.rename_ambiguous_inputs(config.generate_dummy_inputs(framework="pt", **shapes))
            with torch.enable_grad(), config.patch_model_for_export(module):
                ends = [t.sum() for t in _tensors(module(**inputs)) if t.requires_grad]
            grads = torch.autograd.grad(ends, list(wanted.values()), allow_unused=True) if ends else (None,) * len(wanted)
        except Exception:  # noqa: BLE001 - unproven is not excused
            reached.update(wanted)
            continue
        finally:
            state.restore()
        reached.update(n for n, g in zip(wanted, grads) if g is not None)
    return reached


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a model's outputs (ModelOutput, tuples, a transformers cache)."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif hasattr(value, "to_legacy_cache"):
        yield from _tensors(value.to_legacy_cache())


def _task_hint(ckpt: Checkpoint, task: str, loaded: str) -> str:
    """Which task the checkpoint's weights are for, when its ``architectures`` names another one."""
    from optimum.exporters.tasks import TasksManager

    mappings = TasksManager._TRANSFORMERS_TASKS_TO_MODEL_MAPPINGS
    for arch in ckpt.config.get("architectures") or ():
        fits = [t for t, classes in mappings.items() if arch in classes.values()]
        if fits and arch != loaded and task.removesuffix("-with-past") not in fits:
            return f"; the checkpoint's weights are for {arch}: try task {fits[0]}"
    return ""


def _load_timm(ckpt: Checkpoint) -> tuple[Any, LoadingReport]:
    """A timm checkpoint folder (``config.json`` with ``pretrained_cfg``, ``model.safetensors``), built as optimum builds one.

    optimum loads timm with ``create_model("hf_hub:<id>")``, which refuses a folder; ``local-dir:``
    is timm's own source for one (the architecture and model_args of its config.json, exportable
    layers). A checkpoint fetched from the Hub is such a folder too: fetch downloaded it at its revision.
    """
    import timm

    arch = ckpt.model_type
    if not timm.is_model(arch):
        raise ExportError(
            f"{ckpt.path.name}: architecture {arch!r} is unknown to timm {timm.__version__}",
            kind=FailureKind.EXPORT_UNSUPPORTED,
        )
    model = timm.create_model(f"local-dir:{ckpt.path}", pretrained=False, exportable=True)
    return model, _load_timm_weights(model, ckpt.path)


def _load_timm_weights(model: Any, folder: Path) -> LoadingReport:
    """Load the folder's weights into the model and report what they leave uncovered (check_weights judges it).

    timm's own pretrained loading would pass a checkpoint's filter function and adapt the
    classifier; a checkpoint saved by timm is the model's state dict as is.
    """
    import safetensors.torch
    import torch

    safe = sorted(folder.glob("*.safetensors"))
    file = folder / "model.safetensors" if (folder / "model.safetensors").is_file() else (safe or [folder / "pytorch_model.bin"])[0]
    if not file.is_file():
        raise ExportError(f"{folder.name}: no model.safetensors (or pytorch_model.bin) for timm to load")
    # fetch refused pickle weights unless the entry allows them; weights_only unpickles tensors alone
    state = safetensors.torch.load_file(file) if file.suffix == ".safetensors" else torch.load(file, weights_only=True)
    own = model.state_dict()
    mismatched = tuple(k for k, v in state.items() if k in own and own[k].shape != v.shape)
    result = model.load_state_dict({k: v for k, v in state.items() if k not in mismatched}, strict=False)
    return LoadingReport(
        missing=tuple(k for k in result.missing_keys if k not in mismatched),
        unexpected=tuple(result.unexpected_keys),
        mismatched=mismatched,
    )


def _tokenizer_pad_id(ckpt: Checkpoint) -> int:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ckpt.path), trust_remote_code=ckpt.trust_remote_code)
    pad: int | None = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    if pad is None:
        raise ExportError("text-classification export needs a pad_token_id and the tokenizer has none")
    return pad


def _provisional(
    ckpt: Checkpoint, out_dir: Path, tokenizer: Any, ahead: Callable[[ExportedModel], bool], components: list[Component]
) -> bool:
    """``ahead`` called with the export about to run: its components, and the tokenizer verify feeds real text with."""
    early = ExportedModel(ckpt, out_dir, components, opset=0, ir_version=0, node_count=0, op_census={},
                          details={"weights_bytes": _param_bytes(components)})  # fmt: skip
    if tokenizer is not None:
        early.cache.tokenizer, early.cache.tokenizer_loaded = tokenizer, True
    return ahead(early)


def _export_optimum(
    ckpt: Checkpoint, task: str, opset: int | None, onnx_dir: Path, timeout_s: float,
    ahead: Callable[[list[Component]], bool] | None = None,
) -> tuple[list[Component], dict[str, Any]]:
    """optimum-onnx's submodel split, export and post-processing (decoder merge), keeping the configs.

    This is the body of ``onnx_export_from_model`` minus config saving and
    validation: calling the pieces directly is the only way to keep the
    per-component OnnxConfig that post-processing has adjusted. ``ahead`` gets the
    components as they are about to be exported (:func:`export`), and says whether a child
    now runs beside the export.
    """
    from optimum.exporters.onnx.convert import export as export_graph
    from optimum.utils import DEFAULT_DUMMY_SHAPES

    model, report = _load_model(ckpt, task)
    main_config, models_and_configs = _submodels(ckpt, model, task)
    shapes = {**DEFAULT_DUMMY_SHAPES, **_dummy_shapes(ckpt, main_config)}
    weights = check_weights(ckpt, task, model, report, models_and_configs.values(), shapes)
    opset = opset if opset is not None else main_config.DEFAULT_ONNX_OPSET
    subpaths = [f"{name}.onnx" for name in models_and_configs]
    as_loaded = ModuleState(model)
    beside = ahead is not None and ahead(_as_post_processed(models_and_configs, subpaths, onnx_dir, as_loaded))
    fixing: list[Parked[None]] = []
    # With a child beside it, the export's own torch ops (its traced forward) keep to one thread: OpenMP's threads
    # wait for each other at every op, and one of two that shares its CPU with the child holds up both.
    with torch_threads(1) if beside else contextlib.nullcontext():
        try:
            # optimum's export_models, one graph at a time: each graph's dynamic axes are fixed (where that is due)
            # in a child while the next graph is exported, the export leaving a CPU idle (whisper-tiny's decoder: 1.1 s).
            for (module, config), subpath in zip(models_and_configs.values(), subpaths, strict=True):
                export_graph(model=module, config=config, output=onnx_dir / subpath, opset=opset, device="cpu",
                             input_shapes=shapes, dtype="fp32", disable_dynamic_axes_fix=True)  # fmt: skip
                if _axes_to_fix(config, onnx_dir / subpath):
                    fix = functools.partial(_fix_axes, config, onnx_dir / subpath, shapes)
                    fixing.append(start_forked(fix, timeout_s=timeout_s))
            for child in fixing:
                child.result()
        finally:
            for child in fixing:
                child.close()
    components = _post_processed(main_config, onnx_dir, models_and_configs, subpaths, as_loaded)
    return components, {"exporter": "optimum", **({"weights": weights} if weights else {})}


def _fix_axes(config: Any, path: Path, shapes: dict[str, int]) -> None:
    """optimum's ``OnnxConfig.fix_dynamic_axes`` on one exported graph, in a forked child of the job.

    It opens the graph in ONNX Runtime and feeds it optimum's dummy inputs (numpy). Torch is held to one thread
    first, so a torch op on the way never enters the OpenMP pool the fork did not bring along (see ``stages.forked``).
    """
    import torch

    step("ONNX Runtime", f"fixing {path.name}'s dynamic axes")  # a crash says so
    torch.set_num_threads(1)
    config.fix_dynamic_axes(path, device="cpu", dtype="fp32", input_shapes=shapes)


def _axes_to_fix(config: Any, path: Path) -> bool:
    """Whether optimum's ``OnnxConfig.fix_dynamic_axes`` has anything to fix in the graph: an output axis the exporter
    left named but the config does not declare dynamic, or one with no size and no name.

    optimum opens every exported graph in an ONNX Runtime session to ask it (bert-base: 0.9 s and 0.7 GB for a
    fixed-shape check, on every export), and runs it only where this holds; the outputs' shapes are in the graph's
    structure, read here without its weights. An axis with neither size nor name is left to optimum's own check.
    """
    allowed = {axis for axes in (*config.inputs.values(), *config.outputs.values()) for axis in axes.values()}
    for output in onnx_graph.outputs(path):
        dims = output.type.tensor_type.shape.dim if output.type.HasField("tensor_type") else None
        if dims is None or not output.type.tensor_type.HasField("shape"):
            return True
        for dim in dims:
            if dim.HasField("dim_param") and dim.dim_param not in allowed:
                return True
            if not dim.HasField("dim_param") and not dim.HasField("dim_value"):
                return True
    return False


def _refused_pickle(exc: BaseException) -> None:
    """Raise what a pickle torch's safe loader refused is, when that is behind ``exc``.

    transformers loads ``pytorch_model.bin`` with ``torch.load(weights_only=True)``; when that refuses
    the payload (a global other than tensors), optimum retries as a TensorFlow checkpoint and the
    error left is "No module named 'tensorflow'". Nothing of the pickle ran.
    """
    import pickle
    import re

    seen: set[int] = set()
    chain: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    refused = [c for c in chain if isinstance(c, pickle.UnpicklingError)]
    if not refused:
        return
    named = next((m.group(1) for c in chain if (m := re.search(r"checkpoint file for '[^']*' at '([^']+)'", str(c)))), None)
    why = first_line(refused[-1]).split(". Please use")[0]  # the innermost: which global it refused
    raise UnsafeCheckpointError(
        f"{Path(named).name if named else 'the pickle weights'}: refused as unsafe by torch's weights-only loader"
        f" ({why}); the pickle holds more than tensors, and loading it in full would run that code. Nothing of it ran;"
        " allow_pickle does not extend to code: convert a safetensors copy of the weights"
    ) from exc


def _read_back(onnx_dir: Path, exporter: str, cause: BaseException | None = None) -> None:
    """Every graph the exporter wrote must read back whole before anything reads it: a file cut short is the disk's.

    The exporters write through writers that report no failed write (torch.onnx's, onnx's C++),
    so a full disk leaves a protobuf that ends mid-field, recorded as a corrupt model (``internal``
    or ``export_error``) instead of ``storage_error`` (:func:`onnx_graph.read_back`).
    """
    for path in sorted(onnx_dir.rglob("*.onnx")):
        why = onnx_graph.unread(path)
        if why is not None:
            raise onnx_graph.cut_short(path, f"the {exporter} exporter", why) from cause


def _as_post_processed(
    parts: dict[str, tuple[Any, Any]], subpaths: list[str], onnx_dir: Path, as_loaded: ModuleState
) -> list[Component]:
    """The components :func:`_post_processed` will make of ``parts``, before they are exported: no graph yet.

    Two decoders about to be merged are the merged decoder: the with-past branch's module with a copy of its
    config flagged as optimum's post-processing flags it (``is_merged``, ``use_cache_branch``), so that its
    verify cases can be computed before the merge exists. The export runs the originals.
    """
    merged = set(_UNMERGED) <= set(subpaths)
    found = []
    for (module, config), sub in zip(parts.values(), subpaths, strict=True):
        if merged and sub == _UNMERGED[0]:
            continue  # the no-cache branch: verify derives it from the with-past config
        if merged and sub == _UNMERGED[1]:
            sub, config = _MERGED, branch_config(config, is_merged=True, use_cache_branch=True)
        found.append(Component(name=Path(sub).stem, path=onnx_dir / sub, onnx_config=config, torch_module=module,
                               as_loaded=as_loaded))  # fmt: skip
    return found


def _post_processed(
    main_config: Any, onnx_dir: Path, parts: dict[str, tuple[Any, Any]], subpaths: list[str], as_loaded: ModuleState
) -> list[Component]:
    """optimum's post-processing of the graphs written (an encoder-decoder's decoders merged), one Component per file.

    The merge is optimum's graph made at less cost (:mod:`zoo_convert.exporters.merge`). Both exporters'
    encoder-decoders come through here. The last (module, config) per file wins:
    for a merged decoder that is the with-past branch, and verify derives the no-past branch
    from it; the two unmerged decoders are deleted.
    """
    parts, subpaths = merge.post_process(main_config, onnx_dir, parts, subpaths)
    by_file: dict[str, tuple[Any, Any]] = {}
    for (module, config), sub in zip(parts.values(), subpaths):
        by_file[str(sub)] = (module, config)
    if _MERGED in by_file:
        for name in _UNMERGED:
            onnx_graph.delete(onnx_dir / name)
    return [
        Component(name=Path(sub).stem, path=onnx_dir / sub, onnx_config=config, torch_module=module, as_loaded=as_loaded)
        for sub, (module, config) in by_file.items()
    ]


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
    """``torch.onnx.export(dynamo=True)`` of single-graph models and encoder-decoders, with optimum's inputs and axes.

    Whether a model is one graph is optimum's split that decides, not ``config.is_encoder_decoder``:
    DETR-style detectors have an encoder and a decoder inside and export as one graph.
    """
    model, report = _load_model(ckpt, task)
    main_config, parts = _submodels(ckpt, model, task)
    opset = _default_opset(opset, main_config)
    seq2seq = "encoder_model" in parts  # an encoder-decoder: optimum's split, each graph through dynamo
    shapes = _dummy_shapes(ckpt, main_config) if seq2seq else {}
    weights = check_weights(ckpt, task, model, report, parts.values(), shapes)
    details = {"exporter": "torch", **({"weights": weights} if weights else {})}
    if seq2seq:
        as_loaded = ModuleState(model)
        subpaths = torch_seq2seq.export(parts, opset, onnx_dir, shapes)
        as_loaded.restore()
        try:
            return _post_processed(main_config, onnx_dir, parts, subpaths, as_loaded), details
        except RuntimeError as exc:  # "Unable to merge decoders": the cause is what the record needs
            cause = exc.__cause__ or exc
            raise ExportError(f"merging the torch exporter's decoders failed: {type(cause).__name__}: {cause}") from exc
    if len(parts) != 1:
        raise ExportError(
            f"the torch exporter exports one graph or an encoder-decoder; optimum splits {ckpt.model_type!r} "
            f"for task {task!r} into {len(parts)} ({', '.join(parts)}): use exporter optimum",
            kind=FailureKind.EXPORT_UNSUPPORTED,
        )
    ((module, config),) = parts.values()
    if task.endswith("-with-past"):  # a decoder: its cache as flat inputs and outputs
        from ..exporters import (
            torch_decoder,  # imports torch and this package's Component: not at module level
        )

        return [torch_decoder.export(module, config, opset, onnx_dir)], details
    return [_torch_onnx(module, config, opset, onnx_dir, {})], details


def _default_opset(opset: int | None, config: Any) -> int:
    """The opset asked for, else optimum's for the model (18): torchlib's own opset, so torch.onnx converts nothing.

    torch.onnx's default (20) is torchlib's graph converted up; 18 is what optimum's export of
    the same model writes and what its loaders (ORTModel, transformers.js) are tested with.
    """
    return opset if opset is not None else int(config.DEFAULT_ONNX_OPSET)


def _export_generic(
    ckpt: Checkpoint, task: str, opset: int | None, onnx_dir: Path, no_config: str
) -> tuple[list[Component], dict[str, Any]]:
    """The torch exporter on an OnnxConfig built from the model itself (:mod:`zoo_convert.exporters.generic`), recorded with why."""
    model, report = _load_model(ckpt, task)
    from optimum.utils import DEFAULT_DUMMY_SHAPES

    config = generic.onnx_config(model, task, {**DEFAULT_DUMMY_SHAPES, **processor_shapes(ckpt.path)})
    shapes = _dummy_shapes(ckpt, config)
    weights = check_weights(ckpt, task, model, report, [(model, config)], shapes)
    component = _torch_onnx(model, config, _default_opset(opset, config), onnx_dir, shapes)
    details = {"exporter": "torch", "generic": no_config, "onnx_config": type(config).__name__}
    return [component], {**details, **({"weights": weights} if weights else {})}


def _torch_onnx(model: Any, config: Any, opset: int | None, onnx_dir: Path, shapes: dict[str, int]) -> Component:
    """``torch.onnx.export(dynamo=True)`` of ``model`` into ``onnx_dir/model.onnx`` with ``config``'s inputs and axes."""
    import torch

    inputs = config.generate_dummy_inputs(framework="pt", **shapes)
    names = [n for n in config.inputs if n in inputs]
    # AUTO: an axis the model fixes (DETR's channels) becomes static instead of failing the export
    # and sending torch.onnx through its slower fallback strategies; the axes get optimum's names after.
    dynamic_shapes = {n: {axis: torch.export.Dim.AUTO for axis in config.inputs[n]} for n in names}
    # optimum's names are the graph's; a timm model's forward takes them in order (``forward(x)``)
    by_name = set(names) <= set(inspect.signature(model.forward).parameters)
    args = () if by_name else tuple(inputs[n] for n in names)
    path = onnx_dir / "model.onnx"
    as_loaded = ModuleState(model)
    with torch.no_grad(), config.patch_model_for_export(model):
        torch_onnx.export(
            model,
            args,
            path,
            what=type(model).__name__,
            kwargs={n: inputs[n] for n in names} if by_name else None,
            input_names=names,
            output_names=list(config.outputs),
            dynamic_shapes=dynamic_shapes if by_name else tuple(dynamic_shapes.values()),
            opset=opset,
        )
    torch_onnx.name_dynamic_axes(path, {n: config.inputs[n] for n in names})
    return Component(name="model", path=path, onnx_config=config, torch_module=model, as_loaded=as_loaded)


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
        with open_regular(path) as fin, open(dest, "wb") as fout:
            shutil.copyfileobj(fin, fout)
            # never wider than the checkpoint's own file: a 0600 merges.txt stays 0600 (set_modes never widens it)
            os.chmod(fout.fileno(), os.fstat(fin.fileno()).st_mode & 0o644 & ~_umask())


def set_modes(out_dir: Path) -> None:
    """The graphs get mode 0644 less the umask (onnx writes external data 0600); the copied side files keep
    their own mode, narrowed to that one, never widened."""
    mode = 0o644 & ~_umask()
    for path in Path(out_dir).rglob("*"):
        if path.is_file() and not path.is_symlink():
            graph = path.relative_to(out_dir).parts[0] == "onnx"
            path.chmod(mode if graph else stat.S_IMODE(path.stat().st_mode) & mode)


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
    folders = sorted({comp.path.parent for comp in components})  # onnx/, or a pipeline's component folders
    files = {str(p.relative_to(out_dir)): p.stat().st_size for d in folders for p in sorted(d.rglob("*")) if p.is_file()}
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
