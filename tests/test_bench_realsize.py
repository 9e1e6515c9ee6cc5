"""The real-size benchmark's instrument: the checkpoints it builds are the real sizes, and it measures a whole process tree.

The timings themselves belong to ``benchmarks/bench_realsize.py``; these tests only
check that what it builds and how it measures can be trusted.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import _common  # noqa: E402 - benchmarks/ is not a package
import _realsize  # noqa: E402

from zoo_convert.records import Settings  # noqa: E402

# Parameter counts of the real checkpoints (``from_pretrained(...).num_parameters()``).
REAL_PARAMETERS = {
    "bert-base": 109_514_298,  # google-bert/bert-base-uncased, BertForMaskedLM
    "gpt2": 124_439_808,  # openai-community/gpt2, GPT2LMHeadModel
    "t5-small": 60_506_624,  # google-t5/t5-small
    "vit-base": 86_567_656,  # google/vit-base-patch16-224, 1,000 classes
    "whisper-tiny": 37_760_640,  # openai/whisper-tiny
}
# timm's own configurations (``timm.create_model(arch).num_params``, as the Hub checkpoints hold them).
TIMM_PARAMETERS = {
    "resnet50": 25_557_032,
    "vit_base_patch16_224": 86_567_656,
    "convnext_tiny": 28_589_128,
}


@pytest.mark.parametrize("name", sorted(REAL_PARAMETERS))
def test_configs_build_the_real_models_sizes(name: str) -> None:
    import torch

    with torch.device("meta"):  # shapes only: no memory, no time
        model = _realsize.model_for(_realsize.CONFIGS[name]())
    assert model.num_parameters() == REAL_PARAMETERS[name]


def test_the_big_model_needs_external_data() -> None:
    import torch

    with torch.device("meta"):
        model = _realsize.model_for(_realsize.CONFIGS["llama-2g"]())
    fp32_bytes = model.num_parameters() * 4
    assert Settings().external_data_threshold < fp32_bytes < 1.2 * Settings().external_data_threshold


def test_every_model_has_a_builder_or_ships_prebuilt() -> None:
    for model in _realsize.MODELS:
        built = model.timm is not None or (model.name in _realsize.CONFIGS and model.name in _realsize.SIDE_FILES)
        assert model.prebuilt or built, model.name


def test_the_timm_models_are_the_real_architectures() -> None:
    import timm
    import torch

    assert {m.timm for m in _realsize.MODELS if m.timm} == set(TIMM_PARAMETERS)
    for arch, count in TIMM_PARAMETERS.items():
        with torch.device("meta"):
            model = timm.create_model(arch, pretrained=False)
        assert sum(p.numel() for p in model.parameters()) == count, arch


def test_hub_cache_serves_a_timm_folder_to_timms_hub_loader_offline(tmp_path: Path) -> None:
    # What optimum-cli runs for a timm model, create_model("hf_hub:<id>", pretrained=True), with the
    # network off: it must read the folder's own weights, not timm's init of the architecture. In a child
    # with the bench's environment, as optimum-cli gets it: switching this process's huggingface_hub
    # offline would stay switched in every module that imports the flag while it is on (diffusers).
    import subprocess

    import timm
    import torch
    from timm.models import save_for_hf

    torch.manual_seed(0)
    saved = timm.create_model("test_resnet", pretrained=False, num_classes=7)
    with torch.no_grad():
        for p in saved.parameters():
            p.add_(1.0)  # off timm's init: a fresh model would not match
    save_for_hf(saved, str(tmp_path / "ckpt"), safe_serialization=True)
    (tmp_path / "ckpt" / _realsize.STAMP).write_text("x\n")

    env = _realsize.hub_cache(tmp_path / "ckpt", tmp_path / "home", "realsize/tiny")
    assert env["HF_HUB_OFFLINE"] == "1" and env["HF_HOME"] == str(tmp_path / "home")
    snapshot = next((tmp_path / "home" / "hub" / "models--realsize--tiny" / "snapshots").iterdir())
    assert sorted(p.name for p in snapshot.iterdir()) == ["config.json", "model.safetensors"]  # not the stamp
    load = (
        "import sys, timm, torch; m = timm.create_model('hf_hub:realsize/tiny', pretrained=True);"
        "torch.save(m.state_dict(), sys.argv[1]); print(m.num_classes)"
    )
    child = subprocess.run([sys.executable, "-c", load, str(tmp_path / "loaded.pt")], env=env,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert child.returncode == 0, child.stderr
    assert child.stdout.split()[-1] == "7"
    loaded = torch.load(tmp_path / "loaded.pt", weights_only=True)
    own = saved.state_dict()
    assert loaded.keys() == own.keys() and all(torch.equal(v, own[k]) for k, v in loaded.items())
    # Laid out again (a rebuilt checkpoint): the old snapshot is replaced, not added to.
    _realsize.hub_cache(tmp_path / "ckpt", tmp_path / "home", "realsize/tiny")
    assert len(list((tmp_path / "home" / "hub" / "models--realsize--tiny" / "snapshots").iterdir())) == 1


@pytest.mark.slow
@pytest.mark.alone  # a process tree sampled every 0.1 s while its children live 2 s
def test_measure_sums_a_process_tree_and_counts_forked_pages_once(tmp_path: Path) -> None:
    # 300 MB in the parent, shared with a forked child that never writes it, and a
    # separate 200 MB child: the tree holds ~0.5 GB; summing RSS would say ~0.8.
    script = textwrap.dedent(
        """
        import os, subprocess, sys, time
        a = bytearray(300_000_000)
        for i in range(0, len(a), 4096):
            a[i] = 1
        fill = "b = bytearray(200_000_000)\\nfor i in range(0, len(b), 4096): b[i] = 1\\nimport time; time.sleep(2)"
        child = subprocess.Popen([sys.executable, "-c", fill])
        pid = os.fork()
        if pid == 0:
            time.sleep(2)
            os._exit(0)
        child.wait()
        os.waitpid(pid, 0)
        """
    )
    m = _common.measure([sys.executable, "-c", script], tmp_path / "log.txt", interval_s=0.1)
    assert m.rc == 0, (tmp_path / "log.txt").read_text()
    assert 0.48e9 <= m.peak_bytes <= 0.7e9
    assert m.maxrss_bytes >= 0.3e9  # the largest single process, as wait4 reports it
    assert m.cpu_s > 0 and m.wall_s >= 2
    assert 0 < m.sys_s <= m.cpu_s and m.minor_faults > 1000  # 0.5 GB touched: the kernel's share, the first touches
    assert max(n for _, _, n in m.timeline) == 3


@pytest.mark.slow
def test_optimum_cli_exports_a_timm_folder_by_hub_id_offline(tmp_path: Path) -> None:
    # The bench's optimum side for timm, as it runs it: optimum-cli with a Hub id, HF_HUB_OFFLINE, the cache of hub_cache.
    import subprocess

    import onnx
    import timm
    from timm.models import save_for_hf

    save_for_hf(timm.create_model("test_resnet", pretrained=False, num_classes=5), str(tmp_path / "ckpt"), safe_serialization=True)
    env = _realsize.hub_cache(tmp_path / "ckpt", tmp_path / "home", "realsize/tiny")
    cli = Path(sys.executable).parent / "optimum-cli"
    out = tmp_path / "out"
    done = subprocess.run([str(cli), "export", "onnx", "--model", "realsize/tiny", "--task", "image-classification", str(out)],
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False)
    assert [d.dim_value for d in graph.graph.output[0].type.tensor_type.shape.dim][1:] == [5]  # the folder's head
