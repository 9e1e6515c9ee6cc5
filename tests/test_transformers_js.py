"""The converted folders load in the real transformers.js (node), under every dtype name it has for them.

``make node-deps`` installs the pinned @huggingface/transformers from tests/js/package-lock.json
(``npm ci --ignore-scripts``: onnxruntime-node's npm tarball carries its CPU binaries; its
postinstall would only download optional GPU ones). tests/js/run.mjs runs the cases and
prints what transformers.js computed; these tests compare it with PyTorch and, to prove
which file each dtype loaded, with ONNX Runtime in Python on the file it should have picked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from zoo_convert.pipeline import convert_one
from zoo_convert.records import JS_DTYPES, JS_SUFFIXES, VARIANTS, ConversionResult, ManifestEntry, Settings

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]  # node + transformers.js

JS_DIR = Path(__file__).parent / "js"
TEXTS = ("the quick brown fox [MASK] over the lazy dog.", "models run in the browser.")
PROMPT = "the quick brown fox"
NEW_TOKENS = 8


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the transformers.js checks need it (`make node-deps` installs it)")
    if not (JS_DIR / "node_modules" / "@huggingface" / "transformers").is_dir():
        pytest.fail("transformers.js is not installed in tests/js/node_modules: run `make node-deps`")
    return node


@pytest.fixture(scope="module")
def converted(zoo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, ConversionResult]:
    """The zoo bert in every variant and gpt2 in fp32 and q4, as the pipeline writes them."""
    settings = Settings(out_dir=str(tmp_path_factory.mktemp("js-onnx")), benchmark=False)
    jobs = {"bert": ("fill-mask", VARIANTS), "gpt2": ("text-generation-with-past", ("fp32", "q4"))}
    results = {}
    for name, (task, variants) in jobs.items():
        results[name] = convert_one(ManifestEntry(source=str(zoo_dir / name), task=task, variants=variants), settings)
        assert results[name].passed and not results[name].partial, results[name].message
    return results


@pytest.fixture(scope="module")
def js(converted: dict[str, ConversionResult], tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Any]:
    """transformers.js's answers per (model, dtype): bert's logits under every dtype, gpt2's greedy tokens."""
    node = _node()
    root = tmp_path_factory.mktemp("js-models")
    for name, result in converted.items():
        os.symlink(result.artifacts_dir, root / name)
    cases: list[dict[str, Any]] = [
        {"kind": "logits", "model": "bert", "dtype": dtype, "texts": list(TEXTS)}
        for variant in VARIANTS
        for dtype in JS_DTYPES[variant]
    ]
    cases += [{"kind": "generate", "model": "gpt2", "dtype": d, "prompt": PROMPT, "max_new_tokens": NEW_TOKENS}
              for d in ("fp32", "q4")]
    job = root / "job.json"
    job.write_text(json.dumps({"root": f"{root}/", "cases": cases}))
    done = subprocess.run([node, str(JS_DIR / "run.mjs"), str(job)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return {(r["model"], r["dtype"]): r for r in json.loads(done.stdout)}


def _variant(dtype: str) -> str:
    return next(v for v, dtypes in JS_DTYPES.items() if dtype in dtypes)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("dtype", [d for v in VARIANTS for d in JS_DTYPES[v]])
def test_bert_logits_under_every_dtype(dtype: str, js: dict, converted: dict[str, ConversionResult], zoo_dir: Path) -> None:
    import onnxruntime as ort
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    answer = js[("bert", dtype)]
    assert "error" not in answer, answer["error"]
    onnx_dir = Path(converted["bert"].artifacts_dir, "onnx")
    expected_file = onnx_dir / f"model{JS_SUFFIXES[dtype]}.onnx"
    tokenizer = AutoTokenizer.from_pretrained(zoo_dir / "bert")
    torch_model = AutoModelForMaskedLM.from_pretrained(zoo_dir / "bert").eval()
    tolerance = Settings().tolerances[_variant(dtype)]
    sessions = {p: ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
                for p in (expected_file, onnx_dir / "model.onnx")}
    for text, row in zip(TEXTS, answer["rows"], strict=True):
        inputs = tokenizer(text, return_tensors="np")
        assert row["ids"] == inputs["input_ids"][0].tolist()  # the same tokens as the Python tokenizer
        got = np.asarray(row["values"], dtype=np.float32).reshape(row["dims"])
        with torch.no_grad():
            want = torch_model(**{k: torch.from_numpy(v) for k, v in inputs.items()}).logits.numpy()
        assert _cosine(got, want) >= tolerance.min_cosine and np.abs(got - want).max() <= tolerance.max_abs
        # The file it loaded: what ONNX Runtime computes on the expected file, not on another variant's.
        same, fp32 = (sessions[p].run(None, dict(inputs))[0] for p in (expected_file, onnx_dir / "model.onnx"))
        assert np.abs(got - same).max() <= 1e-4
        if dtype != "fp32":
            assert np.abs(got - fp32).max() > 10 * np.abs(got - same).max()


@pytest.mark.parametrize("dtype", ["fp32", "q4"])
def test_gpt2_greedy_tokens(dtype: str, js: dict, converted: dict[str, ConversionResult], zoo_dir: Path) -> None:
    """fp32 decodes exactly as PyTorch; q4 exactly as optimum's ORTModelForCausalLM on model_q4.onnx."""
    import torch
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    answer = js[("gpt2", dtype)]
    assert "error" not in answer, answer["error"]
    tokenizer = AutoTokenizer.from_pretrained(zoo_dir / "gpt2")
    inputs = tokenizer(PROMPT, return_tensors="pt")
    greedy = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    if dtype == "fp32":
        model = AutoModelForCausalLM.from_pretrained(zoo_dir / "gpt2").eval()
    else:
        model = ORTModelForCausalLM.from_pretrained(converted["gpt2"].artifacts_dir, subfolder="onnx",
                                                    file_name=f"model{JS_SUFFIXES[dtype]}.onnx")
    with torch.no_grad():
        want = model.generate(**inputs, **greedy)[0].tolist()
    assert answer["ids"] == want
    assert len(want) == inputs["input_ids"].shape[1] + NEW_TOKENS
