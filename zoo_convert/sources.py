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
import pwd
import re
import stat
from pathlib import Path
from typing import Any, BinaryIO

from .errors import FetchError, UnsafeCheckpointError, ZooConvertError

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
    # The vocabularies other tokenizer classes name (their vocab_files_names), for a checkpoint without
    # tokenizer.json: DeBERTa-v2/v3's spm.model, RemBERT's sentencepiece.model, PhoBERT's bpe.codes, LUKE's
    # entity_vocab.json, Whisper's normalizer.json, FSMT's two vocabularies... (never TransfoXL's pickled vocab.pkl).
    "spm.model",
    "sentencepiece.model",
    "bpe.codes",
    "entity_vocab.json",
    "normalizer.json",
    "emoji.json",
    "vocab-src.json",
    "vocab-tgt.json",
    "prophetnet.tokenizer",
    "word_pronunciation.json",
    "word_shape.json",
    "byte_maps.json",
)
# sentence-transformers' own files beside a Transformer module saved at the root.
_ST_ROOT_FILES = ("modules.json", "config_sentence_transformers.json")
# What a JSON file of a checkpoint may weigh before it is read into memory: tokenizer.json
# of a big vocabulary is tens of MB; anything past this is no config (a link to /dev/zero is infinite).
JSON_LIMIT = 256 * 1024**2
_MODULES_LIMIT = 1024**2


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


def open_regular(path: str | os.PathLike[str], *, limit: int | None = None) -> BinaryIO:
    """Open a checkpoint's file for reading, after looking at it: a regular file (or a link to one), at most ``limit`` bytes.

    A FIFO, device or socket (or a link to one) is UnsafeCheckpointError before it is
    opened: opening a FIFO waits for a writer for ever, /dev/zero never ends. The open
    itself does not block (``O_NONBLOCK``) and the opened file is looked at again, so a
    file swapped for a FIFO in between is refused too. FetchError when it cannot be read.
    """
    name = os.fspath(path)
    try:
        st = os.stat(name)
        if stat.S_ISREG(st.st_mode):
            fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode):
                os.set_blocking(fd, True)
                if limit is not None and st.st_size > limit:
                    os.close(fd)
                    raise FetchError(f"{name} is {st.st_size} bytes, more than the {limit} such a file may have")
                return os.fdopen(fd, "rb")
            os.close(fd)
    except (OSError, RuntimeError) as exc:  # missing, unreadable, a dangling link, a link loop
        raise FetchError(f"cannot read {name}: {getattr(exc, 'strerror', None) or exc}") from exc
    raise UnsafeCheckpointError(f"{name} is {_what(st.st_mode)}, not a regular file: it is never opened")


def read_json(path: str | os.PathLike[str], *, limit: int = JSON_LIMIT) -> object:
    """A checkpoint's JSON file, parsed after :func:`open_regular` looked at it; FetchError naming it when it is no JSON."""
    with open_regular(path, limit=limit) as f:
        raw = f.read(limit + 1)  # the file may have grown since it was looked at
    if len(raw) > limit:
        raise FetchError(f"{os.fspath(path)} is more than the {limit} bytes such a file may have")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep to parse
        raise FetchError(f"{os.fspath(path)} is not valid JSON: {type(exc).__name__}: {exc}") from exc


def _what(mode: int) -> str:
    for test, what in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):  # fmt: skip
        if test(mode):
            return what
    return "no regular file"


def side_files(ckpt_dir: Path, *, remote_code: bool = False) -> list[Path]:
    """The checkpoint's side files to copy beside onnx/; UnsafeCheckpointError for one that leads elsewhere.

    Each must be a regular file that resolves inside the checkpoint folder, or inside the
    Hub cache folder of the same repo (a snapshot's files are links to its ``blobs/``):
    a ``merges.txt`` linked to any other file on the machine would be copied and published.
    A sentence-transformers checkpoint adds its module files, found in modules.json once
    modules.json itself passed. A row allowed remote code adds the folder's ``*.py``: its
    config.json's ``auto_map`` names classes in them, and neither the artifact folder nor
    its users' ``from_pretrained(..., trust_remote_code=True)`` load without them.
    """
    root = ckpt_dir.resolve()
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith("models--"):
        root = root.parent.parent
    names = [*SIDE_FILES, *_ST_ROOT_FILES]
    if remote_code:
        names += sorted(p.name for p in ckpt_dir.glob("*.py"))
    found = [p for name in names if (p := _vetted(ckpt_dir, name, root)) is not None]
    modules = [name for name in sentence_transformers_files(ckpt_dir)[0] if name not in _ST_ROOT_FILES]
    return found + [p for name in modules if (p := _vetted(ckpt_dir, name, root)) is not None]


def vetted_file(ckpt_dir: Path, name: str, root: Path) -> Path | None:
    """``ckpt_dir / name`` when it is a regular file resolving inside ``root``; None when absent (see :func:`side_files`)."""
    return _vetted(ckpt_dir, name, root)


def _vetted(ckpt_dir: Path, name: str, root: Path) -> Path | None:
    """``ckpt_dir / name`` when it is a regular file resolving inside ``root`` that its owner could read; None when absent."""
    path = ckpt_dir / name
    if not os.path.lexists(path):
        return None
    try:
        target: Path | None = path.resolve()
        st: os.stat_result | None = os.stat(path)
    except (OSError, RuntimeError):  # a dangling link, a link loop
        target, st = None, None
    if target is not None and not target.is_relative_to(root):
        problem = f"links to {target}, outside the checkpoint"
    elif st is None or not stat.S_ISREG(st.st_mode):
        problem = "is not a regular file"
    elif not _readable_by(st, os.stat(ckpt_dir).st_uid):
        # A hard link is no link to look through: another user's file linked into the folder reads as the folder's own.
        links = f", hard-linked {st.st_nlink} times" if st.st_nlink > 1 else ""
        problem = (f"is a file the checkpoint's owner could not read (owner uid {st.st_uid}, "
                   f"mode {stat.S_IMODE(st.st_mode):o}{links})")  # fmt: skip
    else:
        return path
    raise UnsafeCheckpointError(
        f"{ckpt_dir}: side file {name} {problem}; only regular files inside the checkpoint are copied to the artifacts"
    )


def _readable_by(st: os.stat_result, uid: int) -> bool:
    """Whether user ``uid`` may read a file of this stat (its mode bits; root reads anything)."""
    if uid == 0:
        return True
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IRUSR)
    try:
        user = pwd.getpwuid(uid)
        groups = set(os.getgrouplist(user.pw_name, user.pw_gid))
    except KeyError:  # a uid without a name: in no group we can know of
        groups = set()
    return bool(st.st_mode & (stat.S_IRGRP if st.st_gid in groups else stat.S_IROTH))


def sentence_transformers_files(src: Path) -> tuple[list[str], list[str]]:
    """A sentence-transformers checkpoint's own files to copy, and the module files left behind.

    ``SentenceTransformer(out, backend="onnx")`` runs ``onnx/model.onnx`` as the Transformer
    module saved at the root and builds every other module in modules.json from its folder:
    Pooling and Normalize from a config (Normalize has none), Dense and LayerNorm from a config
    and weights, which it runs in PyTorch. So of each module folder only what those loaders
    read is copied, its ``config.json`` and its safetensors weights, never pickled weights (we
    neither load nor republish pickles) nor anything else the folder holds; a Dense that has only
    pickles fails to load rather than silently changing the embeddings. A checkpoint whose one
    Transformer is not at the root gets nothing: our graph could not stand in for it.
    """
    try:
        modules: Any = read_json(src / "modules.json", limit=_MODULES_LIMIT)
        transformers = [m["path"] for m in modules if m["type"].rsplit(".", 1)[-1] == "Transformer"]
    except (ZooConvertError, TypeError, KeyError, AttributeError):
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
            needed = f.parent == src / folder and (f.name == "config.json" or f.suffix == ".safetensors")
            (files if needed else left_out).append(rel)
    return files, left_out
