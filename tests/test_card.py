"""The model card: every latency figure it shows comes with its conditions; noisy ones are left out."""

from __future__ import annotations

from pathlib import Path

from zoo_convert.publish.candidates import Candidate, VariantRow
from zoo_convert.publish.card import model_card
from zoo_convert.records import TargetResult

CPU = "Intel(R) Xeon(R) Platinum 8480+ (avx512_vnni, amx_int8)"


def _row(variant: str, ort_ms: float | None, *, noisy: bool = False, note: str | None = None) -> VariantRow:
    timed = ort_ms is not None
    return VariantRow(
        variant=variant,
        status="passed",
        file=f"onnx/model_{variant}.onnx",
        size_bytes=1_000_000,
        max_abs=1e-6,
        min_cosine=0.99999,
        ort_p50_ms=ort_ms,
        torch_p50_ms=20.0 if timed else None,
        speedup=20.0 / ort_ms if ort_ms else None,
        ort_runs=20 if timed else None,
        ort_spread=(0.42 if noisy else 0.03) if timed else None,
        torch_runs=20 if timed else None,
        torch_spread=0.04 if timed else None,
        bench_threads=1,
        bench_shape="1x128",
        bench_cpu=CPU,
        bench_load=0.5,
        bench_noisy=noisy,
        bench_note=note,
    )


def test_the_card_states_the_conditions_of_each_latency_and_leaves_noisy_ones_out() -> None:
    candidate = Candidate(
        run_id="r",
        job_key="k",
        source="org/model",
        revision=None,
        resolved_revision="abc",
        task="feature-extraction",
        model_type="bert",
        exporter="optimum",
        opset=17,
        job_status="passed",
        artifacts_dir=None,
        variants=(
            _row("fp32", 10.0),
            _row("fp16", 37.9, noisy=True),
            _row("int8", None, note="not timed: RuntimeError: no kernel"),
        ),
    )
    card = model_card(candidate, "org/model-onnx")
    table = {line.split("|")[1].strip(): line for line in card.splitlines() if line.startswith("| fp")}
    table.update({line.split("|")[1].strip(): line for line in card.splitlines() if line.startswith("| int8")})
    assert "| 10.00 ms | 20.00 ms | 2.00x |" in table["fp32"]
    assert "37.90" not in card and "0.53x" not in card, "a noisy figure is never shown"
    assert "| - | - | - |" in table["fp16"] and "| - | - | - |" in table["int8"]
    conditions = card[card.index("Latency conditions") :]
    # How the figures were taken, as the benchmark stage takes them (the sides stopped alternating call by call).
    assert conditions.startswith("Latency conditions (p50 of one forward pass; ONNX Runtime and PyTorch eager each timed in a block")
    assert f"- fp32: batch x length 1x128, 1 thread, {CPU}, other processes busy on 0.50 CPUs, ORT 20 samples, spread 3%" in conditions
    assert "- fp16: latency left out, measured under noise (" in conditions and "spread 42%" in conditions
    assert "- int8: no latency (not timed: RuntimeError: no kernel)." in conditions


def test_a_card_without_latency_has_no_conditions_section() -> None:
    candidate = Candidate(run_id="r", job_key="k", source="org/model", revision=None, resolved_revision="abc",
                          task="feature-extraction", model_type="bert", exporter="optimum", opset=17,
                          job_status="passed", artifacts_dir=None,
                          variants=(VariantRow(variant="fp32", status="passed", file="onnx/model.onnx"),))  # fmt: skip
    assert "Latency conditions" not in model_card(candidate, "org/model-onnx")


def test_a_timm_card_names_timm_and_says_how_to_preprocess(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    pretrained_cfg = {"input_size": [3, 64, 64], "interpolation": "bicubic", "crop_pct": 0.95, "crop_mode": "center",
                      "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "num_classes": 10}
    (tmp_path / "config.json").write_text(json.dumps({"architecture": "resnet18", "pretrained_cfg": pretrained_cfg}))
    candidate = Candidate(
        run_id="r", job_key="k", source="timm/resnet18.a1_in1k", revision=None, resolved_revision="abc",
        task="image-classification", model_type="resnet18", exporter="optimum", opset=18, job_status="passed",
        artifacts_dir=str(tmp_path), variants=(_row("fp32", 1.0), _row("int8", 0.5)), library="timm",
    )
    card = model_card(candidate, "org/resnet18-onnx")
    assert "library_name: timm" in card and "transformers.js" not in card
    assert "| `interpolation` | `\"bicubic\"` |" in card and "| `mean` | `[0.485, 0.456, 0.406]` |" in card
    assert "| `input_size` | `[3, 64, 64]` |" in card and "| `crop_pct` | `0.95` |" in card
    assert "timm.data.create_transform" in card and 'hf_hub_download("org/resnet18-onnx", "onnx/model_fp32.onnx")' in card
    assert "ORTModelForImageClassification" in card and "| `onnx/model_int8.onnx` | int8:" in card


def _candidate(**kw: object) -> Candidate:
    fields: dict[str, object] = dict(
        run_id="r", job_key="k", source="org/model", revision=None, resolved_revision="abc", task="feature-extraction",
        model_type="bert", exporter="optimum", opset=17, job_status="passed", artifacts_dir=None,
        variants=(VariantRow(variant="fp32", status="passed", file="onnx/model.onnx"),),
    )
    return Candidate(**{**fields, **kw})  # type: ignore[arg-type]


def test_the_card_names_the_library_each_repo_is_for(tmp_path: Path) -> None:
    from huggingface_hub import ModelCard

    def card(c: Candidate) -> ModelCard:
        return ModelCard(model_card(c, "org/model-onnx"))

    # transformers.js is claimed where its target passed for the job (the recorded row, read back by candidates)
    checked = (TargetResult("transformers.js", "fp32", "passed", version="4.3.2"),)
    plain = card(_candidate(library="transformers", targets=checked))
    assert plain.data.library_name == "transformers" and "transformers.js" in plain.data.tags
    assert "With [Transformers.js]" in plain.text
    # The sentence-transformers modules travel with the repo: it is a sentence-transformers repo.
    (tmp_path / "modules.json").write_text("[]")
    (tmp_path / "tokenizer.json").write_text("{}")  # what transformers.js's feature-extraction pipeline reads
    st = card(_candidate(library="transformers", artifacts_dir=str(tmp_path), targets=checked))
    assert st.data.library_name == "sentence-transformers" and "transformers.js" in st.data.tags
    assert "SentenceTransformer(" in st.text
    # A library transformers.js does not load: named as it is, no transformers.js tag or section.
    timm = card(_candidate(library="timm", model_type="resnet", task="image-classification"))
    assert timm.data.library_name == "timm" and "transformers.js" not in timm.data.tags
    assert "Transformers.js" not in timm.text
    # no target row (a run from before the targets), or one that did not pass: no claim
    for targets in ((), (TargetResult("transformers.js", "fp32", "failed", version="4.3.2"),)):
        unchecked = card(_candidate(library="transformers", targets=targets))
        assert "transformers.js" not in unchecked.data.tags and "Transformers.js" not in unchecked.text


def test_control_and_bidi_characters_from_the_checkpoint_are_escaped_in_the_card() -> None:
    evil = _candidate(source="/zoo/gpt\u202etxt.exe", model_type="bert\x1b[31m", task="fill-mask\u2066",
                      versions={"torch": "2.13\r\n# injected"},
                      variants=(VariantRow(variant="fp32", status="passed", file="onnx/mo\u200fdel.onnx",
                                           ort_p50_ms=1.0, bench_cpu="Xeon\u202d", bench_threads=1),))
    card = model_card(evil, "org/model-onnx")
    raw = [ch for ch in card if ch in "\u202e\u2066\u200f\u202d\x1b\r"]
    assert not raw, raw
    assert "gpt\\u202etxt.exe" in card and "bert\\u001b[31m" in card and "mo\\u200fdel.onnx" in card
    assert "\n# injected" not in card and "2.13\\u000d\\u000a# injected" in card
    assert "Xeon\\u202d" in card
