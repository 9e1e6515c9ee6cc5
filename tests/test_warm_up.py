"""Which fork server a run's jobs fork from: the torch exporter is warmed only for a run that has a torch row."""

from __future__ import annotations

from pathlib import Path

import pytest

from zoo_convert.farm.driver import job_settings
from zoo_convert.farm.isolation import WARM_MODULE, WARM_TORCH_MODULE, default_address, preload_for
from zoo_convert.manifest import read_manifest, write_manifest
from zoo_convert.farm.plan import make_plan
from zoo_convert.records import Settings


@pytest.mark.parametrize(
    ("exporters", "preload"),
    [
        (["optimum", "optimum"], WARM_MODULE),
        # auto resolves per model type, mostly to optimum: the driver does not import optimum to tell
        (["optimum", "auto"], WARM_MODULE),
        (["optimum", "torch"], WARM_TORCH_MODULE),
        (["torch"], WARM_TORCH_MODULE),
    ],
)
def test_the_plans_exporters_choose_the_fork_servers_preload(exporters: list[str], preload: str, tmp_path: Path) -> None:
    rows = []
    for i, exporter in enumerate(exporters):
        (tmp_path / f"m{i}").mkdir()
        (tmp_path / f"m{i}" / "config.json").write_text('{"model_type": "bert"}')
        rows.append({"source": str(tmp_path / f"m{i}"), "task": "fill-mask", "exporter": exporter})
    plan = make_plan(read_manifest(write_manifest(rows, tmp_path / "m.parquet")), Settings())
    settings = job_settings(Settings(), [job.entry for job in plan.jobs])
    assert preload_for(settings) == preload
    assert settings.warm_torch_exporter is (preload == WARM_TORCH_MODULE)


def test_the_two_preloads_are_two_servers() -> None:
    """An optimum-only run never connects to (nor starts) the server that warms the torch exporter."""
    assert default_address(WARM_MODULE) != default_address(WARM_TORCH_MODULE)


def test_a_change_anywhere_in_the_package_is_a_new_fork_server() -> None:
    """A warm server runs the code it imported: an edit to a stage (not only to farm/) must not reach an old one."""
    import os

    import zoo_convert.stages.verify as edited

    path = Path(edited.__file__)
    before = path.stat()
    newest = max(p.stat().st_mtime_ns for p in path.parents[1].rglob("*.py"))
    address = default_address.__wrapped__(WARM_MODULE)
    try:
        os.utime(path, ns=(before.st_atime_ns, newest + 10**9))  # saved after every other file of the package
        assert default_address.__wrapped__(WARM_MODULE) != address
    finally:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_a_venvs_python_and_python3_share_one_fork_server() -> None:
    """The CLI's shebang runs ``python3``, scripts often ``python``: both must find the one warm server."""
    import subprocess
    import sys

    bin_dir = Path(sys.executable).parent
    code = "from zoo_convert.farm.isolation import WARM_MODULE, default_address; print(default_address(WARM_MODULE))"
    names = [n for n in ("python", "python3") if (bin_dir / n).exists()]
    assert len(names) == 2, f"{bin_dir} lacks python or python3"
    addresses = {subprocess.run([str(bin_dir / n), "-c", code], capture_output=True, text=True, check=True).stdout for n in names}
    assert len(addresses) == 1
