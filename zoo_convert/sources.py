"""A manifest source: a local folder or a Hub repo id, the one rule for a valid id, and
which files of a checkpoint folder may be copied out of it (:func:`side_files`).

A valid Hub repo id is huggingface_hub's ``validate_repo_id`` (``name`` or
``org/name`` of letters, digits, ``-``, ``_``, ``.``), without the parts that could
walk out of a folder or the Hub cache. The manifest check and the fetch stage both
apply it; :data:`HUB_ID_PATTERN` is valid in both Python's ``re`` and RE2 (Arrow's
regex engine), so the manifest applies it to a whole column at once.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

from .errors import UnsafeCheckpointError

HUB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,95})?$"
# Never inside an id: ``..`` walks up a path, ``--`` is the Hub cache's folder separator.
HUB_ID_FORBIDDEN = ("..", "--")
HUB_ID_FORBIDDEN_SUFFIX = ".git"

_HUB_ID = re.compile(HUB_ID_PATTERN)

# Files beside the weights that a runtime needs to preprocess inputs or generate: export copies them beside onnx/.
SIDE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "source.spm",
    "target.spm",
    "tokenizer.model",
    "preprocessor_config.json",
    "processor_config.json",
    "feature_extractor_config.json",
    "image_processor_config.json",
    "chat_template.jinja",
)
# sentence-transformers' own files beside a Transformer module saved at the root.
_ST_ROOT_FILES = ("modules.json", "config_sentence_transformers.json")
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def is_hub_id(source: str) -> bool:
    """Whether ``source`` is a Hub repo id the farm accepts."""
    return (
        bool(_HUB_ID.match(source))
        and not any(part in source for part in HUB_ID_FORBIDDEN)
        and not source.endswith(HUB_ID_FORBIDDEN_SUFFIX)
    )


def is_local(source: str) -> bool:
    """A source is a local folder when it exists or is spelled as an absolute path, else a hub id."""
    return os.path.exists(os.path.expanduser(source)) or source.startswith(("/", "./", "~"))


def side_files(ckpt_dir: Path) -> list[Path]:
    """The checkpoint's side files to copy beside onnx/; UnsafeCheckpointError for one that leads elsewhere.

    Each must be a regular file that resolves inside the checkpoint folder, or inside the
    Hub cache folder of the same repo (a snapshot's files are links to its ``blobs/``):
    a ``merges.txt`` linked to any other file on the machine would be copied and published.
    A sentence-transformers checkpoint adds its module files, found in modules.json once
    modules.json itself passed.
    """
    root = ckpt_dir.resolve()
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith("models--"):
        root = root.parent.parent
    found = [p for name in (*SIDE_FILES, *_ST_ROOT_FILES) if (p := _vetted(ckpt_dir, name, root)) is not None]
    modules = [name for name in sentence_transformers_files(ckpt_dir)[0] if name not in _ST_ROOT_FILES]
    return found + [p for name in modules if (p := _vetted(ckpt_dir, name, root)) is not None]


def vetted_file(ckpt_dir: Path, name: str, root: Path) -> Path | None:
    """``ckpt_dir / name`` when it is a regular file resolving inside ``root``; None when absent (see :func:`side_files`)."""
    return _vetted(ckpt_dir, name, root)


def _vetted(ckpt_dir: Path, name: str, root: Path) -> Path | None:
    """``ckpt_dir / name`` when it is a regular file resolving inside ``root``; None when absent."""
    path = ckpt_dir / name
    if not os.path.lexists(path):
        return None
    try:
        target: Path | None = path.resolve()
        regular = stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, RuntimeError):  # a dangling link, a link loop
        target, regular = None, False
    if target is not None and not target.is_relative_to(root):
        problem = f"links to {target}, outside the checkpoint"
    elif not regular:
        problem = "is not a regular file"
    else:
        return path
    raise UnsafeCheckpointError(
        f"{ckpt_dir}: side file {name} {problem}; only regular files inside the checkpoint are copied to the artifacts"
    )


def sentence_transformers_files(src: Path) -> tuple[list[str], list[str]]:
    """A sentence-transformers checkpoint's own files to copy, and the module files left behind.

    ``SentenceTransformer(out, backend="onnx")`` runs ``onnx/model.onnx`` as the Transformer
    module saved at the root and builds every other module in modules.json from its folder:
    Pooling and Normalize from a config (Normalize has none), Dense and LayerNorm from a config
    and weights, which it runs in PyTorch. So the folders are copied whole, safetensors weights
    included, but never pickled weights (we neither load nor republish pickles); a Dense that has
    only those fails to load rather than silently changing the embeddings. A checkpoint whose
    one Transformer is not at the root gets nothing: our graph could not stand in for it.
    """
    try:
        modules = json.loads((src / "modules.json").read_text())
        transformers = [m["path"] for m in modules if m["type"].rsplit(".", 1)[-1] == "Transformer"]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return [], []  # not sentence-transformers, or a modules.json it could not load either
    if transformers not in ([""], ["."]):
        return [], []
    files = [n for n in _ST_ROOT_FILES if (src / n).is_file()]
    files += sorted(p.name for p in src.glob("sentence_*_config.json") if p.is_file())
    left_out: list[str] = []
    for module in modules:
        folder = Path(module["path"])
        if module["path"] in ("", ".") or folder.is_absolute() or ".." in folder.parts:
            continue
        for f in sorted(p for p in (src / folder).rglob("*") if p.is_file()):
            rel = f.relative_to(src).as_posix()
            (left_out if f.suffix in _PICKLE_SUFFIXES else files).append(rel)
    return files, left_out
