"""Fork-server preload for runs with torch-exporter rows: :mod:`zoo_convert.farm.warm`, then one tiny BERT through
``--exporter torch``.

The first ``torch.onnx.export(dynamo=True)`` in a process pays torch.export's, torch.onnx's and
onnxscript's imports and first-call tables (the fake-tensor dispatch cache, the ONNX op
registry's functions); a forked job inherits them. That costs seconds at the server's start, so the
farm preloads this module only when its plan has a ``torch`` row (:func:`zoo_convert.farm.isolation.preload_for`);
an optimum-only run's server never runs it. Like ``_warm``, it never raises.
"""

from __future__ import annotations

import sys
import traceback

from . import warm as _warm

try:
    _warm.convert_tiny_bert("torch")
except Exception:  # noqa: BLE001 - a failed warm-up only makes the torch jobs slower
    print("zoo_convert: the torch exporter's warm-up failed; its jobs will pay the first export:", file=sys.stderr)
    traceback.print_exc()
