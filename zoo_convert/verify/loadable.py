"""The artifact folder loaded as its users load it, before anything is exported from it.

Export copies the checkpoint's side files beside ``onnx/``: that folder is what ORTModel,
transformers.js and sentence-transformers users, and the publisher, get. Fetch's checks parse
the files, and many that parse still do not load: a ``tokenizer_class`` that does not exist, a
bert with neither ``vocab.txt`` nor ``tokenizer.json``, an ``image_processor_type`` that does
not exist, a ``size`` that is no number, ``"num_beams": "x"``. So :func:`load` reads the
artifact folder back with the loaders users call, right after the copy (before the costly
export), once per job:

    config.json               AutoConfig (transformers); timm: the eval transform of its pretrained_cfg, on one image
    tokenizer files           AutoTokenizer, then one sentence tokenized
    preprocessor_config.json  AutoImageProcessor or AutoFeatureExtractor, then one image or half a second of audio
    processor_config.json     AutoProcessor
    generation_config.json    GenerationConfig (its validate()), each value of the type of its default

Which loaders run is decided by the *checkpoint's* files, so a side file export left out fails
too; they read the artifact folder alone (``local_files_only``: no request), with remote code only
where the row allows it. A file that does not load is ``fetch_error`` naming it and the loader's
reason; one that loads from the checkpoint but not from the artifact folder is a file export did not
copy, a bug of ours (``internal``). The tokenizer loaded here is the one verify tokenizes with.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import FetchError, ZooConvertError, first_line
from ..sources import read_json

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from ..job import Checkpoint

# A checkpoint with any of these has a tokenizer its users load with AutoTokenizer.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
)
_SENTENCE = "Hello world, this is a test."


@dataclass(frozen=True)
class Loaded:
    """What loading the artifact folder gave.

    Attributes:
        tokenizer: the tokenizer AutoTokenizer loaded from it, None where the checkpoint has none.
        details: loader -> the class it loaded, and the seconds all of it took (the export stage's details).
    """

    tokenizer: PreTrainedTokenizerBase | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Loader:
    """One loader users call: what it is called, the file its failure is named by, and how it loads a folder."""

    name: str
    file: str
    run: Callable[[Path], Any]
    culprit: Callable[[Path, BaseException], str] | None = None


def load(ckpt: Checkpoint, folder: Path, source: str) -> Loaded:
    """Load ``folder`` (the job's artifact folder) as its users will; FetchError naming the file that does not load."""
    t0 = time.perf_counter()
    loaded: dict[str, Any] = {}
    tokenizer = None
    for loader in _loaders(ckpt):
        try:
            found = loader.run(folder)
        except ZooConvertError:
            raise
        except Exception as exc:  # noqa: BLE001 - transformers raises ValueError, OSError, TypeError, tokenizers' Exception...
            raise _failure(loader, ckpt, folder, source, exc) from exc
        if loader.name == "AutoTokenizer":
            tokenizer = found
        loaded[loader.name] = type(found).__name__
    return Loaded(tokenizer=tokenizer, details={**loaded, "seconds": round(time.perf_counter() - t0, 4)})


def _loaders(ckpt: Checkpoint) -> list[_Loader]:
    """The loaders the checkpoint's own files call for (its folder, not the artifact folder: a file left out fails)."""
    src = ckpt.path
    remote = ckpt.trust_remote_code
    if ckpt.library == "timm":
        return [_Loader("timm.data.create_transform", "config.json", _timm_transform)]
    loaders = [_Loader("AutoConfig", "config.json", lambda d: _auto("AutoConfig", d, remote))]
    if any((src / name).is_file() for name in TOKENIZER_FILES):
        loaders.append(_Loader("AutoTokenizer", "tokenizer_config.json", lambda d: _tokenizer(d, remote), _tokenizer_culprit))
    if (src / "preprocessor_config.json").is_file():
        auto = _preprocessor_class(src, ckpt.model_type)
        loaders.append(_Loader(auto, "preprocessor_config.json", lambda d: _preprocessor(auto, d, remote)))
    if (src / "processor_config.json").is_file():
        loaders.append(_Loader("AutoProcessor", "processor_config.json", lambda d: _auto("AutoProcessor", d, remote)))
    if (src / "generation_config.json").is_file():
        loaders.append(_Loader("GenerationConfig", "generation_config.json", _generation_config))
    return loaders


def _failure(loader: _Loader, ckpt: Checkpoint, folder: Path, source: str, exc: BaseException) -> ZooConvertError:
    """The file a loader failed on, named; when the checkpoint's own folder loads, the files export did not copy."""
    reason = first_line(exc)
    try:
        loader.run(ckpt.path)
    except Exception:  # noqa: BLE001 - the checkpoint's file is broken too: its fault, not the copy's
        culprit = _culprit(loader, folder, exc)
        missing = _missing_module(exc)
        if missing is not None:  # sentencepiece, tiktoken...: ours to install, the file may be fine
            return ZooConvertError(
                f"{source}: {loader.name} needs {missing}, which this environment lacks, to load "
                f"{culprit} from the artifact folder: {reason}"
            )
        return FetchError(f"{source}: {culprit} in the artifact folder does not load ({loader.name}): {reason}")
    artifact = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    left_out = sorted(
        rel for p in ckpt.path.iterdir()
        if p.is_file() and (rel := p.name) not in artifact and not rel.endswith((".safetensors", ".bin", ".pt", ".pth"))
    )  # fmt: skip
    lacks = f"which lacks {', '.join(left_out)}" if left_out else "though it holds every file of the checkpoint"
    return ZooConvertError(f"{source}: {loader.name} loads the checkpoint but not the artifact folder, {lacks}: {reason}")


def _culprit(loader: _Loader, folder: Path, exc: BaseException) -> str:
    """The file to name for a loader's failure; the loader's own file when looking closer fails too."""
    if loader.culprit is None:
        return loader.file
    try:
        return loader.culprit(folder, exc)
    except Exception:  # noqa: BLE001 - e.g. a tokenizer class whose library is missing (a dummy that raises ImportError)
        return loader.file


def _missing_module(exc: BaseException) -> str | None:
    """The modules a loader failed to import on the way to ``exc`` (transformers converts a slow tokenizer with
    sentencepiece, else tiktoken); None when it imported what it needed."""
    seen: set[int] = set()
    names: list[str] = []
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, ImportError):
            names.append(cur.name or first_line(cur))
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return " or ".join(dict.fromkeys(reversed(names))) if names else None


def _auto(name: str, folder: Path, remote: bool) -> Any:
    import transformers

    return getattr(transformers, name).from_pretrained(folder, trust_remote_code=remote, local_files_only=True)


def _tokenizer(folder: Path, remote: bool) -> PreTrainedTokenizerBase:
    """AutoTokenizer's tokenizer of the folder, once it tokenized a sentence (an empty vocabulary loads, and fails there)."""
    from transformers import AutoTokenizer

    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(folder, trust_remote_code=remote, local_files_only=True)
    if not tokenizer(_SENTENCE)["input_ids"]:
        raise ValueError(f"it tokenizes {_SENTENCE!r} as no token at all")
    return tokenizer


def _tokenizer_culprit(folder: Path, exc: BaseException) -> str:
    """Which of the tokenizer's files broke it: tokenizer.json, the class tokenizer_config.json names, or a missing vocabulary."""
    from tokenizers import Tokenizer
    from transformers.models.auto.tokenization_auto import (
        TOKENIZER_MAPPING_NAMES,
        tokenizer_class_from_name,
    )

    if (folder / "tokenizer.json").is_file():
        try:
            Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception:  # noqa: BLE001 - the tokenizers library raises plain Exceptions
            return "tokenizer.json"
    config = _json_or_empty(folder / "tokenizer_config.json")
    named = config.get("tokenizer_class")
    if isinstance(named, str) and tokenizer_class_from_name(named) is None:
        return "tokenizer_config.json"
    model_type = _json_or_empty(folder / "config.json").get("model_type")
    names = [named] if isinstance(named, str) else [n for n in TOKENIZER_MAPPING_NAMES.get(str(model_type), ()) if n]
    slow = next((c for n in names if (c := tokenizer_class_from_name(n.removesuffix("Fast"))) is not None), None)
    try:
        vocab = list(getattr(slow, "vocab_files_names", {}).values())
    except ImportError:  # the class is a dummy: its library (sentencepiece) is missing
        vocab = []
    if not (folder / "tokenizer.json").is_file():  # the fast tokenizer is converted from the vocabulary
        if absent := [f for f in vocab if not (folder / f).is_file()]:
            return f"{' and '.join(absent)} (missing, and no tokenizer.json)"
        if present := [f for f in vocab or TOKENIZER_FILES[2:] if (folder / f).is_file()]:
            return present[0]
    mentioned = [name for name in TOKENIZER_FILES if name in str(exc) and (folder / name).is_file()]
    return mentioned[0] if mentioned else "tokenizer_config.json"


def _json_or_empty(path: Path) -> dict[str, Any]:
    try:
        found = read_json(path)
    except ZooConvertError:
        return {}
    return found if isinstance(found, dict) else {}


def _preprocessor_class(src: Path, model_type: str) -> str:
    """AutoImageProcessor or AutoFeatureExtractor, as the checkpoint's preprocessor_config.json (or its model type) says."""
    from transformers.models.auto.image_processing_auto import (
        IMAGE_PROCESSOR_MAPPING_NAMES,
    )

    config = _json_or_empty(src / "preprocessor_config.json")
    if "image_processor_type" in config:
        return "AutoImageProcessor"
    if "feature_extractor_type" in config or model_type not in IMAGE_PROCESSOR_MAPPING_NAMES:
        return "AutoFeatureExtractor"
    return "AutoImageProcessor"


def _preprocessor(auto: str, folder: Path, remote: bool) -> Any:
    """The folder's image processor or feature extractor, once it processed an image or half a second of audio."""
    import numpy as np
    from transformers import FeatureExtractionMixin
    from transformers.image_processing_base import ImageProcessingMixin

    from .runtime import sample_images

    processor = _auto(auto, folder, remote)
    images = isinstance(processor, ImageProcessingMixin) or not isinstance(processor, FeatureExtractionMixin)
    if images and _needs_more_than_an_image(processor):
        return processor  # ViTPose's needs the person boxes: it loaded, which is what a broken file would not do
    if images:
        processor(images=sample_images(1, 40, 48), return_tensors="np")
    else:
        rate = int(getattr(processor, "sampling_rate", None) or 16000)
        wave = np.sin(np.arange(rate // 2, dtype=np.float32) * 0.05).astype(np.float32)
        processor(wave, sampling_rate=rate, return_tensors="np")
    return processor


def _needs_more_than_an_image(processor: Any) -> list[str]:
    """The arguments besides the images an image processor's ``preprocess`` requires (ViTPose's ``boxes``); [] if none."""
    import inspect

    try:
        params = inspect.signature(processor.preprocess).parameters.values()
    except (AttributeError, TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_ONLY)
    return [p.name for p in params if p.kind in kinds and p.default is inspect.Parameter.empty and p.name != "images"]


def _generation_config(folder: Path) -> Any:
    """GenerationConfig of the folder (its own validate() runs on load), each value of the type its default has.

    validate() checks a few values only: ``"num_beams": "x"`` and ``"max_length": -5`` load,
    and break ``generate()`` later.
    """
    from transformers import GenerationConfig

    loaded = GenerationConfig.from_pretrained(folder, local_files_only=True)
    defaults = GenerationConfig()
    for key, value in _json_or_empty(folder / "generation_config.json").items():
        default = getattr(defaults, key, None)
        if key.startswith("_") or key == "early_stopping" or value is None or not isinstance(default, (bool, int, float)):
            continue  # early_stopping: a bool or "never", which validate() checks
        want = bool if isinstance(default, bool) else int if isinstance(default, int) else float
        if isinstance(value, bool) != (want is bool) or not isinstance(value, int if want is int else (int, float)):
            raise ValueError(f"{key} is {value!r}, not a {want.__name__} as GenerationConfig has it")
        if want is int and default >= 0 and value < 0:
            raise ValueError(f"{key} is {value}: a count, it cannot be negative")
    return loaded


def _timm_transform(folder: Path) -> Any:
    """timm's eval transform as the folder's pretrained_cfg says (what the model card's usage runs), on one image."""
    from timm.data import create_transform, resolve_data_config

    from .runtime import sample_images

    config = _json_or_empty(folder / "config.json")
    if not config:
        raise ValueError("no config.json that holds a JSON object")
    cfg = config.get("pretrained_cfg", {})  # none: timm's defaults, as verify takes them
    if not isinstance(cfg, dict):
        raise ValueError(f"pretrained_cfg is a JSON {type(cfg).__name__ if cfg is not None else 'null'}, not an object")
    transform = create_transform(**resolve_data_config(pretrained_cfg=cfg), is_training=False)
    transform(sample_images(1, 40, 48)[0])
    return transform
