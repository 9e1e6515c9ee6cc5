"""Every example of every command's --help and of README.md runs verbatim after `make demo`.

The demo is made as `make demo` makes it (zoo build, run, dashboard), on the models the
examples name, in a folder laid out like a checkout (``manifests/`` and ``.venv`` linked);
each example then runs there through bash, as a user pastes it. The publish example's
dry run asks the local Hub (tests/hubserver.py) through ``HF_ENDPOINT``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from hubserver import HubServer
from zoo_convert.cli import cli

pytestmark = pytest.mark.slow  # the demo starts Ray

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _help_examples(group: click.Group) -> list[str]:
    found = []
    for cmd in group.commands.values():
        if isinstance(cmd, click.Group):
            found += _help_examples(cmd)
        else:
            found += [line.strip() for line in (cmd.help or "").splitlines() if line.strip().startswith("zoo-convert ")]
    return found


def readme_examples(text: str) -> list[str]:
    """The zoo-convert command lines of the README's code blocks, continuation lines joined, comments dropped."""
    found = []
    for block in re.findall(r"^```(?:bash|sh|console)?\n(.*?)^```", text, flags=re.S | re.M):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = re.sub(r"\s+#.*$", "", line.strip())
            if re.match(r"^(\.venv/bin/)?zoo-convert ", line):
                found.append(line)
    return found


def _demo_commands() -> set[str]:
    """The commands `make demo` runs, as the README shows them."""
    make = (ROOT / "Makefile").read_text()
    recipe = make[make.index("\ndemo:"):].split("\n\n")[0]
    return {line.strip().replace("$(BIN)/", "").replace("$(OUT)", "build/demo") for line in recipe.splitlines()[1:]}


EXAMPLES = sorted(set(_help_examples(cli)) | set(readme_examples((ROOT / "README.md").read_text())))


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """A folder that looks like a checkout after `make demo`, and the environment the examples run in."""
    here = tmp_path_factory.mktemp("checkout")
    (here / "manifests").symlink_to(ROOT / "manifests")
    (here / ".venv").symlink_to(BIN.parent)
    models = sorted({"bert", "gpt2", "vit", *(m for e in EXAMPLES for m in re.findall(r"build/demo/zoo/([\w-]+)(?:\s|$)", e))})
    with HubServer() as hub:
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "HF_ENDPOINT": hub.url,
               "HF_HOME": str(here / "hf_home"), "RAY_ADDRESS": "local"}
        env.pop("HF_TOKEN", None)
        for line in (f"zoo-convert zoo build build/demo/zoo --only {','.join(models)}",
                     "zoo-convert run build/demo/zoo/manifest.parquet --db build/demo/results.duckdb"
                     " --out build/demo/artifacts --num-cpus 2",
                     "zoo-convert dashboard --db build/demo/results.duckdb --out build/demo/site"):
            proc = subprocess.run(["bash", "-c", line], cwd=here, env=env, capture_output=True, text=True, timeout=900)
            assert proc.returncode == 0, proc.stdout + proc.stderr
        yield here, env


def test_the_examples_are_found() -> None:
    assert len(EXAMPLES) >= 15, EXAMPLES
    assert any(e.startswith("zoo-convert publish") for e in EXAMPLES)


@pytest.mark.parametrize("example", [e for e in EXAMPLES if e.removeprefix(".venv/bin/") not in _demo_commands()])
def test_the_example_runs_verbatim_after_make_demo(checkout: tuple[Path, dict[str, str]], example: str) -> None:
    here, env = checkout
    if " --serve" in example:  # serves until stopped: it runs when it says where it serves
        with subprocess.Popen(["bash", "-c", f"exec {example}"], cwd=here, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) as proc:
            assert proc.stdout is not None
            deadline, said = time.monotonic() + 120, ""
            while time.monotonic() < deadline and "serving http://" not in said:
                line = proc.stdout.readline()
                if not line:
                    break
                said += line
            proc.terminate()
        assert "serving http://" in said, said
        return
    proc = subprocess.run(["bash", "-c", example], cwd=here, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{example}\n{proc.stdout}\n{proc.stderr}"
