"""The verify and benchmark stages: ONNX Runtime against PyTorch on real exports."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from zoo_convert import onnx_graph, zoo
from zoo_convert.errors import LONG_INPUTS_ONLY, NumericsMismatchError, VerifyError
from zoo_convert.records import ManifestEntry, Settings, Tolerance
from zoo_convert.verify.runtime import SENTENCES, Branch, cases, feed_for
from zoo_convert.verify.shapes import AUDIO_SAMPLES_PER_STEP
from zoo_convert.stages import Artifact, ExportedModel
from zoo_convert.stages.benchmark import bench_cases, benchmark
from zoo_convert.stages.export import export
from zoo_convert.stages.verify import inconclusive, verify

pytestmark = pytest.mark.timeout(300)

SETTINGS = Settings()
FAST_BENCH = Settings(bench_warmup=1, bench_runs=5)


def fp32(ex: ExportedModel) -> Artifact:
    """The exported graphs as the fp32 artifact."""
    return Artifact("fp32", {c.name: c.path for c in ex.components})


def _copies(ex: ExportedModel, folder: Path) -> dict[str, Path]:
    """Every component's graph copied into ``folder``, with the weights the export keeps beside it."""
    copies = {}
    for comp in ex.components:
        copies[comp.name] = Path(shutil.copy(comp.path, folder / comp.path.name))
        if onnx_graph.data_path(comp.path).exists():
            shutil.copy(onnx_graph.data_path(comp.path), folder / onnx_graph.data_path(comp.path).name)
    return copies


# The short shapes, and the long one: batch 1 at 128 tokens (gpt2: 64 new over a 64-token past, its
# 128 positions; t5: past its 128-token relative-position buckets), 10 s of raw audio (samples);
# images have no length to grow.
SHAPES = {
    "bert": {"1x7", "3x19", "1x128"},
    "gpt2": {"1x7", "3x19", "1x64"},
    "t5": {"1x7", "3x19", "1x129"},
    "vit": {"1x7", "3x19"},
    "wav2vec2": {"1x7000", "3x19000", "1x160000"},
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_fp32_matches_pytorch_at_every_verify_shape(zoo_export, name: str) -> None:
    ex = zoo_export(name)
    checks = verify(ex, fp32(ex), SETTINGS)
    assert all(c.passed for c in checks)
    assert max(c.max_abs for c in checks) <= 1e-4
    assert min(c.cosine for c in checks) >= 0.9999
    assert all(c.nan == 0 and c.inf == 0 for c in checks)
    # The generation steps of a decoder (``1x24/step05``) are tests/test_generation.py's.
    shapes = {c.shape.split("/")[0] for c in checks if "/step" not in c.shape}
    assert shapes == SHAPES[name]
    short = {c.shape.split("/")[0] for c in verify(ex, fp32(ex), Settings(verify_long=False)) if "/step" not in c.shape}
    assert short == SHAPES[name] - {"1x128", "1x64", "1x129", "1x160000"}


def test_audio_length_varies_with_the_verify_shape(zoo_export) -> None:
    ex = zoo_export("wav2vec2")
    lengths = {
        cases(ex, ex.components[0], b, s, SETTINGS, audio_samples=s * AUDIO_SAMPLES_PER_STEP)[Branch.WHOLE]
        .feed["input_values"]
        .shape
        for b, s in SETTINGS.verify_shapes
    }
    assert lengths == {(1, 7000), (3, 19000)}


def test_decoder_checks_the_past_key_values(zoo_export) -> None:
    ex = zoo_export("gpt2")
    outputs = {c.output for c in verify(ex, fp32(ex), SETTINGS)}
    assert {"logits", "present.0.key", "present.0.value"} <= outputs
    case = cases(ex, ex.components[0], 3, 19, SETTINGS, audio_samples=0)[Branch.WHOLE]
    assert case.feed["past_key_values.0.key"].shape[2] == 19, "verify must run with a populated cache"


def test_merged_decoder_checks_both_branches(zoo_export) -> None:
    ex = zoo_export("t5")
    checks = verify(ex, fp32(ex), SETTINGS)
    decoder_shapes = {c.shape for c in checks if c.output.startswith("decoder_model_merged/") and "/step" not in c.shape}
    assert decoder_shapes == {f"{s}/{b}" for s in ("1x7", "3x19", "1x129") for b in ("no-cache", "cache")}
    assert any(c.output == "encoder_model/last_hidden_state" for c in checks)


def test_text_inputs_are_real_tokens(zoo_export) -> None:
    from transformers import AutoTokenizer

    ex = zoo_export("bert")
    tokenizer = AutoTokenizer.from_pretrained(str(ex.checkpoint.path))
    ids = cases(ex, ex.components[0], 1, 7, SETTINGS, audio_samples=0)[Branch.WHOLE].feed["input_ids"]
    assert ids[0].tolist() == tokenizer(SENTENCES[0])["input_ids"][:7]


def test_perturbed_graph_fails_with_numbers(zoo_export, tmp_path: Path) -> None:
    ex = zoo_export("bert")
    model = onnx.load(str(ex.components[0].path))
    # Nudge the largest weight matrix: a plausible conversion bug, not a crash.
    init = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    noise = np.random.default_rng(0).normal(0.0, 0.05, tuple(init.dims)).astype(np.float32)
    weights = numpy_helper.to_array(init) + noise
    init.CopyFrom(numpy_helper.from_array(weights, init.name))
    bad = tmp_path / "model.onnx"
    onnx.save(model, str(bad))

    with pytest.raises(NumericsMismatchError) as raised:
        verify(ex, Artifact("fp32", {"model": bad}), SETTINGS)
    mismatch = raised.value
    # The worst is the check whose element went furthest past its elementwise bound.
    worst = max(mismatch.checks, key=lambda c: c.bound_used)
    assert mismatch.worst == worst and worst.bound_used > 1 and worst.max_abs > 1e-4 and not worst.passed
    assert worst.output == "last_hidden_state" and worst.mean_abs > 0 and worst.max_rel > 0
    assert mismatch.tolerance == SETTINGS.tolerances["fp32"]
    assert "last_hidden_state" in mismatch.message and "tolerance 0.0001" in mismatch.message


def test_tolerance_decides(zoo_export) -> None:
    ex = zoo_export("vit")
    strict = Settings(tolerances={"fp32": Tolerance(max_abs=0.0, min_cosine=1.0 + 1e-9)})
    with pytest.raises(NumericsMismatchError) as raised:
        verify(ex, fp32(ex), strict)
    assert raised.value.worst.output == "logits" and "min 1" in raised.value.message
    assert raised.value.checks and all(not c.passed for c in raised.value.checks)


def test_unloadable_graph_is_verify_error(zoo_export, tmp_path: Path) -> None:
    ex = zoo_export("vit")
    garbage = tmp_path / "model.onnx"
    garbage.write_bytes(b"not an onnx graph")
    with pytest.raises(VerifyError, match="cannot load"):
        verify(ex, Artifact("fp32", {"model": garbage}), SETTINGS)
    with pytest.raises(VerifyError, match="no graph for component"):
        verify(ex, Artifact("fp32", {}), SETTINGS)


def test_pytorch_forward_is_memoized_across_variants(zoo_export, tmp_path: Path) -> None:
    ex = zoo_export("t5")
    verify(ex, fp32(ex), SETTINGS)
    before = {k: [id(c) for c in v.values()] for k, v in ex.cache.cases.items()}
    assert all(c.passed for c in verify(ex, Artifact("fp16", _copies(ex, tmp_path)), SETTINGS))
    after = {k: [id(c) for c in v.values()] for k, v in ex.cache.cases.items()}
    assert after == before


@pytest.mark.parametrize("name", ["bert", "t5"])
def test_benchmark_times_ort_and_torch_with_their_conditions(zoo_export, name: str) -> None:
    ex = zoo_export(name)
    lat = benchmark(ex, [fp32(ex)], FAST_BENCH)["fp32"]
    assert lat.ort is not None and lat.torch is not None and lat.note is None
    assert 0 < lat.ort.p50_ms <= lat.ort.p90_ms and 0 < lat.torch.p50_ms <= lat.torch.p90_ms
    assert lat.speedup is not None and lat.speedup > 0
    # each side timed in a block of its own: at least bench_runs calls (and MIN_TIMED_S of them) per side
    assert lat.ort.runs >= FAST_BENCH.bench_runs and lat.torch.runs >= FAST_BENCH.bench_runs
    assert lat.ort.spread >= 0 and lat.torch.spread >= 0
    assert lat.threads == FAST_BENCH.threads and lat.shape == "1x128" and lat.cpu and lat.load >= 0


def test_pytorch_is_timed_once_for_every_variant_of_the_job(zoo_export, tmp_path: Path, monkeypatch) -> None:
    import zoo_convert.stages.benchmark as bench

    ex = zoo_export("bert")
    copies = _copies(ex, tmp_path)
    bench_cases(ex, FAST_BENCH)  # the inputs and their reference, computed before the timing (as the pipeline does)
    calls: list[int] = []
    blocks: list[int] = []  # per timed block: the PyTorch calls it made
    real_block = bench._block

    def counted(call, settings):  # type: ignore[no-untyped-def]
        before = len(calls)
        try:
            return real_block(call, settings)
        finally:
            blocks.append(len(calls) - before)

    monkeypatch.setattr(bench, "_block", counted)
    hook = ex.components[0].torch_module.register_forward_hook(lambda *_: calls.append(1))
    try:
        found = benchmark(ex, [fp32(ex), Artifact("int8", copies)], FAST_BENCH)
    finally:
        hook.remove()
    assert found["fp32"].torch == found["int8"].torch  # one figure, measured once beside both
    # PyTorch's blocks, then each variant's (a noisy block is timed again: up to BLOCKS per side), never interleaved
    torch_blocks = next(i for i, n in enumerate(blocks) if n == 0)
    assert 1 <= torch_blocks <= bench.BLOCKS and all(n == 0 for n in blocks[torch_blocks:]), blocks
    assert 2 <= len(blocks) - torch_blocks <= 2 * bench.BLOCKS, blocks
    assert len(calls) >= FAST_BENCH.bench_warmup + found["fp32"].torch.runs


def test_a_variant_that_cannot_be_timed_has_no_latency_and_says_why(zoo_export) -> None:
    ex = zoo_export("bert")
    found = benchmark(ex, [Artifact("int8", {}), fp32(ex)], FAST_BENCH)
    assert found["int8"].ort is None and "int8 has no graph for component 'model'" in found["int8"].note
    assert found["fp32"].ort is not None and found["fp32"].note is None, "one variant's failure leaves the others timed"


@pytest.mark.slow
def test_real_minilm_verifies_at_fp32(minilm_dir: Path, tmp_path: Path, checkpoint) -> None:
    ckpt = checkpoint(minilm_dir, "feature-extraction")
    ex = export(ckpt, ManifestEntry(source=str(minilm_dir)), SETTINGS, tmp_path)
    checks = verify(ex, fp32(ex), SETTINGS)
    assert max(c.max_abs for c in checks) <= 1e-4


def test_verify_leaves_the_global_random_generators_as_it_found_them(zoo_export) -> None:
    import dataclasses
    import random

    import torch

    from zoo_convert.verify.runtime import RuntimeCache

    fresh = dataclasses.replace(zoo_export("bert"), cache=RuntimeCache())  # inputs generated anew, not memoized
    random.seed(12345)
    np.random.seed(12345)
    torch.manual_seed(12345)
    before = (random.random(), np.random.random(), torch.rand(1).item())
    random.seed(12345)
    np.random.seed(12345)
    torch.manual_seed(12345)
    verify(fresh, fp32(fresh), SETTINGS)
    assert fresh.cache.cases, "the inputs were generated by this call"
    assert (random.random(), np.random.random(), torch.rand(1).item()) == before


def test_benchmark_times_the_cache_branch_of_a_merged_decoder(zoo_export, monkeypatch: pytest.MonkeyPatch) -> None:
    import zoo_convert.stages.benchmark as bench

    ex = zoo_export("t5")
    found = cases(ex, ex.components[1], 1, 128, SETTINGS, audio_samples=16000)
    assert list(found) == [Branch.NO_CACHE, Branch.CACHE]
    assert found[Branch.NO_CACHE].feed["use_cache_branch"].tolist() == [False]
    assert found[Branch.CACHE].feed["use_cache_branch"].tolist() == [True]
    timed = []

    def spy(session, case, comp):  # the real feed_for, noting which case each component is timed on
        timed.append((comp.name, case.branch))
        return feed_for(session, case, comp)

    monkeypatch.setattr(bench, "feed_for", spy)
    benchmark(ex, [fp32(ex)], FAST_BENCH)
    assert timed == [("encoder_model", Branch.WHOLE), ("decoder_model_merged", Branch.CACHE)]


# Text, speech, vision and the one that fails at its long shape on purpose; the whole-zoo pipeline test
# (tests/test_pipeline.py) asserts both branches at every length for every other merged decoder.
ENCODER_DECODERS = ["t5", "whisper", "vision-encoder-decoder", "bigbird-pegasus"]
assert set(ENCODER_DECODERS) <= {m.name for m in zoo.ZOO if m.family == "encoder-decoder" and m.task.endswith("-with-past")}


@pytest.mark.parametrize("name", ENCODER_DECODERS)
@pytest.mark.slow
def test_every_merged_decoder_verifies_both_branches(zoo_export, name: str) -> None:
    """vision-encoder-decoder wraps its decoder's config: verify could not feed its first step."""
    ex = zoo_export(name)
    merged = next(c for c in ex.components if c.name == "decoder_model_merged")
    try:
        checks = verify(ex, fp32(ex), SETTINGS)
    except NumericsMismatchError as exc:  # bigbird-pegasus's encoder, at the long shape only, on purpose
        assert name == "bigbird-pegasus" and exc.long_only == "1x128 (batch x tokens)", exc.message
        assert {c.output for c in exc.checks if not c.passed} == {"encoder_model/last_hidden_state"}
        checks = exc.checks
    assert all(c.passed for c in checks if c.output.startswith("decoder_model_merged/"))
    decoder_shapes = {c.shape for c in checks if c.output.startswith("decoder_model_merged/") and "/step" not in c.shape}
    lengths = {shape.split("/")[0] for shape in decoder_shapes}
    assert {"1x7", "3x19"} <= lengths  # and the long shape
    assert decoder_shapes == {f"{n}/{branch}" for n in lengths for branch in ("no-cache", "cache")}
    # The first step as ORTModel and transformers.js run it: use_cache_branch off, every past empty.
    first = cases(ex, merged, 3, 19, SETTINGS, audio_samples=19 * AUDIO_SAMPLES_PER_STEP)[Branch.NO_CACHE]
    past = {k: v for k, v in first.feed.items() if k.startswith("past_key_values")}
    assert past and all(v.shape[0] == 3 and v.shape[2] == 0 for v in past.values())
    assert first.feed["use_cache_branch"].tolist() == [False]


@pytest.fixture(scope="module")
def zero_logits(tmp_path_factory: pytest.TempPathFactory, checkpoint) -> ExportedModel:
    """A MobileViT at its default initialisation: its logits are exactly 0 for every image."""
    spec = next(m for m in zoo.ZOO if m.name == "mobilevit")
    config = {k: v for k, v in spec.config.items() if k != "initializer_range"}
    root = tmp_path_factory.mktemp("zero-logits")
    zoo.build_model(replace(spec, name="mobilevit-zero", config=config), root / "ckpt")
    ckpt = checkpoint(root / "ckpt", spec.task)
    return export(ckpt, ManifestEntry(source=str(ckpt.path)), SETTINGS, root / "out")


@pytest.mark.slow
def test_a_pass_against_an_all_zero_reference_is_inconclusive(zero_logits: ExportedModel) -> None:
    checks = verify(zero_logits, fp32(zero_logits), SETTINGS)
    assert all(c.passed and c.max_abs == 0.0 for c in checks), "every check passes: that is the trap"
    why = inconclusive(zero_logits, SETTINGS)
    assert why is not None and "logits is all zero" in why and "1x7, 3x19" in why


def test_an_informative_reference_is_conclusive(zoo_export) -> None:
    for name in ("bert", "t5"):
        ex = zoo_export(name)
        verify(ex, fp32(ex), SETTINGS)
        assert inconclusive(ex, SETTINGS) is None, name


def test_a_constant_or_non_finite_reference_is_inconclusive(zoo_export) -> None:
    import dataclasses

    from zoo_convert.verify.runtime import RuntimeCache

    ex = dataclasses.replace(zoo_export("vit"), cache=RuntimeCache())
    verify(ex, fp32(ex), SETTINGS)
    for found in ex.cache.cases.values():
        found[Branch.WHOLE].reference["logits"][...] = 0.25
    assert "logits is constant (0.25)" in inconclusive(ex, SETTINGS)
    for found in ex.cache.cases.values():
        found[Branch.WHOLE].reference["logits"][...] = np.nan
    assert "logits is non-finite" in inconclusive(ex, SETTINGS)


def test_benchmark_keeps_a_composite_decoders_past_within_its_position_table(zoo_export) -> None:
    """vision-encoder-decoder keeps gpt2's n_positions in config.decoder: a 128 + 128 past overflowed it."""
    ex = zoo_export("vision-encoder-decoder")
    merged = ex.components[1]
    assert cases(ex, merged, 1, 128, SETTINGS, audio_samples=0)[Branch.CACHE].feed["past_key_values.0.key"].shape[2] == 64
    lat = benchmark(ex, [fp32(ex)], FAST_BENCH)["fp32"]
    assert lat.ort is not None and lat.torch is not None and 0 < lat.ort.p50_ms and 0 < lat.torch.p50_ms


def test_a_filterbank_speech_model_is_fed_the_frames_its_extractor_makes(zoo_export) -> None:
    """Speech2Text-style ``input_features`` are 10 ms filterbank frames, not one per raw-audio sample."""
    ex = zoo_export("speech-to-text")
    encoder = ex.components[0]
    checks = verify(ex, fp32(ex), SETTINGS)
    assert all(c.passed for c in checks)
    # 7000 and 19000 samples (the short shapes) and 10 s (the long one), 160 samples a frame
    assert {c.shape for c in checks if c.output.startswith("encoder_model/")} == {"1x43", "3x118", "1x1000"}
    fed = [found[Branch.WHOLE].feed for key, found in ex.cache.cases.items() if key[0] == encoder.name]
    assert sorted(f["input_features"].shape for f in fed) == [(1, 43, 16), (1, 1000, 16), (3, 118, 16)]
    assert all(f["attention_mask"].shape == f["input_features"].shape[:2] for f in fed)
    # The benchmark's one second of audio is 100 frames too.
    timed = cases(ex, encoder, 1, 128, SETTINGS, audio_samples=16000)[Branch.WHOLE]
    assert timed.feed["input_features"].shape == (1, 100, 16)


def test_a_sliding_window_is_crossed_at_the_long_shape(zoo_export, checkpoint, tmp_path: Path) -> None:
    """The exporter keeps the window (the mask is built from positions); a graph without it is caught."""
    ex = zoo_export("qwen2-sliding-window")
    model = ex.components[0]
    window = model.torch_module.config.sliding_window
    assert all(c.passed for c in verify(ex, fp32(ex), SETTINGS))
    past = {s: cases(ex, model, b, s, SETTINGS, audio_samples=0)[Branch.WHOLE].feed["past_key_values.0.key"].shape[2]
            for b, s in [*SETTINGS.verify_shapes, (1, 128)]}  # fmt: skip
    assert past == {7: 7, 19: 19, 128: 64}  # the long shape, capped at half the 128 positions
    # The short shapes never reach the window (19 past + 19 new); the long shape's past alone exceeds it.
    assert 2 * past[19] < window < past[128]
    # The same weights exported without the window: right while a step sees fewer positions than it.
    plain = tmp_path / "no-window"
    shutil.copytree(ex.checkpoint.path, plain)
    config = json.loads((plain / "config.json").read_text())
    del config["layer_types"]  # rederived: full attention in every layer
    (plain / "config.json").write_text(json.dumps({**config, "use_sliding_window": False}))
    unwindowed = export(checkpoint(plain, "text-generation-with-past"), ManifestEntry(source=str(plain)), SETTINGS,
                        tmp_path / "out")  # fmt: skip
    with pytest.raises(NumericsMismatchError) as raised:
        verify(ex, fp32(unwindowed), SETTINGS)
    assert raised.value.message.startswith(f"{LONG_INPUTS_ONLY}: the short shapes passed, diverged at 1x64 (batch x tokens); ")
    assert {c.shape for c in raised.value.checks if not c.passed} == {"1x64"}


@pytest.mark.parametrize(("name", "long"), [("bigbird", "1x128"), ("phi3-longrope", "1x64")])
def test_a_length_switch_frozen_by_the_export_is_caught_at_the_long_shape(zoo_export, name: str, long: str) -> None:
    """BigBird's block-sparse attention (above 56 tokens) and longrope's long factors (past 48 positions)."""
    ex = zoo_export(name)
    with pytest.raises(NumericsMismatchError) as raised:
        verify(ex, fp32(ex), SETTINGS)
    err = raised.value
    assert err.kind.value == "verify_numerics" and err.long_only == f"{long} (batch x tokens)"
    assert err.message.startswith(f"{LONG_INPUTS_ONLY}: the short shapes passed, diverged at {long} (batch x tokens); ")
    assert {c.shape for c in err.checks if not c.passed} == {long} and err.worst.max_abs > 1e-3
    # At the short shapes alone (what verify did before the long shape) the same graph passes.
    assert all(c.passed for c in verify(ex, fp32(ex), Settings(verify_long=False)))


@pytest.mark.parametrize("name", ["bigbird", "bigbird-pegasus", "phi3-longrope"])
def test_the_zoos_long_shape_divergences_stay_failed_under_the_relative_bound(zoo_export, name: str) -> None:
    """The bound follows the output's scale (rtol), and no real divergence turns green: the zoo's three
    deliberate failures fail at their long shape under the default bound, and under ten times its rtol."""
    ex = zoo_export(name)
    default = SETTINGS.tolerances["fp32"]
    assert default.rtol > 0  # the relative part is on: this is the bound that must not let them through
    for rtol in (default.rtol, 10 * default.rtol):
        loose = Settings(tolerances={**SETTINGS.tolerances, "fp32": replace(default, rtol=rtol)})
        with pytest.raises(NumericsMismatchError) as raised:
            verify(ex, fp32(ex), loose)
        err = raised.value
        assert err.long_only is not None and err.message.startswith(LONG_INPUTS_ONLY), err.message
        assert err.worst.bound_used > 1 and f"tolerance 0.0001 + {rtol:g}·|PyTorch|" in err.message, err.message
        assert all(c.passed for c in err.checks if c.shape.split("/")[0] in ("1x7", "3x19"))


def test_the_bound_is_elementwise_as_allclose() -> None:
    """|onnx - torch| <= atol + rtol * |torch| per element: a logit of 1000 may be off by 0.5 (fp32 rounding at
    scale), a value of 0.5 may not be off by 0.002, though that is the smaller error and the cosine is 1."""
    from zoo_convert.verify.compare import compare

    tol = SETTINGS.tolerances["fp32"]
    ref = np.array([[1000.0, 0.5, -300.0]], dtype=np.float32)
    at_scale = compare("logits", "1x7", ref, ref + np.array([[0.5, 0.0, -0.2]], dtype=np.float32), tol)
    assert at_scale.passed and at_scale.max_abs == pytest.approx(0.5) and 0.6 < at_scale.bound_used < 0.7  # -0.2 at -300
    near_zero = compare("logits", "1x7", ref, ref + np.array([[0.0, 0.002, 0.0]], dtype=np.float32), tol)
    assert not near_zero.passed and near_zero.cosine > 0.99999 and near_zero.bound_used > 3
    for check, got in ((at_scale, ref + [[0.5, 0.0, -0.2]]), (near_zero, ref + [[0.0, 0.002, 0.0]])):
        assert check.passed == np.allclose(got, ref, rtol=tol.rtol, atol=tol.max_abs)
    # int8 and q4 bound no element: the cosine (and, for one value, the relative error) decides.
    assert compare("logits", "1x7", ref, ref * 1.01, SETTINGS.tolerances["int8"]).bound_used == 0.0


def test_compare_in_chunks_is_compare_over_the_whole_output() -> None:
    """compare works chunk by chunk (cache-sized): an output spanning chunks, with its one bad element, its
    non-finite values and masked positions in a later chunk, gets the figures a whole-array float64 pass gives."""
    from zoo_convert.verify.compare import CHUNK, compare

    rng = np.random.default_rng(3)
    n = 2 * CHUNK + 1001
    ref = (rng.standard_normal(n) * 4).astype(np.float32)
    got = ref + (rng.standard_normal(n) * 1e-6).astype(np.float32)
    got[CHUNK + 17] += np.float32(0.01)  # the one element over its bound, in the second chunk
    ref[2 * CHUNK + 5] = got[2 * CHUNK + 5] = np.inf  # non-finite in both: not counted against ORT
    got[2 * CHUNK + 9] = np.nan  # NaN where PyTorch was finite: a mismatch, in the last chunk
    keep = np.ones(n, dtype=bool)
    keep[CHUNK - 3 : CHUNK + 3] = False  # masked positions across a chunk boundary
    tol = SETTINGS.tolerances["fp32"]
    check = compare("logits", "1x7", ref, got, tol, keep=keep)

    r, g = ref[keep].astype(np.float64), got[keep].astype(np.float64)
    both = np.isfinite(r) & np.isfinite(g)
    diff = np.abs(r[both] - g[both])
    assert check.nan == 1 and check.inf == 1 and not check.passed
    assert check.max_abs == diff.max() and check.mean_abs == pytest.approx(diff.mean(), rel=1e-12)
    assert check.max_rel == (diff / np.maximum(np.abs(r[both]), 1e-6)).max()
    assert check.bound_used == (diff / (tol.max_abs + tol.rtol * np.abs(r[both]))).max() > 1
    cosine = r[both] @ g[both] / (np.linalg.norm(r[both]) * np.linalg.norm(g[both]))
    assert check.cosine == pytest.approx(cosine, abs=1e-12)
    got[2 * CHUNK + 9], got[CHUNK + 17] = ref[2 * CHUNK + 9], ref[CHUNK + 17]
    assert compare("logits", "1x7", ref, got, tol, keep=keep).passed  # fixed, it passes: nothing else was off


def test_longrope_traced_past_its_threshold_is_right_there_and_wrong_below(
    zoo_export, checkpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The long shape's failure is the model's switch, not our inputs: traced at 64 tokens, the graph flips."""
    from optimum.utils import DEFAULT_DUMMY_SHAPES

    ex = zoo_export("phi3-longrope")
    monkeypatch.setitem(DEFAULT_DUMMY_SHAPES, "sequence_length", 64)
    long_traced = export(ex.checkpoint, ManifestEntry(source=str(ex.checkpoint.path)), SETTINGS, tmp_path)
    with pytest.raises(NumericsMismatchError) as raised:
        verify(ex, fp32(long_traced), SETTINGS)
    failed = {c.shape for c in raised.value.checks if not c.passed}
    assert {s for s in failed if "/step" not in s} == {"1x7", "3x19"}
    assert any("/step" in s for s in failed)  # generating on a short prompt shows it too
    assert raised.value.long_only is None and not raised.value.message.startswith(LONG_INPUTS_ONLY)


def test_the_reference_is_the_model_as_loaded(zoo_export) -> None:
    """The export's 16-token trace switched BigBird to full attention for good; the reference is as loaded."""
    import torch
    from transformers import AutoModelForMaskedLM

    ex = zoo_export("bigbird")
    model = ex.components[0]
    reference = cases(ex, model, 1, 128, SETTINGS, audio_samples=0)[Branch.WHOLE]
    cases(ex, model, 1, 7, SETTINGS, audio_samples=0)  # a short forward switches it again
    assert model.torch_module.bert.attention_type == "original_full"
    model.as_loaded.restore()
    assert model.torch_module.bert.attention_type == "block_sparse"
    layer = model.torch_module.bert.encoder.layer[0]
    assert type(layer.attention.self).__name__ == "BigBirdBlockSparseAttention"
    fresh = AutoModelForMaskedLM.from_pretrained(ex.checkpoint.path).eval()
    with torch.inference_mode():
        logits = fresh(**reference.torch_inputs).logits.numpy()
    np.testing.assert_allclose(reference.reference["logits"], logits, atol=1e-6)
