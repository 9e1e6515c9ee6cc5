"""Building the zoo: seeded checkpoints with their preprocessing files, and the manifest."""

from __future__ import annotations

import copy
import json
import zlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import UsageError
from ..manifest import SCHEMA
from .catalogue import CTC_VOCAB, IMAGE_SIZE, TASK_CLASSES, TIMM_CLASSES, TIMM_INPUT, WHISPER_FRAMES, ZOO, ZooModel
from .tokenizers import make_tokenizer

if TYPE_CHECKING:
    import torch
    from transformers import (
        FeatureExtractionMixin,
        ImageProcessingMixin,
        PretrainedConfig,
        PreTrainedTokenizerFast,
        ProcessorMixin,
    )

    # What a zoo model saves beside its weights for its inputs: an image processor, a feature
    # extractor, or a processor holding one of them with the tokenizer.
    Preprocessor: TypeAlias = ProcessorMixin | ImageProcessingMixin | FeatureExtractionMixin

# The demo builds the zoo here; manifests/zoo.parquet points at it from manifests/.
REPO_MANIFEST_PREFIX = "../build/demo/zoo"


def build(
    out_dir: str | Path, only: Iterable[str] | None = None, models: Sequence[ZooModel] = ZOO
) -> Path:
    """Build the zoo (or the ``only`` named models) into ``out_dir``; returns the manifest path."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the tokenizer classes' "legacy behaviour" notices say nothing about our files
    chosen = select(only, models)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for spec in chosen:
        build_model(spec, out / spec.name)
    path = out / "manifest.parquet"
    pq.write_table(manifest_table(chosen), path)
    return path


def select(only: Iterable[str] | None, models: Sequence[ZooModel] = ZOO) -> list[ZooModel]:
    """The models named in ``only`` (all when None), in zoo order; unknown names are a usage error."""
    if only is None:
        return list(models)
    wanted = set(only)
    unknown = wanted - {m.name for m in models}
    if unknown:
        raise UsageError(f"unknown zoo model(s): {', '.join(sorted(unknown))}; the zoo has {', '.join(m.name for m in models)}")
    return [m for m in models if m.name in wanted]


def manifest_table(models: Sequence[ZooModel], prefix: str = "") -> pa.Table:
    """The manifest rows of ``models``; sources are ``prefix/name`` (just ``name`` without a prefix)."""
    rows = [
        {
            "source": f"{prefix.rstrip('/')}/{m.name}" if prefix else m.name,
            "task": m.task,
            "revision": None,
            "opsets": None,
            "exporter": m.exporter,
            "variants": ["fp32", "fp16", "int8"],
            "timeout_s": None,
            "memory_gb": None,
            "gpu": False,
            "allow_remote_code": False,
            "allow_pickle": False,
            # A torch export (every auto row of the zoo takes it) takes 10-20 s where optimum's takes 1-3:
            # submitted first, it does not end the run alone.
            "priority": 1 if m.exporter in ("torch", "auto") else 0,
            "tags": m.tags,
        }
        for m in models
    ]
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def write_repo_manifest(path: str | Path = "manifests/zoo.parquet") -> None:
    """Write the committed manifest that points at the zoo ``make demo`` builds."""
    pq.write_table(manifest_table(ZOO, REPO_MANIFEST_PREFIX), path)


def build_model(spec: ZooModel, folder: Path) -> None:
    """Write one seeded checkpoint with its preprocessing files into ``folder``."""
    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    if spec.library == "diffusers":
        _build_pipeline(spec, folder)
        return
    if spec.library == "timm":
        _build_timm(spec, folder)
        return
    config_kwargs = copy.deepcopy(spec.config)  # composite configs pop keys from their sub-config dicts
    tokenizer = None
    if spec.tokenizer is not None:
        tokenizer = make_tokenizer(spec.tokenizer)
        ids = {f"{role[: -len('_token')]}_token_id": tok for role, tok in spec.tokenizer.roles.items()}
        ids = {k: v for k, v in ids.items() if k in ("pad_token_id", "bos_token_id", "eos_token_id")}
        text = {"vocab_size": len(tokenizer), **{k: tokenizer.convert_tokens_to_ids(t) for k, t in ids.items()}}
        # Two-tower models: the tokenizer feeds the text tower; encoder-decoder compositions: the decoder.
        tower = next((k for k in ("text_config", "decoder") if k in config_kwargs), None)
        if tower is not None:
            config_kwargs[tower] = {**config_kwargs[tower], **text}
        else:
            config_kwargs.update(text)
        config_kwargs.update({k: tokenizer.convert_tokens_to_ids(t) for k, t in spec.token_ids.items()})
    config = transformers.AutoConfig.for_model(spec.model_type, **config_kwargs)
    torch.manual_seed(model_seed(spec.name))
    cls = getattr(transformers, spec.model_class or TASK_CLASSES[spec.task])
    model = cls.from_config(config) if cls.__name__.startswith("Auto") else cls(config)
    shards = {"max_shard_size": spec.max_shard_size} if spec.max_shard_size else {}
    model.save_pretrained(folder, safe_serialization=True, **shards)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    if spec.processor is not None:
        _PROCESSORS[spec.processor](config, tokenizer).save_pretrained(folder)
    if spec.sentence_transformers:
        _write_sentence_transformers(folder, config.hidden_size)


def _build_timm(spec: ZooModel, folder: Path) -> None:
    """A timm checkpoint as ``timm.models.save_for_hf`` writes one: config.json (architecture, model_args,
    pretrained_cfg) and model.safetensors, with seeded weights moved off their init."""
    import timm
    import torch
    from timm.models import save_for_hf

    side = int(spec.config.get("img_size", TIMM_INPUT))
    args = {**spec.config, "num_classes": TIMM_CLASSES}
    torch.manual_seed(model_seed(spec.name))
    model = timm.create_model(spec.model_type, pretrained_cfg_overlay={"input_size": (3, side, side)}, **args)
    perturb(model, model_seed(spec.name))
    save_for_hf(model, str(folder), model_args=args, safe_serialization=True)


def perturb(model: torch.nn.Module, seed: int) -> None:
    """Move every weight and normalization statistic off its init, deterministically.

    A fresh timm init proves little: residual branches end in zero-initialized norms
    (``zero_init_last``), heads start at zero, batch norms hold mean 0 and variance 1;
    an export that dropped any of them would still match PyTorch.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if not tensor.is_floating_point():
                continue
            noise = torch.randn(tensor.shape, generator=gen)
            if name.endswith("running_var"):
                tensor.mul_(torch.exp(0.2 * noise))
            else:
                tensor.mul_(1 + 0.2 * noise).add_(0.05 * torch.randn(tensor.shape, generator=gen))


def model_seed(name: str) -> int:
    """The torch seed of one model: fixed by its name, so adding or reordering models changes nothing else."""
    return zlib.crc32(name.encode())


def image_size(config: PretrainedConfig) -> int:
    """The image side a model's config asks for (its vision tower's, in two-tower models)."""
    vision = getattr(config, "vision_config", config)
    size = getattr(vision, "image_size", IMAGE_SIZE)
    return int(size[0] if isinstance(size, (list, tuple)) else size)


def _vit_processor(config: PretrainedConfig, tokenizer: PreTrainedTokenizerFast | None) -> Preprocessor:
    from transformers import ViTImageProcessor

    size = image_size(config)
    return ViTImageProcessor(size={"height": size, "width": size})


def _convnext_processor(config: PretrainedConfig, tokenizer: PreTrainedTokenizerFast | None) -> Preprocessor:
    from transformers import ConvNextImageProcessor

    return ConvNextImageProcessor(size={"shortest_edge": image_size(config)})


def _segformer_processor(config: PretrainedConfig, tokenizer: PreTrainedTokenizerFast | None) -> Preprocessor:
    from transformers import SegformerImageProcessor

    processor: ImageProcessingMixin = SegformerImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    return processor  # transformers' @requires decorator hides this class's type


def _detr_processor(config: PretrainedConfig, tokenizer: PreTrainedTokenizerFast | None) -> Preprocessor:
    from transformers import DetrImageProcessor

    return DetrImageProcessor(size={"shortest_edge": IMAGE_SIZE, "longest_edge": IMAGE_SIZE})


def _clip_processor(config: PretrainedConfig, tokenizer: PreTrainedTokenizerFast | None) -> Preprocessor:
    from transformers import CLIPImageProcessor, CLIPProcessor

    size = image_size(config)
    image = CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
    return CLIPProcessor(image_processor=image, tokenizer=tokenizer)


def _owlvit_processor(config: PretrainedConfig, tokenizer: PreTrainedTokenizerFast | None) -> Preprocessor:
    from transformers import OwlViTImageProcessor, OwlViTProcessor

    size = image_size(config)
    image = OwlViTImageProcessor(size={"height": size, "width": size}, crop_size={"height": size, "width": size})
    return OwlViTProcessor(image_processor=image, tokenizer=tokenizer)


def _wav2vec2_extractor(config: PretrainedConfig, tokenizer: PreTrainedTokenizerFast | None) -> Preprocessor:
    from transformers import Wav2Vec2FeatureExtractor

    return Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, return_attention_mask=True)


def _wav2vec2_ctc_processor(config: PretrainedConfig, tokenizer: PreTrainedTokenizerFast | None) -> Preprocessor:
    import tempfile

    from transformers import Wav2Vec2CTCTokenizer, Wav2Vec2Processor

    with tempfile.TemporaryDirectory() as tmp:
        vocab_file = Path(tmp, "vocab.json")
        vocab_file.write_text(json.dumps({t: i for i, t in enumerate(CTC_VOCAB)}))
        ctc = Wav2Vec2CTCTokenizer(str(vocab_file), word_delimiter_token="|")
    return Wav2Vec2Processor(feature_extractor=_wav2vec2_extractor(config, None), tokenizer=ctc)


def _whisper_processor(config: PretrainedConfig, tokenizer: PreTrainedTokenizerFast | None) -> Preprocessor:
    from transformers import WhisperFeatureExtractor, WhisperProcessor

    extractor = WhisperFeatureExtractor(
        feature_size=config.num_mel_bins, chunk_length=WHISPER_FRAMES * 160 // 16000, hop_length=160
    )
    return WhisperProcessor(feature_extractor=extractor, tokenizer=tokenizer)


def _speech2text_extractor(config: PretrainedConfig, tokenizer: PreTrainedTokenizerFast | None) -> Preprocessor:
    from transformers import Speech2TextFeatureExtractor

    bins = config.input_feat_per_channel
    return Speech2TextFeatureExtractor(feature_size=bins, num_mel_bins=bins, sampling_rate=16000)


def _swin2sr_processor(config: PretrainedConfig, tokenizer: PreTrainedTokenizerFast | None) -> Preprocessor:
    from transformers import Swin2SRImageProcessor

    return Swin2SRImageProcessor(pad_size=config.window_size)


def _chinese_clip_processor(config: PretrainedConfig, tokenizer: PreTrainedTokenizerFast | None) -> Preprocessor:
    from transformers import ChineseCLIPImageProcessor, ChineseCLIPProcessor

    size = image_size(config)
    image = ChineseCLIPImageProcessor(size={"height": size, "width": size}, crop_size={"height": size, "width": size})
    return ChineseCLIPProcessor(image_processor=image, tokenizer=tokenizer)


def _siglip_processor(config: PretrainedConfig, tokenizer: PreTrainedTokenizerFast | None) -> Preprocessor:
    from transformers import SiglipImageProcessor

    size = image_size(config)
    return SiglipImageProcessor(size={"height": size, "width": size})


def _ast_extractor(config: PretrainedConfig, tokenizer: PreTrainedTokenizerFast | None) -> Preprocessor:
    from transformers import ASTFeatureExtractor

    return ASTFeatureExtractor(num_mel_bins=config.num_mel_bins, max_length=config.max_length)


_PROCESSORS: dict[str, Callable[[PretrainedConfig, PreTrainedTokenizerFast | None], Preprocessor]] = {
    "vit": _vit_processor,
    "convnext": _convnext_processor,
    "segformer": _segformer_processor,
    "detr": _detr_processor,
    "clip": _clip_processor,
    "owlvit": _owlvit_processor,
    "wav2vec2": _wav2vec2_extractor,
    "wav2vec2-ctc": _wav2vec2_ctc_processor,
    "whisper": _whisper_processor,
    "speech2text": _speech2text_extractor,
    "ast": _ast_extractor,
    "swin2sr": _swin2sr_processor,
    "chinese-clip": _chinese_clip_processor,
    "siglip": _siglip_processor,
}


def _write_sentence_transformers(folder: Path, dim: int) -> None:
    """The module files that make sentence-transformers (and library detection) see this folder as its own."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    files = {
        "modules.json": modules,
        "sentence_bert_config.json": {"max_seq_length": 128, "do_lower_case": False},
        "config_sentence_transformers.json": {"__version__": {"sentence_transformers": "3.0.1"}},
        "1_Pooling/config.json": {"word_embedding_dimension": dim, "pooling_mode_mean_tokens": True},
    }
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(content, indent=2) + "\n")
    (folder / "2_Normalize").mkdir(exist_ok=True)


# A pipeline's tokenizer pads every prompt to this many tokens (CLIP's 77 in real pipelines).
PROMPT_TOKENS = 16
# Seeded noise on every weight of a pipeline: diffusers initialises norms to 1/0 and some
# projections to zero, parts a loader that skipped the weights would reproduce exactly.
WEIGHT_NOISE = 0.02


def _build_pipeline(spec: ZooModel, folder: Path) -> None:
    """A diffusers Stable Diffusion pipeline of tiny seeded components, saved with ``save_pretrained``."""
    import diffusers
    import torch
    from transformers import CLIPImageProcessor, CLIPTextConfig, CLIPTextModel

    lib: Any = diffusers  # its @register_to_config constructors carry no annotations

    assert spec.tokenizer is not None  # the catalogue gives every pipeline one
    tokenizer = make_tokenizer(spec.tokenizer)
    tokenizer.model_max_length = PROMPT_TOKENS
    ids = {f"{role}_id": tokenizer.convert_tokens_to_ids(tokenizer.special_tokens_map[role])
           for role in ("bos_token", "eos_token", "pad_token")}  # fmt: skip
    conf = spec.config
    torch.manual_seed(model_seed(spec.name))
    unet = lib.UNet2DConditionModel(**conf["unet"])
    vae = lib.AutoencoderKL(**conf["vae"])
    text_encoder = CLIPTextModel(CLIPTextConfig(**conf["text_encoder"], vocab_size=len(tokenizer), **ids))
    with torch.no_grad():
        for module in (unet, vae, text_encoder):
            for p in module.parameters():
                p.add_(WEIGHT_NOISE * torch.randn_like(p))
    size = conf["vae"]["sample_size"]
    pipeline = lib.StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=lib.DDIMScheduler(**conf["scheduler"]),
        safety_checker=None,
        feature_extractor=CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size}),
        requires_safety_checker=False,
    )
    pipeline.save_pretrained(folder, safe_serialization=True)
