#!/usr/bin/env bash
# The GPU check, on a machine with an NVIDIA GPU and nothing installed but python3: a venv with
# the `gpu` extra, a small zoo subset marked gpu: true, the farm on a local Ray instance with
# ONNX Runtime's CUDA execution provider, then a latency table for the README's performance table.
#   bash infra/gpu_check.sh [WORKDIR]       (default build/gpu-check)
# Exit status: 0 when every fp32 and fp16 artifact verified on the GPU.
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
# Every row on the GPU, fp32 and fp16 (int8 is a CPU format: dynamic quantization has no CUDA kernels).
"$py" - "$work/zoo/manifest.parquet" "$work/manifest.parquet" <<'PY'
import sys
from pathlib import Path

import pyarrow.parquet as pq

src, dst = Path(sys.argv[1]), sys.argv[2]
table = pq.read_table(src)
rows = [{**r, "source": str(src.parent / r["source"]), "gpu": True, "variants": ["fp32", "fp16"]} for r in table.to_pylist()]
pq.write_table(table.from_pylist(rows, schema=table.schema), dst)
PY

run=("$work/venv/bin/zoo-convert" run "$work/manifest.parquet" --db "$work/results.duckdb" --out "$work/artifacts" --force)
if "$work/venv/bin/zoo-convert" run --help | grep -q -- '--providers'; then
  run+=(--providers "CUDAExecutionProvider,CPUExecutionProvider")
else
  echo "WARNING: zoo-convert run has no --providers; gpu rows run on the providers the farm picks" >&2
fi
"${run[@]}"

"$py" - "$work/results.duckdb" <<'PY'
import sys

import duckdb

db = duckdb.connect(sys.argv[1], read_only=True)
rows = db.execute(
    """
    SELECT source, variant, status, ort_p50_ms, ort_p90_ms, torch_p50_ms, speedup, max_abs, node
    FROM latest_results WHERE variant IS NOT NULL ORDER BY source, variant
    """
).fetchall()
print("| model | variant | status | ORT p50 ms | ORT p90 ms | torch p50 ms | speedup | max abs err |")
print("|---|---|---|---|---|---|---|---|")
fmt = lambda v: "" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)
for source, variant, status, *nums, node in rows:
    print(f"| {source.rsplit('/', 1)[-1]} | {variant} | {status} | " + " | ".join(fmt(v) for v in nums) + " |")
sys.exit(0 if rows and all(r[2] == "passed" for r in rows) else 1)
PY
