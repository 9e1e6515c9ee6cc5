"""Farm progress: a live line on a terminal, a line per job in logs, a summary naming the failures at the end."""

from __future__ import annotations

import io

from zoo_convert.farm.driver import MAX_LISTED, FarmReport, Progress
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


def test_an_inconclusive_job_is_neither_converted_nor_a_failure() -> None:
    why = "fp32: inconclusive: PyTorch's logits is all zero at every verify input (1x7, 3x19), so matching it proves nothing"
    zero = ConversionResult(
        source="zoo/mobilevit-zero", status="inconclusive", message=why,
        variants=(VariantResult(variant="fp32", status="inconclusive", message=why[6:]),),
    )
    out = io.StringIO()
    report = _feed(Progress(out, live=False), [zero])
    lines = out.getvalue().splitlines()
    assert lines[3].startswith("[3/3] inconclusive") and "zoo/mobilevit-zero" in lines[3]
    assert lines[5].split() == "converted 1 of 3 models (fp32 verified), 1 partial (a variant failed)".split()
    assert lines[7] == "inconclusive (1, neither converted nor failed):"
    assert lines[8] == f"  zoo/mobilevit-zero  {why}"
    assert lines[9].split() == "failures optimize_error 1, timeout 1".split() and lines[10] == "failed (2):"
    assert report.n_failures == 2 and report.by_status["inconclusive"] == 1


def test_names_and_messages_cannot_forge_lines_or_drive_the_terminal() -> None:
    """A folder named with ESC, OSC and a newline forged a `[1/1] passed` line and set the terminal's title."""
    forged = "zoo/x\n[1/1] passed                   zoo/bert\x1b]0;pwned\x07\x1b[2J"
    evil = ConversionResult(source=forged, status="failed", failure_kind="fetch_error", stage="fetch",
                            message="cannot read " + forged + "y" * 5000)  # fmt: skip
    for live in (False, True):
        out = io.StringIO()
        _feed(Progress(out, live=live), [evil])
        text = out.getvalue().replace("\r\x1b[K", "")  # the live line's own clearing, and nothing else
        assert "\x1b" not in text.replace("\r", "") and "\x07" not in text, repr(text)
        assert not any(line.startswith("[1/1] passed") for line in text.splitlines())
        assert "zoo/x\\x0a[1/1] passed" in text and "\\x1b]0;pwned\\x07" in text
        assert max(len(line) for line in text.splitlines()) < 1000  # the 5000-character message is cut


def test_on_a_terminal_each_failed_job_gets_a_line_above_the_live_one_as_it_lands() -> None:
    out = io.StringIO()
    progress = Progress(out, live=True)
    report = FarmReport(run_id="r1", total=2)
    progress.start(report, 2)
    bad = ConversionResult(source="zoo/gpt2", status="failed", failure_kind="timeout", stage="export",
                           message="the job ran past 600 s\nsecond line")
    report.count(bad)
    progress.result(report, bad)
    text = out.getvalue()  # before the run ends: the failure is already there, by name
    assert "\r\x1b[Kfailed  zoo/gpt2  timeout  export  the job ran past 600 s\n" in text
    assert "second line" not in text
    assert text.rstrip().split("\r")[-1].startswith("1/2 done  1 failed")  # the live line comes back below it


def test_the_summary_counts_the_whole_manifest_with_the_jobs_skipped_as_done() -> None:
    from collections import Counter

    out = io.StringIO()
    progress = Progress(out, live=False)
    report = FarmReport(run_id="r1", total=4, skipped=3, skipped_by_status=Counter(passed=2, failed=1))
    progress.start(report, 1)
    bad = ConversionResult(source="zoo/gpt2", status="failed", failure_kind="timeout", stage="export", message="late")
    report.count(bad)
    progress.result(report, bad)
    progress.finish(report)
    lines = out.getvalue().splitlines()
    assert lines[0] == "run r1: 1 to do, 3 of 4 already done"
    assert lines[3].split() == ("converted 2 of 4 models (fp32 verified): 0 of 1 this run, 2 of 3 done before;"
                                " 0 partial (a variant failed)").split()


def test_the_run_says_ray_is_starting() -> None:
    out = io.StringIO()
    Progress(out, live=True).starting_ray(None)
    Progress(out, live=False).starting_ray("ray://head:10001")
    assert "starting Ray (a local instance takes 10-20 s) ...\n" in out.getvalue()
    assert "connecting to Ray at ray://head:10001 ...\n" in out.getvalue()
