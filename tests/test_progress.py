"""Farm progress: a live line on a terminal, a line per job in logs, a summary at the end."""

from __future__ import annotations

import io

from zoo_convert.farm import FarmReport, Progress
from zoo_convert.records import ConversionResult, VariantResult


def _feed(progress: Progress) -> FarmReport:
    report = FarmReport(run_id="r1", total=3)
    progress.start(report, 2)
    ok = ConversionResult(source="zoo/bert", status="passed", variants=(
        VariantResult(variant="fp32", status="passed"),
        VariantResult(variant="fp16", status="failed", failure_kind="optimize_error"),
    ))
    bad = ConversionResult(source="zoo/gpt2", status="failed", failure_kind="timeout")
    for result in (ok, bad):
        report.recorded += 1
        report.by_status[result.status] += 1
        if result.failure_kind:
            report.by_kind[result.failure_kind] += 1
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
    assert lines[1].startswith("[1/2] passed") and "[fp16 optimize_error]" in lines[1]
    assert lines[2].startswith("[2/2] failed timeout") and "zoo/gpt2" in lines[2]
    assert "2 recorded" in lines[3]
    assert [line.split() for line in lines[4:]] == [["passed", "1"], ["timeout", "1"]]


def test_live_bar_on_a_terminal() -> None:
    out = io.StringIO()
    _feed(Progress(out, live=True))
    text = out.getvalue()
    bars = [seg for seg in text.split("\r") if " done " in seg]
    assert bars[0].startswith("1/2 done  0 failed")
    assert bars[-1].startswith("2/2 done  1 failed  1 running")
    assert "/min" in bars[-1] and "ETA" in bars[-1]
    assert "[1/2]" not in text  # no per-job lines on a terminal
