"""`zoo-convert manifest coverage`: which rows the farm has a conversion path for, before a run."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from zoo_convert import zoo
from zoo_convert.cli import cli
from zoo_convert.coverage import manifest_coverage, summary
from zoo_convert.manifest import write_manifest


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("coverage")
    zoo.build(root / "zoo", only=["timm-test-resnet", "vit"])
    rows = [
        {"source": str(root / "zoo" / "timm-test-resnet")},  # local: read from its config.json
        {"source": str(root / "zoo" / "vit"), "task": "image-classification"},
        {"source": "google-bert/bert-base-uncased", "task": "fill-mask", "tags": ["transformers", "model_type:bert"]},
        {"source": "microsoft/trocr-small", "task": "text-to-image", "tags": ["transformers", "model_type:trocr"]},
        {"source": "org/mystery", "task": "fill-mask", "tags": ["transformers"]},
        {"source": "timm/resnet50.a1_in1k", "task": "image-classification", "tags": ["timm", "model_type:timm:resnet50"]},
        {"source": "timm/vit_so400m_patch14_siglip_gap_224.webli", "task": "feature-extraction", "tags": ["timm"]},
        {"source": "timm/resnet_of_the_future.x", "tags": ["timm"]},
        {"source": "timm/resnet18.a1_in1k", "task": "object-detection", "tags": ["timm"]},
        {"source": "stabilityai/sd-turbo", "task": "text-to-image", "tags": ["diffusers", "model_type:stable-diffusion"]},
        {"source": "black-forest-labs/FLUX.1-dev", "task": "text-to-image", "tags": ["diffusers", "model_type:flux"]},
        {"source": "black-forest-labs/FLUX.1-Fill-dev", "task": "text-to-image", "tags": ["diffusers", "model_type:flux-fill"]},
        {"source": "stabilityai/stable-diffusion-3.5-medium", "tags": ["diffusers", "model_type:stable-diffusion-3"]},
    ]
    return write_manifest(rows, root / "manifest.parquet")


def test_each_row_says_whether_it_has_a_path_and_why_not(manifest: Path) -> None:
    got = {r.source.rsplit("/", 1)[-1]: (r.library, r.model_type, r.path) for r in manifest_coverage(manifest)}
    assert got == {
        "timm-test-resnet": ("timm", "test_resnet", True),
        "vit": ("transformers", "vit", True),
        "bert-base-uncased": ("transformers", "bert", True),
        "trocr-small": ("transformers", "trocr", False),
        "mystery": ("transformers", None, None),
        "resnet50.a1_in1k": ("timm", "resnet50", True),
        "vit_so400m_patch14_siglip_gap_224.webli": ("timm", "vit_so400m_patch14_siglip_gap_224", True),
        "resnet_of_the_future.x": ("timm", "resnet_of_the_future", False),
        "resnet18.a1_in1k": ("timm", "resnet18", False),
        "sd-turbo": ("diffusers", "stable-diffusion", True),
        "FLUX.1-dev": ("diffusers", "flux", True),
        "FLUX.1-Fill-dev": ("diffusers", "flux-fill", False),
        "stable-diffusion-3.5-medium": ("diffusers", "stable-diffusion-3", True),
    }
    why = {r.source.rsplit("/", 1)[-1]: r.reason for r in manifest_coverage(manifest)}
    assert why["resnet18.a1_in1k"] == "optimum exports timm models for image-classification, not object-detection"
    assert why["trocr-small"] == "optimum exports trocr for feature-extraction; not text-to-image"
    assert why["FLUX.1-Fill-dev"] == (
        "diffusers flux-fill: the farm verifies Stable Diffusion (1.x/2.x, XL, 3), Latent Consistency and Flux "
        "text-to-image pipelines only"
    )
    assert why["resnet_of_the_future.x"].startswith("timm 1.") and "no architecture 'resnet_of_the_future'" in why["resnet_of_the_future.x"]


def test_the_summary_weighs_libraries_by_rows(manifest: Path) -> None:
    lines = summary(manifest_coverage(manifest))
    table = {line.split()[0]: line.split()[1:] for line in lines[1:7] if line.strip()}
    assert table["timm"] == ["5", "3", "2", "0", "60%"]
    assert table["transformers"] == ["4", "2", "1", "1", "50%"]
    assert table["diffusers"] == ["4", "3", "1", "0", "75%"]
    assert table["all"] == ["13", "8", "4", "1", "62%"]


def test_the_command_prints_rows_and_the_summary(manifest: Path) -> None:
    res = CliRunner().invoke(cli, ["manifest", "coverage", str(manifest), "--rows"])
    assert res.exit_code == 0, res.output
    rows = [line.split("\t") for line in res.output.splitlines() if "\t" in line]
    assert [r[:2] for r in rows] == [[str(n), m] for n, m in enumerate(["yes", "yes", "yes", "no", "?", "yes", "yes", "no", "no", "yes", "yes", "no", "yes"], 1)]
    assert "all                        13      8      4        1        62%" in res.output


def test_exporter_auto_counts_what_the_generic_torch_path_takes(tmp_path: Path) -> None:
    """optimum has no config for depth_anything or starcoder2: auto exports the one, not a starcoder2 that generates."""
    rows = [
        {"source": "org/depth", "task": "depth-estimation", "tags": ["transformers", "model_type:depth_anything"]},
        {"source": "org/coder", "task": "text-generation", "tags": ["transformers", "model_type:starcoder2"]},
        {"source": "org/coder-features", "task": "feature-extraction", "tags": ["transformers", "model_type:starcoder2"]},
        {"source": "org/w2v", "task": "feature-extraction", "tags": ["transformers", "model_type:wav2vec2-bert"]},
    ]
    path = write_manifest(rows, tmp_path / "m.parquet")
    assert [r.path for r in manifest_coverage(path)] == [False, False, False, False]
    auto = {r.source: (r.path, r.reason) for r in manifest_coverage(path, "auto")}
    assert auto["org/depth"] == (True, "") and auto["org/coder-features"] == (True, "")
    assert auto["org/coder"][0] is False and "no past key values" in auto["org/coder"][1]
    assert auto["org/w2v"][0] is False and "takes 'input_features'" in auto["org/w2v"][1]
    # a row that asks for auto itself is counted so without the option
    own = write_manifest([{**rows[0], "exporter": "auto"}], tmp_path / "own.parquet")
    assert [r.path for r in manifest_coverage(own)] == [True]

