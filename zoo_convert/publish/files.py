"""The files a published repo holds, and their hashes as the Hub reports them (LFS sha256, git blob id)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import PublishError
from ..records import PASSED, STANDARD_FOLDER, variant_of
from .candidates import Candidate

if TYPE_CHECKING:
    from huggingface_hub.hf_api import RepoSibling

# Files written beside onnx/ that are records of ours, not part of the model.
_PRIVATE_FILES = {"result.json", "README.md"}


@dataclass(frozen=True)
class LocalFile:
    """A file to publish with both hashes the Hub may report for it.

    Attributes:
        path: the file on disk.
        size: its size in bytes.
        sha256: the LFS object id.
        git_oid: the git blob id (what the Hub reports for a regular, non-LFS file).
    """

    path: Path
    size: int
    sha256: str
    git_oid: str

    def same_as(self, remote: RepoSibling | None) -> bool:
        """Whether a Hub sibling (``RepoSibling`` with blob metadata) holds these bytes."""
        if remote is None:
            return False
        if remote.lfs is not None:
            return bool(remote.lfs.sha256 == self.sha256)
        return bool(remote.blob_id == self.git_oid)


def hash_file(path: Path) -> LocalFile:
    """sha256 (LFS oid) and git blob sha1 of a file in one pass."""
    size = path.stat().st_size
    sha256, sha1 = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % size)
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            sha256.update(chunk)
            sha1.update(chunk)
    return LocalFile(path, size, sha256.hexdigest(), sha1.hexdigest())


def repo_files(c: Candidate, *, include_failed: bool = False) -> dict[str, Path]:
    """Path in repo -> local file: the side files (sentence-transformers module folders too) and the ONNX
    graphs (+ external data) of published variants, under every name transformers.js knows them by, and
    their graphs of standard ONNX ops (``onnx/standard/``) where the variant ships fused."""
    if not c.artifacts_dir or not Path(c.artifacts_dir, "onnx").is_dir():
        raise PublishError(f"{c.source}: no onnx/ folder under {c.artifacts_dir!r}")
    root = Path(c.artifacts_dir)
    files = {
        rel: p
        for p in sorted(root.rglob("*"))
        if p.is_file()
        and (rel := p.relative_to(root).as_posix()) not in _PRIVATE_FILES
        and not rel.startswith("onnx/")
        and not any(part.startswith(".") for part in p.relative_to(root).parts)
    }
    wanted = {v.variant for v in c.variants if v.status == PASSED or include_failed}
    # onnx/standard/: a fused variant's graph of standard ONNX ops, the one the saved reference gives other runtimes
    for graph in [*sorted((root / "onnx").glob("*.onnx")), *sorted((root / "onnx" / STANDARD_FOLDER).glob("*.onnx"))]:
        if variant_of(graph.name) not in wanted:
            continue
        for p in (graph, *external_data(graph)):
            files[p.relative_to(root).as_posix()] = p
    if not any(k.endswith(".onnx") for k in files):
        raise PublishError(f"{c.source}: no verified ONNX graph to publish in {root}")
    return files


def external_data(graph: Path) -> list[Path]:
    """The external data files an ONNX graph references (read from the graph, not guessed)."""
    import onnx

    from .. import onnx_graph  # onnx is for the workers; publishing imports it only here

    model = onnx.load(str(graph), load_external_data=False)
    names = {
        entry.value
        for tensor in onnx_graph.tensors(model.graph)
        if tensor.data_location == onnx.TensorProto.EXTERNAL
        for entry in tensor.external_data
        if entry.key == "location"
    }
    return [graph.parent / n for n in sorted(names)]
