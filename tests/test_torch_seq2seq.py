"""Encoder-decoders through the torch (dynamo) exporter: optimum's layout, verified and generating as PyTorch does."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from zoo_convert.pipeline import convert_one
from zoo_convert.records import ManifestEntry, Settings
from zoo_convert.verify.runtime import SENTENCES


@pytest.mark.slow
@pytest.mark.parametrize("name", ["t5"])  # one family: each torch export of an encoder-decoder costs a minute or more
def test_an_encoder_decoder_exported_by_torch_generates_what_pytorch_generates(
    name: str, zoo_dir: Path, tmp_path: Path
) -> None:
    import torch
    from optimum.onnxruntime import ORTModelForSeq2SeqLM
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    folder = zoo_dir / name
    entry = ManifestEntry(source=str(folder), exporter="torch", variants=("fp32",))
    result = convert_one(entry, Settings(out_dir=str(tmp_path), benchmark=False))
    assert result.status == "passed", result.message
    assert (result.task, result.exporter_used) == ("text2text-generation-with-past", "torch")
    fp32 = result.variants[0]
    # verify's generation check ran: 16 greedy steps of ORT on its own cache, every token PyTorch's
    assert (fp32.generation_steps, fp32.generation_token_match) == (16, 1.0)
    assert result.artifacts_dir is not None
    onnx_dir = Path(result.artifacts_dir) / "onnx"
    assert sorted(p.name for p in onnx_dir.glob("*.onnx")) == ["decoder_model_merged.onnx", "encoder_model.onnx"]
    merged = onnx.load(str(onnx_dir / "decoder_model_merged.onnx"), load_external_data=False)
    inputs = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in merged.graph.input}
    outputs = [o.name for o in merged.graph.output]
    # optimum's names and axes, which ORTModel and transformers.js feed by
    assert inputs["past_key_values.1.decoder.key"][2] == "past_decoder_sequence_length"
    assert inputs["past_key_values.1.encoder.value"][2] == "encoder_sequence_length"
    assert inputs["input_ids"] == ["batch_size", "decoder_sequence_length"] and "use_cache_branch" in inputs
    assert outputs[:3] == ["logits", "present.0.decoder.key", "present.0.decoder.value"]
    assert merged.producer_name == "optimum-onnx"  # merged as optimum merges its own decoders

    ort_model = ORTModelForSeq2SeqLM.from_pretrained(result.artifacts_dir, subfolder="onnx")
    assert ort_model.decoder.is_merged and ort_model.can_use_cache
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    user = AutoModelForSeq2SeqLM.from_pretrained(str(folder)).eval()
    prompt = tokenizer(SENTENCES[:2], return_tensors="pt", padding=True)
    greedy = dict(max_new_tokens=10, min_new_tokens=10, do_sample=False, num_beams=1)
    with torch.inference_mode():
        expected = user.generate(**prompt, **greedy)
    got = ort_model.generate(**prompt, **greedy)
    assert got.tolist() == expected.tolist()
