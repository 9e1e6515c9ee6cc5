"""The model card (README.md) of a published repo: Hub metadata, what was verified, how to load it.

The card's ``library_name`` is the library the repo is for (:func:`card_library`): the
sentence-transformers modules in the repo make it ``sentence-transformers``, else the
checkpoint's library as fetch read it, through :data:`CARD_LIBRARIES`. ``transformers.js``
is a tag (and a usage section) where that library's repos load in it and the transformers.js
deployment target passed for the job; "Runs in" lists every target that passed, with its version
(the job's ``target_results`` rows, read by :mod:`.candidates`).

Text that comes from the checkpoint, the manifest or the machine (paths, model types,
versions, a CPU's name) is written with its control and bidirectional-formatting
characters escaped (:func:`printable`): a card reads as what it says.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..records import JS_DTYPES, JS_SUFFIXES, PASSED
from ..sources import is_local
from ..variants import REGISTRY
from .candidates import Candidate, VariantRow
from .hub import DEFAULT_ENDPOINT
from .usage import JS_TARGET, ORT_CLASSES, ort_usage, transformers_js_pipeline_missing, transformers_js_variants

__all__ = ["ORT_CLASSES", "model_card", "card_library", "printable"]

# optimum task -> Hub pipeline tag (the ``-with-past`` suffix is stripped first).
PIPELINE_TAGS = {
    "feature-extraction": "feature-extraction",
    "sentence-similarity": "sentence-similarity",
    "fill-mask": "fill-mask",
    "text-classification": "text-classification",
    "token-classification": "token-classification",
    "question-answering": "question-answering",
    "multiple-choice": "multiple-choice",
    "text-generation": "text-generation",
    "text2text-generation": "text2text-generation",
    "image-classification": "image-classification",
    "object-detection": "object-detection",
    "semantic-segmentation": "image-segmentation",
    "image-segmentation": "image-segmentation",
    "depth-estimation": "depth-estimation",
    "image-to-text": "image-to-text",
    "zero-shot-image-classification": "zero-shot-image-classification",
    "audio-classification": "audio-classification",
    "automatic-speech-recognition": "automatic-speech-recognition",
    "zero-shot-object-detection": "zero-shot-object-detection",
    "image-to-image": "image-to-image",
    "text-to-image": "text-to-image",
}
@dataclass(frozen=True)
class CardLibrary:
    """The library a repo's card says it is for.

    Attributes:
        library_name: the Hub's ``library_name`` (which library's widget and snippets the Hub shows).
        transformers_js: whether transformers.js can load the library's repos: the card then has the
            ``transformers.js`` tag and its usage section where the transformers.js target passed.
    """

    library_name: str
    transformers_js: bool = False


# results.library (or sentence-transformers, see card_library) -> what the card says; a library
# not listed here is named as it is, without transformers.js.
CARD_LIBRARIES: dict[str, CardLibrary] = {
    "transformers": CardLibrary("transformers", transformers_js=True),
    "sentence-transformers": CardLibrary("sentence-transformers", transformers_js=True),
    # the card's usage section preprocesses as the checkpoint's pretrained_cfg says (_timm_usage)
    "timm": CardLibrary("timm"),
}


def card_library(c: Candidate) -> CardLibrary:
    """The library a candidate's repo is for: sentence-transformers when its modules are in the repo, else its own."""
    if c.artifacts_dir and Path(c.artifacts_dir, "modules.json").is_file():
        library = "sentence-transformers"
    else:
        library = c.library or "transformers"
    return CARD_LIBRARIES.get(library, CardLibrary(library))


# Bidirectional formatting characters (Unicode's Bidi_Control): they reorder how the text around them reads.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def printable(text: object, *, keep_newlines: bool = False) -> str:
    """``text`` with control and bidirectional-formatting characters written as ``\\uXXXX`` escapes."""
    return "".join(
        f"\\u{ord(ch):04x}"
        if (ch in _BIDI or unicodedata.category(ch) == "Cc") and not (keep_newlines and ch == "\n")
        else ch
        for ch in str(text)
    )


# What each variant is, for the card's dtype table.
VARIANT_NOTES = {name: spec.note for name, spec in REGISTRY.items()}


def model_card(
    c: Candidate,
    repo_id: str,
    *,
    variants: Iterable[str] | None = None,
    endpoint: str | None = None,
    license: str | None = None,
) -> str:
    """The README.md text: Hub metadata, what was verified, how to load it; deterministic per candidate.

    ``variants`` are the ones the repo holds (default: those that passed).
    """
    from huggingface_hub import ModelCard, ModelCardData

    hub = (endpoint or DEFAULT_ENDPOINT).rstrip("/")
    pipeline_tag = PIPELINE_TAGS.get((c.task or "").removesuffix("-with-past"))
    from_hub = not is_local(c.source)
    library = card_library(c)
    in_repo = set(variants) if variants is not None else {v.variant for v in c.variants if v.status == PASSED}
    published = [v for v in c.variants if v.variant in in_repo]
    # transformers.js is claimed (tag and section) only for the variants its target passed for this job.
    js_variants = transformers_js_variants(c, published) if library.transformers_js else ()
    js = bool(js_variants)
    timm_cfg = _timm_pretrained_cfg(c) if library.library_name == "timm" else None
    data = ModelCardData(
        base_model=printable(c.source) if from_hub else None,
        library_name=library.library_name,
        pipeline_tag=pipeline_tag,
        license=printable(license) if license else None,
        tags=["onnx", "onnxruntime", "optimum", *(["transformers.js"] if js else []), "zoo-convert",
              *([printable(c.model_type)] if c.model_type else [])],
    )
    name = repo_id.split("/")[-1]
    rev = (c.resolved_revision or "").split(":")[-1][:12]
    origin = (
        f"[`{printable(c.source)}`]({hub}/{printable(c.source)}) at revision `{printable(rev)}`"
        if from_hub
        else f"a local checkpoint `{printable(Path(c.source).name)}` (content hash `{printable(rev)}`)"
    )
    lines = [
        f"# {name}",
        "",
        f"ONNX export of {origin}, made with {printable(c.exporter or 'optimum')} at opset {c.opset} by zoo_convert "
        "and verified against PyTorch with ONNX Runtime before publishing.",
        "",
        "## Verification",
        "",
        "| variant | file | size | max abs error | tolerance | min cosine | ORT p50 | PyTorch p50 | speedup | status |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
        *(
            f"| {v.variant} | {f'`{printable(v.file)}`' if v.variant in in_repo else 'not published'} | {_mb(v.size_bytes)} "
            f"| {_sci(v.max_abs)} | {_sci(c.tolerances.get(v.variant))} | {_fixed(v.min_cosine, 6)} "
            f"| {_latency(v, v.ort_p50_ms, ' ms')} | {_latency(v, v.torch_p50_ms, ' ms')} | {_latency(v, v.speedup, 'x')} "
            f"| {v.status} |"
            for v in c.variants
        ),
        "",
        *_latency_conditions(c.variants),
        *_generation(c.variants),
        f"Task `{printable(c.task)}`, model type `{printable(c.model_type)}`, verified {(c.finished_at or '')[:10]} with "
        + ", ".join(f"{printable(k)} {printable(v)}" for k, v in sorted(c.versions.items()))
        + ".",
        "",
        *_runs_in(c, in_repo),
        "## Usage",
        "",
        *_optimum(c, repo_id, pipeline_tag, published),
        *(
            _timm_usage(repo_id, timm_cfg, published) if timm_cfg is not None
            else _transformers_js(c, repo_id, pipeline_tag, [v for v in published if v.variant in js_variants])
            if js else []
        ),
        *(
            [
                "With [sentence-transformers](https://sbert.net) (its modules are in the repo):",
                "",
                "```python",
                "from sentence_transformers import SentenceTransformer",
                "",
                f'model = SentenceTransformer("{repo_id}", backend="onnx", model_kwargs={{"file_name": "onnx/model.onnx"}})',
                "```",
                "",
            ]
            if c.artifacts_dir and Path(c.artifacts_dir, "modules.json").is_file()
            else []
        ),
    ]
    # Whatever a field above did not escape (a CPU's name, a note) is escaped here; the card's own newlines stay.
    card = ModelCard(printable(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines), keep_newlines=True))
    return str(card)


def _optimum(c: Candidate, repo_id: str, pipeline_tag: str | None, published: list[VariantRow]) -> list[str]:
    """The card's optimum section: the class that loads the repo, the fp32 load, each other variant's load commented."""
    usage = ort_usage(c, repo_id, pipeline_tag, published)
    (first, load), *others = usage.loads
    return [
        "With [Optimum](https://huggingface.co/docs/optimum-onnx) and ONNX Runtime"
        + (f" ({usage.note})" if usage.note else ":"),
        "",
        "```python",
        f"from optimum.onnxruntime import {usage.cls}",
        "",
        f"model = {load}",
        *(f"# {variant}: model = {other}" for variant, other in others),
        "```",
        "",
    ]


def _runs_in(c: Candidate, in_repo: set[str]) -> list[str]:
    """The deployment targets that passed the repo's variants, with their versions (the job's target rows)."""
    rows = [t for t in c.targets if t.variant in in_repo]
    if not rows:
        return []
    names = list(dict.fromkeys(t.target for t in rows))
    passed = {n: [t for t in rows if t.target == n and t.status == PASSED] for n in names}
    others = {n: [t for t in rows if t.target == n and t.status != PASSED] for n in names}
    lines = [
        "## Runs in",
        "",
        "Each variant was re-run on these runtimes from the reference saved with the artifacts (the inputs verification"
        " fed, PyTorch's outputs) and judged at the variant's tolerance:",
        "",
    ]
    if any(passed.values()):
        # The graph each target ran: other runtimes read onnx/standard/ where a variant ships ONNX Runtime's CPU fusions.
        lines += ["| target | version | variants passed | graphs it ran |", "|---|---|---|---|"]
        lines += [f"| {printable(n)} | {printable(next((t.version for t in passed[n] if t.version), '-'))} "
                  f"| {', '.join(printable(t.variant) for t in passed[n])} "
                  f"| {', '.join(dict.fromkeys(printable(g) for t in passed[n] for g in (t.graph or '-').split(',')))} |"
                  for n in names if passed[n]]  # fmt: skip
        lines.append("")
    else:
        lines += ["No target passed.", ""]
    missed = [f"{printable(n)}: " + ", ".join(f"{printable(t.variant)} {printable(t.status)}" for t in others[n])
              for n in names if others[n]]  # fmt: skip
    if missed:
        lines += ["Checked, not passed: " + "; ".join(missed) + ".", ""]
    return lines


def _transformers_js(c: Candidate, repo_id: str, pipeline_tag: str | None, checked: list[VariantRow]) -> list[str]:
    """The card's transformers.js section: the load its target ran, and which ``dtype`` loads which file.

    ``checked`` are the variants the transformers.js target passed. The ``pipeline()`` line is added only
    where that pipeline was also seen to load the model type and task and finds its tokenizer.
    """
    dtypes = [d for v in checked for d in JS_DTYPES.get(v.variant, ())] or ["fp32"]
    shared = next((JS_DTYPES[v.variant] for v in checked if len(JS_DTYPES.get(v.variant, ())) > 1), None)
    version = next((t.version for t in c.targets if t.target == JS_TARGET and t.version), None)
    pipe = transformers_js_pipeline_missing(c, pipeline_tag) is None
    imports = "AutoModel, pipeline" if pipe else "AutoModel"
    return [
        f"With [Transformers.js](https://huggingface.co/docs/transformers.js) ({printable(version or 'checked')}: each"
        " `dtype` below was loaded this way in node and its graphs matched PyTorch's outputs):",
        "",
        "```js",
        f"import {{ {imports} }} from '@huggingface/transformers';",
        "",
        f"const model = await AutoModel.from_pretrained('{repo_id}', {{ dtype: '{dtypes[0]}' }});",
        *([f"const pipe = await pipeline('{pipeline_tag or printable(c.task)}', '{repo_id}', {{ dtype: '{dtypes[0]}' }});"]
          if pipe else []),
        "```",
        "",
        "| `dtype` | file | variant |",
        "|---|---|---|",
        *(
            f"| `'{d}'` | `{printable(_named(v.file, v.variant, d))}` | {v.variant}: {VARIANT_NOTES.get(v.variant, '')} |"
            for v in checked
            if v.file
            for d in JS_DTYPES.get(v.variant, ())
        ),
        "",
        *([f"`'{shared[0]}'` and `'{shared[1]}'` load the same graph: one file under two names.", ""] if shared else []),
    ]


# The pretrained_cfg fields that say how to preprocess an image for a timm model.
_TIMM_PREPROCESSING = ("input_size", "interpolation", "crop_pct", "crop_mode", "mean", "std")


def _timm_pretrained_cfg(c: Candidate) -> dict[str, Any] | None:
    """The pretrained_cfg of a timm checkpoint's config.json (copied beside onnx/), None for any other library."""
    file = Path(c.artifacts_dir, "config.json") if c.artifacts_dir else None
    try:
        config = json.loads(file.read_text()) if file is not None and file.is_file() else None
    except (OSError, ValueError):
        return None
    cfg = config.get("pretrained_cfg") if isinstance(config, dict) else None
    return cfg if isinstance(cfg, dict) else None


def _timm_usage(repo_id: str, cfg: dict[str, Any], published: list[VariantRow]) -> list[str]:
    """How to preprocess an image as the timm checkpoint's pretrained_cfg says, and run the graph in ONNX Runtime."""
    files = [v for v in published if v.file]
    return [
        "With [timm](https://huggingface.co/docs/timm)'s preprocessing and ONNX Runtime: the graph takes",
        "`pixel_values` (batch x channels x height x width, float32) prepared as the checkpoint's `pretrained_cfg`",
        "(in `config.json`) says:",
        "",
        "| pretrained_cfg | value |",
        "|---|---|",
        *(f"| `{k}` | `{json.dumps(cfg[k])}` |" for k in _TIMM_PREPROCESSING if k in cfg),
        "",
        "```python",
        "import json",
        "",
        "import onnxruntime as ort",
        "import timm.data",
        "from huggingface_hub import hf_hub_download",
        "from PIL import Image",
        "",
        f'cfg = json.load(open(hf_hub_download("{repo_id}", "config.json")))["pretrained_cfg"]',
        "transform = timm.data.create_transform(**timm.data.resolve_data_config(pretrained_cfg=cfg))",
        f'session = ort.InferenceSession(hf_hub_download("{repo_id}", "{files[0].file if files else "onnx/model.onnx"}"))',
        'pixels = transform(Image.open("image.jpg").convert("RGB")).unsqueeze(0).numpy()',
        'logits = session.run(None, {"pixel_values": pixels})[0]',
        "```",
        "",
        "| file | variant |",
        "|---|---|",
        *(f"| `{v.file}` | {v.variant}: {VARIANT_NOTES.get(v.variant, '')} |" for v in files),
        "",
    ]


def _generation(variants: Iterable[VariantRow]) -> list[str]:
    """What generating with each variant gave against PyTorch generate(), for a model that generates."""
    rows = [v for v in variants if v.generation_steps or v.generation_note]
    if not rows:
        return []
    steps = next((v.generation_steps for v in rows if v.generation_steps), 16)
    return [
        "### Generation",
        "",
        f"Each variant generated {steps} tokens greedily in ONNX Runtime with its own key/value cache, from an"
        " empty past, teacher-forced on PyTorch `generate()`'s tokens; every step's logits were compared with"
        " PyTorch's at the variant's tolerance. *Greedy tokens* is the share of ONNX Runtime's own greedy tokens"
        " (running on its own output) identical to PyTorch's.",
        "",
        "| variant | steps | max abs error | min cosine | greedy tokens |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {v.variant} | {v.generation_steps or 0} | {_sci(v.generation_max_abs)} "
            f"| {_fixed(v.generation_min_cosine, 6)} | {_share(v.generation_token_match)} |"
            if v.generation_steps
            else f"| {v.variant} | not checked: {v.generation_note} | | | |"
            for v in rows
        ),
        "",
    ]


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _named(file: str, variant: str, dtype: str) -> str:
    """The recorded file of a variant (``onnx/model_quantized.onnx``) under another dtype's name (``onnx/model_int8.onnx``)."""
    path = Path(file)
    stem = path.name.removesuffix(".onnx").removesuffix(JS_SUFFIXES[JS_DTYPES[variant][0]])
    return (path.parent / f"{stem}{JS_SUFFIXES[dtype]}.onnx").as_posix()


def _latency(v: VariantRow, x: float | None, unit: str) -> str:
    """A latency figure, or "-" where it was measured under noise (too spread, or under load): no figure to trust."""
    return "-" if v.bench_noisy else _fixed(x, 2, unit)


def _latency_conditions(variants: Iterable[VariantRow]) -> list[str]:
    """What every latency figure shown was measured under, and why a figure is missing; nothing when none is shown."""
    lines = []
    for v in variants:
        if v.bench_noisy:
            lines.append(f"- {v.variant}: latency left out, measured under noise ({_conditions(v)}).")
        elif v.ort_p50_ms is not None:
            lines.append(f"- {v.variant}: {_conditions(v)}.")
        elif v.bench_note:
            lines.append(f"- {v.variant}: no latency ({v.bench_note}).")
    return ["Latency conditions (p50 of one forward pass; ONNX Runtime and PyTorch eager each timed in a block of its own):",
            "", *lines, ""] if lines else []  # fmt: skip


def _conditions(v: VariantRow) -> str:
    parts = [
        f"batch x length {v.bench_shape}" if v.bench_shape else None,
        f"{v.bench_threads} thread{'s' if v.bench_threads != 1 else ''}" if v.bench_threads is not None else None,
        v.bench_cpu,
        f"other processes busy on {v.bench_load:.2f} CPUs" if v.bench_load is not None else None,
        f"ORT {v.ort_runs} samples, spread {v.ort_spread:.0%}" if v.ort_runs is not None and v.ort_spread is not None else None,
        f"PyTorch {v.torch_runs} samples, spread {v.torch_spread:.0%}"
        if v.torch_runs is not None and v.torch_spread is not None
        else None,
    ]
    known = [p for p in parts if p]
    return ", ".join(known) if known else "conditions not recorded"


def _mb(n: int | None) -> str:
    return f"{n / 1e6:.2f} MB" if n is not None else "-"


def _sci(x: float | None) -> str:
    return f"{x:.2e}" if x is not None else "-"


def _fixed(x: float | None, digits: int, unit: str = "") -> str:
    return f"{x:.{digits}f}{unit}" if x is not None else "-"
