"""diffusers pipelines: one job per pipeline, its components exported as optimum does, loaded back by optimum's ORT pipeline."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hubserver import HubServer
from zoo_convert import zoo
from zoo_convert.exporters import diffusion
from zoo_convert.errors import FailureKind, UnsafeCheckpointError
from zoo_convert.pipeline import convert_one
from zoo_convert.records import ConversionResult, ManifestEntry, Settings
from zoo_convert.stages.fetch import fetch

NAME = "stable-diffusion"
COMPONENTS = ("text_encoder", "unet", "vae_encoder", "vae_decoder")
PROMPT = "a painting of a river at night"
STEPS = 3


@pytest.fixture(scope="module")
def sd_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The zoo's tiny Stable Diffusion pipeline alone (the whole zoo is not needed here)."""
    out = tmp_path_factory.mktemp("sd-zoo")
    zoo.build(out, [NAME])
    return out / NAME


@pytest.fixture(scope="module")
def converted(sd_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> ConversionResult:
    settings = Settings(out_dir=str(tmp_path_factory.mktemp("sd-onnx")), benchmark=False)
    return convert_one(ManifestEntry(source=str(sd_dir)), settings)


@pytest.mark.slow  # a real export of four graphs and their variants: about 25 s of CPU
def test_pipeline_folder_is_one_job_of_every_component(converted: ConversionResult) -> None:
    assert (converted.status, converted.failure_kind) == ("passed", None), converted.message
    assert (converted.library, converted.task, converted.model_type) == ("diffusers", "text-to-image", "StableDiffusionPipeline")
    assert {v.variant: v.status for v in converted.variants} == {"fp32": "passed", "fp16": "passed", "int8": "passed"}
    fp32 = converted.variant("fp32")
    assert fp32 is not None and fp32.max_abs is not None and fp32.max_abs <= 1e-4
    assert fp32.file == "text_encoder/model.onnx"
    # every component checked against its own PyTorch forward, at every verify shape
    checked = {c.output.split("/")[0] for c in fp32.outputs}
    assert checked == set(COMPONENTS)
    outputs = {c.output for c in fp32.outputs}
    assert {"unet/out_sample", "vae_encoder/latent_parameters", "vae_decoder/sample"} <= outputs
    assert {c.shape.split("/")[0] for c in fp32.outputs if c.output == "unet/out_sample"} == {"1x7", "3x19"}
    # each component is optimized as its own model type: the text encoder with the transformers optimizer's clip fuser
    text = fp32.optimizer["components"]["text_encoder"]
    assert (text["method"], text["optimizer_model_type"]) == ("transformers_optimizer", "clip"), text
    assert fp32.optimizer["components"]["unet"]["model_type"] == "unet-2d-condition"
    # the unet and vae have no CPU fuser: ONNX Runtime's offline optimization, checked like the rest
    assert {c: fp32.optimizer["components"][c]["method"] for c in ("unet", "vae_encoder", "vae_decoder")} == dict.fromkeys(
        ("unet", "vae_encoder", "vae_decoder"), "ort_offline"
    )
    export = next(s for s in converted.stages if s.stage == "export")
    assert export.details["components"] == list(COMPONENTS)


@pytest.mark.slow  # a real export of four graphs and their variants: about 25 s of CPU
def test_artifacts_are_in_the_layout_optimum_loads(converted: ConversionResult, sd_dir: Path) -> None:
    art = Path(converted.artifacts_dir or "")
    for comp in COMPONENTS:
        assert {"model.onnx", "model_fp16.onnx", "model_quantized.onnx", "config.json"} <= {p.name for p in (art / comp).iterdir()}
        assert not list((art / comp).glob("*_data")), comp  # tiny: weights inside each graph
    for copied in ("model_index.json", "scheduler/scheduler_config.json", "tokenizer/tokenizer.json", "feature_extractor/preprocessor_config.json"):
        assert (art / copied).read_bytes() == (sd_dir / copied).read_bytes(), copied
    assert not (art / "onnx").exists() and not (art / "vae").exists()
    assert json.loads((art / "unet" / "config.json").read_text())["cross_attention_dim"] == 32


def _images(pipe: object, latents: object) -> np.ndarray:
    out = pipe(PROMPT, num_inference_steps=STEPS, guidance_scale=7.5, latents=latents, output_type="np")  # type: ignore[operator]
    return np.asarray(out.images)


@pytest.mark.slow  # a real export of four graphs and their variants: about 25 s of CPU
def test_ort_pipeline_draws_the_diffusers_pipelines_image(converted: ConversionResult, sd_dir: Path) -> None:
    """optimum's ORTStableDiffusionPipeline on the artifacts, against diffusers on the checkpoint: same latents, same image."""
    import torch
    from diffusers import StableDiffusionPipeline
    from onnxruntime import InferenceSession
    from optimum.onnxruntime import ORTStableDiffusionPipeline

    art = Path(converted.artifacts_dir or "")
    reference = StableDiffusionPipeline.from_pretrained(sd_dir, torch_dtype=torch.float32)
    latents = torch.randn((1, 4, 8, 8), generator=torch.Generator().manual_seed(0))
    want = _images(reference, latents)
    got = _images(ORTStableDiffusionPipeline.from_pretrained(art), latents)
    assert want.shape == got.shape == (1, 16, 16, 3)
    assert want.std() > 0.05  # an image, not a flat field every graph would match
    assert np.abs(want - got).max() < 1e-4
    # the fp16 UNet, loaded as a user would pick a variant, draws the same picture to the eye
    fp16_unet = InferenceSession(str(art / "unet" / "model_fp16.onnx"), providers=["CPUExecutionProvider"])
    half = _images(ORTStableDiffusionPipeline.from_pretrained(art, unet_session=fp16_unet), latents)
    assert np.abs(want - half).max() < 2e-2


def test_zoo_pipeline_weights_are_not_a_fresh_init(sd_dir: Path) -> None:
    """Seeded noise on every weight: a loader that skipped the weights would not reproduce them."""
    import torch
    from diffusers import UNet2DConditionModel

    loaded = UNet2DConditionModel.from_pretrained(sd_dir / "unet")
    torch.manual_seed(0)
    fresh = UNet2DConditionModel(**next(m for m in zoo.ZOO if m.name == NAME).config["unet"])
    for (name, a), b in zip(loaded.state_dict().items(), fresh.state_dict().values()):
        assert not torch.equal(a, b), name


def _copy(sd_dir: Path, dest: Path) -> Path:
    shutil.copytree(sd_dir, dest)
    return dest


def test_a_component_from_outside_diffusers_needs_remote_code(sd_dir: Path, tmp_path: Path) -> None:
    folder = _copy(sd_dir, tmp_path / "custom")
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, "unet": ["my_unet", "MyUNet"]}))
    with pytest.raises(UnsafeCheckpointError, match=r"unet \(my_unet.MyUNet\).*allow_remote_code"):
        fetch(ManifestEntry(source=str(folder)), Settings(out_dir=str(tmp_path / "out")))


def test_pickle_only_component_is_refused_and_a_missing_one_named(sd_dir: Path, tmp_path: Path) -> None:
    folder = _copy(sd_dir, tmp_path / "pickled")
    weights = folder / "vae" / "diffusion_pytorch_model.safetensors"
    weights.rename(weights.with_suffix(".bin"))
    settings = Settings(out_dir=str(tmp_path / "out"))
    with pytest.raises(UnsafeCheckpointError, match=r"vae/ has only pickle weights"):
        fetch(ManifestEntry(source=str(folder)), settings)
    shutil.rmtree(folder / "vae")
    result = convert_one(ManifestEntry(source=str(folder)), settings)
    assert (result.failure_kind, result.stage) == (FailureKind.FETCH_ERROR.value, "fetch")
    assert "lists vae but the pipeline has no vae/ folder" in (result.message or "")


def test_the_torch_exporter_says_a_pipeline_is_optimums(sd_dir: Path, tmp_path: Path) -> None:
    result = convert_one(ManifestEntry(source=str(sd_dir), exporter="torch"), Settings(out_dir=str(tmp_path)))
    assert (result.failure_kind, result.stage, result.library) == (FailureKind.EXPORT_UNSUPPORTED.value, "export", "diffusers")
    assert "use exporter optimum" in (result.message or "")


def test_exporter_auto_takes_optimum_for_a_pipeline(sd_dir: Path, tmp_path: Path) -> None:
    """optimum has a config for every component of a pipeline: auto exports it as optimum does; verify feeds
    the text encoder real text through the pipeline's tokenizer/ (there is none at the root)."""
    from transformers import AutoTokenizer

    from zoo_convert.verify.runtime import SENTENCES, cases
    from zoo_convert.stages.export import export

    entry = ManifestEntry(source=str(sd_dir), exporter="auto")
    settings = Settings(out_dir=str(tmp_path))
    exported = export(fetch(entry, settings), entry, settings, tmp_path / "out")
    assert exported.details["exporter"] == "optimum" and len(exported.components) >= 3
    text = next(c for c in exported.components if c.name == "text_encoder")
    case = next(iter(cases(exported, text, 1, 7, settings, audio_samples=16000).values()))
    tokenizer = AutoTokenizer.from_pretrained(sd_dir / "tokenizer")
    assert case.feed["input_ids"].tolist() == [tokenizer(SENTENCES[0])["input_ids"][:7]]


def test_a_text_encoder_gets_the_tokenizer_its_pipeline_loads(sd_dir: Path, tmp_path: Path) -> None:
    """model_index.json names the tokenizer's class: a folder without tokenizer_config.json loads in the pipeline
    (CLIPTokenizerFast from tokenizer.json) but not in AutoTokenizer; verify still feeds the encoder real text."""
    import shutil

    from transformers import CLIPTokenizerFast

    from zoo_convert.verify.runtime import SENTENCES, cases
    from zoo_convert.stages.export import export

    pipeline = tmp_path / "sd"
    shutil.copytree(sd_dir, pipeline)
    (pipeline / "tokenizer" / "tokenizer_config.json").unlink()
    entry = ManifestEntry(source=str(pipeline))
    settings = Settings(out_dir=str(tmp_path))
    exported = export(fetch(entry, settings), entry, settings, tmp_path / "out")
    text = next(c for c in exported.components if c.name == "text_encoder")
    case = next(iter(cases(exported, text, 1, 7, settings, audio_samples=16000).values()))
    tokenizer = CLIPTokenizerFast.from_pretrained(pipeline / "tokenizer")
    assert case.feed["input_ids"].tolist() == [tokenizer(SENTENCES[0])["input_ids"][:7]]


def test_hub_files_take_each_component_and_leave_variants_and_single_files() -> None:
    files = (
        "model_index.json", "v1-5-pruned.ckpt", "v1-5-pruned-emaonly.safetensors", "README.md",
        "unet/config.json", "unet/diffusion_pytorch_model.safetensors", "unet/diffusion_pytorch_model.fp16.safetensors",
        "unet/diffusion_pytorch_model.non_ema.bin", "vae/config.json", "vae/diffusion_pytorch_model.bin",
        "text_encoder/model.safetensors", "tokenizer/vocab.json", "tokenizer/merges.txt", "onnx/unet/model.onnx",
    )  # fmt: skip
    assert diffusion.hub_files(files, allow_pickle=False) == [
        "model_index.json", "text_encoder/model.safetensors", "tokenizer/merges.txt", "tokenizer/vocab.json",
        "unet/config.json", "unet/diffusion_pytorch_model.safetensors", "vae/config.json",
    ]  # fmt: skip
    assert "vae/diffusion_pytorch_model.bin" in diffusion.hub_files(files, allow_pickle=True)


@pytest.fixture(scope="module")
def hub(sd_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HubServer, str]]:
    """The pipeline on a local Hub, with what real SD repos also hold: a single-file checkpoint and fp16 weights."""
    folder = tmp_path_factory.mktemp("sd-repo")
    shutil.copytree(sd_dir, folder, dirs_exist_ok=True)
    (folder / "sd-pruned.safetensors").write_bytes(b"\0" * 64)
    (folder / "unet" / "diffusion_pytorch_model.fp16.safetensors").write_bytes(b"\0" * 64)
    with HubServer() as server:
        yield server, server.seed_repo("zoo/tiny-sd", folder)


def test_hub_pipeline_is_fetched_component_by_component(hub: tuple[HubServer, str], tmp_path: Path) -> None:
    server, sha = hub
    settings = Settings(out_dir=str(tmp_path / "out"), hf_endpoint=server.url, hf_cache=str(tmp_path / "cache"))
    ckpt = fetch(ManifestEntry(source="zoo/tiny-sd"), settings)
    assert (ckpt.library, ckpt.resolved_revision, ckpt.task) == ("diffusers", sha, "text-to-image")
    got = {p.relative_to(ckpt.path).as_posix() for p in ckpt.path.rglob("*") if p.is_file()}
    assert {"model_index.json", "unet/diffusion_pytorch_model.safetensors", "tokenizer/tokenizer.json"} <= got
    assert not {"sd-pruned.safetensors", "unet/diffusion_pytorch_model.fp16.safetensors"} & got


def _tiny_sdxl(folder: Path) -> None:
    """An SDXL pipeline: two text encoders (the second with its projection) and a UNet conditioned on text_time."""
    import torch
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    from zoo_convert.zoo.tokenizers import clip_bpe, make_tokenizer

    spec = next(m for m in zoo.ZOO if m.name == NAME).config
    tok = make_tokenizer(clip_bpe())
    tok.model_max_length = 16
    ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    text = CLIPTextConfig(**spec["text_encoder"], vocab_size=len(tok), **ids)
    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        **{**spec["unet"], "cross_attention_dim": 64},  # both encoders' hidden states, concatenated
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=32 + 6 * 8,  # pooled text embeds + 6 time ids
    )
    encoders = (CLIPTextModel(text), CLIPTextModelWithProjection(text))
    with torch.no_grad():
        for module in (unet, *encoders):
            for p in module.parameters():
                p.add_(0.02 * torch.randn_like(p))
    StableDiffusionXLPipeline(
        vae=AutoencoderKL(**spec["vae"]),
        text_encoder=encoders[0],
        text_encoder_2=encoders[1],
        tokenizer=tok,
        tokenizer_2=tok,
        unet=unet,
        scheduler=EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1),
    ).save_pretrained(folder, safe_serialization=True)


@pytest.mark.slow  # builds and exports five graphs: about 20 s of CPU
def test_sdxl_pipeline_with_two_text_encoders(tmp_path: Path) -> None:
    import torch
    from diffusers import StableDiffusionXLPipeline
    from optimum.onnxruntime import ORTStableDiffusionXLPipeline

    _tiny_sdxl(tmp_path / "sdxl")
    result = convert_one(
        ManifestEntry(source=str(tmp_path / "sdxl"), variants=("fp32",)), Settings(out_dir=str(tmp_path / "out"), benchmark=False)
    )
    assert (result.status, result.model_type, result.task) == ("passed", "StableDiffusionXLPipeline", "text-to-image"), result.message
    fp32 = result.variant("fp32")
    assert fp32 is not None
    assert {c.output.split("/")[0] for c in fp32.outputs} == {"text_encoder", "text_encoder_2", *COMPONENTS[1:]}
    assert {"text_encoder_2/text_embeds", "unet/out_sample"} <= {c.output for c in fp32.outputs}
    latents = torch.randn((1, 4, 8, 8), generator=torch.Generator().manual_seed(0))
    kw = dict(num_inference_steps=STEPS, guidance_scale=5.0, latents=latents, height=16, width=16, output_type="np")
    want = StableDiffusionXLPipeline.from_pretrained(tmp_path / "sdxl", torch_dtype=torch.float32)(PROMPT, **kw).images
    got = ORTStableDiffusionXLPipeline.from_pretrained(result.artifacts_dir)(PROMPT, **kw).images
    assert np.asarray(want).std() > 0.05 and np.abs(np.asarray(want) - np.asarray(got)).max() < 1e-4


@pytest.mark.slow  # a real export of four graphs, fp32 alone: about 20 s of CPU
def test_ort_cpu_target_re_runs_the_saved_reference(sd_dir: Path, tmp_path: Path) -> None:
    """The saved reference is what verify fed ONNX Runtime: the UNet's scalar timestep stays a scalar, so ort-cpu passes too."""
    result = convert_one(
        ManifestEntry(source=str(sd_dir), variants=("fp32",)),
        Settings(out_dir=str(tmp_path), benchmark=False, targets=("ort-cpu",)),
    )
    assert result.status == "passed", result.message
    rows = [(t.target, t.variant, t.status, t.message) for t in result.targets]
    assert rows and all(status == "passed" for _, _, status, _ in rows), rows
    from zoo_convert.targets import reference

    saved = reference.load(Path(result.artifacts_dir or ""))
    assert {c.feed["timestep"].shape for c in saved.cases if c.component == "unet"} == {()}
