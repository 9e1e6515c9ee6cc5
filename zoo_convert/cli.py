"""The ``zoo-convert`` command line: parse, call the library, one error boundary.

Exit codes: 0 success, 1 a recorded failure (a model that did not convert, a
regression found), 2 bad usage or bad input.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .errors import ZooConvertError
from .records import EXPORTERS, VARIANTS, ManifestEntry, Settings


class _Group(click.Group):
    """Turns library errors into one-line messages instead of tracebacks."""

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except ZooConvertError as exc:
            raise click.UsageError(str(exc)) from exc


@click.group(cls=_Group)
@click.version_option(package_name="zoo_convert")
def cli() -> None:
    """Convert HuggingFace checkpoints to verified ONNX models, at farm scale."""


def _variants(value: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    bad = [v for v in names if v not in VARIANTS]
    if bad or not names:
        raise click.BadParameter(f"unknown variant(s) {bad or value!r}; choose from {', '.join(VARIANTS)}")
    return names


@cli.command()
@click.argument("source")
@click.option("--task", help="optimum task name; inferred from config.architectures when omitted.")
@click.option("--revision", help="hub branch, tag or commit sha.")
@click.option("--opset", type=int, help="ONNX opset; the exporter's default when omitted.")
@click.option("--exporter", type=click.Choice(EXPORTERS), default="optimum", show_default=True)
@click.option("--variants", default=",".join(VARIANTS), show_default=True, help="comma-separated: fp32,fp16,int8")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True, help="artifact folder")
@click.option("--allow-remote-code", is_flag=True, help="let transformers run code shipped with the checkpoint.")
@click.option("--allow-pickle", is_flag=True, help="accept pickle (pytorch_model.bin) weights.")
@click.option("--json", "as_json", is_flag=True, help="print the result record as JSON.")
def convert(
    source: str,
    task: str | None,
    revision: str | None,
    opset: int | None,
    exporter: str,
    variants: str,
    out_dir: str,
    allow_remote_code: bool,
    allow_pickle: bool,
    as_json: bool,
) -> None:
    """Convert one checkpoint (hub id or local folder) and verify it.

    Example:

        zoo-convert convert build/zoo/bert --out build/onnx --variants fp32,int8
    """
    from .pipeline import convert_one
    from .report import summary

    entry = ManifestEntry(
        source=source,
        task=task,
        revision=revision,
        opset=opset,
        exporter=exporter,
        variants=_variants(variants),
        allow_remote_code=allow_remote_code,
        allow_pickle=allow_pickle,
    )
    result = convert_one(entry, Settings(out_dir=out_dir))
    if result.artifacts_dir:
        Path(result.artifacts_dir, "result.json").write_text(result.to_json())
    click.echo(result.to_json() if as_json else summary(result))
    sys.exit(0 if result.passed else 1)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="zoo-convert")
