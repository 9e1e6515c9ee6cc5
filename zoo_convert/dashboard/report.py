"""Human-readable summaries of conversion results for the terminal."""

from __future__ import annotations

from ..records import ConversionResult


def summary(result: ConversionResult) -> str:
    """A few lines: the verdict, the stages with their times, one line per variant."""
    head = f"{result.source}  {result.status.upper()}"
    facts = [
        f"task={result.task}",
        f"model_type={result.model_type}",
        f"exporter={result.exporter}"
        + (f"->{result.exporter_used}" if result.exporter_used not in (None, result.exporter) else ""),
        f"opset={result.opset}",
    ]
    lines = [head, "  " + "  ".join(f for f in facts if not f.endswith("=None"))]
    if result.exporter_reason:
        lines.append(f"  generic torch export: {result.exporter_reason}")
    if result.failure_kind:
        lines.append(f"  failure: {result.failure_kind} in {result.stage}: {result.message}")
    stages = "  ".join(
        f"{s.stage}{'[' + s.details['variant'] + ']' if 'variant' in s.details else ''} {s.seconds:.2f}s"
        + ("" if s.status == "passed" else " FAILED")
        for s in result.stages
    )
    lines.append(f"  stages: {stages}")
    for v in result.variants:
        cells = [f"  {v.variant:<5} {v.status:<6}"]
        if v.max_abs is not None:
            twin = any("verified_on" in c for c in v.optimizer.get("components", {}).values())
            cells.append(f"max_abs={v.max_abs:.2e} cos={v.min_cosine:.5f}" + (" (its exact sums, on a uint8 twin)" if twin else ""))
        if v.generation_steps:
            match = f"{v.generation_token_match:.0%}" if v.generation_token_match is not None else "-"
            cells.append(f"generate {v.generation_steps} steps max_abs={v.generation_max_abs:.2e} tokens={match}")
        elif v.generation_note:
            cells.append(f"generation not checked: {v.generation_note}")
        if v.ort_p50_ms is not None:
            torch = f"{v.torch_p50_ms:.2f}ms" if v.torch_p50_ms is not None else "-"
            speedup = f"{v.speedup:.2f}x" if v.speedup is not None else "-"
            cells.append(f"ort p50={v.ort_p50_ms:.2f}ms torch p50={torch} speedup={speedup}")
            cells.append(f"({v.bench_shape}, {v.bench_threads} thr, others on {v.bench_load} CPUs{', NOISY' if v.bench_noisy else ''})")
        elif v.bench_note:
            cells.append(f"latency empty: {v.bench_note}")
        elif v.status in ("passed", "inconclusive"):
            cells.append("latency not measured")  # --no-benchmark
        if v.size_bytes is not None:
            cells.append(f"{v.size_bytes / 1e6:.1f} MB")
        if v.message:
            cells.append(f"— {v.failure_kind}: {v.message}" if v.failure_kind else f"— {v.message}")
        lines.append("  ".join(cells))
        for t in (t for t in result.targets if t.variant == v.variant):
            numbers = f"max_abs={t.max_abs:.2e} cos={t.min_cosine:.5f}" if t.max_abs is not None and t.min_cosine is not None else ""
            latency = f" p50={t.latency_ms:.2f}ms" if t.latency_ms is not None else ""
            lines.append(f"        on {t.target:<16} {t.status:<11} {numbers}{latency}" + (f" — {t.message}" if t.message else ""))
    if result.artifacts_dir:
        lines.append(f"  artifacts: {result.artifacts_dir}")
    return "\n".join(lines)
