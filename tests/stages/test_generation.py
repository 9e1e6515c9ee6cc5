"""Generation, not one forward (zoo_convert/verify/generation.py): ORT's own cache over 16 steps against PyTorch generate()."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from zoo_convert import onnx_graph, zoo
from zoo_convert.job import Generation
from zoo_convert.verify import generation
from zoo_convert.errors import GenerationMismatchError, NumericsMismatchError
from zoo_convert.records import OutputCheck, Settings
from zoo_convert.stages import Artifact, ExportedModel, Verified
from zoo_convert.stages import verify as verify_stage

# Without the long shape: these tests are about the steps, and the long shape is test_verify's.
SETTINGS = Settings(verify_long=False)


@pytest.fixture(scope="module")
def with_past(zoo_dir: Path, checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], ExportedModel]:
    """``with_past(name)``: a zoo model exported with the catalogue's ``*-with-past`` task, once per module."""
    from zoo_convert.records import ManifestEntry
    from zoo_convert.stages.export import export

    root = tmp_path_factory.mktemp("with-past")
    done: dict[str, ExportedModel] = {}

    def get(name: str) -> ExportedModel:
        if name not in done:
            task = next(m.task for m in zoo.ZOO if m.name == name)
            assert task.endswith("-with-past")
            ckpt = checkpoint(zoo_dir / name, task)
            done[name] = export(ckpt, ManifestEntry(source=str(ckpt.path)), SETTINGS, root / name)
        return done[name]

    return get


def _fp32(ex: ExportedModel) -> Artifact:
    return Artifact("fp32", {c.name: c.path for c in ex.components})


def _user_generate(folder: Path, task: str, prompt: np.ndarray, encoder: dict[str, np.ndarray]) -> np.ndarray:
    """What a user gets: the checkpoint loaded fresh, greedy generate() for 16 tokens, no EOS stop."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, GenerationConfig

    cls = AutoModelForSeq2SeqLM if task.startswith("text2text") else AutoModelForCausalLM
    model = cls.from_pretrained(folder).eval()
    model.generation_config = GenerationConfig(
        do_sample=False, max_new_tokens=16, pad_token_id=0,
        decoder_start_token_id=model.generation_config.decoder_start_token_id,
    )  # fmt: skip
    kwargs = {k: torch.from_numpy(v) for k, v in encoder.items()} or {"input_ids": torch.from_numpy(prompt)}
    with torch.inference_mode():
        out = model.generate(**kwargs)
    return out[0, -16:].numpy()


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_a_decoder_is_checked_over_16_steps_of_its_own_cache(with_past, zoo_dir: Path, name: str) -> None:
    ex = with_past(name)
    artifact = _fp32(ex)
    checks = verify_stage.verify(ex, artifact, SETTINGS)
    dec = generation.decoder(ex)
    assert dec is not None and dec.name == ("model" if name == "gpt2" else "decoder_model_merged")
    gen = artifact.verified[dec.name].generation
    assert gen is not None and gen.note is None
    assert gen.steps == 16 and len(gen.checks) == 16
    ref = ex.cache.generation.reference
    # A real prompt: the first verify sentence, tokenized (gpt2's decoder prompt; t5's encoder input).
    prompt = ref.prompt if name == "gpt2" else ref.encoder_feed["input_ids"]
    assert prompt.shape[1] > 7 and len(set(prompt[0].tolist())) > 3
    assert [c.shape for c in gen.checks] == [f"1x{prompt.shape[1]}/step{i:02d}" for i in range(16)]
    assert all(c.passed and c.max_abs < 1e-4 and c.cosine > 0.9999 for c in gen.checks)
    assert set(gen.checks) <= set(checks)  # judged with the shape checks
    assert gen.token_match == 1.0 and gen.first_mismatch is None
    summary = gen.summary()
    assert summary["generation_steps"] == 16 and summary["generation_token_match"] == 1.0
    assert summary["generation_max_abs"] == max(c.max_abs for c in gen.checks) < 1e-4
    # The reference is the model a user loads and generates with.
    task = next(m.task for m in zoo.ZOO if m.name == name)
    encoder = {k: v for k, v in ref.encoder_feed.items() if k in ("input_ids", "attention_mask")}
    np.testing.assert_array_equal(ref.tokens, _user_generate(zoo_dir / name, task, ref.prompt, encoder))


def _forget_past_on_one_token_steps(src: Path, dst: Path) -> Path:
    """The decoder with its past multiplied by 0 whenever one token is fed: right on a prompt, wrong at every later step.

    The verify shapes feed several tokens over a populated past, so only generating shows it.
    """
    model = onnx.load(str(src))
    graph = model.graph
    past = [i.name for i in graph.input if i.name.startswith("past_key_values")]
    nodes = [
        helper.make_node("Shape", ["input_ids"], ["_forget_len"], start=1, end=2),
        helper.make_node("Constant", [], ["_forget_one"], value=helper.make_tensor("v", TensorProto.INT64, [1], [1])),
        helper.make_node("Equal", ["_forget_len", "_forget_one"], ["_forget_eq"]),
        helper.make_node("Not", ["_forget_eq"], ["_forget_keep"]),
        helper.make_node("Cast", ["_forget_keep"], ["_forget_mask"], to=TensorProto.FLOAT),
    ]
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name in past:
                node.input[k] = f"{name}_kept"
    nodes += [helper.make_node("Mul", [name, "_forget_mask"], [f"{name}_kept"]) for name in past]
    for node in reversed(nodes):
        graph.node.insert(0, node)
    onnx.save(model, str(dst))
    return dst


def test_a_decoder_that_forgets_its_past_on_one_token_steps_fails_generation(with_past, tmp_path: Path) -> None:
    ex = with_past("gpt2")
    broken = _forget_past_on_one_token_steps(ex.components[0].path, tmp_path / "model.onnx")
    artifact = Artifact("fp32", {"model": broken})
    with pytest.raises(NumericsMismatchError) as err:
        verify_stage.verify(ex, artifact, SETTINGS)
    checks = err.value.checks
    # One forward at each verify shape cannot tell: every shape check passes.
    shape_checks = [c for c in checks if "/step" not in c.shape]
    assert shape_checks and all(c.passed for c in shape_checks)
    steps = [c for c in checks if "/step" in c.shape]
    assert len(steps) == 16
    assert steps[0].passed  # the prompt, on an empty past, is right
    assert not any(c.passed for c in steps[1:])  # every step on the cache is not
    assert "/step" in err.value.worst.shape and "/step" in err.value.message


def _with_generation(variant: str, gen: Generation) -> Artifact:
    artifact = Artifact(variant, {})
    artifact.verified["model"] = Verified(gen.checks, 0.0, generation=gen)
    return artifact


def _steps(n: int = 16) -> tuple[OutputCheck, ...]:
    return tuple(OutputCheck("logits", f"1x9/step{i:02d}", 1e-6, 1e-6, 1e-7, 1.0) for i in range(n))


def test_fp32_greedy_tokens_must_be_pytorchs(with_past) -> None:
    ex = with_past("gpt2")
    diverged = Generation(16, _steps(), token_match=0.75, first_mismatch=12)
    with pytest.raises(GenerationMismatchError) as err:
        verify_stage.judge(ex, _with_generation("fp32", diverged), _steps(), SETTINGS)
    assert "diverged from PyTorch generate() at step 12 of 16: 75% of tokens identical" in err.value.message
    assert err.value.worst.shape == "1x9/step12"
    # The other variants record their share: information, not a failure.
    for variant in ("fp16", "int8", "q4"):
        assert verify_stage.judge(ex, _with_generation(variant, diverged), _steps(), SETTINGS) == _steps()
    # Two PyTorch candidates closer than the tolerance are a tie, not a divergence.
    tie = Generation(16, _steps(), token_match=0.75, first_mismatch=12, tie=True)
    assert verify_stage.judge(ex, _with_generation("fp32", tie), _steps(), SETTINGS) == _steps()
    assert "diverged at step 12 on a near tie" in tie.summary()["generation_note"]
    assert diverged.summary()["generation_note"] is None


def test_a_model_without_past_has_no_generation_check(zoo_export) -> None:
    ex = zoo_export("bert")
    artifact = _fp32(ex)
    checks = verify_stage.verify(ex, artifact, SETTINGS)
    assert generation.decoder(ex) is None
    assert all(v.generation is None for v in artifact.verified.values())
    assert not any("/step" in c.shape for c in checks)


def test_whisper_generates_from_its_encoded_audio(with_past) -> None:
    ex = with_past("whisper")
    artifact = _fp32(ex)
    verify_stage.verify(ex, artifact, SETTINGS)
    gen = artifact.verified["decoder_model_merged"].generation
    assert gen is not None and gen.note is None and gen.steps == 16
    assert all(c.passed for c in gen.checks) and gen.token_match == 1.0
    assert "input_features" in ex.cache.generation.reference.encoder_feed


def test_no_generation_checks_single_forwards_only(with_past) -> None:
    """``--no-generation``: the decoder is verified at its shapes, and nothing is generated."""
    ex = with_past("gpt2")
    artifact = _fp32(ex)
    checks = verify_stage.verify(ex, artifact, Settings(verify_long=False, verify_generation=False))
    assert checks and not any("/step" in c.shape for c in checks)
    assert artifact.verified["model"].generation is None


# One of each way a cache is laid out or fed: a plain decoder, bloom's fused heads, a mixture of experts with
# sinks, a sliding window, an encoder-decoder, speech, vision. The whole-zoo pipeline test
# (tests/test_pipeline.py) asserts 16 steps and PyTorch's tokens for every other zoo model with past.
WITH_PAST = ["gpt2", "bloom", "gpt-oss", "qwen2-sliding-window", "t5", "whisper", "vision-encoder-decoder"]
assert set(WITH_PAST) <= {m.name for m in zoo.ZOO if m.task.endswith("-with-past")}


@pytest.mark.slow
@pytest.mark.parametrize("name", WITH_PAST)
def test_every_zoo_model_with_past_generates_as_pytorch_does(with_past, name: str) -> None:
    """Decoders, encoder-decoders, speech and vision encoders: 16 steps on the cache, PyTorch's tokens, at fp32."""
    ex = with_past(name)
    artifact = _fp32(ex)
    verify_stage.verify(ex, artifact, SETTINGS)
    dec = generation.decoder(ex)
    assert dec is not None
    gen = artifact.verified[dec.name].generation
    assert gen is not None and gen.note is None, gen
    assert gen.steps == 16 and all(c.passed for c in gen.checks) and gen.token_match == 1.0


@pytest.mark.parametrize("name", ["whisper", "t5"])
def test_the_encoders_check_hands_its_decoder_the_prompts_encoding(with_past, name: str, tmp_path: Path) -> None:
    """optimize passes the encoder's own encoding of the prompt on to the decoder's children (``Verified.encoded`` ->
    ``RuntimeCache.encoded``), so they open the encoder no more: it must be the encoding generation makes itself
    (whisper's out of verify's batch-1 case, t5's text prompt run once more), and the decoder must generate from it."""
    from zoo_convert.verify.runtime import session_for

    ex = with_past(name)
    generation.reference(ex, SETTINGS)
    enc, dec = ex.components
    art = _fp32(ex)
    encoded = verify_stage.check(ex, art, enc, SETTINGS).encoded
    assert encoded is not None and verify_stage.check(ex, art, dec, SETTINGS).encoded is None
    prompt = ex.cache.generation.reference.encoder_feed
    want = generation.encode_prompt(session_for(ex, art, enc, SETTINGS), prompt, dec)
    assert encoded.keys() == want.keys()
    for key, value in want.items():
        np.testing.assert_array_equal(encoded[key], value)
    if name == "whisper":  # its prompt is verify's batch-1 case of the encoder: taken from that run
        assert any(np.array_equal(case.feed["input_features"], prompt["input_features"])
                   for case, _ in verify_stage.cases_of(ex, enc, SETTINGS))  # fmt: skip
    fresh = verify_stage.check(ex, art, dec, SETTINGS).generation
    try:
        ex.cache.encoded[enc.path] = encoded
        assert verify_stage.check(ex, art, dec, SETTINGS).generation == fresh
        # It is read, not recomputed: another encoding generates otherwise.
        ex.cache.encoded[enc.path] = {**encoded, "encoder_hidden_states": encoded["encoder_hidden_states"] * 0.5}
        assert verify_stage.check(ex, art, dec, SETTINGS).generation != fresh
        # Kept by the encoder's file: a check handed another encoder graph (here a copy) encodes with that one.
        for path in (enc.path, onnx_graph.data_path(enc.path)):
            shutil.copy(path, tmp_path / path.name)
        other = Artifact("fp32", {enc.name: tmp_path / enc.path.name, dec.name: dec.path})
        assert verify_stage.check(ex, other, dec, SETTINGS).generation == fresh
    finally:
        ex.cache.encoded.clear()
