"""Farm progress: a live line on a terminal, a line per job in logs, a summary naming the failures at the end."""

from __future__ import annotations

import io

from zoo_convert.farm import MAX_LISTED, FarmReport, Progress
from zoo_convert.records import ConversionResult, StageResult, VariantResult


def _feed(progress: Progress, extra: list[ConversionResult] = ()) -> FarmReport:
    report = FarmReport(run_id="r1", total=3 + len(extra))
    progress.start(report, 2 + len(extra))
    ok = ConversionResult(
        source="zoo/bert", status="passed",
        stages=(StageResult("optimize", "failed", 0.1, None, {"variant": "fp16"}),),
        variants=(
            VariantResult(variant="fp32", status="passed"),
            VariantResult(variant="fp16", status="failed", failure_kind="optimize_error",
                          message="ORT's layout optimizer crashed\nsecond line"),
        ),
    )
    bad = ConversionResult(source="zoo/gpt2", status="failed", failure_kind="timeout", stage="export",
                           message="the job ran past 600 s")
    for result in (ok, bad, *extra):
        report.count(result)
        progress.result(report, result)
        progress.tick(report, running=1)
    report.seconds = 2.0
    progress.finish(report)
    return report


def test_log_lines_per_job_and_a_summary() -> None:
    out = io.StringIO()
    _feed(Progress(out, live=False))
    lines = out.getvalue().splitlines()
    assert lines[0] == "run r1: 2 to do, 0 of 3 already done"
    assert lines[1].startswith("[1/2] partial") and "[fp16 optimize_error]" in lines[1]
    assert lines[2].startswith("[2/2] failed timeout") and "zoo/gpt2" in lines[2]
    assert "2 recorded" in lines[3]
    assert lines[4].split() == "converted 1 of 2 models (fp32 verified), 1 partial (a variant failed)".split()
    assert lines[5].split() == "variants 1 of 2 verified".split()
    assert lines[6].split() == "failures optimize_error 1, timeout 1".split()
    assert lines[7] == "failed (2):"
    assert lines[8].split() == "zoo/bert [fp16] optimize_error optimize ORT's layout optimizer crashed".split()
    assert lines[9].split() == "zoo/gpt2 timeout export the job ran past 600 s".split()
    assert len(lines) == 10


def test_live_bar_on_a_terminal_then_the_failures_by_name() -> None:
    out = io.StringIO()
    _feed(Progress(out, live=True))
    text = out.getvalue()
    bars = [seg for seg in text.split("\r") if " done " in seg]
    assert bars[0].startswith("1/2 done  0 failed")
    assert bars[-1].startswith("2/2 done  1 failed  1 running")
    assert "/min" in bars[-1] and "ETA" in bars[-1]
    assert "[1/2]" not in text  # no per-job lines on a terminal
    assert "zoo/bert [fp16]  optimize_error  optimize  ORT's layout optimizer crashed" in text
    assert "zoo/gpt2" in text.split("failed (2):", 1)[1]


def test_the_failure_list_stops_at_twenty_and_counts_the_rest() -> None:
    out = io.StringIO()
    many = [ConversionResult(source=f"zoo/m{i:02d}", status="failed", failure_kind="export_error", stage="export",
                             message=f"boom {i}") for i in range(30)]
    report = _feed(Progress(out, live=False), many)
    lines = out.getvalue().splitlines()
    listed = lines[lines.index("failed (32):") + 1:]
    assert len(listed) == MAX_LISTED + 1 and report.n_failures == 32
    assert listed[-1].startswith("  ... and 12 more: zoo-convert db query") and "run_id = 'r1'" in listed[-1]
