"""Decoders with past through the torch (dynamo) exporter: optimum's layout, verified, generating as PyTorch does."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from zoo_convert.pipeline import convert_one
from zoo_convert.records import ManifestEntry, Settings

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

def _io(path: Path) -> tuple[list[str], list[str]]:
    graph = onnx.load(str(path), load_external_data=False).graph
    return sorted(i.name for i in graph.input), [o.name for o in graph.output]


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_torch_exporter_converts_a_decoder_with_past(name: str, zoo_dir: Path, tmp_path: Path, zoo_export) -> None:
    """Passed with its generation checked, and the graph's inputs and outputs are optimum's."""
    result = convert_one(
        ManifestEntry(source=str(zoo_dir / name), exporter="torch", variants=("fp32",)),
        Settings(out_dir=str(tmp_path), benchmark=False, bench_warmup=0, bench_runs=1),
    )
    assert result.status == "passed", (result.failure_kind, result.message)
    assert result.exporter_used == "torch" and result.task == "text-generation-with-past"
    (fp32,) = result.variants
    assert fp32.generation_steps == 16 and fp32.generation_token_match == 1.0
    ins, outs = _io(Path(result.artifacts_dir) / "onnx" / "model.onnx")
    want_ins, want_outs = _io(zoo_export(name).components[0].path)
    assert result.opset == zoo_export(name).opset == 18  # the opset optimum's export writes
    assert ins == want_ins and "past_key_values.0.key" in ins
    assert outs == want_outs and outs[:2] == ["logits", "present.0.key"]
    assert {"attention_mask", "position_ids"} <= set(ins)


def test_ortmodel_generates_pytorchs_tokens_from_the_torch_export(zoo_dir: Path, tmp_path: Path) -> None:
    """ORTModelForCausalLM loads the artifact folder and greedy-decodes what PyTorch does, starting from an empty past."""
    import torch
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    result = convert_one(
        ManifestEntry(source=str(zoo_dir / "llama"), exporter="torch", variants=("fp32",)),
        Settings(out_dir=str(tmp_path), benchmark=False, optimize=False, bench_warmup=0, bench_runs=1),
    )
    assert result.status == "passed", (result.failure_kind, result.message)
    tokenizer = AutoTokenizer.from_pretrained(zoo_dir / "llama")
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    inputs = tokenizer(["a cat sat on the mat", "hello"], return_tensors="pt", padding=True)
    greedy = dict(max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    ort = ORTModelForCausalLM.from_pretrained(result.artifacts_dir, subfolder="onnx", file_name="model.onnx")
    assert ort.use_cache
    torch_model = AutoModelForCausalLM.from_pretrained(zoo_dir / "llama").eval()
    with torch.no_grad():
        want = torch_model.generate(**inputs, **greedy)
    got = ort.generate(**inputs, **greedy)
    assert got.tolist() == want.tolist()
    assert len(set(want[0, -12:].tolist())) > 1  # not one token repeated: the cache steps are exercised


def test_feature_extraction_with_past_has_optimums_layout(zoo_dir: Path, tmp_path: Path, checkpoint) -> None:
    """feature-extraction-with-past: the cache as outputs only (no past inputs), as optimum writes it; verified."""
    from zoo_convert.stages import Artifact
    from zoo_convert.stages.export import export
    from zoo_convert.stages.verify import verify

    ckpt = checkpoint(zoo_dir / "llama", "feature-extraction-with-past")
    graphs = {
        exporter: export(ckpt, ManifestEntry(source=str(ckpt.path), exporter=exporter), Settings(), tmp_path / exporter)
        for exporter in ("torch", "optimum")
    }
    torch_io, optimum_io = (_io(ex.components[0].path) for ex in graphs.values())
    assert torch_io == optimum_io and torch_io[1][:2] == ["last_hidden_state", "present.0.key"]
    assert not any(name.startswith("past_key_values") for name in torch_io[0])
    ex = graphs["torch"]
    checks = verify(ex, Artifact("fp32", {"model": ex.components[0].path}), Settings(verify_long=False))
    assert checks and all(c.passed for c in checks)
