"""Hostile checkpoint files are refused by looking at them, never by opening them (issue 23, item 3).

A FIFO waits for a writer for ever, /dev/zero never ends, another user's file hard-linked
into a folder reads as the folder's own: each is met where a checkpoint file is read
(planning's hash, fetch, export's copies, the failure path of a row that never ran).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zoo_convert import zoo
from zoo_convert.errors import FailureKind, FetchError, UnsafeCheckpointError, ZooConvertError
from zoo_convert.farm.isolation import failure_result
from zoo_convert.manifest import SCHEMA
from zoo_convert.records import ManifestEntry, Settings
from zoo_convert.sources import open_regular, read_json, sentence_transformers_files
from zoo_convert.stages.fetch import fetch, folder_hash

EXE = str(Path(sys.executable).with_name("zoo-convert"))


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The zoo's bert alone (its manifest row too), built once for the module."""
    root = tmp_path_factory.mktemp("hostile")
    zoo.build(root, only=["bert"])
    return root / "bert"


@pytest.fixture
def ckpt(bert: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(bert, dst)
    return dst


def _fetch_fails(ckpt: Path) -> ZooConvertError:
    with pytest.raises(ZooConvertError) as info:
        fetch(ManifestEntry(source=str(ckpt)), Settings())
    return info.value


@pytest.mark.parametrize("plant", ["fifo", "dev-zero", "socket", "link-to-fifo"])
def test_a_file_that_is_no_regular_file_is_refused_unopened(plant: str, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    if plant == "fifo":
        os.mkfifo(path)
    elif plant == "dev-zero":
        path.symlink_to("/dev/zero")
    elif plant == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
    else:
        os.mkfifo(tmp_path / "pipe")
        path.symlink_to(tmp_path / "pipe")
    with pytest.raises(UnsafeCheckpointError, match="not a regular file: it is never opened"):
        read_json(path)


def test_a_json_file_past_its_size_cap_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"pad": "x" * 2000}))
    with pytest.raises(FetchError, match="more than the 1000 such a file may have"):
        read_json(path, limit=1000)
    assert read_json(path)["pad"] == "x" * 2000  # type: ignore[index]
    with open_regular(path) as f:
        assert f.read(1) == b"{"


def _run_invalid_row(source: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], list[tuple[object, ...]]]:
    """`zoo-convert run` on one row of ``source`` whose task is invalid: recorded without Ray, from the failure path."""
    row = {name: None for name in SCHEMA.names} | {"source": str(source), "task": "no-such-task"}
    manifest = tmp_path / "one.parquet"
    pq.write_table(pa.Table.from_pylist([row], schema=SCHEMA), manifest)
    db = tmp_path / "results.duckdb"

    def cap_memory() -> None:  # on today's main the driver reads /dev/zero into memory: fail, never take the host
        resource.setrlimit(resource.RLIMIT_AS, (8 * 1024**3, 8 * 1024**3))

    proc = subprocess.run(
        [EXE, "run", str(manifest), "--db", str(db), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120, check=False, preexec_fn=cap_memory,
        env={**os.environ, "RAY_ADDRESS": "local"},
    )  # fmt: skip
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT failure_kind, model_type FROM results").fetchall()
    return proc, rows


@pytest.mark.parametrize("plant", ["fifo", "dev-zero"])
def test_the_driver_never_opens_a_hostile_config_of_an_invalid_row(plant: str, ckpt: Path, tmp_path: Path) -> None:
    """The run blocked for ever opening a FIFO config.json (in failure_result) while holding the DB's run lock."""
    (ckpt / "config.json").unlink()
    if plant == "fifo":
        os.mkfifo(ckpt / "config.json")
    else:
        (ckpt / "config.json").symlink_to("/dev/zero")
    proc, rows = _run_invalid_row(ckpt, tmp_path)
    assert rows == [("manifest_error", None)], proc.stdout + proc.stderr


def test_the_failure_path_reads_a_local_config_and_nothing_else(ckpt: Path) -> None:
    assert failure_result(ManifestEntry(source=str(ckpt)), FailureKind.TIMEOUT, "killed").model_type == "bert"
    assert failure_result(ManifestEntry(source="org/name"), FailureKind.TIMEOUT, "killed").model_type is None


@pytest.mark.parametrize(
    ("name", "plant"),
    [
        ("config.json", "fifo"),
        ("notes.txt", "fifo"),  # no side file, but hashed
        ("notes.txt", "dev-zero"),
        ("sub/zero.bin", "dev-zero"),
        ("extra.safetensors", "fifo"),
    ],
)
def test_a_fifo_or_device_anywhere_in_a_checkpoint_is_fetch_unsafe(name: str, plant: str, ckpt: Path) -> None:
    path = ckpt / name
    path.parent.mkdir(exist_ok=True)
    path.unlink(missing_ok=True)
    if plant == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    err = _fetch_fails(ckpt)
    assert err.kind == FailureKind.FETCH_UNSAFE and name.rsplit("/", 1)[-1] in str(err), err
    with pytest.raises(UnsafeCheckpointError):  # planning's hash refuses it too, unopened
        folder_hash(ckpt)


def test_a_side_file_hard_linked_to_a_file_its_owner_could_not_read_is_refused(ckpt: Path, tmp_path: Path) -> None:
    """Symlinks were caught, hard links not: root's 0600 file linked as merges.txt was published 0644."""
    if os.geteuid() != 0:
        pytest.skip("needs root: to hand the checkpoint to another user")
    secret = tmp_path / "secret"
    secret.write_text("root's own\n")
    secret.chmod(0o600)
    os.link(secret, ckpt / "merges.txt")
    for path in (ckpt, *ckpt.iterdir()):
        if path != ckpt / "merges.txt":
            os.chown(path, 12345, 12345)
    err = _fetch_fails(ckpt)
    assert err.kind == FailureKind.FETCH_UNSAFE
    assert "side file merges.txt is a file the checkpoint's owner could not read" in str(err)
    assert "hard-linked 2 times" in str(err)
    os.chown(ckpt / "merges.txt", 12345, 12345)  # the owner's own 0600 file: fine
    assert fetch(ManifestEntry(source=str(ckpt)), Settings()).model_type == "bert"


def test_a_side_file_is_never_copied_wider_than_it_was(ckpt: Path, tmp_path: Path) -> None:
    from zoo_convert.pipeline import convert_one

    (ckpt / "vocab.txt").chmod(0o600)
    (ckpt / "tokenizer_config.json").chmod(0o640)
    result = convert_one(
        ManifestEntry(source=str(ckpt), task="feature-extraction", variants=("fp32",)),
        Settings(out_dir=str(tmp_path / "out"), benchmark=False),
    )
    assert result.passed, result.message
    out = Path(result.artifacts_dir or "")
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE((out / "vocab.txt").stat().st_mode) == 0o600
    assert stat.S_IMODE((out / "tokenizer_config.json").stat().st_mode) == 0o640 & ~umask
    assert stat.S_IMODE((out / "config.json").stat().st_mode) == 0o644 & ~umask
    assert stat.S_IMODE((out / "onnx" / "model.onnx").stat().st_mode) == 0o644 & ~umask


def test_only_what_the_loaders_read_is_copied_from_a_module_folder(tmp_path: Path) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
    ]
    src = tmp_path / "ckpt"
    for name in ("1_Pooling/config.json", "1_Pooling/notes/diary.txt", "1_Pooling/.env", "2_Dense/config.json",
                 "2_Dense/model.safetensors", "2_Dense/train.log"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text("{}")
    (src / "modules.json").write_text(json.dumps(modules))
    files, left_out = sentence_transformers_files(src)
    assert files == ["modules.json", "1_Pooling/config.json", "2_Dense/config.json", "2_Dense/model.safetensors"]
    assert left_out == ["1_Pooling/.env", "1_Pooling/notes/diary.txt", "2_Dense/train.log"]


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        ("tokenizer_config.json", b'{"model_max_length": 512,', "tokenizer_config.json is not valid JSON"),
        ("special_tokens_map.json", b'["[CLS]", "[SEP]"]', "special_tokens_map.json holds a JSON list, not an object"),
        ("vocab.txt", b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "vocab.txt is not UTF-8 text"),
        ("vocab.txt", b"[PAD]\n\x00\x00\x00\n", "vocab.txt is not text: it holds NUL bytes"),
        ("generation_config.json", b'{"max_new_tokens": -1}', "generation_config.json cannot be loaded"),
        ("generation_config.json", b"{not json", "generation_config.json is not valid JSON"),
    ],
    ids=["tokenizer-config", "special-tokens-list", "vocab-binary", "vocab-nul", "generation-bad", "generation-json"],
)
def test_a_broken_side_file_is_fetch_error_naming_it(name: str, content: bytes, said: str, ckpt: Path) -> None:
    """They passed and were published as they were."""
    (ckpt / name).write_bytes(content)
    err = _fetch_fails(ckpt)
    assert err.kind == FailureKind.FETCH_ERROR and said in str(err), err
