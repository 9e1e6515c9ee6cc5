"""The artifact folder is loaded as its users load it before a result may pass (issue 23).

Each broken side file here parses (fetch's checks let it through) and still does not load: on
main the job passed and published it. Each job fails before its export, so the failing cases
cost a fetch and a copy; the positive ones convert fp32 without a benchmark.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from zoo_convert import sources, zoo
from zoo_convert.pipeline import convert_one
from zoo_convert.records import ConversionResult, ManifestEntry, Settings


@pytest.fixture
def built(zoo_dir: Path) -> Path:
    """The session's zoo: its bert, gpt2, vit and a timm vit are copied and broken here."""
    return zoo_dir


def _convert(built: Path, tmp_path: Path, name: str, breaks: Callable[[Path], object] = lambda _: None) -> ConversionResult:
    """The zoo model ``name`` copied, broken by ``breaks``, through the per-model pipeline (no Ray)."""
    src = tmp_path / name
    shutil.copytree(built / name, src)
    breaks(src)
    task = next(m.task for m in zoo.ZOO if m.name == name)
    return convert_one(
        ManifestEntry(source=str(src), task=task, variants=("fp32",)),
        Settings(out_dir=str(tmp_path / "out"), benchmark=False),
    )


def _edit(name: str, **changes: Any) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        path = folder / name
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))

    return edit


def _without(*names: str) -> Callable[[Path], None]:
    def remove(folder: Path) -> None:
        for name in names:
            (folder / name).unlink()

    return remove


def _empty_vocab(folder: Path) -> None:
    (folder / "tokenizer.json").unlink()
    (folder / "vocab.txt").write_text("")


@pytest.mark.parametrize(
    ("model", "breaks", "said"),
    [
        ("bert", _edit("tokenizer_config.json", tokenizer_class="FooTokenizer"),
         "tokenizer_config.json in the artifact folder does not load (AutoTokenizer): "
         "ValueError: Tokenizer class FooTokenizer does not exist"),
        ("bert", _without("vocab.txt", "tokenizer.json"),
         "vocab.txt (missing, and no tokenizer.json) in the artifact folder does not load (AutoTokenizer)"),
        ("bert", _empty_vocab, "vocab.txt in the artifact folder does not load (AutoTokenizer): Exception: WordPiece error"),
        ("vit", _edit("preprocessor_config.json", image_processor_type="FooImageProcessor"),
         "preprocessor_config.json in the artifact folder does not load (AutoImageProcessor): "
         "ValueError: Unrecognized image processor"),
        ("vit", _edit("preprocessor_config.json", size={"height": "big", "width": 32}),
         "preprocessor_config.json in the artifact folder does not load (AutoImageProcessor)"),
        ("gpt2", _edit("generation_config.json", num_beams="x"),
         "generation_config.json in the artifact folder does not load (GenerationConfig): "
         "ValueError: num_beams is 'x', not a int as GenerationConfig has it"),
        ("gpt2", _edit("generation_config.json", max_length=-5),
         "generation_config.json in the artifact folder does not load (GenerationConfig): "
         "ValueError: max_length is -5: a count, it cannot be negative"),
        ("timm-test-vit", _edit("config.json", pretrained_cfg="vit"),
         "config.json in the artifact folder does not load (timm.data.create_transform): "
         "ValueError: pretrained_cfg is a JSON str, not an object"),
    ],
    ids=["tokenizer-class", "no-vocab", "empty-vocab", "image-processor-type", "size-not-a-number",
         "num-beams-string", "max-length-negative", "timm-pretrained-cfg"],
)  # fmt: skip
def test_a_side_file_that_does_not_load_is_fetch_error_naming_it(
    model: str, breaks: Callable[[Path], None], said: str, built: Path, tmp_path: Path
) -> None:
    result = _convert(built, tmp_path, model, breaks)
    assert (result.status, result.failure_kind, result.stage) == ("failed", "fetch_error", "export"), result.message
    assert said in (result.message or ""), result.message
    assert [s.stage for s in result.stages] == ["fetch", "export"]  # nothing exported from it
    assert result.variants == () and result.artifacts_dir is None and not any((tmp_path / "out").iterdir())


def test_a_side_file_export_did_not_copy_is_a_bug_of_ours(
    built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tokenizer loads from the checkpoint, not from the artifact folder: our copy left its vocabulary out."""
    monkeypatch.setattr(sources, "SIDE_FILES", tuple(n for n in sources.SIDE_FILES if n != "vocab.txt"))
    result = _convert(built, tmp_path, "bert", _without("tokenizer.json"))
    assert (result.status, result.failure_kind) == ("failed", "internal"), result.message
    assert "AutoTokenizer loads the checkpoint but not the artifact folder, which lacks vocab.txt" in (result.message or "")


@pytest.mark.skipif(find_spec("sentencepiece") is not None, reason="sentencepiece is installed: the tokenizer converts")
def test_a_library_this_environment_lacks_is_ours_not_the_checkpoint_s(built: Path, tmp_path: Path) -> None:
    """A t5 with spiece.model alone: converting it needs a library (sentencepiece) the farm must install, not the model fix."""

    def sentencepiece_only(folder: Path) -> None:
        (folder / "tokenizer.json").unlink()
        (folder / "spiece.model").write_bytes(b"\x0a\x0b")

    result = _convert(built, tmp_path, "t5", sentencepiece_only)
    assert (result.status, result.failure_kind, result.stage) == ("failed", "internal", "export"), result.message
    assert "AutoTokenizer needs tiktoken, which this environment lacks, to load spiece.model" in (result.message or "")


def test_the_artifact_folder_loads_as_its_users_load_it(built: Path, tmp_path: Path) -> None:
    """What passed loads from its artifact folder alone; verify tokenized with that same tokenizer."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    result = _convert(built, tmp_path, "gpt2")
    assert result.passed, result.message
    export = next(s for s in result.stages if s.stage == "export")
    assert {k: v for k, v in export.details["loaded"].items() if k != "seconds"} == {
        "AutoConfig": "GPT2Config", "AutoTokenizer": "GPT2TokenizerFast", "GenerationConfig": "GenerationConfig",
    }  # fmt: skip
    out = Path(result.artifacts_dir or "")
    shutil.rmtree(tmp_path / "gpt2")  # the checkpoint is gone: only the artifacts are read
    assert AutoConfig.from_pretrained(out, local_files_only=True).model_type == "gpt2"
    assert AutoTokenizer.from_pretrained(out, local_files_only=True)("Hello world")["input_ids"]
    assert GenerationConfig.from_pretrained(out, local_files_only=True).eos_token_id is not None


def test_an_image_model_s_artifact_folder_loads_its_image_processor(built: Path, tmp_path: Path) -> None:
    result = _convert(built, tmp_path, "vit")
    assert result.passed, result.message
    loaded = next(s for s in result.stages if s.stage == "export").details["loaded"]
    assert loaded["AutoImageProcessor"] == "ViTImageProcessor" and "AutoTokenizer" not in loaded


def test_a_vocabulary_other_tokenizer_classes_name_is_fetched_and_copied(tmp_path: Path) -> None:
    """DeBERTa-v3 ships spm.model and no tokenizer.json: left out of the artifacts, its tokenizer does not load there."""
    from huggingface_hub.utils import filter_repo_objects

    from zoo_convert.stages import fetch

    names = ["spm.model", "bpe.codes", "entity_vocab.json", "normalizer.json", "prophetnet.tokenizer"]
    for name in ["config.json", *names, "vocab.pkl"]:
        (tmp_path / name).write_text("{}")
    assert {p.name for p in sources.side_files(tmp_path)} == {"config.json", *names}  # never a pickled vocab.pkl
    assert set(filter_repo_objects(names, allow_patterns=fetch.SIDE_FILES)) == set(names)


def test_an_image_processor_that_needs_more_than_an_image_is_not_a_broken_file(tmp_path: Path) -> None:
    """ViTPose's processor loads and needs the person boxes to run: the check refused the folder as
    "preprocessor_config.json ... does not load: missing 1 required positional argument: 'boxes'" (issue 33, item 3)."""
    from transformers import VitPoseImageProcessor

    from zoo_convert.verify.loadable import _preprocessor

    VitPoseImageProcessor().save_pretrained(tmp_path)
    assert type(_preprocessor("AutoImageProcessor", tmp_path, False)).__name__ == "VitPoseImageProcessor"
    # a file that is broken still is
    (tmp_path / "preprocessor_config.json").write_text('{"image_processor_type": "VitPoseImageProcessor", ')
    with pytest.raises(Exception):  # noqa: B017 - whatever transformers raises for it
        _preprocessor("AutoImageProcessor", tmp_path, False)
