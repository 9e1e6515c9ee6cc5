"""The error helpers every layer shares: one line per failure, and what counts as a bug of ours."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zoo_convert import onnx_graph
from zoo_convert.errors import MESSAGE_LIMIT, ExportError, FetchError, first_line, is_our_bug
from zoo_convert.manifest import read_manifest, write_manifest
from zoo_convert.sources import is_hub_id
from zoo_convert.stages.fetch import validate_repo_id


def test_first_line_names_foreign_errors_and_keeps_ours_as_written() -> None:
    assert first_line(ValueError("bad value\nsecond line")) == "ValueError: bad value"
    assert first_line(ExportError("\n  opset 99 is not supported\nmore")) == "opset 99 is not supported"
    assert first_line(KeyError()) == "KeyError"
    assert first_line(ExportError("")) == "ExportError"
    long = first_line(RuntimeError("x" * 5000))
    assert len(long) == MESSAGE_LIMIT + 4 and long.endswith(" ...")


def _raise_in_json() -> None:
    json.loads("{")  # raised inside the json module: not our code


def test_a_bug_of_ours_is_told_by_the_frame_that_raised() -> None:
    with pytest.raises(ValueError) as foreign:
        _raise_in_json()
    assert not is_our_bug(foreign.value)
    with pytest.raises(AttributeError) as ours:
        onnx_graph.data_path(None)  # type: ignore[arg-type] - None.with_name, in our own frame
    assert is_our_bug(ours.value)
    with pytest.raises(FetchError) as deliberate:
        validate_repo_id("a/../b")  # raised in our code, on purpose: a kind of its own, not a bug
    assert not is_our_bug(deliberate.value)


IDS = ["org/name", "name", "a.b-c_d/e", "org/../etc", "a--b", "org/name.git", "a/b/c", "-lead", "sp ace", "x" * 97]


@pytest.mark.parametrize("source", IDS)
def test_manifest_and_fetch_apply_one_hub_id_rule(source: str, tmp_path: Path) -> None:
    valid = is_hub_id(source)
    assert valid == (source in ("org/name", "name", "a.b-c_d/e"))
    problems = read_manifest(write_manifest([{"source": source}], tmp_path / "m.parquet")).problems
    assert (not problems) == valid, [p.reason for p in problems]
    if valid:
        validate_repo_id(source)
    else:
        with pytest.raises(FetchError, match="valid hub repo id"):
            validate_repo_id(source)
