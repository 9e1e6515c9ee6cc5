"""Real-size checkpoints: ``zoo-convert convert`` against ``optimum-cli export onnx --optimize O2``, side by side.

Checkpoints (built at run time into ``build/realsize/ckpt`` and reused by later
runs; see ``_realsize.py``): the real all-MiniLM-L6-v2, and random weights with
the real configurations of bert-base-uncased, gpt2 (124M, exported with past),
t5-small, vit-base-patch16-224, whisper-tiny, and a 2.28 GB llama-style decoder
in three safetensors shards (``llama-2g``); and three timm models, resnet50,
vit_base_patch16_224 (``vit-base-timm``) and convnext_tiny, timm's own
configurations with a seeded fresh init, saved as ``timm.models.save_for_hf``
writes a Hub checkpoint.

Part 1, per model, one after another (never two heavy processes at once), each
command timed end to end with its process tree's memory sampled from /proc:

* ``optimum``: ``optimum-cli export onnx --task T --optimize O2`` (export, fuse,
  validate at one shape). A timm model is named by a Hub id and read from a private
  Hugging Face cache, offline, whose snapshot links to the same folder: optimum loads
  timm with ``create_model("hf_hub:<id>")``, never from a folder. Its ``--optimize`` fails
  on every timm checkpoint (ORTOptimizer reads the export's config.json with AutoConfig,
  which a timm config without ``model_type`` fails), so the timm rows (marked ``*``)
  compare against its plain export (export, validate at one shape), the cheaper command;
  and, printed beside it with no target, against that export followed by what a user runs
  when ``--optimize O2`` fails: ``python -m onnxruntime.transformers.optimizer --opt_level 2``
  on it (the ViT fuser for the ViT, ORT's own optimizations for the CNNs);
* ``ours fp32``: ``zoo-convert convert --variants fp32 --no-benchmark`` (export,
  check, fused fp32 verified against PyTorch in its forked child, at two shapes and the long one);
  both ``ours`` commands with ``--targets none``: the deployment targets (on by default where installed, 20 s
  of whisper-tiny's 95 s fp32 run with the test suite beside it, plus the standard-ops graph they read) are
  checks optimum-cli does not make, measured by ``bench_targets.py``;
* ``ours all``: ``zoo-convert convert`` (fp32, fp16, int8, each verified and timed); judged without its latency
  measurement (each run's wall less its own benchmark stage's seconds, from its result.json, the median run of
  those judged: in the farm the latency is a phase of its own), which is printed beside it.

Both CLIs use every CPU of the machine (``convert``'s ``--threads`` default; a farm job
runs on one).

Targets: ours fp32 wall <= 0.9x optimum's and peak memory <= 0.9x; ours all,
its latency left out, <= 1.3x optimum's wall; the > 2 GB model's peak (ours all) <= 2.5x its fp32
weight bytes. With ``--repeat N`` the median run is judged and each side's spread (max - min over median) printed. Wall is noisy on a shared machine, so CPU seconds (user + sys of
the whole tree) are printed beside it; per-stage seconds come from the
result.json the run wrote, verify time among them.

Part 2 (minilm, bert-base, gpt2): optimum's O2 and O3 artifacts, and
``optimum-cli onnxruntime quantize --avx512_vnni`` of its plain export, against
our fp32 and int8, in one child process, interleaved in rounds at the same
thread count, batch 1 x 128 tokens (gpt2: 128 new tokens over a 128-token
cache); cosine vs PyTorch over several real-text inputs. Targets: our fp32
p50 <= O2's; our int8 p50 <= optimum int8's with cosine >= its cosine. On a CPU
that saturates int8 products in ONNX Runtime (x86 without VNNI or AMX) both int8
graphs' uint8 twins (``* exact``: their exact sums, as VNNI, AMX and ARM compute
them) are measured too, and their cosines are the ones judged.

Part 3: one job (``--repeat-model``) converted 5 times on one thread, as the farm runs it; the p50s it records
(ORT per variant, PyTorch) must agree within 5 %. Meaningful on a quiet machine only.

    .venv/bin/python benchmarks/bench_realsize.py [--only bert-base,gpt2] [--skip-llama] [--parts 1,2,3]
        [--repeat 1] [--threads 1] [--repeat-model minilm] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from _common import BIN, Measured, cpu_model, machine, measure, verdict
from _realsize import MODELS, RealModel, hub_cache, is_built, minilm_dir, weight_bytes

from zoo_convert import node
from zoo_convert.variants.quantize import unsigned_twin

ROOT = Path(__file__).resolve().parent.parent
CKPT_DIR = ROOT / "build" / "realsize" / "ckpt"
# The cost issue's goals: fp32 <= 0.9x O2's wall and memory; every variant made and verified <= 1.3x O2's wall, the
# latency measurement apart (in the farm it is a phase of its own), printed beside it.
FP32_WALL, FP32_MEM, ALL_WALL, BIG_MEM = 0.9, 0.9, 1.3, 2.5
REPEAT_SPREAD = 0.05
# timm's second baseline: optimum's plain export, then ORT's transformers optimizer at O2 on it (by_hand_cmd).
BY_HAND = "ORT O2"
GB = 1e9


@dataclass
class Side:
    """One command's runs (the median run is judged) and the record of the last one."""

    label: str
    runs: list[Measured] = field(default_factory=list)
    results: list[dict | None] = field(default_factory=list)  # each run's result.json, in run order

    @property
    def result(self) -> dict | None:
        """The last run's result.json that was written."""
        return next((r for r in reversed(self.results) if r is not None), None)

    @property
    def latency_apart(self) -> tuple[float, float]:
        """(wall less that run's own latency stage, the latency) of the median run by that difference: a run's wall
        less another run's latency (this CPU's latency stage moved by 7 s between two whisper-tiny runs) is no figure."""
        pairs = sorted((m.wall_s - latency_s(r), latency_s(r)) for m, r in zip(self.runs, self.results, strict=True))
        return pairs[len(pairs) // 2]

    @property
    def median(self) -> Measured:
        return sorted(self.runs, key=lambda m: m.wall_s)[len(self.runs) // 2]

    @property
    def ok(self) -> bool:
        return all(m.rc == 0 for m in self.runs)


def checkpoint(model: RealModel) -> Path:
    """The model's folder, built now unless a complete one from the current builder is cached."""
    if model.prebuilt:
        return minilm_dir()
    folder = CKPT_DIR / model.name
    if not is_built(model.name, folder):
        print(f"building {model.name} (the {model.real} configuration) into {folder} ...", flush=True)
        log = CKPT_DIR / f"{model.name}.build.log"
        built = measure([sys.executable, str(Path(__file__).with_name("_realsize.py")), "build", model.name, str(folder)], log)
        if built.rc != 0:
            raise SystemExit(f"building {model.name} failed; see {log}")
    return folder


def optimum_cmd(source: str | Path, task: str, out: Path, level: str | None) -> list[str]:
    """``optimum-cli export onnx``, with ``--optimize level`` unless level is None."""
    optimize = ["--optimize", level] if level else []
    return [str(BIN / "optimum-cli"), "export", "onnx", "--model", str(source), "--task", task, *optimize, str(out)]


def optimum_source(model: RealModel, ckpt: Path) -> tuple[str, dict[str, str] | None]:
    """What optimum-cli's ``--model`` names for ``model``, and the environment it runs in (None: ours).

    A transformers checkpoint is the folder itself. A timm one is read the way optimum reads
    any timm model, ``timm.create_model("hf_hub:<id>", pretrained=True)``: by a Hub id, here
    answered offline from a private cache whose snapshot links to the same files.
    """
    if model.timm is None:
        return str(ckpt), None
    repo_id = f"realsize/{model.name}"
    return repo_id, hub_cache(ckpt, CKPT_DIR.parent / "hf-home", repo_id)


def optimum_level(model: RealModel) -> str | None:
    """O2 for transformers models; none for timm, where optimum-onnx 0.1.0's ``--optimize`` cannot run.

    Its ORTOptimizer reads the export's config.json with AutoConfig, which a timm config
    (no ``model_type``) fails, after the export and before the validation (unless the output
    folder's path happens to contain a transformers model type's name, AutoConfig's
    fallback: ``.../resnet50/o2`` would be read as a transformers ResNet). The plain export
    validates and is the cheaper command.
    """
    return None if model.timm else "O2"


def by_hand_cmd(model: RealModel, plain: Path, out: Path) -> list[str]:
    """What a user runs on optimum's plain export of a timm model when its ``--optimize O2`` fails: ORT's optimizer at O2.

    ``python -m onnxruntime.transformers.optimizer --opt_level 2`` is ORT's extended graph
    optimization followed by the transformers fusions (with symbolic shape inference, as
    optimum's O2 runs them): the ViT fuser for a ViT, ORT's own optimizations alone for a CNN,
    as the farm picks them.
    """
    fuser = ["--model_type", "vit"] if model.timm and model.timm.startswith("vit") else ["--only_onnxruntime"]
    return [sys.executable, "-m", "onnxruntime.transformers.optimizer", "--input", str(plain), "--output", str(out),
            "--opt_level", "2", *fuser]  # fmt: skip


def ours_cmd(ckpt: Path, task: str, out: Path, *flags: str) -> list[str]:
    """``zoo-convert convert`` without the deployment targets: they are checks optimum-cli has no counterpart of
    (and whose standard-ops graphs optimize then makes too), measured by ``bench_targets.py``; this bench weighs
    the conversion and its verification against optimum's."""
    return [str(BIN / "zoo-convert"), "convert", str(ckpt), "--task", task, "--out", str(out), "--targets", "none", *flags]


def run_side(side: Side, cmd: list[str], out: Path, logs: Path, env: dict[str, str] | None = None) -> None:
    """One measured run of ``cmd`` into a fresh ``out``; our runs' result.json is kept for the stage table."""
    shutil.rmtree(out, ignore_errors=True)
    m = measure(cmd, logs / f"{side.label.replace(' ', '-')}-{len(side.runs) + 1}.log", env)
    side.runs.append(m)
    found = sorted(out.rglob("result.json"))
    side.results.append(json.loads(found[0].read_text()) if found else None)
    print(f"  {side.label:10} exit {m.rc}  wall {m.wall_s:6.1f} s  cpu {m.cpu_s:6.1f} s (kernel {m.sys_s:5.1f} s,"
          f" {m.minor_faults / 1e6:.2f} M page faults)  peak {m.peak_bytes / GB:5.2f} GB"
          f"  (ru_maxrss {m.maxrss_bytes / GB:.2f} GB, load {m.load:.1f})", flush=True)  # fmt: skip


def _user(m: Measured) -> float:
    return max(m.cpu_s - m.sys_s, 1e-9)


def stages(result: dict | None) -> dict[str, float]:
    """Seconds per stage of one result.json; verify, benchmark and optimize also per variant."""
    if result is None:
        return {}
    out: dict[str, float] = {}
    for s in result["stages"]:
        variant = s["details"].get("variant")
        out[s["stage"]] = out.get(s["stage"], 0.0) + s["seconds"]
        if variant:
            out[f"{s['stage']}[{variant}]"] = s["seconds"]
        if s["stage"] == "optimize":
            for v, d in s["details"].items():
                if isinstance(d, dict) and "seconds" in d:
                    out[f"optimize[{v}]"] = d["seconds"]
    return out


def latency_s(result: dict | None) -> float:
    """The benchmark stage's seconds of one result.json (0 where it did not run)."""
    return stages(result).get("benchmark", 0.0)


def spread(side: Side) -> float:
    """(max - min) / median of a side's walls: what one run's figure can move by."""
    walls = [m.wall_s for m in side.runs]
    return (max(walls) - min(walls)) / statistics.median(walls) if len(walls) > 1 else 0.0


def peak_stage(result: dict | None) -> str:
    """The first stage by the end of which the job's own peak RSS (ru_maxrss, as recorded) was reached."""
    if not result or not result["stages"]:
        return "?"
    top = max(s["peak_mem_mb"] for s in result["stages"])
    first = next(s for s in result["stages"] if s["peak_mem_mb"] >= top)
    return f"{first['stage']}" + (f"[{first['details']['variant']}]" if first["details"].get("variant") else "")


def stage_line(result: dict | None) -> str:
    st = stages(result)
    parts = []
    for name in ("fetch", "export", "check", "optimize", "verify", "benchmark"):
        if name not in st:
            continue
        sub = [f"{v} {st[f'{name}[{v}]']:.1f}" for v in ("fp32", "fp16", "int8") if f"{name}[{v}]" in st]
        parts.append(f"{name} {st[name]:.1f}" + (f" ({', '.join(sub)})" if sub else ""))
    return "; ".join(parts)


def part1(model: RealModel, ckpt: Path, work: Path, repeat: int) -> dict[str, Side]:
    """optimum O2 (timm: its plain export), ours fp32, ours all, ``repeat`` rounds in that order; artifacts of the last round are kept."""
    sides = {k: Side(k) for k in ("optimum O2", "ours fp32", "ours all")}
    if model.timm:
        sides[BY_HAND] = Side(BY_HAND)
    logs = work / "logs"
    source, env = optimum_source(model, ckpt)
    for _ in range(repeat):
        run_side(sides["optimum O2"], optimum_cmd(source, model.task, work / "o2", optimum_level(model)), work / "o2",
                 logs, env)  # fmt: skip
        if model.timm:
            run_side(sides[BY_HAND], by_hand_cmd(model, work / "o2" / "model.onnx", work / "o2" / "model_o2.onnx"),
                     work / "o2-by-hand", logs)  # fmt: skip
        run_side(sides["ours fp32"], ours_cmd(ckpt, model.task, work / "fp32", "--variants", "fp32", "--no-benchmark"),
                 work / "fp32", logs)  # fmt: skip
        shutil.rmtree(work / "fp32", ignore_errors=True)
        run_side(sides["ours all"], ours_cmd(ckpt, model.task, work / "all"), work / "all", logs)
    return sides


def part2(model: RealModel, ckpt: Path, work: Path, sides: dict[str, Side], threads: int, rounds: int) -> dict | None:
    """O3 and optimum's int8 made now; then every artifact timed and compared in one child process.

    optimum's int8 is its documented path: a plain export, then ``onnxruntime quantize``
    (ORT's quantizer cannot type the fused graph of an O2 export).
    """
    logs = work / "logs"
    o3, plain, q = Side("optimum O3"), Side("plain"), Side("quantize")
    run_side(o3, optimum_cmd(ckpt, model.task, work / "o3", "O3"), work / "o3", logs)
    run_side(plain, optimum_cmd(ckpt, model.task, work / "plain", None), work / "plain", logs)
    quantize = [str(BIN / "optimum-cli"), "onnxruntime", "quantize", "--onnx_model", str(work / "plain"),
                "--avx512_vnni", "-o", str(work / "int8")]  # fmt: skip
    run_side(q, quantize, work / "int8", logs)
    ours = sides["ours all"].result
    if ours is None or not (o3.ok and plain.ok and q.ok and sides["optimum O2"].ok):
        print(f"  part 2 skipped for {model.name}: a run above failed (logs in {logs})")
        return None
    onnx_dir = Path(ours["artifacts_dir"]) / "onnx"
    quantized = sorted((work / "int8").glob("*quantized*.onnx"))
    artifacts = {
        "ours fp32": onnx_dir / "model.onnx",
        "optimum O2": work / "o2" / "model.onnx",
        "optimum O3": work / "o3" / "model.onnx",
        "ours int8": onnx_dir / "model_quantized.onnx",
        "optimum int8": quantized[0] if quantized else work / "int8" / "missing.onnx",
    }
    missing = [f"{k} ({p})" for k, p in artifacts.items() if not p.is_file()]
    if missing:
        print(f"  part 2 skipped for {model.name}: missing {', '.join(missing)}")
        return None
    if node.int8_saturates():  # both int8 graphs' exact sums too (what VNNI, AMX and ARM compute): their cosines
        for side in ("ours int8", "optimum int8"):
            twin = work / "exact" / side.replace(" ", "-") / "model.onnx"
            twin.parent.mkdir(parents=True, exist_ok=True)
            unsigned_twin(artifacts[side], twin)
            artifacts[f"{side} exact"] = twin
    spec = work / "latency.json"
    spec.write_text(json.dumps({"model_dir": str(ckpt), "task": model.task, "threads": threads, "rounds": rounds,
                                "block_s": 0.3, "artifacts": {k: str(p) for k, p in artifacts.items()}}))  # fmt: skip
    log, out = work / "latency.log", work / "latency-result.json"
    m = measure([sys.executable, str(Path(__file__).with_name("_realsize.py")), "latency", str(spec), str(out)], log)
    if m.rc != 0 or not out.is_file():
        print(f"  part 2 failed for {model.name}: see {log}")
        return None
    report = json.loads(out.read_text())
    report["load"] = m.load
    return report


def part3(model: RealModel, ckpt: Path, work: Path, n: int = 5) -> dict[str, list[float]]:
    """The same job converted ``n`` times: the p50s each run records, by variant (and PyTorch's per variant)."""
    p50s: dict[str, list[float]] = {}
    loads = []
    for i in range(n):
        side = Side("repeat")
        # On one thread, as the farm runs every job; part 1's commands use the machine, as optimum-cli does.
        run_side(side, ours_cmd(ckpt, model.task, work / "repeat", "--threads", "1"), work / "repeat", work / "logs")
        loads.append(side.runs[0].load)
        for v in (side.result or {}).get("variants", []):
            for key, name in (("ort_p50_ms", v["variant"]), ("torch_p50_ms", f"torch ({v['variant']} row)")):
                if v.get(key) is not None:
                    p50s.setdefault(name, []).append(v[key])
    shutil.rmtree(work / "repeat", ignore_errors=True)
    p50s["_load"] = loads
    return p50s


def main() -> int:
    """Build, run the parts asked for, print the tables; the verdict is the last line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated model names: " + ",".join(m.name for m in MODELS))
    ap.add_argument("--skip-llama", action="store_true", help="leave out the > 2 GB model (about 10 GB of memory)")
    ap.add_argument("--parts", default="1,2,3", help="which parts to run: 1 (cost), 2 (artifact latency), 3 (repeat)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of part 1 per model; the median run is judged")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads in part 2 (both sides)")
    ap.add_argument("--rounds", type=int, default=10, help="part 2 rounds per side")
    ap.add_argument("--repeat-model", default="minilm", help="the job part 3 repeats 5 times")
    ap.add_argument("--keep", type=Path, help="work here and keep logs and artifacts")
    args = ap.parse_args()
    parts = {int(p) for p in args.parts.split(",")}
    wanted = set(args.only.split(",")) if args.only else {m.name for m in MODELS}
    unknown = wanted - {m.name for m in MODELS}
    if unknown:
        ap.error(f"unknown model(s): {', '.join(sorted(unknown))}")
    models = [m for m in MODELS if m.name in wanted and not (args.skip_llama and m.big)]
    print(machine())
    print(f"CPU: {cpu_model()}")
    print(f"models: {', '.join(m.name for m in models)}; parts {sorted(parts)}", flush=True)

    results: dict[str, dict[str, Side]] = {}
    latency: dict[str, dict] = {}
    weights: dict[str, int] = {}
    repeat: dict[str, list[float]] = {}
    CKPT_DIR.mkdir(parents=True, exist_ok=True)  # the work folder goes beside it: same disk as the artifacts
    with tempfile.TemporaryDirectory(prefix="bench-realsize-", dir=CKPT_DIR.parent) as tmp:
        base = args.keep or Path(tmp)
        for model in models:
            ckpt = checkpoint(model)
            weights[model.name] = weight_bytes(ckpt)
            work = base / model.name
            if 1 in parts or (2 in parts and model.latency):
                print(f"{model.name} ({model.real}; {weights[model.name] / GB:.2f} GB fp32 weights; task {model.task})",
                      flush=True)  # fmt: skip
                results[model.name] = part1(model, ckpt, work, args.repeat)
            if 2 in parts and model.latency:
                report = part2(model, ckpt, work, results[model.name], args.threads, args.rounds)
                if report is not None:
                    latency[model.name] = report
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
        if 3 in parts:
            model = next(m for m in MODELS if m.name == args.repeat_model)
            print(f"part 3: {model.name} converted 5 times (all variants, latency)", flush=True)
            repeat = part3(model, checkpoint(model), base / "repeat-job")

    checks: dict[str, bool] = {}
    summary: list[str] = []
    if results and 1 in parts:
        print(f"\npart 1: end to end per command ({'median of ' + str(args.repeat) if args.repeat > 1 else 'one run'});"
              " peak = process tree's peak memory (PSS sum, or the main process's VmHWM if higher)")  # fmt: skip
        print(f"{'model':14}{'weights':>8} | {'optimum O2':^24} | {'ours fp32':^24} | {'ours all':^24} | "
              f"{'fp32/O2':^15} | {'all/O2, latency apart':^27}")  # fmt: skip
        print(f"{'':14}{'GB':>8} | {'wall s':>7}{'cpu s':>8}{'GB':>8}  | {'wall s':>7}{'cpu s':>8}{'GB':>8}  | "
              f"{'wall s':>7}{'cpu s':>8}{'GB':>8}  | {'wall':>6}{'mem':>7}   | {'wall':>6}{'latency s':>11}{'with it':>9}")  # fmt: skip
        for name, sides in results.items():
            o, f, a = (sides[k].median for k in ("optimum O2", "ours fp32", "ours all"))
            apart, lat = sides["ours all"].latency_apart
            star = "*" if next(m for m in MODELS if m.name == name).timm else ""
            print(f"{name + star:14}{weights[name] / GB:>8.2f} | "
                  + " | ".join(f"{m.wall_s:>7.1f}{m.cpu_s:>8.1f}{m.peak_bytes / GB:>8.2f} " for m in (o, f, a))
                  + f" | {f.wall_s / o.wall_s:>5.2f}x{f.peak_bytes / o.peak_bytes:>6.2f}x  |"
                  f" {apart / o.wall_s:>5.2f}x{lat:>11.1f}{a.wall_s / o.wall_s:>8.2f}x")  # fmt: skip
        # On a VM whose freed memory goes back to its host (this one: Firecracker, free page reporting), a first touch
        # costs several microseconds a page and half a real-size job's wall can be the kernel's: the walls then move
        # with where the faults fall, the user CPU much less (docs/benchmarks.md). Printed so a ratio can be read.
        print("user CPU (without the kernel's) and page faults, fp32 / O2: " + "; ".join(
            f"{name} {_user(sides['ours fp32'].median) / _user(sides['optimum O2'].median):.2f}x user,"
            f" kernel {sides['optimum O2'].median.sys_s:.1f} / {sides['ours fp32'].median.sys_s:.1f} s,"
            f" faults {sides['optimum O2'].median.minor_faults / 1e6:.2f} / {sides['ours fp32'].median.minor_faults / 1e6:.2f} M"
            for name, sides in results.items()))  # fmt: skip
        if args.repeat > 1:
            print("spread of the walls over the repeats, (max - min) / median: " + "; ".join(
                f"{name} " + ", ".join(f"{k} {spread(s):.0%}" for k, s in sides.items()) for name, sides in results.items()))  # fmt: skip
        if any(next(m for m in MODELS if m.name == n).timm for n in results):
            print("* timm: optimum's side is its plain export, read from a Hub id (offline cache) as optimum loads timm:"
                  " its --optimize fails on every timm checkpoint (ORTOptimizer reads config.json with AutoConfig)")  # fmt: skip
        by_hand = {n: s for n, s in results.items() if BY_HAND in s}
        if by_hand:
            print("\ntimm, a second baseline (not judged): optimum's plain export + `python -m onnxruntime.transformers"
                  ".optimizer --opt_level 2` on it, what a user runs when --optimize O2 fails; wall and CPU summed, peak the"
                  " higher (medians)")  # fmt: skip
            for name, sides in by_hand.items():
                o, h, f, a = (sides[k].median for k in ("optimum O2", BY_HAND, "ours fp32", "ours all"))
                wall, cpu, peak = o.wall_s + h.wall_s, o.cpu_s + h.cpu_s, max(o.peak_bytes, h.peak_bytes)
                print(f"  {name:14} optimizer alone {h.wall_s:6.1f} s wall {h.cpu_s:6.1f} cpu s {h.peak_bytes / GB:5.2f} GB;"
                      f" export + optimizer {wall:6.1f} / {cpu:6.1f} / {peak / GB:5.2f};"
                      f" ours fp32 {f.wall_s / wall:.2f}x wall {f.cpu_s / cpu:.2f}x cpu {f.peak_bytes / peak:.2f}x mem,"
                      f" all {a.wall_s / wall:.2f}x wall {a.cpu_s / cpu:.2f}x cpu")  # fmt: skip
        print("\nper stage, seconds (from result.json), and the stage where the job's own peak RSS was reached")
        for name, sides in results.items():
            for key in ("ours fp32", "ours all"):
                res = sides[key].result
                status = res["status"] if res else "no result"
                print(f"  {name:12} {key:9} [{status}] {stage_line(res)}; peak by {peak_stage(res)}")
        print("verify seconds (fp32 run -> all-variants run): " + ", ".join(
            f"{n} {stages(s['ours fp32'].result).get('verify', 0):.1f} -> {stages(s['ours all'].result).get('verify', 0):.1f}"
            for n, s in results.items()))  # fmt: skip
        for name, sides in results.items():
            o, f, a = (sides[k].median for k in ("optimum O2", "ours fp32", "ours all"))
            checks[f"{name}: every run succeeded"] = all(s.ok for s in sides.values())
            checks[f"{name}: fp32 wall <= {FP32_WALL:g}x"] = f.wall_s <= FP32_WALL * o.wall_s
            checks[f"{name}: fp32 memory <= {FP32_MEM:g}x"] = f.peak_bytes <= FP32_MEM * o.peak_bytes
            apart, lat = sides["ours all"].latency_apart
            checks[f"{name}: all variants wall, latency apart, <= {ALL_WALL:g}x"] = apart <= ALL_WALL * o.wall_s
            summary.append(f"{name} fp32 {f.wall_s / o.wall_s:.2f}x wall {f.peak_bytes / o.peak_bytes:.2f}x mem,"
                           f" all {apart / o.wall_s:.2f}x (+{lat:.1f} s latency)")  # fmt: skip
            if next(m for m in MODELS if m.name == name).big:
                ratio = max(f.peak_bytes, a.peak_bytes) / weights[name]
                print(f"{name}: peak memory {max(f.peak_bytes, a.peak_bytes) / GB:.2f} GB = {ratio:.2f}x its "
                      f"{weights[name] / GB:.2f} GB of fp32 weights (target <= {BIG_MEM:g}x)")  # fmt: skip
                checks[f"{name}: peak <= {BIG_MEM:g}x weights"] = ratio <= BIG_MEM
                summary.append(f"{name} peak {ratio:.2f}x weights")

    if latency:
        print(f"\npart 2: artifact latency, CPU {cpu_model()}, {args.threads} thread(s), interleaved, {args.rounds} rounds")
        print(f"{'model':12}{'side':19}{'p50 ms':>9}{'p90 ms':>9}{'IQR/p50':>9}{'runs':>6}{'cosine':>10}{'max|diff|':>11}")
        for name, rep in latency.items():
            for side, r in rep["sides"].items():
                cos = f"{r['cosine']:.5f}" if "cosine" in r else ""
                diff = f"{r['max_abs']:.3g}" if "max_abs" in r else ""
                print(f"{name:12}{side:19}{r['p50_ms']:>9.2f}{r['p90_ms']:>9.2f}{r['iqr_rel']:>9.2f}{r['runs']:>6}"
                      f"{cos:>10}{diff:>11}")  # fmt: skip
            s = rep["sides"]
            print(f"{'':12}shape {rep['shape']}; {rep['cases']} inputs for cosine; load {rep['load']:.1f}; "
                  f"O3 / O2 p50 {s['optimum O3']['p50_ms'] / s['optimum O2']['p50_ms']:.2f}x")  # fmt: skip
            checks[f"{name}: fp32 p50 <= O2"] = s["ours fp32"]["p50_ms"] <= s["optimum O2"]["p50_ms"]
            checks[f"{name}: int8 p50 <= optimum int8"] = s["ours int8"]["p50_ms"] <= s["optimum int8"]["p50_ms"]
            # On a CPU that saturates int8 products, the cosines of the graphs' exact sums (their uint8 twins) are judged.
            exact = " exact" if "ours int8 exact" in s else ""
            checks[f"{name}: int8{exact} cosine >= optimum int8{exact}"] = (
                s[f"ours int8{exact}"]["cosine"] >= s[f"optimum int8{exact}"]["cosine"]
            )
            summary.append(f"{name} fp32/O2 {s['ours fp32']['p50_ms'] / s['optimum O2']['p50_ms']:.2f}x,"
                           f" int8/optimum {s['ours int8']['p50_ms'] / s['optimum int8']['p50_ms']:.2f}x")  # fmt: skip
    elif 2 in parts:
        checks["part 2 measured"] = False

    if repeat:
        loads = repeat.pop("_load")
        print(f"\npart 3: {args.repeat_model} converted {len(loads)} times; load during the runs "
              + ", ".join(f"{x:.1f}" for x in loads))  # fmt: skip
        print(f"{'p50 of':24}{'runs, ms':>48}{'spread':>9}")
        worst = 0.0
        for name, values in repeat.items():
            moved = (max(values) - min(values)) / statistics.median(values)  # not `spread`: main() calls spread()
            worst = max(worst, moved)
            print(f"{name:24}{'  '.join(f'{v:.2f}' for v in values):>48}{moved:>8.1%}")
        checks[f"repeated job p50s within {REPEAT_SPREAD:.0%}"] = bool(repeat) and worst <= REPEAT_SPREAD
        summary.append(f"repeat spread {worst:.1%}")

    print(f"\n{machine()}")
    return verdict("bench_realsize", checks, "; ".join(summary) or "nothing measured")


if __name__ == "__main__":
    sys.exit(main())
