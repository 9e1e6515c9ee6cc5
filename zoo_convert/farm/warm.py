"""Fork-server preload: importing this module warms the process that forks every job.

It imports the toolchain (torch, transformers, optimum, onnxruntime, the
pipeline), preloads the installed targets (openvino's import, the model types
transformers.js knows), quiets the libraries' warnings and logs for every job it will fork,
and converts one tiny BERT, so forked jobs start with every lazy import and
first-call cache already paid. Everything runs single-threaded:
forking a process whose OpenMP or intra-op pool is running deadlocks the child.
Nothing here may raise: a failed warm-up only makes jobs slower, so it is
reported on stderr and swallowed. :mod:`zoo_convert.farm.warm_torch` adds the torch
exporter's warm-up, for the runs that use it.
"""

from __future__ import annotations

import sys
import tempfile
import time
import traceback


def warm_up() -> float:
    """Import the toolchain and convert one tiny model with optimum; return the seconds it took."""
    t0 = time.perf_counter()
    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    import onnxruntime  # noqa: F401

    from .. import targets
    from ..pipeline import quiet_libraries

    quiet_libraries()
    for name in targets.installed():  # the runtimes every job's target children would import (openvino)
        targets.get(name).preload()
    convert_tiny_bert("optimum")
    return time.perf_counter() - t0


def convert_tiny_bert(exporter: str) -> None:
    """Convert a one-layer BERT built here (fp32, no benchmark) with ``exporter``."""
    import transformers

    from ..pipeline import convert_one
    from ..records import ManifestEntry, Settings

    with tempfile.TemporaryDirectory(prefix="zoo-warm-") as tmp:
        config = transformers.BertConfig(
            vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
        )
        transformers.BertModel(config).save_pretrained(f"{tmp}/bert")
        entry = ManifestEntry(source=f"{tmp}/bert", task="feature-extraction", variants=("fp32",), exporter=exporter)
        # No targets: they run in forked children, which would warm nothing here (openvino is preloaded above).
        settings = Settings(out_dir=f"{tmp}/out", bench_warmup=0, bench_runs=1, threads=1, targets=())
        result = convert_one(entry, settings)
        if not result.passed:
            print(f"zoo_convert: the warm-up's tiny BERT ({exporter}) did not pass: {result.status}", file=sys.stderr)


try:
    warm_up()
except Exception:  # noqa: BLE001 - see the module docstring
    print("zoo_convert: fork-server warm-up failed; jobs will pay the imports:", file=sys.stderr)
    traceback.print_exc()
