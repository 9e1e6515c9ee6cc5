"""Reference cases saved beside the artifacts: what verify fed and what PyTorch answered, for any runtime anywhere.

A job's artifact folder gets ``reference/``::

    reference/manifest.json     format, tolerances, the graph file of each component per variant, the cases
    reference/case-NNN.npz      one case: ``in/<input>`` (the feed), ``ref/<output>`` (PyTorch),
                                ``keep/<output>`` (where the attention mask keeps a token),
                                ``idx/<output>`` (a reduced output's flat positions)

One case is one component at one verify shape (one per branch of a merged decoder), exactly
the inputs ONNX Runtime was fed and the PyTorch outputs it was compared with. An output of
more than :data:`FULL_LIMIT` elements (a big vocabulary's logits at the long shape) is saved
*reduced*: its full shape, and its values at :data:`SAMPLED` evenly strided positions among
those the mask keeps (``reduction: "strided"``, the positions in ``idx/``). A runtime's answer
must still have the full shape; its values are read at the same positions. A wrong graph
differs nearly everywhere, so a strided sample of 65,536 values judges it as the whole would.

Reading needs numpy and json only: no PyTorch, no checkpoint (:func:`load`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..records import Tolerance

FORMAT = "zoo-convert-reference"
VERSION = 1
FOLDER = "reference"
MANIFEST = "manifest.json"
# Outputs above this many elements (4 MiB of float32) are saved reduced; SAMPLED values are kept.
FULL_LIMIT = 1 << 20
SAMPLED = 1 << 16


@dataclass(frozen=True)
class SavedOutput:
    """PyTorch's answer for one output of one case.

    Attributes:
        name: the graph's output name.
        shape: its full shape (a runtime's answer must have exactly this shape).
        values: the reference values: the whole tensor, or the sampled ones when reduced.
        keep: where the attention mask keeps a token (the full shape; None: every position counts).
        index: a reduced output's flat positions ``values`` were read at (None: not reduced).
    """

    name: str
    shape: tuple[int, ...]
    values: np.ndarray
    keep: np.ndarray | None = None
    index: np.ndarray | None = None

    @property
    def reduction(self) -> str | None:
        return "strided" if self.index is not None else None


@dataclass(frozen=True)
class SavedCase:
    """One component at one verify shape: the feed and PyTorch's outputs.

    Attributes:
        component: the component's name (``model``, ``decoder_model_merged``, ``unet``).
        label: the shape label verify records (``3x19``, ``1x7/cache``).
        long: whether it is the long verify shape.
        feed: graph input name -> value, as ONNX Runtime was fed (float32 / int64; cast to a graph's float16).
        outputs: the outputs this case checks.
    """

    component: str
    label: str
    long: bool
    feed: dict[str, np.ndarray]
    outputs: tuple[SavedOutput, ...]


@dataclass(frozen=True)
class Reference:
    """A folder's saved reference: the tolerances, each variant's graph files, the cases.

    Attributes:
        folder: the artifact folder (holding ``reference/``).
        tolerances: variant -> the tolerance the farm judged it at.
        variants: variant -> component -> graph file relative to ``folder``.
        standard: variant -> component -> its graph of standard ONNX ops only (the same file as
            ``variants``' where that holds no contrib op); absent for a variant that has none, and
            in folders saved before it was recorded.
        cases: every saved case, in verify's order.
        model_type / task: of the checkpoint, as the record has them.
    """

    folder: Path
    tolerances: dict[str, Tolerance]
    variants: dict[str, dict[str, str]]
    cases: tuple[SavedCase, ...]
    model_type: str | None = None
    task: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    standard: dict[str, dict[str, str]] = field(default_factory=dict)

    def files(self, variant: str, *, standard: bool = False) -> dict[str, Path]:
        """component -> graph path of ``variant`` in this folder; ``standard``: its standard-ops graphs where recorded."""
        chosen = self.standard.get(variant) if standard else None
        return {comp: self.folder / rel for comp, rel in (chosen or self.variants.get(variant, {})).items()}


def save(
    folder: Path,
    cases: list[tuple[str, str, bool, dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]],
    tolerances: dict[str, Tolerance],
    *,
    model_type: str | None = None,
    task: str | None = None,
) -> int:
    """Write ``folder/reference/``: one npz per (component, label, long, feed, reference, keep); returns the bytes written."""
    out = Path(folder) / FOLDER
    out.mkdir(exist_ok=True)
    entries = []
    total = 0
    for n, (component, label, long, feed, reference, keep) in enumerate(cases):
        arrays: dict[str, np.ndarray] = {f"in/{k}": np.asarray(v, order="C") for k, v in feed.items()}
        outputs = []
        for name, ref in reference.items():
            ref = np.asarray(ref)
            mask = keep.get(name)
            described: dict[str, Any] = {"name": name, "shape": list(ref.shape), "dtype": str(ref.dtype), "reduction": None}
            if ref.size > FULL_LIMIT:
                flat = np.flatnonzero(mask.ravel()) if mask is not None else np.arange(ref.size)
                index = flat[np.linspace(0, flat.size - 1, min(SAMPLED, flat.size)).astype(np.int64)] if flat.size else flat
                arrays[f"idx/{name}"] = index.astype(np.int64)
                arrays[f"ref/{name}"] = ref.ravel()[index]
                described.update(reduction="strided", sampled=int(index.size))
            else:
                arrays[f"ref/{name}"] = ref
                if mask is not None:
                    arrays[f"keep/{name}"] = np.asarray(mask, dtype=bool)
            outputs.append(described)
        path = out / f"case-{n:03d}.npz"
        # Uncompressed: PyTorch's float outputs deflate by 10-20 % only, and deflating them took a real-size gpt2's
        # job 2 s (29 against 26 MB for its largest case, written in 0.02 s).
        np.savez(path, **arrays)  # type: ignore[arg-type]
        total += path.stat().st_size
        entries.append({"component": component, "label": label, "long": long, "file": path.name,
                        "inputs": sorted(feed), "outputs": outputs})  # fmt: skip
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "model_type": model_type,
        "task": task,
        "tolerances": {v: {"max_abs": _finite(t.max_abs), "min_cosine": t.min_cosine} for v, t in tolerances.items()},
        "variants": {},
        "cases": entries,
    }
    text = json.dumps(manifest, indent=1)
    (out / MANIFEST).write_text(text)
    return total + len(text)


def add_variants(folder: Path, variants: dict[str, dict[str, str]], standard: dict[str, dict[str, str]] | None = None) -> None:
    """Record each made variant's graph files (component -> path relative to ``folder``) in the manifest.

    ``standard``: per variant, the graphs of standard ONNX ops computing the same (the variant's own
    where they hold no contrib op, else those under ``standard/``); a variant not there has none.
    """
    path = Path(folder) / FOLDER / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["variants"] = {**manifest.get("variants", {}), **variants}
    if standard is not None:
        manifest["standard"] = {**manifest.get("standard", {}), **standard}
    path.write_text(json.dumps(manifest, indent=1))


def exists(folder: Path) -> bool:
    return (Path(folder) / FOLDER / MANIFEST).is_file()


def _why_none(folder: Path) -> str:
    """What a folder without a reference is: a conversion's parent folder (``--out``), an older artifact folder, or
    no artifact folder at all."""
    inside = sorted(p.parent.parent for p in folder.glob(f"*/*/{FOLDER}/{MANIFEST}"))[:3] or sorted(
        p.parent.parent for p in folder.glob(f"*/{FOLDER}/{MANIFEST}"))[:3]  # fmt: skip
    if inside:
        return "name the artifact folders under it, such as " + ", ".join(str(p) for p in inside)
    if any(folder.glob("onnx/*.onnx")) or any(folder.glob("*.onnx")):
        return "it was converted before references were saved"
    return "it is not an artifact folder (no ONNX model in it)"


def load(folder: Path) -> Reference:
    """The saved reference of an artifact folder; ValueError when there is none or it is not this format."""
    folder = Path(folder)
    path = folder / FOLDER / MANIFEST
    if not path.is_file():
        raise ValueError(f"{folder} has no saved reference ({FOLDER}/{MANIFEST}): {_why_none(folder)}")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ValueError(f"{path} is not a {FORMAT} v{VERSION} manifest")
    cases = []
    for entry in manifest["cases"]:
        with np.load(folder / FOLDER / entry["file"], allow_pickle=False) as npz:
            feed = {k: npz[f"in/{k}"] for k in entry["inputs"]}
            outputs = tuple(
                SavedOutput(
                    name=o["name"],
                    shape=tuple(o["shape"]),
                    values=npz[f"ref/{o['name']}"],
                    keep=npz[f"keep/{o['name']}"] if f"keep/{o['name']}" in npz.files else None,
                    index=npz[f"idx/{o['name']}"] if o.get("reduction") == "strided" else None,
                )
                for o in entry["outputs"]
            )
        cases.append(SavedCase(entry["component"], entry["label"], bool(entry["long"]), feed, outputs))
    tolerances = {
        v: Tolerance(max_abs=float("inf") if t["max_abs"] is None else float(t["max_abs"]), min_cosine=float(t["min_cosine"]))
        for v, t in manifest["tolerances"].items()
    }
    return Reference(folder, tolerances, manifest.get("variants", {}), tuple(cases),
                     manifest.get("model_type"), manifest.get("task"), standard=manifest.get("standard", {}))  # fmt: skip


def size_bytes(folder: Path) -> int:
    """Bytes the saved reference takes in ``folder`` (0 when there is none)."""
    ref = Path(folder) / FOLDER
    return sum(p.stat().st_size for p in ref.iterdir() if p.is_file()) if ref.is_dir() else 0


def _finite(x: float) -> float | None:
    return None if not np.isfinite(x) else float(x)
