"""``transformers.js``: the pinned @huggingface/transformers in node, loading the artifact folder as its users do.

``AutoModel.from_pretrained(folder, {dtype})`` picks the variant's files by its own dtype names
(``records.JS_DTYPES``: int8 is ``q8``), and each saved case runs on the session it loaded for
that graph (matched by input and output names). A model type transformers.js has no architecture
for is ``unsupported``, apart from a failure. The runner is ``transformers_js.mjs`` beside this
module; transformers.js comes from a ``node_modules`` folder (the repository's tests/js, which
``make node-deps`` fills from its package-lock).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TargetError, TargetUnsupported
from ..records import JS_DTYPES
from .base import Loaded, Outputs, cast_feed, graph_input_types
from .base import Target as Target
from .reference import SavedCase

RUNNER = Path(__file__).with_name("transformers_js.mjs")
# The repository's pinned install (tests/js/package-lock.json, `make node-deps`).
NODE_MODULES = Path(__file__).resolve().parents[2] / "tests" / "js" / "node_modules"
PACKAGE = Path("@huggingface") / "transformers"
_TYPES = {"float32": np.float32, "float16": np.float16, "float64": np.float64, "int64": np.int64, "int32": np.int32,
          "int8": np.int8, "uint8": np.uint8, "bool": np.bool_}  # fmt: skip
_JS_TYPE = {np.dtype(v).name: k for k, v in _TYPES.items()}
TIMEOUT_S = 600.0


class JsLoaded(Loaded):
    """A folder and dtype for one node process that loads them and runs every case (node starts once per variant)."""

    def __init__(self, target: TransformersJs, folder: Path, variant: str, files: dict[str, Path]) -> None:
        self.target = target
        self.folder = folder
        self.dtype = JS_DTYPES[variant][0]
        self.types = {comp: graph_input_types(path) for comp, path in files.items()}
        self.providers = "onnxruntime-node (cpu)"

    def run(self, case: SavedCase) -> Outputs:
        answers, _ = self.run_all([case])
        answer = answers[0]
        if isinstance(answer, TargetError):
            raise answer
        return answer

    def run_all(self, cases: Any, *, timed: int = 0) -> tuple[list[Outputs | TargetError], list[float]]:
        with tempfile.TemporaryDirectory(prefix="zoo-js-") as tmp:
            work = Path(tmp)
            (work / "models").mkdir()
            (work / "models" / "model").symlink_to(self.folder.resolve())
            specs = []
            for n, case in enumerate(cases):
                types = self.types.get(case.component)
                if types is None:
                    specs.append({"inputs": [], "outputs": [o.name for o in case.outputs]})
                    continue
                inputs: list[dict[str, Any]] = []
                for name, value in cast_feed(case.feed, types, case.component).items():
                    value = np.asarray(value, order="C")  # ascontiguousarray would make a scalar 1-d
                    file = work / f"in-{n}-{len(inputs)}.bin"
                    file.write_bytes(value.astype(np.uint8).tobytes() if value.dtype == np.bool_ else value.tobytes())
                    inputs.append({"name": name, "type": _JS_TYPE[value.dtype.name], "dims": list(value.shape),
                                   "file": str(file)})  # fmt: skip
                specs.append({"inputs": inputs, "outputs": [o.name for o in case.outputs]})
            job = {"root": f"{work / 'models'}/", "model": "model", "dtype": self.dtype, "cases": specs,
                   "timed": timed, "out": str(work)}  # fmt: skip
            (work / "job.json").write_text(json.dumps(job))
            answer = self.target.node_run(work / "job.json")
            if "unsupported" in answer:
                raise TargetUnsupported(answer["unsupported"])
            if "error" in answer:
                raise TargetError(answer["error"])
            found: list[Outputs | TargetError] = []
            for case_answer in answer["cases"]:
                if "error" in case_answer:
                    found.append(TargetError(f"transformers.js: {case_answer['error']}"))
                    continue
                found.append({o["name"]: _read(o) for o in case_answer["outputs"]})
            return found, [float(s) for s in answer.get("seconds", [])]


def _read(spec: dict[str, Any]) -> np.ndarray:
    data: np.ndarray = np.fromfile(spec["file"], dtype=_TYPES[spec["type"]] if spec["type"] != "bool" else np.uint8)
    return data.reshape(spec["dims"]).astype(np.bool_) if spec["type"] == "bool" else data.reshape(spec["dims"])


class TransformersJs(Target):
    """transformers.js in node, on the onnxruntime-node it ships."""

    name = "transformers.js"

    def __init__(self, node_modules: Path = NODE_MODULES) -> None:
        self.node_modules = Path(node_modules)

    def _package(self) -> Path:
        return self.node_modules / PACKAGE

    def version(self) -> str | None:
        try:
            return str(json.loads((self._package() / "package.json").read_text())["version"])
        except (OSError, ValueError, KeyError):
            return None

    def unavailable(self) -> str | None:
        if shutil.which("node") is None:
            return f"{self.name}: node is not installed on this node"
        if self.version() is None:
            return f"{self.name}: @huggingface/transformers is not installed in {self.node_modules} (`make node-deps`)"
        return None

    def load(self, folder: Path, variant: str, files: dict[str, Path]) -> Loaded:
        if variant not in JS_DTYPES:
            raise TargetUnsupported(f"transformers.js has no dtype for variant {variant!r}")
        return JsLoaded(self, Path(folder), variant, files)

    def node_run(self, job: Path) -> dict[str, Any]:
        node = shutil.which("node")
        if node is None:
            raise TargetError("node is not installed")
        try:
            done = subprocess.run([node, str(RUNNER), str(self.node_modules), str(job)], capture_output=True,
                                  text=True, timeout=TIMEOUT_S)  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise TargetError(f"transformers.js did not answer within {TIMEOUT_S:.0f} s") from exc
        if done.returncode != 0:
            tail = done.stderr.strip().splitlines()[-3:]
            raise TargetError(f"node exited with {done.returncode}: {' '.join(tail)}")
        try:
            answer: dict[str, Any] = json.loads(done.stdout)
        except ValueError as exc:
            raise TargetError(f"transformers.js printed no answer: {done.stdout[-300:]}") from exc
        return answer
