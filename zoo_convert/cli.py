"""The ``zoo-convert`` command line: parse, call the library, one error boundary.

Exit codes (:data:`EXIT_CODES` maps the library's errors onto them):

* 0 done: the command did what it was asked (``run`` exits 0 whatever the models did).
* 1 a recorded failure (a model that did not convert, a regression found, a model that
  did not publish) or an operational error: the results DB locked, missing or
  unreadable (:class:`~zoo_convert.errors.StoreError`), the Hub unreachable, an unusable
  ``--out``, a ``run`` stopped early because every job met the same fault of the machine
  (:class:`~zoo_convert.errors.MachineFaultError`).
* 2 bad usage: a wrong option or argument (click's own errors,
  :class:`~zoo_convert.errors.UsageError`) or a manifest file that cannot be used
  (:class:`~zoo_convert.errors.ManifestError`); also ``run`` refused because another run
  holds the DB (:class:`~zoo_convert.errors.RunLockedError`): like bad usage, nothing was
  done, and the same command succeeds later or with ``--wait``.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TypeVar

import click

from . import node
from .errors import (
    MachineFaultError,
    ManifestError,
    RunLockedError,
    UsageError,
    ZooConvertError,
    printable,
)
from .farm.hub_budget import Governor, HubLimits
from .records import (
    DEFAULT_OPTIMIZATION,
    DEFAULT_VARIANTS,
    EXPORTERS,
    MAX_OPSET,
    MIN_OPSET,
    OPTIMIZATION_LEVELS,
    PASSED,
    SHAPE_OPTIONS,
    TARGETS,
    VARIANTS,
    ManifestEntry,
    Settings,
    is_task,
)

F = TypeVar("F", bound=Callable[..., object])

# The error boundary's table: library error -> exit code; the first class in the error's MRO wins.
# Anything else from the library (StoreError, FetchError, PublishError, ...) is operational: 1.
EXIT_CODES: dict[type[ZooConvertError], int] = {
    UsageError: 2,
    ManifestError: 2,
    RunLockedError: 2,  # refused before doing anything, as bad usage is: run again later or with --wait
    ZooConvertError: 1,
}


def exit_code(exc: ZooConvertError) -> int:
    """The exit code of a library error that reaches the command line."""
    return next(EXIT_CODES[t] for t in type(exc).__mro__ if t in EXIT_CODES)


class _Group(click.Group):
    """The one error boundary: library errors become one-line messages and exit codes, not tracebacks."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ZooConvertError as exc:
            click.echo(f"Error: {printable(str(exc), 2000)}", err=True)  # as click prints its own errors, on one line
            ctx.exit(exit_code(exc))


@click.group(cls=_Group)
@click.version_option(package_name="zoo_convert")
def cli() -> None:
    """Convert HuggingFace checkpoints to verified ONNX models, at farm scale.

    \b
    Exit codes:
      0  done (`run`: the run completed, whatever the models did)
      1  a recorded failure (a model, a regression), or an operational error:
         the results DB locked or unreadable, the Hub unreachable
      2  bad usage: options, arguments, or a manifest file that cannot be used;
         also `run` refused because another run holds the DB (see --wait)
    """


def _not_nan(param: click.Parameter, value: float) -> float:
    # FloatRange lets NaN through (it compares false with either bound) and inf, which a manifest's timeout_s refuses
    if not math.isfinite(value):
        raise click.BadParameter(f"must be a finite number of seconds, not {value}", param=param)
    return value


def _variants(value: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    bad = [v for v in names if v not in VARIANTS]
    if bad or not names:
        raise click.BadParameter(f"unknown variant(s) {bad or value!r}; choose from {', '.join(VARIANTS)}")
    return names


def _targets(value: str | None) -> tuple[str, ...] | None:
    """``--targets``: comma-separated target names, ``none`` for none; None (not given): every target installed here."""
    if value is None:
        return None
    names = tuple(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    if names == ("none",):
        return ()
    bad = [v for v in names if v not in TARGETS]
    if bad or not names:
        raise click.BadParameter(f"unknown target(s) {bad or value!r}; choose from {', '.join(TARGETS)} (or none)")
    return names


_TARGETS = click.option(
    "--targets", "targets", callback=lambda ctx, param, value: _targets(value),
    help=f"deployment targets each variant is checked on, comma-separated, of {','.join(TARGETS)}; none for none"
         " [default: every target installed on the node; a manifest row's targets column wins]",
)  # fmt: skip


# Shared by convert and run: the cheap compatibility answer (does it export, does ORT match PyTorch?).
_NO_OPTIMIZE = click.option(
    "--no-optimize", is_flag=True,
    help="keep the plain export as the fp32 artifact (no graph fusion), like optimum-cli without --optimize",
)


def _level(ctx: click.Context, param: click.Parameter, value: str) -> str:
    level = value.upper()
    if level == "O4":
        raise click.BadParameter("O4 is optimum's O3 in fp16: here that is the fp16 variant, made from the fp32"
                                 " graph (--variants fp16, a default); pass --optimize O3 for the fp32 graph", param=param)
    if level not in OPTIMIZATION_LEVELS:
        raise click.BadParameter(f"{value!r} is not one of {', '.join(OPTIMIZATION_LEVELS)}", param=param)
    return level


_OPTIMIZE = click.option(
    "--optimize", "optimization", default=DEFAULT_OPTIMIZATION, show_default=True, callback=_level, metavar="O1|O2|O3",
    help="optimization level of the fp32 graph, as optimum-cli's: O1 basic ONNX Runtime optimizations, O2 also the"
         " transformers fusions, O3 also the GELU approximation (kept only where it still matches PyTorch);"
         " optimum's O4 (O3 in fp16) is the fp16 variant. A manifest's optimize column overrides it per row",
)
_NO_BENCHMARK = click.option("--no-benchmark", is_flag=True, help="skip the latency measurement")

_SHAPE_HELP = {
    "batch_size": "batch of the short verify shapes and of the benchmark [default: 1 and 3; 1]",
    "sequence_length": "tokens of the short verify shapes and of the benchmark [default: 7 and 19; 128]",
    "num_choices": "choices of a multiple-choice model's inputs",
    "height": "image height fed at every shape where config.json does not fix image_size, as in optimum"
              " [default: the processor's]",
    "width": "image width, likewise [default: the processor's]",
    "num_channels": "image channels [default: the config's]",
    "audio_sequence_length": "samples of audio of the short verify shapes and of the benchmark"
                             " [default: 1000 per token of the short shapes; 16000]",
    "feature_size": "mel bins of a filterbank model's input [default: the processor's]",
    "nb_max_frames": "mel frames of a whisper-style input [default: the processor's]",
}


def _shape_options(f: F) -> F:
    """optimum-cli's shape options (``--batch-size``, ``--sequence-length``, ...), handed to ``f`` as ``shapes``, ``--atol`` and ``--rtol``."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        given = {name: kwargs.pop(name) for name in SHAPE_OPTIONS}
        return f(*args, shapes={k: v for k, v in given.items() if v is not None}, **kwargs)

    for name in reversed(SHAPE_OPTIONS):
        wrapper = click.option(f"--{name.replace('_', '-')}", name, type=click.IntRange(1), help=_SHAPE_HELP[name])(wrapper)
    wrapper = click.option(
        "--rtol", type=click.FloatRange(0, max=1), callback=_finite, help="the relative part of the fp32 graph's elementwise bound,"
        " |ONNX - PyTorch| <= atol + rtol * |PyTorch| as numpy.allclose [default: 1e-3]; recorded with the result",
    )(wrapper)
    return click.option(
        "--atol", type=click.FloatRange(0, min_open=True), help="the absolute part of the fp32 graph's elementwise"
        " bound: the largest |ONNX - PyTorch| where PyTorch's value is near zero [default: 1e-4]; recorded with the result",
    )(wrapper)  # type: ignore[return-value]


def _finite(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """A bound must be a number: NaN passes click's range check (every comparison with it is false)."""
    if value is not None and value != value:
        raise click.BadParameter("must be a number, not nan", ctx=ctx, param=param)
    return value


def _with_atol(settings: Settings, atol: float | None, rtol: float | None = None) -> Settings:
    """``settings`` with the fp32 tolerance's max_abs replaced by ``atol`` and its rtol by ``rtol``, where given."""
    if atol is None and rtol is None:
        return settings
    from dataclasses import replace

    fp32 = settings.tolerances["fp32"]
    fp32 = replace(fp32, max_abs=fp32.max_abs if atol is None else atol, rtol=fp32.rtol if rtol is None else rtol)
    return replace(settings, tolerances={**settings.tolerances, "fp32": fp32})
_NO_LONG_SHAPE = click.option(
    "--no-long-shape", is_flag=True,
    help="verify at the two short shapes only, not also at the length the model is used at (README: verify)",
)
_NO_GENERATION = click.option(
    "--no-generation", is_flag=True,
    help="do not run a decoder's 16 greedy generation steps on ORT's own cache against PyTorch generate()",
)


# Every Hub request of the command (and of a run's workers) draws from this budget.
_HUB_REQUESTS = click.option("--hub-requests-per-5min", type=click.IntRange(1), default=HubLimits.api, show_default=True,
                             help="Hub API requests per 5 minutes, for the whole run (the token's limit)")
_HUB_DOWNLOADS = click.option("--hub-downloads-per-5min", type=click.IntRange(1), default=HubLimits.resolvers,
                              show_default=True,
                              help="Hub file downloads (/resolve/) per 5 minutes, for the whole run")


def _hub_budget(requests_per_5min: int, downloads_per_5min: int = HubLimits.resolvers) -> AbstractContextManager[Governor]:
    """The command's Hub requests paced by one budget while it runs."""
    from .farm.hub_budget import LocalGovernor, governing

    return governing(LocalGovernor(HubLimits(api=requests_per_5min, resolvers=downloads_per_5min)))


def _known_task(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An optimum task name (a manifest's task column's check), refused before anything is fetched."""
    if value is not None and not is_task(value):
        raise click.BadParameter(f"{value!r} is not an optimum task (e.g. fill-mask, text-generation-with-past)")
    return value


@cli.command()
@click.argument("source")
@click.option("--task", callback=_known_task, help="optimum task name; inferred from config.architectures when omitted.")
@click.option("--revision", help="hub branch, tag or commit sha.")
@click.option("--opset", type=click.IntRange(MIN_OPSET, MAX_OPSET), help="ONNX opset; the exporter's default when omitted.")
@click.option("--exporter", type=click.Choice(EXPORTERS), default="optimum", show_default=True)
@click.option("--variants", default=",".join(DEFAULT_VARIANTS), show_default=True,
              help=f"comma-separated, of {','.join(VARIANTS)} ({' and '.join(v for v in VARIANTS if v not in DEFAULT_VARIANTS)} are opt-in).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True, help="artifact folder")
@click.option("--allow-remote-code", "--trust-remote-code", "allow_remote_code", is_flag=True,
              help="let transformers run code shipped with the checkpoint.")
@click.option("--allow-pickle", is_flag=True, help="accept pickle (pytorch_model.bin) weights.")
@_OPTIMIZE
@_NO_OPTIMIZE
@_NO_BENCHMARK
@_NO_LONG_SHAPE
@_NO_GENERATION
@_shape_options
@click.option("--threads", type=click.IntRange(1),
              help="intra-op threads of PyTorch and ONNX Runtime in verify and the latency measurement"
                   " [default: the CPUs this process may use; a farm job uses 1]")
@_TARGETS
@_HUB_REQUESTS
@_HUB_DOWNLOADS
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
    optimization: str,
    no_optimize: bool,
    no_benchmark: bool,
    no_long_shape: bool,
    no_generation: bool,
    shapes: dict[str, int],
    atol: float | None,
    rtol: float | None,
    threads: int | None,
    targets: tuple[str, ...] | None,
    hub_requests_per_5min: int,
    hub_downloads_per_5min: int,
    as_json: bool,
) -> None:
    """Convert one checkpoint (hub id or local folder) and verify it.

    Example:

    \b
        zoo-convert convert build/demo/zoo/bert --out build/onnx --variants fp32,int8
        zoo-convert convert build/demo/zoo/bert --out build/onnx --no-optimize --no-benchmark --optimize O1
    """
    from .dashboard.report import summary
    from .pipeline import convert_one, quiet_libraries, toolchain_frozen

    quiet_libraries()

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
    settings = Settings(
        out_dir=out_dir,
        optimize=not no_optimize,
        optimization=optimization,
        benchmark=not no_benchmark,
        verify_long=not no_long_shape,
        verify_generation=not no_generation,
        # One model on this machine, as optimum-cli runs it; the farm packs one job per CPU instead.
        threads=threads or node.usable_cpus(),
        shapes=shapes,
        targets=targets,
    )
    settings = _with_atol(settings, atol, rtol)
    with _hub_budget(hub_requests_per_5min, hub_downloads_per_5min), _stdout_to_stderr(), \
            toolchain_frozen() as on_stage:  # fmt: skip
        result = convert_one(entry, settings, on_stage=on_stage, alone=_own_process)
    if result.artifacts_dir:
        Path(result.artifacts_dir, "result.json").write_text(result.to_json())
    click.echo(result.to_json() if as_json else summary(result))
    global _nothing_left_to_write
    _nothing_left_to_write = True
    sys.exit(0 if result.passed else 1)


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """While converting, whatever is printed to stdout goes to stderr: stdout carries the result alone.

    At the file-descriptor level, as torch's exporter prints its graph dumps from C++.
    """
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        ctypes.CDLL(None).fflush(None)  # C stdio's buffer, before fd 1 is the real stdout again
        os.dup2(saved, 1)
        os.close(saved)


@cli.group()
def zoo() -> None:
    """The bundled tiny zoo of random checkpoints used by the demo and the tests."""


@zoo.command("build")
@click.argument("out_dir", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--only", help="comma-separated model names to build (default: all).")
def zoo_build(out_dir: str, only: str | None) -> None:
    """Build tiny seeded checkpoints and DIR/manifest.parquet.

    Example:

    \b
        zoo-convert zoo build build/zoo --only bert,gpt2,vit
    """
    from . import zoo as zoo_lib
    from .pipeline import quiet_libraries

    quiet_libraries()  # building a model imports transformers' modules; their deprecation chatter is not the zoo's
    names = [n.strip() for n in only.split(",") if n.strip()] if only else None
    manifest = zoo_lib.build(out_dir, names)
    click.echo(f"built {len(zoo_lib.select(names))} models; manifest: {manifest}")


DEFAULT_DB = "results.duckdb"


def _db_option(help: str, *, exists: bool = False) -> Callable[[F], F]:
    """--db, with one default in every command."""
    return click.option("--db", "db_path", type=click.Path(dir_okay=False, exists=exists), default=DEFAULT_DB,
                        show_default=True, help=help)


_DB_OPTION = _db_option("the farm's results database (opened read-only)")


@cli.group()
def db() -> None:
    """Read the compatibility database (read-only but for migrate; waits while a farm run holds it)."""


@db.command("status")
@_DB_OPTION
def db_status(db_path: str) -> None:
    """Show the latest run at a glance.

    Example:

    \b
        zoo-convert db status --db build/demo/results.duckdb
    """
    from .store import ResultStore
    from .store.queries import format_status, status

    info = status(ResultStore(db_path, read_only=True))
    click.echo(format_status(info) if info else "no runs yet")


@db.command("regressions")
@_DB_OPTION
@click.option("--since", help="list regressions in every run after this run (name or id) or from this date on"
              " (YYYY-MM-DD, UTC); default: the latest run only")
def db_regressions(db_path: str, since: str | None) -> None:
    """List regressions; exits 1 when there are any (a CI gate).

    Example:

    \b
        zoo-convert db regressions --db build/demo/results.duckdb
        zoo-convert db regressions --db build/demo/results.duckdb --since 2026-01-01
    """
    from .store import ResultStore
    from .store.queries import format_table, regressions

    columns, rows = regressions(ResultStore(db_path, read_only=True), since)
    if not rows:
        click.echo("no regressions")
        return
    click.echo(format_table(columns, rows))
    sys.exit(1)


@db.command("query")
@_DB_OPTION
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json", "markdown"]), default="table",
              show_default=True, help="table cuts long cells to fit a terminal; csv, json and markdown never cut")
@click.argument("sql")
def db_query(db_path: str, fmt: str, sql: str) -> None:
    """Run one SQL statement against the database.

    Example:

    \b
        zoo-convert db query --db build/demo/results.duckdb "SELECT * FROM compat_matrix WHERE pass_rate < 1"
        zoo-convert db query --db build/demo/results.duckdb --format json "SELECT source, message FROM latest_results WHERE status = 'failed'"
    """
    from .store import ResultStore
    from .store.queries import FORMATS, query

    columns, rows = query(ResultStore(db_path, read_only=True), sql, untrusted=True)
    if columns:
        click.echo(FORMATS[fmt](columns, rows))


@db.command("migrate")
@_db_option("the farm's results database", exists=True)
def db_migrate(db_path: str) -> None:
    """Bring the database's schema up to this zoo_convert's, as the next run on it would.

    The readers (db status, regressions, query, export, the dashboard) open it read-only and refuse a schema
    older than theirs: after an upgrade, this (or the next run) migrates it. Migrations only add: columns,
    tables and views made again.

    Example:

    \b
        zoo-convert db migrate --db build/demo/results.duckdb
    """
    from .store import ResultStore
    from .store.schema import LATEST_VERSION

    found = ResultStore(db_path).found_version
    if found > LATEST_VERSION:  # a newer zoo_convert wrote it: nothing here to apply
        click.echo(f"{db_path}: schema version {found}, newer than this zoo_convert's {LATEST_VERSION}: nothing to do")
    else:
        click.echo(f"{db_path}: schema version {LATEST_VERSION}" + (f" (was {found})" if found < LATEST_VERSION else " (already the latest)"))


@db.command("export")
@_DB_OPTION
@click.argument("out_dir", type=click.Path(file_okay=False))
def db_export(db_path: str, out_dir: str) -> None:
    """Write every table and view as Parquet files into OUT_DIR.

    Example:

    \b
        zoo-convert db export --db build/demo/results.duckdb build/parquet
    """
    from .store import ResultStore
    from .store.queries import export_parquet

    for path in export_parquet(ResultStore(db_path, read_only=True), out_dir):
        click.echo(path)


@cli.command()
@_db_option("the results database (opened read-only)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True, help="folder for the site")
@click.option("--serve", "serve_it", is_flag=True, help="serve the site on 127.0.0.1 after building it")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="0 picks a free port")
def dashboard(db_path: str, out_dir: str, serve_it: bool, port: int) -> None:
    """Build the static, offline dashboard of a results database.

    Example:

    \b
        zoo-convert dashboard --db build/demo/results.duckdb --out build/demo/site --serve
    """
    from .dashboard.site import build_site, serve

    index = build_site(db_path, out_dir)
    click.echo(f"wrote {index}")
    if serve_it:
        server = serve(out_dir, port=port)
        click.echo(f"serving http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            server.server_close()


@cli.command()
@_db_option("the results database", exists=True)
@click.option("--run", default="latest", show_default=True, help="run to publish: its name (run --name), its id, or 'latest'")
@click.option("--namespace", required=True, help="Hub user or organisation that receives the repos")
@click.option("--repo-template", default="{namespace}/{name}-ONNX", show_default=True,
              help="repo id pattern; fields: namespace, name, owner, model_type, exporter, opset, revision")
@click.option("--only", help="comma-separated: publish only the models with this source, name or manifest tag")
@click.option("--where", help="SQL condition on the run's `results` rows (one per variant): publish the models"
              " with a matching row, e.g. \"model_type = 'bert'\"")
@click.option("--endpoint", envvar="HF_ENDPOINT", help="Hub URL (default: $HF_ENDPOINT, else huggingface.co)")
@click.option("--dry-run", is_flag=True, help="report what would be uploaded; create and upload nothing")
@click.option("--private", is_flag=True, help="create new repos private")
@click.option("--include-failed", is_flag=True, help="also publish models whose verification failed")
@click.option("--token", help="Hub write token (default: $HF_TOKEN, else the huggingface-cli login)")
@click.option("--hub-commits-per-hour", type=click.IntRange(1), default=128, show_default=True,
              help="commits the token may make per hour; the rest is deferred to the next publish")
@click.option("--max-time", "max_time_s", type=click.FloatRange(0, min_open=True), default=3600.0, show_default=True,
              callback=lambda ctx, param, value: _not_nan(param, value),
              help="seconds the whole publish may take: past it no model is started (the rest is deferred to the"
                   " next publish) and no Hub retry is waited for")
@_HUB_REQUESTS
def publish(
    db_path: str,
    run: str,
    namespace: str,
    repo_template: str,
    only: str | None,
    where: str | None,
    endpoint: str | None,
    dry_run: bool,
    private: bool,
    include_failed: bool,
    token: str | None,
    hub_commits_per_hour: int,
    max_time_s: float,
    hub_requests_per_5min: int,
) -> None:
    """Push every verified model of a run to the Hub: one repo and one commit each, nothing when unchanged.

    Models an earlier publish deferred (its commit or time budget was spent) go first, oldest first.
    The token is checked once before anything is sent; a Hub that cannot be reached stops the
    publish at once. Exits 1 when a model failed to publish or two models target one repo.

    Example:

    \b
        zoo-convert publish --db build/demo/results.duckdb --namespace my-org --dry-run
        zoo-convert publish --db build/demo/results.duckdb --namespace my-org --dry-run --only bert,gpt2
        zoo-convert publish --db build/demo/results.duckdb --namespace my-org --dry-run --where "model_type = 'vit'"
    """
    from huggingface_hub import get_token

    from .errors import UsageError
    from .publish import PublicationStatus, PublishOptions, publish_run, select
    from .store import ResultStore, queries

    token = token or get_token()
    if token is None and not dry_run:
        raise UsageError("no Hub token: pass --token, set HF_TOKEN or run `huggingface-cli login`")
    options = PublishOptions(namespace=namespace, repo_template=repo_template, endpoint=endpoint, private=private,
                             dry_run=dry_run, include_failed=include_failed, commits_per_hour=hub_commits_per_hour,
                             max_time_s=max_time_s, only=tuple(o.strip() for o in (only or "").split(",") if o.strip()),
                             where=where)
    store = ResultStore(db_path, read_only=dry_run)
    click.echo(f"{'would publish' if dry_run else 'publishing'} {select(store, queries.find_run(store, run), options).describe()}")
    with _hub_budget(hub_requests_per_5min):
        pubs = publish_run(store, options, run=run, token=token)
    for p in pubs:
        click.echo(f"{p.status:<10} {p.repo_id:<50} {p.uploaded_files} file(s), {p.uploaded_bytes / 1e6:.1f} MB  "
                   f"{p.message or p.commit_url or ''}")
    click.echo(", ".join(f"{s} {sum(p.status == s for p in pubs)}" for s in sorted({p.status for p in pubs})) or "nothing to publish")
    sys.exit(1 if any(p.status in (PublicationStatus.FAILED, PublicationStatus.CONFLICT) for p in pubs) else 0)


@cli.command()
@click.argument("manifest_path", metavar="MANIFEST", type=click.Path(dir_okay=False, exists=True))
@_db_option("the results database (created if missing)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True, help="artifact folder every node sees")
@click.option("--address", help="Ray cluster: auto or ray://HOST:10001 (default: start a local instance)")
@click.option("--num-cpus", type=click.IntRange(1), help="CPUs of the local Ray instance (default: all)")
@click.option("--max-in-flight", type=click.IntRange(1), help="jobs submitted at once (default: twice the cluster's CPUs)")
@click.option("--force", is_flag=True, help="rerun every job, even those with a result")
@click.option("--retry-failed", is_flag=True, help="rerun jobs whose latest result failed")
@click.option("--max-attempts", type=click.IntRange(1), default=3, show_default=True, help="runs per job on transient failures")
@click.option("--timeout", "timeout_s", type=click.FloatRange(0, min_open=True), default=600.0, show_default=True,
              callback=lambda ctx, param, value: _not_nan(param, value), help="default hard timeout per job, seconds")
@click.option("--wait", is_flag=True, help="when another run holds the DB, wait for it to finish instead of stopping")
@click.option("--offline", is_flag=True, help="never touch the Hub (use the local cache)")
@click.option("--hf-endpoint", envvar="HF_ENDPOINT", help="Hub URL the workers fetch from (default: $HF_ENDPOINT)")
@click.option("--hf-cache", envvar="HF_HUB_CACHE", help="Hub cache every node sees (default: $HF_HUB_CACHE)")
@_OPTIMIZE
@_NO_OPTIMIZE
@_NO_BENCHMARK
@click.option("--bench-lanes", type=click.IntRange(1),
              help="benchmarks a node times at once, each pinned to CPUs of its own (default: its CPUs; 1: one at a time)")
@_NO_LONG_SHAPE
@_NO_GENERATION
@_shape_options
@click.option("--name", help="a unique name for this run, usable wherever a run id is (db regressions --since NAME)")
@_TARGETS
@_HUB_REQUESTS
@_HUB_DOWNLOADS
def run(
    manifest_path: str,
    db_path: str,
    out_dir: str,
    address: str | None,
    num_cpus: int | None,
    max_in_flight: int | None,
    force: bool,
    retry_failed: bool,
    max_attempts: int,
    timeout_s: float,
    wait: bool,
    offline: bool,
    hf_endpoint: str | None,
    hf_cache: str | None,
    optimization: str,
    no_optimize: bool,
    no_benchmark: bool,
    bench_lanes: int | None,
    no_long_shape: bool,
    no_generation: bool,
    shapes: dict[str, int],
    atol: float | None,
    rtol: float | None,
    name: str | None,
    targets: tuple[str, ...] | None,
    hub_requests_per_5min: int,
    hub_downloads_per_5min: int,
) -> None:
    """Convert every job of a Parquet manifest on Ray and record each result in DuckDB.

    Jobs already answered in the DB (same checkpoint, settings and toolchain) are
    skipped; rerunning an interrupted run finishes the rest. Exits 0 when the run
    completed, whatever the models did; 1 when it stopped early because every job met
    the same fault of the machine (a full disk, lost workers), which the next run redoes. One run per DB: a second one stops at
    once, saying which run holds it (or waits, with --wait).

    Example:

    \b
        zoo-convert run build/demo/zoo/manifest.parquet --db build/demo/results.duckdb --out build/demo/artifacts
        zoo-convert run build/demo/zoo/manifest.parquet --db build/demo/results.duckdb --out build/demo/artifacts --retry-failed
    """
    from .farm.driver import FarmOptions, run_farm

    # Hub settings travel in Settings: workers on other nodes do not see the driver's environment.
    settings = Settings(
        out_dir=str(Path(out_dir).resolve()),
        timeout_s=timeout_s,
        offline=offline,
        hf_endpoint=hf_endpoint,
        hf_cache=hf_cache,
        optimize=not no_optimize,
        optimization=optimization,
        benchmark=not no_benchmark,
        verify_long=not no_long_shape,
        verify_generation=not no_generation,
        shapes=shapes,
        targets=targets,
    )
    settings = _with_atol(settings, atol, rtol)
    options = FarmOptions(
        address=address,
        num_cpus=num_cpus,
        max_in_flight=max_in_flight,
        force=force,
        retry_failed=retry_failed,
        max_attempts=max_attempts,
        hub_limits=HubLimits(api=hub_requests_per_5min, resolvers=hub_downloads_per_5min),
        wait=wait,
        bench_lanes=bench_lanes,
    )
    report = run_farm(manifest_path, db_path=db_path, settings=settings, options=options, name=name)
    if report.stopped:
        raise MachineFaultError(report.stopped)


@cli.command("verify-target")
@click.argument("folders", metavar="FOLDER...", nargs=-1, required=True, type=click.Path(file_okay=False, exists=True))
@click.option("--target", "target_names", required=True, callback=lambda ctx, param, value: _targets(value),
              help=f"comma-separated, of {','.join(TARGETS)}")
@click.option("--variants", help="comma-separated variants to check [default: every variant the folder has]")
@click.option("--json", "as_json", is_flag=True, help="print one JSON record per folder, variant and target.")
def verify_target(folders: tuple[str, ...], target_names: tuple[str, ...], variants: str | None, as_json: bool) -> None:
    """Re-check artifact folders on deployment targets from their saved reference: no PyTorch, no checkpoint.

    What a user runs after upgrading a runtime, or on a GPU node that never converted anything. Reads
    FOLDER/reference/ (written by every conversion) and prints one line per folder, variant and target; exits 1
    when any of them did not pass. A folder without a saved reference is reported and the others still run.

    Example:

    \b
        zoo-convert verify-target build/demo/artifacts/zoo__bert/optimum-* --target openvino
        zoo-convert verify-target build/demo/artifacts/zoo__bert/optimum-* --target ort-cpu,transformers.js --variants fp32,int8
        zoo-convert verify-target build/demo/artifacts/zoo__bert/optimum-* build/demo/artifacts/zoo__vit/optimum-* --target ort-cpu --json
    """
    import dataclasses
    import json

    from . import targets as registry

    chosen = _variants(variants) if variants else None
    everything_passed = True
    for folder in folders:
        try:
            rows = [r for name in target_names for r in registry.check_folder(Path(folder), name, chosen)]
        except ValueError as exc:
            if len(folders) == 1:
                raise UsageError(str(exc)) from exc
            click.echo(f"{folder}: {exc}", err=True)  # one unreadable folder never hides the others' rows
            everything_passed = False
            continue
        everything_passed = everything_passed and bool(rows) and all(r.status == PASSED for r in rows)
        if len(folders) > 1 and not as_json:
            click.echo(folder)
        for r in rows:
            if as_json:
                record = {k: v for k, v in dataclasses.asdict(r).items() if k != "checks"}
                click.echo(json.dumps({"folder": folder, **record}, default=str))
                continue
            numbers = (f"max abs {r.max_abs:.3g}, cosine {r.min_cosine:.6f}" if r.max_abs is not None and r.min_cosine is not None
                       else "")  # fmt: skip
            latency = f", {r.latency_ms:.3g} ms" if r.latency_ms is not None else ""
            click.echo(f"{r.target:<16} {r.version or '-':<10} {r.variant:<6} {r.status:<12} {numbers}{latency}"
                       f"{'  ' + r.message if r.message else ''}")  # fmt: skip
    sys.exit(0 if everything_passed else 1)


@cli.group()
def manifest() -> None:
    """Check and build Parquet manifests."""


@manifest.command("validate")
@click.argument("path", metavar="FILE", type=click.Path(dir_okay=False))
def manifest_validate(path: str) -> None:
    """Print every bad row with its number and reason; exit 1 if there is any.

    Example:

    \b
        zoo-convert manifest validate manifests/hub_examples.parquet
    """
    from .manifest import read_manifest

    m = read_manifest(path)
    for warning in m.warnings:
        click.echo(f"warning: {printable(str(warning), 1000)}", err=True)
    for problem in m.problems:
        click.echo(printable(str(problem), 1000))  # a row's values are anyone's: no control character reaches the terminal
    if m.duplicates_summary:
        click.echo(f"warning: {m.duplicates_summary}", err=True)
    click.echo(f"{m.rows} rows, {len(m.entries)} jobs, {len(m.problems)} problems", err=True)
    sys.exit(1 if m.problems else 0)


@manifest.command("from-csv")
@click.argument("csv_path", metavar="CSV", type=click.Path(dir_okay=False, exists=True))
@click.argument("out_path", metavar="OUT", type=click.Path(dir_okay=False))
def manifest_from_csv(csv_path: str, out_path: str) -> None:
    """Build a manifest of hub ids from a CSV of model_id and, where it has them, task, revision, library.

    Every row gets the checks `manifest validate` makes (and duplicates): a row that fails one is
    dropped, said on stderr with its CSV row number, never written (none usable: exit 2, no file). Also copied where present:
    exporter, optimize; model_type becomes a model_type: tag (for `manifest coverage`).

    Example:

    \b
        zoo-convert manifest from-csv manifests/hub_model_ids_sample.csv build/hub_sample.parquet
    """
    from .manifest import manifest_from_csv as build

    written, dropped = build(csv_path, out_path)
    for reason in dropped:
        click.echo(f"dropped {reason}", err=True)
    click.echo(f"wrote {written} rows to {out_path} ({len(dropped)} dropped)")


@manifest.command("coverage")
@click.argument("path", metavar="MANIFEST", type=click.Path(dir_okay=False, exists=True))
@click.option("--rows", "per_row", is_flag=True, help="also print every row: number, path (yes/no/?), library, model type, task, source, why")
@click.option("--top", type=click.IntRange(min=0), default=15, show_default=True, help="model types without a path to list")
@click.option("--exporter", type=click.Choice(["optimum", "torch", "auto"]), default=None,
              help="count what this exporter would convert, instead of each row's own (auto: optimum where it has a "
              "config, the torch exporter's generic path otherwise)")
def manifest_coverage(path: str, per_row: bool, top: int, exporter: str | None) -> None:
    """Say how much of a manifest the farm has a conversion path for, by library and model type, weighted by rows.

    Local rows are read from their config.json; hub rows from their model_type: and library: tags
    (or model_type / library columns); nothing is asked of the Hub.

    Example:

    \b
        zoo-convert manifest coverage manifests/hub_examples.parquet
        zoo-convert manifest coverage manifests/hub_examples.parquet --exporter auto
    """
    from .coverage import manifest_coverage as cover
    from .coverage import summary

    rows = cover(path, exporter)
    if per_row:
        for r in rows:
            mark = {True: "yes", False: "no", None: "?"}[r.path]
            click.echo("\t".join([str(r.row), mark, r.library, r.model_type or "", r.task or "", r.source, r.reason]))
    for line in summary(rows, top):
        click.echo(line)


# Set by main(): this process is the console script's own, which a command may shape to its one job (convert);
# a caller's process (a test's CliRunner, a library user's) is left as it is.
_own_process = False

# Set by a command once everything it writes is written and closed (convert): main() then
# exits without Python's teardown of torch, transformers and onnxruntime, object by
# object and module by module, which nothing needs (1.0-1.2 s on 2 cores, measured).
_nothing_left_to_write = False


def main() -> None:
    """Console-script entry point."""
    global _own_process
    _own_process = True
    node.one_blas_thread(os.environ)  # before any command imports numpy
    node.no_triton()  # before any command imports torch
    try:
        cli(prog_name="zoo-convert")
    except SystemExit as done:
        if _nothing_left_to_write:
            atexit._run_exitfuncs()  # what libraries registered (temporary folders, logging) still runs
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(done.code if isinstance(done.code, int) else 1)
        raise


if __name__ == "__main__":  # ``python -m zoo_convert.cli``: a checkout on a node where nothing was installed (a GPU node re-checking)
    main()
