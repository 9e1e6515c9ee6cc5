"""How the model card tells each library to load a repo: code a test executes, never a guess.

The card's snippets are what users copy, so each one is chosen from what the repo holds (its
``.onnx`` files, ``model_index.json``, ``tokenizer.json``) and the task it was exported for:

    a Diffusers pipeline      ORTDiffusionPipeline on the repo's root (it loads each component's model.onnx)
    CTC speech recognition    ORTModelForCTC (one graph), not ORTModelForSpeechSeq2Seq (encoder + decoder)
    an encoder-decoder        its encoder and decoder file per variant; exported without past: use_cache=False
    a decoder without past    use_cache=False
    a task optimum has no     ORTModelForCustomTasks (runs the graph as it is: object detection,
    class for                 depth estimation...)

transformers.js is offered only for the variants its deployment target passed for this job
(:func:`transformers_js_variants`: the recorded ``target_results`` rows), with the code that target ran
(``AutoModel.from_pretrained(repo, { dtype })``). Its ``pipeline()`` line is a second claim, added only
where that pipeline was also seen to load the model type and task (:data:`JS_CHECKED`) and finds what it
reads: tokenizer.json for a task with text (``vocab.json`` alone, as a wav2vec2 checkpoint ships it, is
not enough; the target loads the model, not the tokenizer). tests/test_card_snippets.py runs every
snippet a card shows against the artifact folder: optimum's classes in Python, transformers.js in node.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..records import JS_DTYPES, PASSED
from .candidates import Candidate, VariantRow

# The deployment target whose passed rows let a card claim transformers.js (zoo_convert/targets/transformers_js.py).
JS_TARGET = "transformers.js"

# Hub pipeline tag -> the optimum.onnxruntime class that loads it (as optimum's own pipelines map it).
ORT_CLASSES = {
    "feature-extraction": "ORTModelForFeatureExtraction",
    "sentence-similarity": "ORTModelForFeatureExtraction",
    "fill-mask": "ORTModelForMaskedLM",
    "text-classification": "ORTModelForSequenceClassification",
    "token-classification": "ORTModelForTokenClassification",
    "question-answering": "ORTModelForQuestionAnswering",
    "multiple-choice": "ORTModelForMultipleChoice",
    "text-generation": "ORTModelForCausalLM",
    "text2text-generation": "ORTModelForSeq2SeqLM",
    "image-classification": "ORTModelForImageClassification",
    "image-segmentation": "ORTModelForSemanticSegmentation",
    "image-to-image": "ORTModelForImageToImage",
    "image-to-text": "ORTModelForVision2Seq",
    "zero-shot-image-classification": "ORTModelForZeroShotImageClassification",
    "audio-classification": "ORTModelForAudioClassification",
    "automatic-speech-recognition": "ORTModelForSpeechSeq2Seq",
}
# A graph optimum has no task class for runs as it is (inputs and outputs by name) in this one.
ORT_ANY_GRAPH = "ORTModelForCustomTasks"
ORT_CTC = "ORTModelForCTC"
ORT_DIFFUSION = "ORTDiffusionPipeline"
# The classes that load an encoder and a decoder graph (file names per graph) and generate with a cache.
ORT_ENCODER_DECODER = ("ORTModelForSeq2SeqLM", "ORTModelForSpeechSeq2Seq", "ORTModelForVision2Seq")

# Hub pipeline tags whose transformers.js pipeline loads a tokenizer (its tokenizer.json) besides the model.
JS_TOKENIZER_TASKS = frozenset({
    "feature-extraction", "sentence-similarity", "fill-mask", "text-classification", "token-classification",
    "question-answering", "text-generation", "text2text-generation", "image-to-text", "automatic-speech-recognition",
    "zero-shot-image-classification", "zero-shot-object-detection", "zero-shot-classification",
})  # fmt: skip

# The model types whose ``pipeline(task, repo, { dtype })`` ran in transformers.js 4.3.2, the version tests/js
# pins, per Hub pipeline tag: measured on every model of the bundled zoo (tests/snippets.py). Whether the model
# loads at all is the transformers.js target's recorded verdict (transformers_js_variants); this table is the
# pipeline line's second condition only: the target loads the model with AutoModel and runs its graphs, a
# pipeline also needs its task's class and the preprocessor (transformers.js answers "Unsupported model type"
# for 24 of the zoo's pairs: albert's multiple-choice, bigbird, pegasus, nystromformer, regnet, swinv2,
# speech_to_text, chinese_clip's image processor...).
JS_CHECKED: dict[str, frozenset[str]] = {task: frozenset(types) for task, types in {
    "audio-classification": ("audio-spectrogram-transformer", "hubert", "unispeech"),
    "automatic-speech-recognition": ("moonshine", "whisper"),
    "depth-estimation": ("depth_anything", "dpt", "glpn"),
    "feature-extraction": ("bert", "starcoder2", "xlm-roberta"),
    "sentence-similarity": ("bert", "xlm-roberta"),
    "fill-mask": ("bert", "camembert", "convbert", "deberta", "esm", "mobilebert", "modernbert", "mpnet", "roformer",
                  "squeezebert", "xlm"),
    "image-classification": ("beit", "convnext", "convnextv2", "deit", "dinov2", "dinov2_with_registers",
                             "efficientnet", "hiera", "mobilenet_v1", "mobilenet_v2", "mobilevit", "pvt", "resnet",
                             "swin", "vit", "vit_msn"),
    "image-to-image": ("swin2sr",),
    "image-to-text": ("vision-encoder-decoder",),
    "object-detection": ("detr", "table-transformer", "yolos"),
    "question-answering": ("deberta-v2",),
    "image-segmentation": ("segformer",),
    "text-classification": ("distilbert", "electra"),
    "text-generation": ("arcee", "bloom", "codegen", "cohere", "falcon", "gemma", "gemma2", "gemma3_text", "glm", "gpt2",
                        "gpt_bigcode", "gpt_neo", "gpt_neox", "gpt_oss", "gptj", "granite", "helium", "llama", "mistral",
                        "mpt", "olmo", "olmo2", "opt", "phi", "phi3", "qwen2", "qwen3", "qwen3_moe", "smollm3",
                        "stablelm"),
    "text2text-generation": ("bart", "blenderbot", "blenderbot-small", "m2m_100", "marian", "mbart", "mt5", "t5"),
    "token-classification": ("roberta",),
    "zero-shot-image-classification": ("clip", "siglip"),
    "zero-shot-object-detection": ("owlvit",),
}.items()}  # fmt: skip


@dataclass(frozen=True)
class OrtUsage:
    """How optimum loads the repo: the class, then one load line per published variant.

    Attributes:
        cls: the optimum.onnxruntime class.
        loads: (variant, the Python expression that loads it), the first the one the card runs.
        note: what the card says besides (a variant the class cannot pick, why use_cache is off), or None.
    """

    cls: str
    loads: tuple[tuple[str, str], ...]
    note: str | None = None


def onnx_files(c: Candidate, published: Iterable[VariantRow]) -> set[str]:
    """The repo's ONNX graphs (paths relative to its root): the artifact folder's, else the variants' recorded files."""
    if c.artifacts_dir and Path(c.artifacts_dir).is_dir():
        root = Path(c.artifacts_dir)
        return {p.relative_to(root).as_posix() for p in root.rglob("*.onnx")}
    return {v.file for v in published if v.file}


def is_diffusion(c: Candidate) -> bool:
    """Whether the repo is a Diffusers pipeline (its model_index.json, or the library fetch read)."""
    return c.library == "diffusers" or bool(c.artifacts_dir and Path(c.artifacts_dir, "model_index.json").is_file())


def ort_usage(c: Candidate, repo_id: str, pipeline_tag: str | None, published: list[VariantRow]) -> OrtUsage:
    """The optimum class and load line of each published variant, as the repo's files and the task call for."""
    files = onnx_files(c, published)
    if is_diffusion(c):
        return OrtUsage(
            ORT_DIFFUSION, ((published[0].variant if published else "fp32", f'{ORT_DIFFUSION}.from_pretrained("{repo_id}")'),),
            note=f"{ORT_DIFFUSION} loads each component's `model.onnx` (fp32)"
            + (": the other variants' graphs (`unet/model_fp16.onnx`, ...) are for ONNX Runtime sessions of your own."
               if any(v.variant != "fp32" for v in published) else "."),
        )  # fmt: skip
    tag = pipeline_tag or ""
    with_past = (c.task or "").endswith("-with-past")
    cls = ORT_CLASSES.get(tag, ORT_ANY_GRAPH)
    if tag == "automatic-speech-recognition" and not any(Path(f).name.startswith("encoder_model") for f in files):
        cls = ORT_CTC  # one graph with CTC logits (wav2vec2, hubert...): no encoder and decoder to load
    base = f'"{repo_id}", subfolder="onnx"'
    no_cache = cls in (*ORT_ENCODER_DECODER, "ORTModelForCausalLM") and not with_past
    extra = ", use_cache=False" if no_cache else ""
    note = "exported without past key/values: `use_cache=False` (no cache to generate with)." if no_cache else None
    loads: list[tuple[str, str]] = []
    for v in published:
        if not v.file:
            continue
        name = Path(v.file).name
        if cls in ORT_ENCODER_DECODER:
            suffix = name.removesuffix(".onnx").removeprefix("encoder_model")
            if v.variant == "fp32" and not suffix:
                loads.append((v.variant, f"{cls}.from_pretrained({base}{extra})"))
                continue
            merged, plain = f"decoder_model_merged{suffix}.onnx", f"decoder_model{suffix}.onnx"
            decoder = merged if any(Path(f).name == merged for f in files) else plain
            # optimum looks for a decoder_with_past graph whenever a decoder file is named and the cache is
            # on; a merged decoder is that graph too, so it is named for both.
            with_past_name = f', decoder_with_past_file_name="{decoder}"' if decoder == merged else ""
            loads.append((v.variant, f'{cls}.from_pretrained({base}, encoder_file_name="{name}", '
                                     f'decoder_file_name="{decoder}"{with_past_name}{extra})'))  # fmt: skip
        elif v.variant == "fp32" and name == "model.onnx":
            loads.append((v.variant, f"{cls}.from_pretrained({base}{extra})"))
        else:
            loads.append((v.variant, f'{cls}.from_pretrained({base}, file_name="{name}"{extra})'))
    if not loads:
        loads.append(("fp32", f"{cls}.from_pretrained({base}{extra})"))
    return OrtUsage(cls, tuple(loads), note)


def transformers_js_variants(c: Candidate, published: Iterable[VariantRow]) -> tuple[str, ...]:
    """The published variants the transformers.js target passed for this job (none for a Diffusers pipeline)."""
    if is_diffusion(c):
        return ()
    passed = set(c.passed_on(JS_TARGET))
    return tuple(v.variant for v in published if v.status == PASSED and v.variant in passed and v.variant in JS_DTYPES)


def transformers_js_pipeline_missing(c: Candidate, pipeline_tag: str | None) -> str | None:
    """What transformers.js's ``pipeline()`` would not find for the repo (None when it was seen to load it)."""
    if is_diffusion(c):
        return "a Diffusers pipeline"
    if (c.model_type or "") not in JS_CHECKED.get(pipeline_tag or "", ()):
        return f"a check that {c.model_type} loads in its {pipeline_tag or c.task} pipeline"
    if (pipeline_tag or "") in JS_TOKENIZER_TASKS and c.artifacts_dir is not None:
        if not Path(c.artifacts_dir, "tokenizer.json").is_file():
            return "tokenizer.json (transformers.js reads no other tokenizer file)"
    return None
