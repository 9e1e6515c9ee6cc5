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
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TargetError, TargetUnsupported
from ..records import JS_DTYPES
from .base import Loaded, Outputs, Ran, cast_feed, graph_input_types
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
PROVIDERS = "onnxruntime-node (cpu, 1 thread)"


class JsLoaded(Loaded):
    """One variant of a folder, run by :meth:`TransformersJs.run_variants` (a node process per call)."""

    def __init__(self, target: TransformersJs, folder: Path, variant: str, files: dict[str, Path]) -> None:
        self.target = target
        self.folder = folder
        self.variant = variant
        self.files = files
        self.providers = PROVIDERS

    def run(self, case: SavedCase) -> Outputs:
        answers, _ = self.run_all([case])
        answer = answers[0]
        if isinstance(answer, TargetError):
            raise answer
        return answer

    def run_all(self, cases: Sequence[SavedCase], *, timed: int = 0) -> tuple[list[Outputs | TargetError], list[float]]:
        ran = self.target.run_variants(self.folder, {self.variant: self.files}, cases, timed=timed)[self.variant]
        if ran.error is not None:
            raise ran.error
        return ran.answers, ran.seconds


def _job(work: Path, folder: Path, variants: Mapping[str, dict[str, Path]], cases: Sequence[SavedCase],
         timed: int) -> dict[str, Any]:  # fmt: skip
    """The runner's job: each variant's dtype and cases, their inputs written once per (case, input, dtype)."""
    (work / "models").mkdir()
    (work / "models" / "model").symlink_to(folder.resolve())
    written: dict[tuple[int, str, str], str] = {}
    jobs: list[dict[str, Any]] = []
    for variant, files in variants.items():
        types = {comp: graph_input_types(path) for comp, path in files.items()}
        out = work / f"out-{len(jobs)}"
        out.mkdir()
        specs: list[dict[str, Any]] = []
        for n, case in enumerate(cases):
            comp_types = types.get(case.component)
            if comp_types is None:
                specs.append({"inputs": [], "outputs": [o.name for o in case.outputs]})
                continue
            inputs: list[dict[str, Any]] = []
            for name, value in cast_feed(case.feed, comp_types, case.component).items():
                value = np.asarray(value, order="C")  # ascontiguousarray would make a scalar 1-d
                key = (n, name, value.dtype.name)
                if key not in written:
                    file = work / f"in-{len(written)}.bin"
                    file.write_bytes(value.astype(np.uint8).tobytes() if value.dtype == np.bool_ else value.tobytes())
                    written[key] = str(file)
                inputs.append({"name": name, "type": _JS_TYPE[value.dtype.name], "dims": list(value.shape),
                               "file": written[key]})  # fmt: skip
            specs.append({"inputs": inputs, "outputs": [o.name for o in case.outputs]})
        jobs.append({"variant": variant, "dtype": JS_DTYPES[variant][0], "cases": specs, "timed": timed, "out": str(out)})
    return {"root": f"{work / 'models'}/", "model": "model", "variants": jobs}


def _ran(answer: dict[str, Any], elapsed: float) -> Ran:
    """One variant's part of the runner's answer."""
    if "error" in answer:
        return Ran(error=TargetError(answer["error"]), providers=PROVIDERS, elapsed=elapsed)
    found: list[Outputs | TargetError] = []
    for case_answer in answer["cases"]:
        if "error" in case_answer:
            found.append(TargetError(f"transformers.js: {case_answer['error']}"))
            continue
        found.append({o["name"]: _read(o) for o in case_answer["outputs"]})
    return Ran(found, None, [float(s) for s in answer.get("seconds", [])], PROVIDERS, elapsed)


def _read(spec: dict[str, Any]) -> np.ndarray:
    data: np.ndarray = np.fromfile(spec["file"], dtype=_TYPES[spec["type"]] if spec["type"] != "bool" else np.uint8)
    return data.reshape(spec["dims"]).astype(np.bool_) if spec["type"] == "bool" else data.reshape(spec["dims"])


class TransformersJs(Target):
    """transformers.js in node, on the onnxruntime-node it ships."""

    name = "transformers.js"

    def __init__(self, node_modules: Path = NODE_MODULES) -> None:
        self.node_modules = Path(node_modules)
        # The model types transformers.js has an architecture for, once :meth:`preload` asked node (None: not asked).
        self.known: frozenset[str] | None = None

    def preload(self) -> None:
        """Ask node once for the model types transformers.js knows (its runner's own test), so a job whose model
        it has no architecture for is ``unsupported`` without starting node (39 of the 138 zoo models)."""
        node = shutil.which("node")
        if node is None or self.version() is None:
            return
        try:
            done = subprocess.run([node, str(RUNNER), str(self.node_modules), "--known"], capture_output=True, text=True,
                                  timeout=TIMEOUT_S, check=True)  # fmt: skip
            self.known = frozenset(json.loads(done.stdout))
        except (OSError, subprocess.SubprocessError, ValueError):
            self.known = None  # every job asks node itself, as without the preload

    def unknown(self, folder: Path) -> str | None:
        """The runner's "no architecture" answer for the folder's model type, when :attr:`known` already says so."""
        if self.known is None:
            return None
        try:
            model_type = json.loads((Path(folder) / "config.json").read_text()).get("model_type")
        except (OSError, ValueError, AttributeError):
            return None  # node reads the config itself and says what is wrong with it
        if not isinstance(model_type, str) or model_type in self.known:
            return None
        return f'transformers.js {self.version()} has no architecture for model type "{model_type}"'

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

    def run_variants(
        self,
        folder: Path,
        variants: Mapping[str, dict[str, Path]],
        cases: Sequence[SavedCase],
        *,
        timed: int = 0,
        doing: Callable[[str], None] | None = None,
        ready: Callable[[Mapping[str, Ran]], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> dict[str, Ran]:
        """Every variant in one node process: node starts, imports transformers.js and reads the config once per job,
        then loads each dtype in turn. The process start is in the first variant's ``elapsed``.

        With ``ready`` (and ``timed``), node keeps every checked model loaded, says READY and waits for a line on its
        stdin, sent once ``ready({})`` returns (node's answers come with its timings, after the phase's go); then it times them (see :meth:`.base.Target.run_variants`). node's own
        per-variant milliseconds run on while the job is paused (node is stopped with it): where they add up to more
        than the job's ``clock`` saw, they are scaled down to it."""
        ran = {v: Ran(error=TargetUnsupported(f"transformers.js has no dtype for variant {v!r}"))
               for v in variants if v not in JS_DTYPES}  # fmt: skip
        known = {v: files for v, files in variants.items() if v in JS_DTYPES}
        if not known:
            return ran
        unknown = self.unknown(folder)
        if unknown is not None:
            return {**ran, **{v: Ran(error=TargetUnsupported(unknown), providers=PROVIDERS) for v in known}}
        if doing is not None:
            doing(",".join(known))
        t0 = clock()
        with tempfile.TemporaryDirectory(prefix="zoo-js-") as tmp:
            work = Path(tmp)
            job = _job(work, Path(folder), known, cases, timed)
            job["park"] = ready is not None and bool(timed)
            (work / "job.json").write_text(json.dumps(job))
            waited = _Waited(ready, clock)
            try:
                answer = self.node_run(work / "job.json", waited if job["park"] else None)
            except TargetError as exc:
                return {**ran, **{v: Ran(error=exc, providers=PROVIDERS, elapsed=clock() - t0) for v in known}}
            if "unsupported" in answer or "error" in answer:
                error = TargetUnsupported(answer["unsupported"]) if "unsupported" in answer else TargetError(answer["error"])
                return {**ran, **{v: Ran(error=error, providers=PROVIDERS) for v in known}}
            total = clock() - t0 - waited.seconds
            own = sum(sum(a.get("ms", {}).values()) for a in answer["variants"]) / 1000
            scale = min(1.0, total / own) if own > 0 else 1.0
            shared = max(0.0, total - own)
            for n, (variant, part) in enumerate(zip(known, answer["variants"], strict=True)):
                own = sum(part.get("ms", {}).values()) / 1000 * scale
                ran[variant] = _ran(part, own + (shared if n == 0 else 0.0))
        return {v: ran[v] for v in variants}

    def node_run(self, job: Path, ready: Callable[[], None] | None = None) -> dict[str, Any]:
        """The runner's answer to ``job``; with ``ready``, called between node's READY line and its timed calls."""
        node = shutil.which("node")
        if node is None:
            raise TargetError("node is not installed")
        with tempfile.TemporaryFile("w+") as err:  # a file: node's warnings never fill a pipe nobody reads yet
            with subprocess.Popen([node, str(RUNNER), str(self.node_modules), str(job)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=err, text=True) as proc:  # fmt: skip
                assert proc.stdin is not None and proc.stdout is not None
                watchdog = threading.Timer(TIMEOUT_S, proc.kill)  # a node that hangs before its first line
                watchdog.start()
                try:
                    first = proc.stdout.readline()
                    watchdog.cancel()
                    if first == "READY\n":  # parked: every model checked and loaded, waiting to be timed
                        first = ""
                        if ready is not None:
                            ready()
                        proc.stdin.write("go\n")
                        proc.stdin.flush()
                    out, _ = proc.communicate(timeout=TIMEOUT_S)
                    out = first + out
                except subprocess.TimeoutExpired as exc:
                    proc.kill()
                    raise TargetError(f"transformers.js did not answer within {TIMEOUT_S:.0f} s") from exc
                except BrokenPipeError:
                    out = first + proc.stdout.read()
                    proc.wait()
            err.seek(0)
            stderr = err.read()
        if proc.returncode != 0:
            tail = stderr.strip().splitlines()[-3:]
            raise TargetError(f"node exited with {proc.returncode}: {' '.join(tail)}")
        try:
            answer: dict[str, Any] = json.loads(out)
        except ValueError as exc:
            raise TargetError(f"transformers.js printed no answer: {out[-300:]}") from exc
        return answer


class _Waited:
    """``ready`` with a clock: the seconds spent in it are no target's own."""

    def __init__(self, ready: Callable[[Mapping[str, Ran]], None] | None, clock: Callable[[], float]) -> None:
        self.ready, self.clock, self.seconds = ready, clock, 0.0

    def __call__(self) -> None:
        t0 = self.clock()
        if self.ready is not None:
            self.ready({})
        self.seconds += self.clock() - t0
