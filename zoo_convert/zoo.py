"""The bundled tiny zoo: random checkpoints of many architectures, built locally.

``build(dir)`` writes one folder per model (config.json, model.safetensors, and
the tokenizer / image processor / feature extractor files its task needs) plus
``manifest.parquet`` in the farm's manifest schema. Nothing is downloaded:
tokenizer vocabularies are learned from a fixed synthetic English corpus and
weights come from ``from_config`` right after seeding torch with the model's
:func:`model_seed`, so every build writes the same bytes.
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import UsageError
from .manifest import SCHEMA

SEED = 0
VOCAB_SIZE = 1000
IMAGE_SIZE = 32
# Whisper's encoder takes a fixed number of mel frames; optimum's dummy input has 3000 (30 s at hop 160).
WHISPER_FRAMES = 3000
WHISPER_MEL_BINS = 16
# Character vocabulary of the CTC head (wav2vec2).
_CTC_VOCAB = ("<pad>", "<s>", "</s>", "<unk>", "|", *"ABCDEFGHIJKLMNOPQRSTUVWXYZ'")
# The demo builds the zoo here; manifests/zoo.parquet points at it from manifests/.
REPO_MANIFEST_PREFIX = "../build/demo/zoo"

# The auto class each task loads in optimum; weights are saved for that head so
# the exporter loads them without initialising anything at random.
TASK_CLASSES = {
    "feature-extraction": "AutoModel",
    "fill-mask": "AutoModelForMaskedLM",
    "text-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "multiple-choice": "AutoModelForMultipleChoice",
    "text-generation-with-past": "AutoModelForCausalLM",
    "text2text-generation-with-past": "AutoModelForSeq2SeqLM",
    "automatic-speech-recognition-with-past": "AutoModelForSpeechSeq2Seq",
    "automatic-speech-recognition": "AutoModelForCTC",
    "audio-classification": "AutoModelForAudioClassification",
    "image-classification": "AutoModelForImageClassification",
    "object-detection": "AutoModelForObjectDetection",
    "semantic-segmentation": "AutoModelForSemanticSegmentation",
    "zero-shot-image-classification": "AutoModelForZeroShotImageClassification",
    "zero-shot-object-detection": "AutoModelForZeroShotObjectDetection",
}

_WORDS = """
the of and to in is was that for on with as by at from his her they this which be
are have had not but were all one an or their there been has would who will more
when time if no out so up what about into than them can only other new some could
these two may first then do any like my now over such our man me even most made
after also did many before must through back years where much your way well down
should because each just those people how too little state good very make world
still own see men work long get here between both life being under never day same
another know while last might us great old year off come since against go came
right used take three small large house home water light river city country place
north south east west morning evening night summer winter spring autumn garden
mountain forest island ocean bridge station market school library window kitchen
table chair letter story music picture question answer number reason moment friend
family mother father brother sister children teacher doctor farmer writer painter
quickly slowly quietly happily carefully suddenly together always sometimes often
walk run read write sing speak listen think believe remember understand travel
build open close begin finish carry bring follow return change improve measure
bright dark warm cold quiet loud simple strange beautiful important different
possible natural careful gentle ancient modern famous common private public
river's children's model models convert converted converting conversion export
exported exporting tensor tensors matrix vector layer layers network networks
language translation sentence sentences token tokens vocabulary encoder decoder
attention transformer image images audio sound signal frequency camera picture
"""


def corpus(lines: int = 2000) -> list[str]:
    """A fixed synthetic English corpus: the same sentences on every call."""
    words = _WORDS.split()
    rng = random.Random(SEED)
    out = []
    for _ in range(lines):
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(4, 14)))
        out.append(sentence[0].upper() + sentence[1:] + rng.choice([".", ".", "!", "?", ","]))
    return out


@dataclass(frozen=True)
class TokenizerSpec:
    """How to make one tokenizer.

    Attributes:
        algo: ``wordpiece`` (bert-likes), ``bytelevel`` (gpt2/roberta-likes byte-level BPE),
            ``metaspace-bpe`` (llama-style sentencepiece BPE) or ``unigram`` (t5-style sentencepiece).
        specials: special tokens, given the first ids in this order.
        cls: the transformers fast tokenizer class it is saved as.
        roles: tokenizer role (``pad_token``, ``bos_token``, ...) -> special token.
        kwargs: extra constructor arguments of ``cls``.
    """

    algo: str
    specials: tuple[str, ...]
    cls: str
    roles: dict[str, str] = field(default_factory=dict)
    kwargs: dict[str, Any] = field(default_factory=dict)


_BERT_ROLES = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}
_BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_ROBERTA_ROLES = {
    "bos_token": "<s>",
    "pad_token": "<pad>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "mask_token": "<mask>",
    "cls_token": "<s>",
    "sep_token": "</s>",
}
_ROBERTA_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
_GPT2_ROLES = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
_LLAMA_ROLES = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}
_T5_ROLES = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}


def wordpiece(cls: str = "BertTokenizerFast") -> TokenizerSpec:
    """A bert-style lower-cased WordPiece tokenizer saved as ``cls``."""
    return TokenizerSpec("wordpiece", _BERT_SPECIALS, cls, _BERT_ROLES)


def roberta_bpe(cls: str = "RobertaTokenizerFast") -> TokenizerSpec:
    """A roberta/bart-style byte-level BPE tokenizer saved as ``cls``."""
    return TokenizerSpec("bytelevel", _ROBERTA_SPECIALS, cls, _ROBERTA_ROLES)


def gpt2_bpe(cls: str = "GPT2TokenizerFast", **roles: str) -> TokenizerSpec:
    """A gpt2-style byte-level BPE tokenizer (one ``<|endoftext|>`` special) saved as ``cls``."""
    return TokenizerSpec("bytelevel", ("<|endoftext|>",), cls, {**_GPT2_ROLES, **roles})


def llama_bpe(cls: str = "LlamaTokenizerFast", **roles: str) -> TokenizerSpec:
    """A llama-style sentencepiece BPE tokenizer saved as ``cls``."""
    return TokenizerSpec("metaspace-bpe", ("<unk>", "<s>", "</s>"), cls, {**_LLAMA_ROLES, **roles})


def t5_unigram(cls: str = "T5TokenizerFast", **kwargs: Any) -> TokenizerSpec:
    """A t5-style sentencepiece Unigram tokenizer saved as ``cls``."""
    return TokenizerSpec("unigram", ("<pad>", "</s>", "<unk>"), cls, _T5_ROLES, kwargs)


def bert_unigram(cls: str) -> TokenizerSpec:
    """A sentencepiece Unigram tokenizer with bert's special tokens (albert, deberta-v2)."""
    return TokenizerSpec("unigram", _BERT_SPECIALS, cls, _BERT_ROLES)


def roberta_unigram(cls: str, **kwargs: Any) -> TokenizerSpec:
    """A sentencepiece Unigram tokenizer with roberta's special tokens (xlm-roberta, camembert)."""
    return TokenizerSpec("unigram", _ROBERTA_SPECIALS, cls, _ROBERTA_ROLES, kwargs)


def clip_bpe() -> TokenizerSpec:
    """A byte-level BPE tokenizer with CLIP's start/end tokens."""
    specials = ("<|startoftext|>", "<|endoftext|>")
    roles = {"bos_token": specials[0], "eos_token": specials[1], "unk_token": specials[1], "pad_token": specials[1]}
    return TokenizerSpec("bytelevel", specials, "CLIPTokenizerFast", roles)


def whisper_bpe() -> TokenizerSpec:
    """A byte-level BPE tokenizer with the whisper control tokens generation needs."""
    specials = (
        "<|endoftext|>",
        "<|startoftranscript|>",
        "<|en|>",
        "<|transcribe|>",
        "<|translate|>",
        "<|notimestamps|>",
    )
    roles = {"bos_token": specials[0], "eos_token": specials[0], "unk_token": specials[0], "pad_token": specials[0]}
    return TokenizerSpec("bytelevel", specials, "WhisperTokenizerFast", roles)


@dataclass(frozen=True)
class ZooModel:
    """One tiny checkpoint of the zoo.

    Attributes:
        name: folder name under the zoo directory.
        family: encoder, decoder, encoder-decoder, vision, audio or multimodal.
        task: the optimum task it is exported with.
        model_type: the transformers ``model_type`` of its config.
        config: config arguments (sizes kept tiny).
        tokenizer: the tokenizer to build, for text models.
        processor: which image processor / feature extractor to save (see ``_PROCESSORS``).
        token_ids: config key -> special token, resolved to that token's id.
        model_class: transformers class to instantiate; default is the task's auto class.
        sentence_transformers: also write the sentence-transformers module files.
    """

    name: str
    family: str
    task: str
    model_type: str
    config: dict[str, Any]
    tokenizer: TokenizerSpec | None = None
    processor: str | None = None
    token_ids: dict[str, str] = field(default_factory=dict)
    model_class: str | None = None
    sentence_transformers: bool = False

    @property
    def tags(self) -> list[str]:
        """The manifest tags: ``zoo``, the family and the model type."""
        tags = ["zoo", f"family:{self.family}", f"model_type:{self.model_type}"]
        return tags + (["library:sentence_transformers"] if self.sentence_transformers else [])


# Every transformer in the zoo: hidden size 32, 2 layers of 2 heads.
_LAYERS = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
_ENC = dict(_LAYERS, max_position_embeddings=128)
# Position ids of roberta-likes start after the padding index.
_ROBERTA_ENC = dict(_ENC, max_position_embeddings=130)
_DEC = dict(_ENC, num_key_value_heads=1)
_VIT = dict(_LAYERS, image_size=IMAGE_SIZE, patch_size=8)
_BART = dict(
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=128,
)
_SPEECH = dict(
    _LAYERS,
    conv_dim=(16, 16),
    conv_stride=(5, 2),
    conv_kernel=(10, 3),
    num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=2,
)
_TINY_RESNET = dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic")

ZOO: tuple[ZooModel, ...] = (
    # text encoders
    ZooModel("bert", "encoder", "fill-mask", "bert", _ENC, wordpiece()),
    ZooModel(
        "distilbert",
        "encoder",
        "text-classification",
        "distilbert",
        dict(dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=128),
        wordpiece("DistilBertTokenizerFast"),
    ),
    ZooModel("roberta", "encoder", "token-classification", "roberta", _ROBERTA_ENC, roberta_bpe()),
    ZooModel(
        "deberta-v2", "encoder", "question-answering", "deberta-v2", _ENC, bert_unigram("DebertaV2TokenizerFast")
    ),
    ZooModel(
        "xlm-roberta",
        "encoder",
        "feature-extraction",
        "xlm-roberta",
        _ROBERTA_ENC,
        roberta_unigram("XLMRobertaTokenizerFast"),
    ),
    ZooModel(
        "modernbert",
        "encoder",
        "fill-mask",
        "modernbert",
        {**_ENC, "local_attention": 16, "global_attn_every_n_layers": 2},
        TokenizerSpec("bytelevel", _BERT_SPECIALS, "PreTrainedTokenizerFast", _BERT_ROLES),
        token_ids={"cls_token_id": "[CLS]", "sep_token_id": "[SEP]"},
    ),
    ZooModel(
        "electra",
        "encoder",
        "text-classification",
        "electra",
        {**_ENC, "embedding_size": 16},
        wordpiece("ElectraTokenizerFast"),
    ),
    ZooModel(
        "albert",
        "encoder",
        "multiple-choice",
        "albert",
        {**_ENC, "embedding_size": 16},
        bert_unigram("AlbertTokenizerFast"),
    ),
    ZooModel(
        "camembert",
        "encoder",
        "fill-mask",
        "camembert",
        _ROBERTA_ENC,
        # Without this it adds three "NOTUSED" tokens beyond the vocabulary.
        roberta_unigram("CamembertTokenizerFast", additional_special_tokens=[]),
    ),
    # A sentence-transformers folder: fetch must not be fooled into another library.
    ZooModel(
        "sentence-bert",
        "encoder",
        "feature-extraction",
        "bert",
        _ENC,
        wordpiece(),
        sentence_transformers=True,
    ),
    # decoders, exported with past key values
    ZooModel(
        "gpt2",
        "decoder",
        "text-generation-with-past",
        "gpt2",
        dict(n_embd=32, n_layer=2, n_head=2, n_positions=128),
        gpt2_bpe(),
    ),
    ZooModel("llama", "decoder", "text-generation-with-past", "llama", {**_DEC, "head_dim": 16}, llama_bpe()),
    ZooModel(
        "qwen2",
        "decoder",
        "text-generation-with-past",
        "qwen2",
        _DEC,
        gpt2_bpe("Qwen2TokenizerFast", pad_token="<|endoftext|>"),
    ),
    ZooModel("mistral", "decoder", "text-generation-with-past", "mistral", {**_DEC, "head_dim": 16}, llama_bpe()),
    ZooModel(
        "phi3",
        "decoder",
        "text-generation-with-past",
        "phi3",
        {**_DEC, "num_key_value_heads": 2},
        llama_bpe(pad_token="<unk>"),
    ),
    ZooModel(
        "gemma",
        "decoder",
        "text-generation-with-past",
        "gemma",
        {**_DEC, "head_dim": 16},
        llama_bpe("GemmaTokenizerFast", pad_token="<unk>"),
    ),
    ZooModel(
        "gpt-neox",
        "decoder",
        "text-generation-with-past",
        "gpt_neox",
        {k: v for k, v in _DEC.items() if k != "num_key_value_heads"},
        gpt2_bpe("GPTNeoXTokenizerFast"),
    ),
    ZooModel(
        "opt",
        "decoder",
        "text-generation-with-past",
        "opt",
        dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            ffn_dim=64,
            word_embed_proj_dim=32,
            max_position_embeddings=128,
        ),
        gpt2_bpe(pad_token="<|endoftext|>"),
    ),
    # encoder-decoders
    ZooModel(
        "t5",
        "encoder-decoder",
        "text2text-generation-with-past",
        "t5",
        dict(d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=2),
        t5_unigram(extra_ids=0),
        token_ids={"decoder_start_token_id": "<pad>"},
    ),
    ZooModel(
        "bart",
        "encoder-decoder",
        "text2text-generation-with-past",
        "bart",
        _BART,
        roberta_bpe("BartTokenizerFast"),
        token_ids={"decoder_start_token_id": "</s>", "forced_eos_token_id": "</s>"},
    ),
    ZooModel(
        "marian",
        "encoder-decoder",
        "text2text-generation-with-past",
        "marian",
        _BART,
        # MarianTokenizer is sentencepiece-only; the generic fast class loads without it.
        t5_unigram("PreTrainedTokenizerFast"),
        token_ids={"decoder_start_token_id": "<pad>"},
    ),
    ZooModel(
        "whisper",
        "encoder-decoder",
        "automatic-speech-recognition-with-past",
        "whisper",
        dict(
            _BART,
            num_mel_bins=WHISPER_MEL_BINS,
            max_source_positions=WHISPER_FRAMES // 2,
            max_target_positions=64,
            begin_suppress_tokens=None,
            suppress_tokens=None,
        ),
        whisper_bpe(),
        processor="whisper",
        token_ids={"decoder_start_token_id": "<|startoftranscript|>"},
    ),
    # vision
    ZooModel("vit", "vision", "image-classification", "vit", _VIT, processor="vit"),
    ZooModel("resnet", "vision", "image-classification", "resnet", _TINY_RESNET, processor="convnext"),
    ZooModel(
        "convnext",
        "vision",
        "image-classification",
        "convnext",
        dict(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], image_size=IMAGE_SIZE),
        processor="convnext",
    ),
    ZooModel(
        "swin",
        "vision",
        "image-classification",
        "swin",
        dict(image_size=IMAGE_SIZE, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4),
        processor="vit",
    ),
    # The image-classification auto class maps deit to two classes; from_config needs one.
    ZooModel(
        "deit",
        "vision",
        "image-classification",
        "deit",
        _VIT,
        processor="vit",
        model_class="DeiTForImageClassification",
    ),
    ZooModel("dinov2", "vision", "image-classification", "dinov2", {**_VIT, "mlp_ratio": 2}, processor="vit"),
    ZooModel(
        "mobilevit",
        "vision",
        "image-classification",
        "mobilevit",
        dict(
            image_size=2 * IMAGE_SIZE,
            hidden_sizes=[16, 16, 16],
            neck_hidden_sizes=[8, 8, 16, 16, 16, 16, 32],
            num_attention_heads=2,
            # At the default 0.02 the activations underflow to exact zeros by the last stage,
            # and a verification of all-zero logits proves nothing.
            initializer_range=0.5,
        ),
        processor="vit",
    ),
    ZooModel(
        "segformer",
        "vision",
        "semantic-segmentation",
        "segformer",
        dict(
            num_encoder_blocks=2,
            depths=[1, 1],
            sr_ratios=[2, 1],
            hidden_sizes=[16, 32],
            patch_sizes=[7, 3],
            strides=[4, 2],
            num_attention_heads=[1, 2],
            mlp_ratios=[2, 2],
            decoder_hidden_size=32,
            num_labels=4,
        ),
        processor="segformer",
    ),
    ZooModel(
        "detr",
        "vision",
        "object-detection",
        "detr",
        dict(
            use_timm_backbone=False,
            use_pretrained_backbone=False,
            backbone=None,
            backbone_config={"model_type": "resnet", **_TINY_RESNET, "out_features": ["stage2"]},
            d_model=32,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            num_queries=8,
        ),
        processor="detr",
    ),
    ZooModel(
        "yolos",
        "vision",
        "object-detection",
        "yolos",
        {**_VIT, "image_size": [IMAGE_SIZE, IMAGE_SIZE], "num_detection_tokens": 8},
        processor="detr",
    ),
    # multimodal: text and image towers
    ZooModel(
        "clip",
        "multimodal",
        "zero-shot-image-classification",
        "clip",
        dict(text_config=_LAYERS, vision_config=_VIT, projection_dim=32),
        clip_bpe(),
        processor="clip",
    ),
    ZooModel(
        "owlvit",
        "multimodal",
        "zero-shot-object-detection",
        "owlvit",
        dict(text_config=_LAYERS, vision_config=_VIT, projection_dim=32),
        clip_bpe(),
        processor="owlvit",
    ),
    # audio
    ZooModel(
        "wav2vec2",
        "audio",
        "automatic-speech-recognition",
        "wav2vec2",
        {**_SPEECH, "vocab_size": len(_CTC_VOCAB)},
        processor="wav2vec2-ctc",
    ),
    ZooModel("hubert", "audio", "audio-classification", "hubert", _SPEECH, processor="wav2vec2"),
    ZooModel("wavlm", "audio", "feature-extraction", "wavlm", _SPEECH, processor="wav2vec2"),
    ZooModel(
        "data2vec-audio",
        "audio",
        "audio-classification",
        "data2vec-audio",
        {**_SPEECH, "conv_pos_kernel_size": 5, "num_conv_pos_embeddings": 5},
        processor="wav2vec2",
    ),
)


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
            "exporter": "optimum",
            "variants": ["fp32", "fp16", "int8"],
            "timeout_s": None,
            "memory_gb": None,
            "gpu": False,
            "allow_remote_code": False,
            "allow_pickle": False,
            "priority": 0,
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
    config_kwargs = dict(spec.config)
    tokenizer = None
    if spec.tokenizer is not None:
        tokenizer = make_tokenizer(spec.tokenizer)
        ids = {f"{role[: -len('_token')]}_token_id": tok for role, tok in spec.tokenizer.roles.items()}
        ids = {k: v for k, v in ids.items() if k in ("pad_token_id", "bos_token_id", "eos_token_id")}
        text = {"vocab_size": len(tokenizer), **{k: tokenizer.convert_tokens_to_ids(t) for k, t in ids.items()}}
        if "text_config" in config_kwargs:  # two-tower models: the tokenizer feeds the text tower
            config_kwargs["text_config"] = {**config_kwargs["text_config"], **text}
        else:
            config_kwargs.update(text)
        config_kwargs.update({k: tokenizer.convert_tokens_to_ids(t) for k, t in spec.token_ids.items()})
    config = transformers.AutoConfig.for_model(spec.model_type, **config_kwargs)
    torch.manual_seed(model_seed(spec.name))
    cls = getattr(transformers, spec.model_class or TASK_CLASSES[spec.task])
    model = cls.from_config(config) if cls.__name__.startswith("Auto") else cls(config)
    model.save_pretrained(folder, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    if spec.processor is not None:
        _PROCESSORS[spec.processor](config, tokenizer).save_pretrained(folder)
    if spec.sentence_transformers:
        _write_sentence_transformers(folder, config.hidden_size)


def model_seed(name: str) -> int:
    """The torch seed of one model: fixed by its name, so adding or reordering models changes nothing else."""
    return zlib.crc32(name.encode())


def make_tokenizer(spec: TokenizerSpec) -> Any:
    """A fast tokenizer of class ``spec.cls`` over a vocabulary learned from :func:`corpus`."""
    import transformers
    from tokenizers import Tokenizer

    cls = getattr(transformers, spec.cls)
    backend = Tokenizer.from_str(_trained_json(spec.algo, spec.specials, spec.roles["unk_token"]))
    return cls(tokenizer_object=backend, **spec.roles, **spec.kwargs)


@cache
def _trained_json(algo: str, specials: tuple[str, ...], unk: str) -> str:
    """Build once per (algorithm, specials) and keep the serialized tokenizer.

    The vocabularies are learned here in plain Python rather than with the
    ``tokenizers`` trainers, whose tie-breaking follows hash order and so
    changes the vocabulary from one process to the next.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    if algo == "wordpiece":
        normalizer = normalizers.BertNormalizer(lowercase=True)
        pre = pre_tokenizers.BertPreTokenizer()
        counts = _pre_token_counts(pre, normalizer)
        chars = sorted({c for word in counts for c in word})
        words = [w for w in sorted(counts, key=lambda w: (-counts[w], w)) if len(w) > 1]
        vocab = list(specials) + chars + ["##" + c for c in chars] + words
        tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab[:VOCAB_SIZE])}, unk_token=unk))
        tok.normalizer = normalizer
        tok.pre_tokenizer = pre
        tok.decoder = decoders.WordPiece()
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", vocab.index("[CLS]")), ("[SEP]", vocab.index("[SEP]"))],
        )
    elif algo == "bytelevel":
        # CLIPTokenizerFast insists on a Sequence here.
        pre = pre_tokenizers.Sequence([pre_tokenizers.ByteLevel(add_prefix_space=False)])
        vocab, merges = _bpe_vocab("bytelevel", specials)
        tok = Tokenizer(models.BPE(vocab, merges))
        tok.pre_tokenizer = pre
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    elif algo in ("metaspace-bpe", "unigram"):
        pre = _metaspace()
        vocab, merges = _bpe_vocab("metaspace", specials)
        if algo == "unigram":
            # The BPE pieces with scores falling by rank: Viterbi then favours long, early pieces.
            pieces = sorted(vocab, key=vocab.__getitem__)
            scored = [(p, 0.0 if p in specials else -1.0 - i / len(pieces)) for i, p in enumerate(pieces)]
            tok = Tokenizer(models.Unigram(scored, unk_id=pieces.index(unk)))
        else:
            tok = Tokenizer(models.BPE(vocab, merges, unk_token=unk, fuse_unk=True))
        tok.pre_tokenizer = pre
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    else:
        raise ValueError(f"unknown tokenizer algorithm {algo!r}")
    tok.add_special_tokens(list(specials))
    return tok.to_str()


def _pre_token_counts(pre: Any, normalizer: Any = None) -> dict[str, int]:
    """How often each pre-token (word piece before the model splits it) occurs in the corpus."""
    counts: dict[str, int] = {}
    for line in corpus():
        text = normalizer.normalize_str(line) if normalizer is not None else line
        for word, _ in pre.pre_tokenize_str(text):
            counts[word] = counts.get(word, 0) + 1
    return counts


def _metaspace() -> Any:
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")


def _bpe_vocab(pre: str, specials: tuple[str, ...]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Specials, then the alphabet, then merged tokens until the vocabulary holds VOCAB_SIZE tokens."""
    alphabet, all_merges = _learn_bpe(pre)
    vocab = list(specials) + [c for c in alphabet if c not in specials]
    seen = set(vocab)
    merges: list[tuple[str, str]] = []
    for a, b in all_merges:
        if len(vocab) >= VOCAB_SIZE:
            break
        merges.append((a, b))
        if a + b not in seen:  # two different merges can spell the same token
            seen.add(a + b)
            vocab.append(a + b)
    return {t: i for i, t in enumerate(vocab)}, merges


@cache
def _learn_bpe(pre: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The alphabet and up to VOCAB_SIZE byte-pair merges, ties broken by the pair's text so they never vary."""
    from tokenizers import pre_tokenizers

    if pre == "bytelevel":
        counts = _pre_token_counts(pre_tokenizers.ByteLevel(add_prefix_space=False))
        alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    else:
        counts = _pre_token_counts(_metaspace())
        alphabet = sorted({c for word in counts for c in word})
    words = {tuple(w): c for w, c in counts.items()}
    merges: list[tuple[str, str]] = []
    while len(merges) < VOCAB_SIZE:
        pairs: dict[tuple[str, str], int] = {}
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] = pairs.get(pair, 0) + count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        words = {_merge(word, best): count for word, count in words.items()}
    return alphabet, merges


def _merge(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def _image_size(config: Any) -> int:
    vision = getattr(config, "vision_config", config)
    size = getattr(vision, "image_size", IMAGE_SIZE)
    return size[0] if isinstance(size, (list, tuple)) else size


def _vit_processor(config: Any, tokenizer: Any) -> Any:
    from transformers import ViTImageProcessor

    size = _image_size(config)
    return ViTImageProcessor(size={"height": size, "width": size})


def _convnext_processor(config: Any, tokenizer: Any) -> Any:
    from transformers import ConvNextImageProcessor

    return ConvNextImageProcessor(size={"shortest_edge": _image_size(config)})


def _segformer_processor(config: Any, tokenizer: Any) -> Any:
    from transformers import SegformerImageProcessor

    return SegformerImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})


def _detr_processor(config: Any, tokenizer: Any) -> Any:
    from transformers import DetrImageProcessor

    return DetrImageProcessor(size={"shortest_edge": IMAGE_SIZE, "longest_edge": IMAGE_SIZE})


def _clip_processor(config: Any, tokenizer: Any) -> Any:
    from transformers import CLIPImageProcessor, CLIPProcessor

    size = _image_size(config)
    image = CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
    return CLIPProcessor(image_processor=image, tokenizer=tokenizer)


def _owlvit_processor(config: Any, tokenizer: Any) -> Any:
    from transformers import OwlViTImageProcessor, OwlViTProcessor

    size = _image_size(config)
    image = OwlViTImageProcessor(size={"height": size, "width": size}, crop_size={"height": size, "width": size})
    return OwlViTProcessor(image_processor=image, tokenizer=tokenizer)


def _wav2vec2_extractor(config: Any, tokenizer: Any) -> Any:
    from transformers import Wav2Vec2FeatureExtractor

    return Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, return_attention_mask=True)


def _wav2vec2_ctc_processor(config: Any, tokenizer: Any) -> Any:
    import tempfile

    from transformers import Wav2Vec2CTCTokenizer, Wav2Vec2Processor

    with tempfile.TemporaryDirectory() as tmp:
        vocab_file = Path(tmp, "vocab.json")
        vocab_file.write_text(json.dumps({t: i for i, t in enumerate(_CTC_VOCAB)}))
        ctc = Wav2Vec2CTCTokenizer(str(vocab_file), word_delimiter_token="|")
    return Wav2Vec2Processor(feature_extractor=_wav2vec2_extractor(config, None), tokenizer=ctc)


def _whisper_processor(config: Any, tokenizer: Any) -> Any:
    from transformers import WhisperFeatureExtractor, WhisperProcessor

    extractor = WhisperFeatureExtractor(
        feature_size=config.num_mel_bins, chunk_length=WHISPER_FRAMES * 160 // 16000, hop_length=160
    )
    return WhisperProcessor(feature_extractor=extractor, tokenizer=tokenizer)


_PROCESSORS = {
    "vit": _vit_processor,
    "convnext": _convnext_processor,
    "segformer": _segformer_processor,
    "detr": _detr_processor,
    "clip": _clip_processor,
    "owlvit": _owlvit_processor,
    "wav2vec2": _wav2vec2_extractor,
    "wav2vec2-ctc": _wav2vec2_ctc_processor,
    "whisper": _whisper_processor,
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
