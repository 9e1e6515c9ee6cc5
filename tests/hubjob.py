"""A farm job for Hub tests, in a module of its own: the forked child imports it to unpickle the job,
and a test module's imports (ray, pytest, DuckDB) would cost each job half a second."""

from __future__ import annotations

from collections.abc import Callable

from zoo_convert.errors import ZooConvertError
from zoo_convert.farm.isolation import failure_result
from zoo_convert.records import PASSED, ConversionResult, ManifestEntry, Settings


def fetch_only(
    entry: ManifestEntry, settings: Settings, *, on_stage: Callable[[str], None] | None = None
) -> ConversionResult:
    """The real fetch stage (cache lookup and vetting), no export: what is measured is Hub traffic."""
    from zoo_convert.stages.fetch import fetch

    try:
        ckpt = fetch(entry, settings)
    except ZooConvertError as exc:
        return failure_result(entry, exc.kind, exc.message, stage="fetch")
    return ConversionResult(source=entry.source, status=PASSED, revision=entry.revision, task=ckpt.task,
                            resolved_revision=ckpt.resolved_revision, exporter=entry.exporter)
