"""How much of a manifest the farm has a conversion path for, said before a night's run.

Per row: its library, model type and task, and whether the farm can convert that
combination. A local row is read from its folder (``config.json``, as fetch reads it);
a hub row from its ``model_type:`` / ``library:`` tags (``manifest from-csv`` writes
them) or ``model_type`` / ``library`` columns, with nothing asked of the Hub. A
transformers model type has a path when optimum's TasksManager has an ONNX config for it
and the task; a timm one when the installed timm has the architecture.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from .manifest import read_manifest
from .errors import ZooConvertError
from .sources import is_local, read_json

# What a manifest's library tag may say, as the farm's library names.
_LIBRARIES = {
    "transformers": "transformers",
    "sentence-transformers": "sentence-transformers",
    "sentence_transformers": "sentence-transformers",
    "timm": "timm",
    "diffusers": "diffusers",
    "open_clip": "open_clip",
}
# sentence-transformers rows export their transformers backbone, whose task is feature-extraction.
_ST_TASKS = {"sentence-similarity": "feature-extraction"}


@dataclass(frozen=True)
class RowCoverage:
    """One manifest row and whether the farm has a conversion path for it.

    Attributes:
        row: 1-based manifest row.
        source: hub id or local folder.
        library / model_type / task: what the row is (model_type None: not known without the Hub).
        path: True / False, None when unknown.
        reason: why there is no path, or why it is unknown ("" when there is one).
    """

    row: int
    source: str
    library: str
    model_type: str | None
    task: str | None
    path: bool | None
    reason: str = ""


def manifest_coverage(path: str | Path, exporter: str | None = None) -> list[RowCoverage]:
    """One RowCoverage per valid row of the manifest (bad rows are ``manifest validate``'s to report).

    ``exporter`` (``optimum``, ``torch``, ``auto``) replaces every row's own, to ask what it would convert.
    """
    manifest = read_manifest(path)
    columns = _extra_columns(Path(path))
    seen: set[int] = set()
    rows = []
    for entry in manifest.entries:
        row = entry.row or 0
        if row in seen:  # a row with several opsets is several jobs
            continue
        seen.add(row)
        extra = columns.get(row, {})
        library, model_type = _describe(entry.source, entry.tags, extra)
        task = entry.task
        found = _has_path(library, model_type, task, exporter or entry.exporter)
        rows.append(RowCoverage(row, entry.source, library, model_type, task, *found))
    return rows


def _extra_columns(path: Path) -> dict[int, dict[str, Any]]:
    """``model_type`` / ``library`` columns by 1-based row, where the Parquet file has them (outside the schema)."""
    names = [c for c in ("model_type", "library") if c in pq.read_schema(path).names]
    if not names:
        return {}
    table = pq.read_table(path, columns=names).to_pylist()
    return {n: rec for n, rec in enumerate(table, start=1)}


def _describe(source: str, tags: tuple[str, ...], extra: dict[str, Any]) -> tuple[str, str | None]:
    """(library, model type) of a row: from its folder when local, else from its columns and tags."""
    if is_local(source) and (Path(source).expanduser() / "config.json").is_file():
        folder = Path(source).expanduser()
        try:
            config = read_json(folder / "config.json")
        except ZooConvertError:  # unreadable, unsafe (a FIFO) or no JSON: its type is unknown
            config = {}
        if not isinstance(config, dict):
            config = {}
        if "pretrained_cfg" in config or ("architecture" in config and "model_type" not in config):
            return "timm", config.get("architecture")
        if (folder / "model_index.json").is_file():
            return "diffusers", None
        library = "sentence-transformers" if (folder / "modules.json").is_file() else "transformers"
        return library, config.get("model_type")
    if is_local(source) and (Path(source).expanduser() / "model_index.json").is_file():
        try:
            index = read_json(Path(source).expanduser() / "model_index.json")
        except ZooConvertError:
            index = {}
        return "diffusers", (index.get("_class_name") if isinstance(index, dict) else None) or None
    named = extra.get("library") or next((t.split(":", 1)[1] for t in tags if t.startswith("library:")), None)
    named = str(named or next((t for t in tags if t in _LIBRARIES), None) or "transformers")
    library = _LIBRARIES.get(named, named)
    model_type = extra.get("model_type") or next((t.split(":", 1)[1] for t in tags if t.startswith("model_type:")), None)
    if library == "timm":
        # timm's Hub ids name the architecture (timm/resnet50.a1_in1k); a tag may hold a config's name instead
        arch = (model_type or "").removeprefix("timm:")
        model_type = arch if _is_timm_arch(arch) else source.split("/")[-1].split(".")[0]
    elif library == "sentence-transformers" and model_type == "transformer":
        model_type = None  # optimum's name for any sentence-transformers backbone: the real type is unknown
    return library, model_type or None


def _is_timm_arch(name: str) -> bool:
    import timm

    return bool(name) and bool(timm.is_model(name))


# Pipelines the farm has converted, verified and loaded back with optimum's ORT pipeline class, by
# the model_type tags of Hub rows and the pipeline class names of local ones: the UNet pipelines
# (StableDiffusion*, SDXL, LatentConsistency) and the transformer ones, Stable Diffusion 3 by prefix
# (its img2img and inpaint pipelines share the components) and Flux text-to-image exactly (optimum
# has no ORT class for FluxFill, FluxImg2Img or Flux 2, whose transformers differ or are unknown to it).
_PIPELINE_PREFIXES = ("stable-diffusion", "latent-consistency", "StableDiffusion", "LatentConsistency")
_PIPELINES = ("flux", "FluxPipeline")
_VERIFIED = "the farm verifies Stable Diffusion (1.x/2.x, XL, 3), Latent Consistency and Flux text-to-image pipelines only"


def _has_path(library: str, model_type: str | None, task: str | None, exporter: str = "optimum") -> tuple[bool | None, str]:
    if library == "timm":
        import timm

        if not model_type or not _is_timm_arch(model_type):
            return False, f"timm {timm.__version__} has no architecture {model_type!r}"
        if task in ("feature-extraction", "image-feature-extraction"):
            return True, ""  # the features of a model without a classifier (num_classes 0), as such hub ids are
        if task not in (None, "image-classification"):
            return False, f"optimum exports timm models for image-classification, not {task}"
        return True, ""
    if library == "diffusers":
        # optimum splits any pipeline; the farm has verified these end to end
        if model_type is None or model_type.startswith(_PIPELINE_PREFIXES) or model_type in _PIPELINES:
            return True, ""
        return False, f"diffusers {model_type}: {_VERIFIED}"
    if library not in ("transformers", "sentence-transformers"):
        return False, f"no exporter for {library} checkpoints"
    if model_type is None:
        return None, "model type unknown (no model_type tag or column; the Hub is not asked)"
    import optimum.exporters.onnx.model_configs  # noqa: F401 - registers the ONNX configs with the TasksManager
    from optimum.exporters.tasks import TasksManager

    supported = None
    for name in dict.fromkeys((model_type, model_type.replace("_", "-"))):  # optimum spells depth_anything depth-anything
        try:
            supported = TasksManager.get_supported_tasks_for_model_type(name, "onnx", library_name="transformers")
            break
        except KeyError:
            continue
    if supported is None:
        if exporter in ("auto", "torch") and library == "transformers":
            return _generic_path(model_type, task)
        return False, f"optimum has no ONNX config for model type {model_type!r}"
    if task is None:
        return True, ""
    wanted = TasksManager.map_from_synonym(_ST_TASKS.get(task, task) if library == "sentence-transformers" else task)
    tasks = {t.removesuffix("-with-past") for t in supported}
    if wanted.removesuffix("-with-past") not in tasks:
        return False, f"optimum exports {model_type} for {', '.join(sorted(tasks))}; not {task}"
    return True, ""


def summary(rows: list[RowCoverage], top: int = 15) -> list[str]:
    """The shares by library, then the model types with most rows without a path, weighted by rows."""
    lines = [f"{'library':<22} {'rows':>6} {'path':>6} {'none':>6} {'unknown':>8} {'with path':>10}"]
    by_lib: dict[str, Counter[bool | None]] = {}
    for r in rows:
        by_lib.setdefault(r.library, Counter())[r.path] += 1
    for lib, counts in sorted(by_lib.items(), key=lambda kv: -sum(kv[1].values())):
        lines.append(_line(lib, counts))
    total: Counter[bool | None] = Counter(r.path for r in rows)
    lines.append(_line("all", total))
    missing = Counter((r.library, r.model_type or "?", r.reason) for r in rows if r.path is not True)
    if missing:
        lines += ["", f"{'rows':>6}  library / model type without a path, and why (top {top})"]
        lines += [f"{n:>6}  {lib} / {mt}: {why}" for (lib, mt, why), n in missing.most_common(top)]
    return lines


def _line(name: str, counts: Counter[bool | None]) -> str:
    n = sum(counts.values())
    share = f"{counts[True] / n:.0%}" if n else "-"
    return f"{name:<22} {n:>6} {counts[True]:>6} {counts[False]:>6} {counts[None]:>8} {share:>10}"


def _generic_path(model_type: str, task: str | None) -> tuple[bool, str]:
    """Whether the torch exporter's generic path (``generic.onnx_config``) takes a model type optimum has no config for.

    Read from transformers' classes, not a model: one graph (no encoder-decoder, nothing that generates),
    with text (``input_ids``) or an image (``pixel_values``) as the main input.
    """
    from optimum.exporters.tasks import TasksManager
    from transformers import CONFIG_MAPPING

    name = next((n for n in (model_type, model_type.replace("-", "_")) if n in CONFIG_MAPPING), None)
    if name is None:
        return False, f"transformers has no model type {model_type!r}"
    wanted = TasksManager.map_from_synonym(task or "feature-extraction")
    if wanted.removesuffix("-with-past") in ("text-generation", "text2text-generation") or wanted.endswith("-with-past"):
        return False, f"the generic torch export has no past key values: {model_type} for {wanted} needs optimum's config"
    config_class = CONFIG_MAPPING[name]
    try:
        composite = getattr(config_class(), "is_encoder_decoder", False)
    except Exception:  # noqa: BLE001 - a composite config (vision-encoder-decoder) has no defaults to build
        composite = True
    if composite:
        return False, f"the generic torch export exports one graph; {model_type} is an encoder-decoder"
    try:
        cls = TasksManager.get_model_class_for_task(wanted, model_type=name, library="transformers")
    except (KeyError, ValueError):
        return False, f"no transformers class loads {model_type} for {wanted}"
    mapping = getattr(cls, "_model_mapping", None)
    if mapping is not None:
        if config_class not in mapping:
            return False, f"no transformers class loads {model_type} for {wanted}"
        cls = mapping[config_class]
    main = getattr(cls, "main_input_name", "input_ids")
    if main not in ("input_ids", "pixel_values"):
        return False, f"the generic torch export handles text and image models; {cls.__name__} takes {main!r}"
    return True, ""

