"""The reference saved beside the artifacts: verify's cases, readable and re-checkable with no PyTorch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from zoo_convert import targets
from zoo_convert.records import ConversionResult, OutputCheck, Tolerance
from zoo_convert.targets import reference

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_every_verify_case_is_saved_with_its_tolerances(folders: dict[str, Path], converted: dict[str, ConversionResult]) -> None:
    manifest = json.loads((folders["bert"] / "reference" / "manifest.json").read_text())
    assert manifest["format"] == "zoo-convert-reference" and manifest["version"] == 1
    assert set(manifest["variants"]) == {"fp32", "fp16", "int8"}
    assert manifest["variants"]["int8"] == {"model": "onnx/model_quantized.onnx"}
    assert manifest["tolerances"]["fp32"] == {"max_abs": 1e-4, "min_cosine": 0.9999}
    assert manifest["tolerances"]["int8"]["max_abs"] is None  # unbounded, written as JSON can
    ref = reference.load(folders["bert"])
    # the same (output, shape) pairs verify checked for fp32: the record's checks (generation steps aside)
    fp32 = converted["bert"].variant("fp32")
    assert fp32 is not None
    assert {(o.name, c.label) for c in ref.cases for o in c.outputs} == {(o.output, o.shape) for o in fp32.outputs}
    # a padded batch keeps its keep-mask
    assert any(o.keep is not None and not o.keep.all() for c in ref.cases for o in c.outputs)
    bart = reference.load(folders["bart"])
    assert {c.component for c in bart.cases} == {"encoder_model", "decoder_model_merged"}
    assert any(c.label.endswith("/cache") for c in bart.cases)
    stage = next(s for s in converted["bert"].stages if s.stage == "verify" and "reference_bytes" in s.details)
    assert 0 < stage.details["reference_bytes"] <= reference.size_bytes(folders["bert"])  # + the variants it lists


def test_a_folder_is_rechecked_without_pytorch(folders: dict[str, Path]) -> None:
    """No torch, no transformers, no checkpoint: only the folder (torch is made unimportable)."""
    probe = (
        "import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
        "from pathlib import Path\n"
        "from zoo_convert import targets\n"
        f"rows = targets.check_folder(Path({str(folders['bert'])!r}), 'ort-cpu')\n"
        "print([(r.variant, r.status) for r in rows])\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[('fp32', 'passed'), ('fp16', 'passed'), ('int8', 'passed')]"


def test_a_huge_output_is_saved_reduced_and_still_judges(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 40, 20000)).astype(np.float32)  # 1.6 M values: above FULL_LIMIT
    keep = np.ones(logits.shape, dtype=bool)
    keep[1, 30:] = False
    written = reference.save(tmp_path, [("model", "2x40", False, {"input_ids": np.zeros((2, 40), np.int64)},
                                         {"logits": logits}, {"logits": keep})],
                             {"fp32": Tolerance(1e-4, 0.9999)})  # fmt: skip
    assert written < logits.nbytes / 4  # 65,536 values and their positions, not 6.4 MB
    ref = reference.load(tmp_path)
    saved = ref.cases[0].outputs[0]
    assert saved.reduction == "strided" and saved.values.size == reference.SAMPLED and saved.shape == logits.shape
    assert keep.ravel()[saved.index].all()  # only positions the mask keeps
    tol = ref.tolerances["fp32"]
    case = ref.cases[0]
    assert targets.compare_saved(case, saved, logits.copy(), tol).passed
    wrong = logits.copy()
    wrong[0, 3] += 0.5  # one row of logits off: sampled positions land in it
    assert not targets.compare_saved(case, saved, wrong, tol).passed
    padded_only = logits.copy()
    padded_only[1, 35] = 99.0  # a padded position: never compared
    assert targets.compare_saved(case, saved, padded_only, tol).passed


def test_a_wrong_shape_is_a_failure_whatever_the_overlapping_values(tmp_path: Path) -> None:
    values = np.arange(8, dtype=np.float32).reshape(2, 4)
    reference.save(tmp_path, [("model", "2x4", False, {}, {"logits": values}, {})], {"fp32": Tolerance(1e-4, 0.9999)})
    ref = reference.load(tmp_path)
    case = ref.cases[0]
    check = targets.compare_saved(case, case.outputs[0], values[:0], ref.tolerances["fp32"])  # efficientnet's [0,4] for [2,4]
    assert isinstance(check, OutputCheck) and not check.passed
    assert check.mismatch == "shape 0x4 from the target, 2x4 in PyTorch"


def test_no_reference_is_a_clear_error_that_says_what_the_folder_is(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="has no saved reference .*: it is not an artifact folder"):
        reference.load(tmp_path)
    old = tmp_path / "old"  # an artifact folder from before references were saved
    (old / "onnx").mkdir(parents=True)
    (old / "onnx" / "model.onnx").write_bytes(b"")
    with pytest.raises(ValueError, match="converted before references were saved"):
        reference.load(old)
    job = tmp_path / "out" / "zoo__bert" / "optimum-opsetdefault-1234"  # what convert --out OUT makes
    job.mkdir(parents=True)
    reference.save(job, [("model", "2x4", False, {}, {"logits": np.zeros((2, 4), np.float32)}, {})],
                   {"fp32": Tolerance(1e-4, 0.9999)})  # fmt: skip
    for given in (tmp_path / "out", tmp_path / "out" / "zoo__bert"):  # the --out folder, or the model's: name the job's
        with pytest.raises(ValueError, match=f"name the artifact folders under it, such as {job}$"):
            reference.load(given)


def test_a_scalar_input_is_saved_as_a_scalar(tmp_path: Path) -> None:
    """A UNet's ``timestep`` is declared ``[]``: the saved feed keeps it 0-d (``np.ascontiguousarray`` made it ``(1,)``)."""
    feed = {"timestep": np.array(949.7, dtype=np.float32), "sample": np.ones((1, 4, 8, 8), np.float32).transpose(0, 1, 3, 2)}
    reference.save(tmp_path, [("unet", "1x7", False, feed, {"out_sample": np.zeros((1, 4, 8, 8), np.float32)}, {})],
                   {"fp32": Tolerance(max_abs=1e-4, min_cosine=0.999)})  # fmt: skip
    (case,) = reference.load(tmp_path).cases
    assert case.feed["timestep"].shape == ()
    assert case.feed["timestep"] == np.float32(949.7)
    np.testing.assert_array_equal(case.feed["sample"], feed["sample"])
