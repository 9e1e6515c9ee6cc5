"""verify checks the model as users load it, on inputs as they send them, and says what happened (issue 22)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from zoo_convert import zoo
from zoo_convert.errors import LONG_INPUTS_ONLY, NumericsMismatchError
from zoo_convert.records import ManifestEntry, Settings, Tolerance
from zoo_convert.verify.runtime import Branch, RuntimeCache, cases
from zoo_convert.stages import Artifact, ExportedModel
from zoo_convert.stages.export import export
from zoo_convert.stages.verify import sampling, verify
from zoo_convert.verify.compare import compare, single_value_rel

pytestmark = pytest.mark.timeout(300)

SETTINGS = Settings()


def fp32(ex: ExportedModel) -> Artifact:
    return Artifact("fp32", {c.name: c.path for c in ex.components})


def fresh(ex: ExportedModel) -> ExportedModel:
    """The export with an empty runtime cache: its references computed again."""
    return dataclasses.replace(ex, cache=RuntimeCache())


# 2. The reference is the model as loaded, never as patched for export.


def test_the_reference_is_the_model_as_loaded_not_as_patched(zoo_export) -> None:
    """optimum's BigBird-Pegasus patcher switches the encoder to full attention; a user's model keeps block-sparse."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    ex = zoo_export("bigbird-pegasus")
    encoder = ex.components[0]
    case = cases(ex, encoder, 1, 128, SETTINGS, audio_samples=0)[Branch.WHOLE]
    loaded = AutoModelForSeq2SeqLM.from_pretrained(ex.checkpoint.path).eval()
    with torch.inference_mode():
        user = loaded.get_encoder()(**case.torch_inputs).last_hidden_state.numpy()
    np.testing.assert_allclose(case.reference["last_hidden_state"], user, atol=1e-6)
    # ... and the export's graph computed full attention: it is wrong there, right below 56 tokens.
    with pytest.raises(NumericsMismatchError) as raised:
        verify(ex, fp32(ex), SETTINGS)
    err = raised.value
    assert err.long_only == "1x128 (batch x tokens)" and err.message.startswith(f"{LONG_INPUTS_ONLY}: ")
    assert {(c.output, c.shape) for c in err.checks if not c.passed} == {("encoder_model/last_hidden_state", "1x128")}
    assert err.worst.max_abs > 1e-2
    # The patcher is left as optimum has it: the export still runs it, entered.
    assert type(loaded.get_encoder().layers[0].self_attn.self).__name__ == "BigBirdPegasusBlockSparseAttention"


def test_the_unpatched_reference_still_reads_caches_and_names_outputs_as_the_graph(zoo_export) -> None:
    """Tuple caches in, present.N.* out, the cross-attention cache dropped from the cache branch: as the patcher does."""
    ex = zoo_export("bart")
    merged = ex.components[1]
    found = cases(ex, merged, 3, 19, SETTINGS, audio_samples=0)
    assert {"logits", "present.0.decoder.key", "present.0.encoder.value"} <= set(found[Branch.NO_CACHE].reference)
    assert "present.0.encoder.key" not in found[Branch.CACHE].outputs
    assert found[Branch.CACHE].reference["present.1.decoder.value"].shape[2] == 19 + 1  # the past and one new token
    assert all(c.passed for c in verify(ex, fp32(ex), SETTINGS))


# 4. Inputs as users send them.


def _one_sided(mask: np.ndarray) -> bool:
    """Every row is ones with zeros at one end only: no holes."""
    for row in mask.reshape(-1, mask.shape[-1]):
        kept = np.flatnonzero(row)
        if not kept.size or kept[-1] - kept[0] + 1 != kept.size or (kept[0] != 0 and kept[-1] != row.size - 1):
            return False
    return True


@pytest.mark.parametrize("name", ["bert", "gpt2", "t5"])
def test_attention_masks_are_as_users_send_them(zoo_export, name: str) -> None:
    ex = zoo_export(name)
    for comp in ex.components:
        for batch, seq in [(1, 7), (3, 19), (1, 128)]:
            for case in cases(ex, comp, batch, seq, SETTINGS, audio_samples=0).values():
                masks = {k: v for k, v in case.feed.items() if k.endswith("attention_mask")}
                assert masks, (comp.name, case.label)
                for key, mask in masks.items():
                    if batch == 1:
                        assert mask.all(), (comp.name, case.label, key)  # one sequence: nothing padded
                    else:
                        assert _one_sided(mask), (comp.name, case.label, key, mask)
                        # the first row is whole, the others padded, none mostly padding
                        assert mask[0].all() and not mask[1:].all() and (mask.sum(-1) > mask.shape[-1] // 2).all()


def test_a_batch_is_padded_at_the_side_the_tokenizer_pads(zoo_export, tmp_path: Path, checkpoint) -> None:
    import shutil

    ex = zoo_export("gpt2")
    left = tmp_path / "left"
    shutil.copytree(ex.checkpoint.path, left)
    config = json.loads((left / "tokenizer_config.json").read_text())
    (left / "tokenizer_config.json").write_text(json.dumps({**config, "padding_side": "left"}))
    padded = {}
    for side, folder in (("right", ex.checkpoint.path), ("left", left)):
        ex_side = fresh(dataclasses.replace(ex, checkpoint=checkpoint(folder, "text-generation-with-past")))
        case = cases(ex_side, ex_side.components[0], 3, 19, SETTINGS, audio_samples=0)[Branch.WHOLE]
        padded[side] = case.feed
    right_mask, left_mask = padded["right"]["attention_mask"], padded["left"]["attention_mask"]
    assert right_mask.shape == left_mask.shape == (3, 38)  # 19 past + 19 new
    assert not right_mask[1:, -1].any() and right_mask[:, 0].all()
    assert not left_mask[1:, 0].any() and left_mask[:, -1].all()
    # Position ids follow the mask as generate() makes them: counted over the kept tokens only.
    positions = padded["left"]["position_ids"]
    np.testing.assert_array_equal(positions[0], np.arange(19, 38))
    assert positions[2, -1] == left_mask[2].sum() - 1


def test_per_token_outputs_are_compared_where_the_mask_keeps_a_token(zoo_export) -> None:
    ex = zoo_export("bert")  # feature-extraction: a hidden state per token
    case = cases(ex, ex.components[0], 3, 19, SETTINGS, audio_samples=0)[Branch.WHOLE]
    keep = case.keep["last_hidden_state"]
    assert keep.shape == case.reference["last_hidden_state"].shape
    np.testing.assert_array_equal(keep[:, :, 0], case.feed["attention_mask"] != 0)
    tol = SETTINGS.tolerances["fp32"]
    wrong_at_padding = np.where(keep, case.reference["last_hidden_state"], case.reference["last_hidden_state"] + 5.0)
    assert compare("h", case.label, case.reference["last_hidden_state"], wrong_at_padding, tol, keep=keep).passed
    assert not compare("h", case.label, case.reference["last_hidden_state"], wrong_at_padding, tol).passed
    wrong_at_a_token = case.reference["last_hidden_state"].copy()
    wrong_at_a_token[0, 0, 0] += 5.0
    assert not compare("h", case.label, case.reference["last_hidden_state"], wrong_at_a_token, tol, keep=keep).passed


def test_a_model_of_fixed_length_is_verified_at_it(zoo_export) -> None:
    """Nystromformer's landmarks average exactly segment_means_seq_len tokens: 1x7 is no input it takes."""
    ex = zoo_export("nystromformer")
    checks = verify(ex, fp32(ex), SETTINGS)
    assert {c.shape for c in checks} == {"1x32", "3x32"}
    assert all(c.passed for c in checks) and max(c.max_abs for c in checks) <= 1e-4


# An RT-DETR without preprocessor_config.json: its ONNX config sizes the dummy image from height and width.
RT_DETR = zoo.ZooModel(
    "rt-detr-bare",
    "vision",
    "object-detection",
    "rt_detr",
    dict(
        backbone_config={
            "model_type": "rt_detr_resnet",
            "embedding_size": 16,
            "hidden_sizes": [16, 32, 32],
            "depths": [1, 1, 1],
            "layer_type": "basic",
            "out_features": ["stage1", "stage2", "stage3"],
        },
        encoder_in_channels=[16, 32, 32],
        encoder_hidden_dim=32,
        encoder_ffn_dim=64,
        encoder_attention_heads=2,
        d_model=32,
        decoder_in_channels=[32, 32, 32],
        decoder_ffn_dim=64,
        decoder_attention_heads=2,
        decoder_layers=1,
        num_queries=8,
        num_denoising=0,
    ),
)


@pytest.mark.slow
def test_a_detector_without_a_processor_config_is_sized_as_its_export(tmp_path: Path, checkpoint) -> None:
    """verify crashed with KeyError 'height' (an internal error) where the export had sized the image itself."""
    from optimum.utils import DEFAULT_DUMMY_SHAPES

    zoo.build_model(RT_DETR, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt" / "preprocessor_config.json").exists()
    ckpt = checkpoint(tmp_path / "ckpt", RT_DETR.task)
    ex = export(ckpt, ManifestEntry(source=str(ckpt.path)), SETTINGS, tmp_path / "out")
    try:
        checks = verify(ex, fp32(ex), SETTINGS)
    except NumericsMismatchError as exc:  # a verdict on the numbers, whichever it is, never a crash
        checks = exc.checks
    assert {(c.output, c.shape) for c in checks} == {(o, s) for o in ("logits", "pred_boxes") for s in ("1x7", "3x19")}
    fed = {found[Branch.WHOLE].feed["pixel_values"].shape for found in ex.cache.cases.values()}
    assert fed == {(b, 3, DEFAULT_DUMMY_SHAPES["height"], DEFAULT_DUMMY_SHAPES["width"]) for b in (1, 3)}


# 5. Messages that say what happened.


def test_a_shape_mismatch_says_the_two_shapes() -> None:
    tol = Tolerance(max_abs=1e-4, min_cosine=0.9999)
    check = compare("last_hidden_state", "1x7", np.zeros((1, 7, 32)), np.zeros((1, 8, 32), dtype=np.float32), tol)
    assert not check.passed and check.mismatch == "shape 1x8x32 in ONNX Runtime, 1x7x32 in PyTorch"
    err = NumericsMismatchError(worst=check, tolerance=tol, checks=(check,))
    assert err.message == (
        "1/1 output checks failed; worst last_hidden_state at 1x7: shape 1x8x32 in ONNX Runtime, 1x7x32 in PyTorch"
    )


def test_a_single_value_is_not_judged_by_cosine_alone() -> None:
    """CLIP's logits_per_image at batch 1: the cosine of one number against another is 1 whenever their signs agree."""
    int8 = SETTINGS.tolerances["int8"]
    ref = np.array([[12.5]], dtype=np.float32)
    far = compare("logits_per_image", "1x7", ref, np.array([[3.0]], dtype=np.float32), int8)
    assert far.cosine == pytest.approx(1.0) and not far.passed
    near = compare("logits_per_image", "1x7", ref, np.array([[12.6]], dtype=np.float32), int8)
    assert near.passed
    assert single_value_rel(int8) == pytest.approx(0.203, abs=1e-3)
    # Many values: the cosine judges as before.
    many = compare("logits", "3x19", np.arange(1.0, 9.0), np.arange(1.0, 9.0) * 1.5, int8)
    assert many.passed


def _with_noise(ex: ExportedModel, folder: Path, op: str) -> ExportedModel:
    """The export with ``logits + RandomUniformLike(logits)`` (or another random op) in its graph."""
    comp = ex.components[0]
    model = onnx.load(str(comp.path))
    graph = model.graph
    out = graph.output[0].name
    for node in graph.node:
        node.output[:] = [f"{o}_clean" if o == out else o for o in node.output]
    graph.node.extend(
        [
            onnx.helper.make_node(op, [f"{out}_clean"], [f"{out}_noise"]),
            onnx.helper.make_node("Add", [f"{out}_clean", f"{out}_noise"], [out]),
        ]
    )
    path = folder / "noisy.onnx"
    onnx.save(model, str(path))
    noisy = dataclasses.replace(comp, path=path, _graph=None)
    return dataclasses.replace(ex, components=[noisy])


@pytest.mark.parametrize("op", ["RandomUniformLike", "RandomNormalLike"])
def test_a_graph_that_samples_is_inconclusive_not_a_mismatch(zoo_export, tmp_path: Path, op: str) -> None:
    ex = zoo_export("bert")
    assert sampling(ex) is None
    noisy = _with_noise(ex, tmp_path, op)
    why = sampling(noisy)
    assert why is not None and why.startswith(f"inconclusive: the model samples: noisy.onnx draws random numbers ({op})")


def test_a_pytorch_forward_that_differs_from_itself_is_inconclusive(zoo_export) -> None:
    import torch

    ex = fresh(zoo_export("bert"))
    model = ex.components[0].torch_module

    def noisy(_module: object, _inputs: object, out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {**out, "last_hidden_state": out["last_hidden_state"] + torch.rand_like(out["last_hidden_state"])}

    hook = model.register_forward_hook(noisy)
    try:
        with pytest.raises(NumericsMismatchError):  # the numbers alone say "wrong"
            verify(ex, fp32(ex), SETTINGS)
    finally:
        hook.remove()
    assert ex.cache.unrepeatable == {"model": ("last_hidden_state",)}
    why = sampling(ex)
    assert why is not None and "PyTorch's model differs from itself on the same input (last_hidden_state)" in why
    # A forward that is the same twice is not mistaken for one that samples.
    steady = fresh(zoo_export("bert"))
    verify(steady, fp32(steady), SETTINGS)
    assert steady.cache.unrepeatable == {} and sampling(steady) is None


@pytest.fixture(scope="module")
def vits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny VITS text-to-speech checkpoint: its duration predictor and flow draw noise on every call."""
    import torch
    from transformers import VitsConfig, VitsModel, VitsTokenizer

    folder = tmp_path_factory.mktemp("vits")
    chars = ["<pad>", "<unk>", " ", *"abcdefghijklmnopqrstuvwxyz.,'"]
    (folder / "vocab.json").write_text(json.dumps({c: i for i, c in enumerate(chars)}))
    VitsTokenizer(str(folder / "vocab.json"), add_blank=True, phonemize=False).save_pretrained(folder / "ckpt")
    config = VitsConfig(
        vocab_size=len(chars), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, ffn_dim=64, flow_size=16,
        spectrogram_bins=33, upsample_initial_channel=32, upsample_rates=[4, 4], upsample_kernel_sizes=[8, 8],
        resblock_kernel_sizes=[3], resblock_dilation_sizes=[[1, 3]], prior_encoder_num_flows=2,
        prior_encoder_num_wavenet_layers=2, posterior_encoder_num_wavenet_layers=2, duration_predictor_num_flows=2,
        duration_predictor_filter_channels=32, depth_separable_num_layers=2, window_size=4,
    )  # fmt: skip
    torch.manual_seed(0)
    VitsModel(config).eval().save_pretrained(folder / "ckpt")
    return folder / "ckpt"


@pytest.mark.slow
def test_a_model_that_samples_is_recorded_inconclusive_with_the_reason(vits: Path, tmp_path: Path) -> None:
    """VITS: a waveform of another length each call; its numbers prove nothing either way."""
    from zoo_convert.pipeline import convert_one
    from zoo_convert.records import INCONCLUSIVE

    settings = Settings(out_dir=str(tmp_path), benchmark=False)
    result = convert_one(ManifestEntry(source=str(vits), task="text-to-audio", variants=("fp32",)), settings)
    fp32_result = result.variant("fp32")
    assert fp32_result is not None and fp32_result.status == INCONCLUSIVE and fp32_result.failure_kind is None
    assert result.status == INCONCLUSIVE
    assert fp32_result.message.startswith("inconclusive: the model samples: model.onnx draws random numbers (")
    assert "RandomNormalLike" in fp32_result.message and "PyTorch's model differs from itself" in fp32_result.message
    assert fp32_result.outputs, "the checks are kept for the record"
