#!/usr/bin/env bash
# The GPU check, on a machine with an NVIDIA GPU and nothing installed but python3: a venv with
# the `gpu` extra, a small zoo subset marked gpu: true, the farm on a local Ray instance, each
# variant verified by ONNX Runtime on the CPU (the verdict, as on every node) and checked on the
# GPU targets (ort-cuda, ort-tensorrt), then a table of what ran where and how fast.
#   bash infra/gpu_check.sh [WORKDIR]       (default build/gpu-check)
# Exit status: 0 when every variant verified and passed ort-cuda.
set -euo pipefail

cd "$(dirname "$0")/.."
work="${1:-build/gpu-check}"
models="${ZOO_GPU_MODELS:-bert,gpt2,vit}"
mkdir -p "$work"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [[ ! -x "$work/venv/bin/zoo-convert" ]]; then
  python3 -m venv "$work/venv"
  "$work/venv/bin/pip" install -q --upgrade pip
  "$work/venv/bin/pip" install -q -e '.[gpu,dev]'
fi
py="$work/venv/bin/python"
"$py" -c 'import onnxruntime as ort; p = ort.get_available_providers(); print("ORT", ort.__version__, p); assert "CUDAExecutionProvider" in p, p'

"$work/venv/bin/zoo-convert" zoo build "$work/zoo" --only "$models"
# Every row asks for a GPU node. int8 too: its MatMulInteger runs on CUDA's CPU fallback, which the row's providers show.
"$py" - "$work/zoo/manifest.parquet" "$work/manifest.parquet" <<'PY'
import sys
from pathlib import Path

import pyarrow.parquet as pq

src, dst = Path(sys.argv[1]), sys.argv[2]
table = pq.read_table(src)
rows = [{**r, "source": str(src.parent / r["source"]), "gpu": True} for r in table.to_pylist()]
pq.write_table(table.from_pylist(rows, schema=table.schema), dst)
PY

"$work/venv/bin/zoo-convert" run "$work/manifest.parquet" --db "$work/results.duckdb" --out "$work/artifacts" --force \
  --targets ort-cpu,ort-cuda,ort-tensorrt

"$py" - "$work/results.duckdb" <<'PY'
import sys

import duckdb

db = duckdb.connect(sys.argv[1], read_only=True)
rows = db.execute(
    """
    SELECT l.source, l.variant, l.status, t.target, t.status, t.latency_ms, t.max_abs, t.providers, t.message
    FROM latest_results l LEFT JOIN target_results t ON t.job_key = l.job_key AND t.run_id = l.run_id AND t.variant = l.variant
    WHERE l.variant IS NOT NULL ORDER BY l.source, l.variant, t.target
    """
).fetchall()
print("| model | variant | verified (ORT CPU) | target | status | p50 ms | max abs | providers |")
print("|---|---|---|---|---|---|---|---|")
fmt = lambda v: "" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)
for source, variant, verdict, target, status, *nums, providers, message in rows:
    print(f"| {source.rsplit('/', 1)[-1]} | {variant} | {verdict} | {fmt(target)} | {fmt(status)} | "
          + " | ".join(fmt(v) for v in nums) + f" | {fmt(providers)} |" + (f" {message[:120]}" if message and status != "passed" else ""))
cuda = [r for r in rows if r[3] == "ort-cuda"]
sys.exit(0 if cuda and all(r[2] == "passed" for r in rows) and all(r[4] == "passed" for r in cuda) else 1)
PY
