"""Run a model card's code blocks as its readers would, against the artifact folder it describes.

Each card is given a workspace where its repo id is a folder: ``ROOT/<org>/<name>`` links to the
artifact folder, so ``from_pretrained("org/name", ...)`` in Python (run with ``ROOT`` as its working
directory, offline) and ``pipeline(task, "org/name")`` in transformers.js (``env.localModelPath =
ROOT``, remote models off) load the very files the repo would hold, through the card's own text.

- Python: every ```` ```python ```` block runs as it is; in the optimum block each ``# VARIANT: model = ...``
  line (another variant's load) runs too, after the block's imports.
- JS: every ```` ```js ```` block runs once per ``dtype`` of the card's dtype table.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

JS_DIR = Path(__file__).parent / "js"
_BLOCK = re.compile(r"```(python|js)\n(.*?)```", re.S)
_VARIANT_LOAD = re.compile(r"^# (\w+): (model = .*)$", re.M)
_DTYPE_ROW = re.compile(r"^\| `'(\w+)'` \| `", re.M)


@dataclass(frozen=True)
class Snippet:
    """One piece of a card's code to run: which card, which language, a label (the variant or dtype), the code."""

    repo_id: str
    language: str
    label: str
    code: str


def snippets(card: str, repo_id: str) -> list[Snippet]:
    """Every piece of code the card shows, each as a reader would run it."""
    found: list[Snippet] = []
    for language, code in _BLOCK.findall(card):
        if language == "python":
            found.append(Snippet(repo_id, "python", "as shown", code))
            imports = "\n".join(line for line in code.splitlines() if line.startswith(("from ", "import ")))
            found += [Snippet(repo_id, "python", variant, f"{imports}\n{load}\n")
                      for variant, load in _VARIANT_LOAD.findall(code)]  # fmt: skip
        else:
            dtypes = _DTYPE_ROW.findall(card) or [""]
            shown = re.search(r"dtype: '(\w+)'", code)
            for dtype in dtypes:
                body = code.replace(f"dtype: '{shown.group(1)}'", f"dtype: '{dtype}'") if shown and dtype else code
                found.append(Snippet(repo_id, "js", dtype or "as shown", body))
    return found


def workspace(root: Path, folders: dict[str, str]) -> Path:
    """``root`` with each repo id (``org/name``) a link to its artifact folder."""
    for repo_id, folder in folders.items():
        link = root / repo_id
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            os.symlink(folder, link)
    return root


_PY_RUNNER = r"""
import json, sys, traceback, warnings
warnings.filterwarnings("ignore")
results = []
for s in json.load(open(sys.argv[1])):
    try:
        exec(compile(s["code"], f"<card {s['repo_id']} {s['label']}>", "exec"), {"__name__": "__card__"})
        results.append(None)
    except BaseException as e:  # noqa: BLE001 - the snippet's own failure is the answer
        results.append(f"{type(e).__name__}: {e}"[:600])
json.dump(results, open(sys.argv[2], "w"))
"""


def run_python(root: Path, pieces: list[Snippet], timeout: float = 900) -> list[str | None]:
    """Run the Python snippets in one process with ``root`` as the working directory; each one's error or None."""
    job, out = root / "py-snippets.json", root / "py-results.json"
    job.write_text(json.dumps([p.__dict__ for p in pieces]))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, "-c", _PY_RUNNER, str(job), str(out)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert done.returncode == 0 and out.is_file(), done.stderr[-3000:]
    results: list[str | None] = json.loads(out.read_text())
    return results


_JS_PRELUDE = """import { env } from "@huggingface/transformers";
env.allowRemoteModels = false; // the repo is a local folder: a file it lacks must fail, not be fetched
env.localModelPath = %s;
env.useFSCache = false;
"""


def run_js(node: str, root: Path, pieces: list[Snippet], timeout: float = 120) -> list[str | None]:
    """Run each JS snippet in its own node (a module in tests/js, which has transformers.js); each one's error or None."""
    results: list[str | None] = []
    scratch = JS_DIR / f".card-snippets-{os.getpid()}"
    scratch.mkdir(exist_ok=True)
    try:
        for i, piece in enumerate(pieces):
            module = scratch / f"snippet{i}.mjs"
            module.write_text(_JS_PRELUDE % json.dumps(f"{root}/") + piece.code)
            try:
                done = subprocess.run([node, str(module)], capture_output=True, text=True, timeout=timeout, cwd=root)
            except subprocess.TimeoutExpired:
                results.append(f"timed out after {timeout} s")
                continue
            error = [line for line in done.stderr.splitlines() if "Error" in line]
            results.append(None if done.returncode == 0 else (error[0] if error else done.stderr[-600:]))
    finally:
        for module in scratch.glob("*.mjs"):
            module.unlink()
        scratch.rmdir()
    return results
