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
        assert model.prebuilt or (model.name in _realsize.CONFIGS and model.name in _realsize.SIDE_FILES), model.name


@pytest.mark.slow
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
    assert max(n for _, _, n in m.timeline) == 3
