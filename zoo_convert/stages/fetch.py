"""Fetch stage: resolve a manifest source to a vetted checkpoint folder on local disk.

A source is either a local folder or a hub repo id (``org/name``), fetched with
huggingface_hub at the entry's revision (``Settings.hf_endpoint`` / ``hf_cache``;
the token comes from ``HF_TOKEN`` or the huggingface_hub login, read by the
client itself). Safetensors are preferred; pickle-only weights and checkpoints
that need remote code are refused unless the entry allows them.

Planning resolves a hub id once (:func:`hub_snapshot`: the commit and its file
list, one API request) and hands the result to the job on the entry, so the job
asks the Hub nothing more and downloads only the files an export needs, by
commit: files already in the cache cost no request at all. The farm brings them
in before the job starts (:func:`download`, under the cluster's Hub budget), so
the job's own fetch finds everything on disk.

Only light imports at module level: the farm driver calls :func:`hub_snapshot`
to build cache keys without paying for torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import stat
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import (
    ExportError,
    FailureKind,
    FetchError,
    UnsafeCheckpointError,
    ZooConvertError,
    first_line,
)
from ..exporters import diffusion
from ..records import HubSnapshot, ManifestEntry, Settings
from ..sources import is_hub_id, is_local, open_regular, read_json, side_files
from . import Checkpoint

if TYPE_CHECKING:
    from huggingface_hub import HfApi

log = logging.getLogger(__name__)
T = TypeVar("T")

SAFE_WEIGHTS = ("*.safetensors", "*.safetensors.index.json")
PICKLE_WEIGHTS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")
# Everything an export or a published model needs besides the weights.
SIDE_FILES = ("*.json", "*.txt", "*.model", "*.tiktoken", "merges.txt", "vocab.*", "*.py", "1_Pooling/*", "README.md",
              "bpe.codes", "prophetnet.tokenizer")

# Side files that loaders parse as a JSON object (config.json is checked on its own, tokenizer.json by tokenizers).
_JSON_SIDE_FILES = (
    "generation_config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "preprocessor_config.json",
    "processor_config.json",
    "feature_extractor_config.json",
    "image_processor_config.json",
)
_PREFERRED_TASKS = ("text2text-generation", "automatic-speech-recognition", "text-generation")
# The safetensors format's own limit; a longer header is corrupt, and not worth reading into memory.
_MAX_SAFETENSORS_HEADER = 100 * 1024**2
# A config.json read only for its model_type after a failed fetch; real ones are a few KB.
_MAX_CONFIG_BYTES = 1024**2


def fetch(entry: ManifestEntry, settings: Settings, *, on_disk: Callable[[Path], None] | None = None) -> Checkpoint:
    """Bring the entry's checkpoint to local disk and vet it.

    ``on_disk(path)`` is told where its files are before they are vetted: before the vetting imports transformers,
    and optimum's task table where the entry names no task.
    """
    if is_local(entry.source):
        path = Path(entry.source).expanduser()
        if not path.is_dir():
            raise FetchError(f"no such checkpoint folder: {entry.source}", kind=FailureKind.FETCH_NOT_FOUND)
        # refused before a byte of it is read: a side file linked out of the checkpoint
        side_files(path, remote_code=entry.allow_remote_code)
        if on_disk is not None:
            on_disk(path)
        # The hash reads every byte (bert-base's 0.44 GB: 0.3 s) with the GIL released: the vetting, and the
        # transformers import it starts, run beside it.
        with ThreadPoolExecutor(1, "folder-hash") as pool:
            hashed = pool.submit(folder_hash, path)
            try:
                vetted = _vet(path, "", entry)
            except BaseException:
                hashed.result()  # a file the hash cannot read is said first, as it was before the vetting ran beside it
                raise
            return dataclasses.replace(vetted, resolved_revision=hashed.result())
    else:
        path, resolved = download(entry, settings)
        side_files(path, remote_code=entry.allow_remote_code)
        if on_disk is not None:
            on_disk(path)
    return _vet(path, resolved, entry)


def config_model_type(entry: ManifestEntry, settings: Settings) -> str | None:
    """The model_type of the entry's config.json where it is on disk, for a job that failed before it was vetted.

    A failed fetch still lands in its model type's row of the matrix. Reads a local
    folder's file or the Hub cache's copy (no request), a regular file of at most
    :data:`_MAX_CONFIG_BYTES`; anything else is None.
    """
    if is_local(entry.source):
        config = Path(entry.source).expanduser() / "config.json"
    elif is_hub_id(entry.source):
        from huggingface_hub import try_to_load_from_cache

        revision = entry.snapshot.sha if entry.snapshot else entry.revision
        try:
            cached = try_to_load_from_cache(entry.source, "config.json", cache_dir=settings.hf_cache, revision=revision)
        except ValueError:  # an id huggingface_hub refuses
            return None
        if not isinstance(cached, str):
            return None
        config = Path(cached)
    else:
        return None
    try:
        parsed = read_json(config, limit=_MAX_CONFIG_BYTES)  # looked at first: a FIFO or /dev/zero is never read
    except ZooConvertError:
        return None
    model_type = parsed.get("model_type") if isinstance(parsed, dict) else None
    return model_type if isinstance(model_type, str) and model_type else None


def resolve_revision(entry: ManifestEntry, settings: Settings) -> str:
    """The exact revision a job would convert: hub commit sha or ``sha256:`` of a local folder."""
    if is_local(entry.source):
        path = Path(entry.source).expanduser()
        if not path.is_dir():
            raise FetchError(f"no such checkpoint folder: {entry.source}", kind=FailureKind.FETCH_NOT_FOUND)
        return folder_hash(path)
    if settings.offline:
        return _cached(entry, settings).name
    return hub_snapshot(entry, settings).sha


def hub_snapshot(entry: ManifestEntry, settings: Settings) -> HubSnapshot:
    """The commit the entry's revision points at and the files in it: one API request."""
    info = _hub_call(
        lambda api: api.model_info(entry.source, revision=entry.revision, timeout=settings.hub_timeout_s),
        entry,
        settings,
    )
    if info.sha is None:
        raise FetchError(f"{entry.source}@{entry.revision or 'main'}: the Hub named no commit", kind=FailureKind.FETCH_TRANSIENT)
    return HubSnapshot(sha=info.sha, files=tuple(s.rfilename for s in info.siblings or ()))


def list_snapshots(owner: str, wanted: set[str], settings: Settings) -> dict[str, HubSnapshot]:
    """Default-branch snapshots of the ``wanted`` hub ids of one owner, read from the owner's model listing.

    One request per page of the listing instead of one per model. It stops once it has
    them all, or when the pages read outnumber the ids found (a big owner with few of
    them), so listing costs at most one request more than asking for each; ids it did
    not find are left to :func:`hub_snapshot`, and an error returns what was found so far.
    """
    from huggingface_hub import constants
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    todo = {w.lower(): w for w in wanted}
    found: dict[str, HubSnapshot] = {}
    url: str | None = f"{(settings.hf_endpoint or constants.ENDPOINT).rstrip('/')}/api/models"
    params: dict[str, str | list[str]] | None = {"author": owner, "expand": ["sha", "siblings"]}
    pages = 0
    try:
        while url and todo and pages <= len(found):
            response = get_session().get(url, params=params, headers=build_hf_headers(), timeout=settings.hub_timeout_s)
            hf_raise_for_status(response)
            pages += 1
            for item in response.json():
                source = todo.pop(str(item.get("id", "")).lower(), None)
                if source is not None and item.get("sha") and isinstance(item.get("siblings"), list):
                    files = tuple(s["rfilename"] for s in item["siblings"])
                    found[source] = HubSnapshot(sha=item["sha"], files=files)
            url, params = response.links.get("next", {}).get("url"), None  # the next link carries the query
    except Exception as exc:  # noqa: BLE001 - a listing is only a shortcut; model_info asks again
        log.info("listing the models of %s stopped after %d page(s): %s: %s", owner, pages, type(exc).__name__, exc)
    return found


def validate_repo_id(source: str) -> None:
    """Refuse ids that could escape the cache or smuggle a path: ``..``, absolute paths, odd characters."""
    if not is_hub_id(source):
        raise UnsafeCheckpointError(
            f"{source!r} is neither an existing folder nor a valid hub repo id ('name' or 'org/name' of "
            "letters, digits, '-', '_', '.', without '..' or '--')"
        )


def folder_hash(path: Path) -> str:
    """Content hash of every file under ``path`` (names and bytes), stable across machines."""
    h = hashlib.sha256()
    current = path
    try:
        for f in sorted(path.rglob("*")):
            rel = f.relative_to(path).as_posix()
            if rel.startswith(".cache/") or "/." in f"/{rel}" or f.is_dir():
                continue
            current = f
            if not os.path.exists(f):  # a dangling link: the file a loader would read is not there
                continue
            with open_regular(f) as fh:  # a FIFO or a device is refused before it is opened
                h.update(rel.encode() + b"\0")
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
            h.update(b"\0")
    except OSError as exc:  # unreadable, or a link to something that is no file (/proc/self/mem)
        raise FetchError(f"{path}: cannot read {exc.filename or current}: {exc.strerror or exc}") from exc
    except FetchError as exc:  # the message names the file by its path inside the checkpoint
        raise type(exc)(exc.message.replace(str(current), f"{path}: {current.relative_to(path)}", 1), kind=exc.kind) from exc
    return "sha256:" + h.hexdigest()


def _cached(entry: ManifestEntry, settings: Settings) -> Path:
    """The snapshot folder (named by its commit sha) of a hub checkpoint already in the local cache."""
    from huggingface_hub import snapshot_download

    return Path(
        _hub_call(
            lambda api: snapshot_download(
                entry.source, revision=entry.revision, cache_dir=settings.hf_cache, local_files_only=True
            ),
            entry,
            settings,
        )
    )


def download(entry: ManifestEntry, settings: Settings) -> tuple[Path, str]:
    """Bring what an export needs of a hub checkpoint into the cache; returns its snapshot folder and commit sha.

    Uses the entry's :class:`HubSnapshot` when planning resolved it (no API request), and
    downloads by commit sha, so a file already in the cache costs no request.
    """
    if settings.offline:  # no request: the cache alone says which commit we have
        path = _cached(entry, settings)
        return path, path.name
    snap = entry.snapshot or hub_snapshot(entry, settings)
    has_safe = any(n.endswith(".safetensors") for n in snap.files)
    pickled = [n for n in snap.files if n.endswith((".bin", ".pt", ".pth", ".ckpt", ".pkl"))]
    if not has_safe and pickled and not entry.allow_pickle:
        raise UnsafeCheckpointError(
            f"{entry.source}@{snap.sha[:12]} has only pickle weights ({', '.join(pickled)}); "
            "loading them can run arbitrary code — set allow_pickle to accept them"
        )
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import filter_repo_objects

    wanted = list(filter_repo_objects(snap.files, allow_patterns=[*SIDE_FILES, *(SAFE_WEIGHTS if has_safe else PICKLE_WEIGHTS)]))
    if diffusion.is_pipeline_repo(snap.files):
        wanted = diffusion.hub_files(snap.files, entry.allow_pickle)
    else:
        _hub_not_a_source(entry, snap, settings, has_weights=has_safe or bool(pickled))

    def get_all(api: HfApi) -> Path:
        paths = {
            name: hf_hub_download(
                entry.source,
                name,
                revision=snap.sha,
                cache_dir=settings.hf_cache,
                endpoint=settings.hf_endpoint,
                etag_timeout=settings.hub_timeout_s,
            )
            for name in wanted
        }
        top = "config.json" if "config.json" in paths else diffusion.INDEX
        return Path(paths[top]).parent

    folder = _hub_call(get_all, entry, settings)
    _remember_ref(folder, entry.revision or "main", snap.sha)
    return folder, snap.sha


def _hub_not_a_source(entry: ManifestEntry, snap: HubSnapshot, settings: Settings, *, has_weights: bool) -> None:
    """Say what a repo is that has no config.json or no weights, by its file list, as :func:`_vet` says of a folder.

    A PEFT adapter: its adapter_config.json (a few hundred bytes) is downloaded to name the base model.
    """
    files = [n for n in snap.files if "/" not in n]
    where = f"{entry.source}@{snap.sha[:12]}"
    if "config.json" not in files and "adapter_config.json" in files:
        from huggingface_hub import hf_hub_download

        adapter = _hub_call(
            lambda api: hf_hub_download(
                entry.source, "adapter_config.json", revision=snap.sha, cache_dir=settings.hf_cache,
                endpoint=settings.hf_endpoint, etag_timeout=settings.hub_timeout_s,
            ),
            entry,
            settings,
        )  # fmt: skip
        _adapter(Path(adapter), dataclasses.replace(entry, source=where))
    if not has_weights:
        _gguf_only([n for n in files if n.endswith(".gguf")], dataclasses.replace(entry, source=where))
    if "config.json" not in files:
        raise FetchError(f"{where}: no config.json in the repo — not a transformers checkpoint (nor a diffusers pipeline: no model_index.json)")


def _remember_ref(snapshot_folder: Path, revision: str, sha: str) -> None:
    """Record ``revision -> sha`` in the cache (``refs/<revision>``), as snapshot_download would, for offline runs."""
    if revision == sha:
        return
    ref = snapshot_folder.parents[1] / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(sha)


def _hub_call(fn: Callable[[HfApi], T], entry: ManifestEntry, settings: Settings) -> T:
    """Run a huggingface_hub call, mapping its errors onto fetch failure kinds."""
    import requests
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    validate_repo_id(entry.source)
    where = f"{entry.source}@{entry.revision or 'main'}"
    try:
        return fn(HfApi(endpoint=settings.hf_endpoint))
    except (RepositoryNotFoundError, RevisionNotFoundError, GatedRepoError) as exc:
        raise FetchError(f"{where}: {first_line(exc)}", kind=FailureKind.FETCH_NOT_FOUND) from exc
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as exc:
        raise FetchError(f"{where}: not in the local cache and offline: {first_line(exc)}") from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        kind = FailureKind.FETCH_TRANSIENT if status in (None, 408, 429) or (status or 0) >= 500 else FailureKind.FETCH_ERROR
        raise FetchError(f"{where}: HTTP {status}: {first_line(exc)}", kind=kind) from exc
    except (requests.ConnectionError, requests.Timeout, OSError) as exc:
        raise FetchError(f"{where}: network error: {first_line(exc)}", kind=FailureKind.FETCH_TRANSIENT) from exc


def _vet(path: Path, resolved: str, entry: ManifestEntry) -> Checkpoint:
    if diffusion.is_pipeline(path):
        return diffusion.vet(path, resolved, entry)
    config_file = path / "config.json"
    if not os.path.lexists(config_file):
        _not_a_source(path, entry)
        raise FetchError(f"{entry.source}: no config.json in {path} — not a transformers checkpoint folder (nor a diffusers pipeline: no model_index.json)")
    config = _check_config(_json_file(config_file, entry), entry)
    _check_quantization(config, entry)
    library = _library(path, config)
    model_type = config.get("model_type") or config.get("architecture") or ""
    if config.get("auto_map") and not entry.allow_remote_code:
        raise UnsafeCheckpointError(
            f"{entry.source}: config.json maps to custom code ({', '.join(config['auto_map'])}); "
            "set allow_remote_code to run it"
        )
    if library == "transformers":
        _check_model_type(model_type, entry)
    _check_weights(path, entry)
    _check_tokenizer(path, entry)
    _check_side_files(path, entry)
    task = entry.task or infer_task(config, model_type, library, entry.source)
    return Checkpoint(
        path=path,
        resolved_revision=resolved,
        model_type=model_type,
        task=task,
        library=library,
        config=config,
        trust_remote_code=entry.allow_remote_code,
    )


def _json_file(file: Path, entry: ManifestEntry) -> object:
    """A JSON file of the checkpoint, looked at before it is opened (no FIFO, no device, no endless file)."""
    try:
        return read_json(file)
    except FetchError as exc:  # the message names the file by its name in the checkpoint
        raise type(exc)(exc.message.replace(str(file), f"{entry.source}: {file.name}", 1), kind=exc.kind) from exc


def _check_config(config: object, entry: ManifestEntry) -> dict[str, Any]:
    """The config, once the fields fetch reads have the types transformers gives them; else the checkpoint is broken."""
    if not isinstance(config, dict):
        raise FetchError(f"{entry.source}: config.json holds a JSON {type(config).__name__}, not an object")
    for key, want in (("model_type", str), ("architecture", str), ("architectures", list), ("auto_map", dict)):
        if config.get(key) is not None and not isinstance(config[key], want):
            raise FetchError(f"{entry.source}: config.json: {key} is a JSON {type(config[key]).__name__}, not a {want.__name__}")
    if not all(isinstance(a, str) for a in config.get("architectures") or ()):
        raise FetchError(f"{entry.source}: config.json: architectures holds something other than names")
    return config


def _library(path: Path, config: dict[str, Any]) -> str:
    # sentence-transformers folders are exported as their transformers backbone: optimum
    # would otherwise misdetect them and export a different graph than we verify.
    if "pretrained_cfg" in config or ("architecture" in config and "model_type" not in config):
        return "timm"
    if (path / "model_index.json").is_file():
        return "diffusers"
    return "transformers"


def _check_model_type(model_type: str, entry: ManifestEntry) -> None:
    from transformers import CONFIG_MAPPING

    if not model_type:
        raise ExportError(f"{entry.source}: config.json has no model_type", kind=FailureKind.EXPORT_UNSUPPORTED)
    if model_type not in CONFIG_MAPPING and not entry.allow_remote_code:
        import transformers

        raise ExportError(
            f"{entry.source}: model_type {model_type!r} is unknown to transformers {transformers.__version__}",
            kind=FailureKind.EXPORT_UNSUPPORTED,
        )


def _not_a_source(path: Path, entry: ManifestEntry) -> None:
    """Say what a folder without config.json is when it is a known non-source: a PEFT adapter, GGUF files."""
    if os.path.isfile(path / "adapter_config.json") and not os.path.islink(path / "adapter_config.json"):
        _adapter(path / "adapter_config.json", entry)
    _gguf_only([p.name for p in path.glob("*.gguf")], entry)


def _adapter(file: Path, entry: ManifestEntry) -> None:
    """Raise: a PEFT adapter is no model; its adapter_config.json names the base model it needs."""
    adapter = _json_file(file, entry)
    base = adapter.get("base_model_name_or_path") if isinstance(adapter, dict) else None
    kind = adapter.get("peft_type") if isinstance(adapter, dict) else None
    raise ExportError(
        f"{entry.source}: a PEFT adapter ({kind or 'adapter_config.json'}), not a model: its base model is"
        f" {base or 'not named in adapter_config.json'}; merge the adapter into it (peft's merge_and_unload,"
        " then save_pretrained) and convert the merged folder",
        kind=FailureKind.EXPORT_UNSUPPORTED,
    )


def _gguf_only(names: list[str], entry: ManifestEntry) -> None:
    """Raise where a checkpoint without weights of ours has GGUF files (``names``)."""
    gguf = sorted(names)
    if gguf:
        raise ExportError(
            f"{entry.source}: only GGUF weights ({', '.join(gguf[:3])}{', ...' if len(gguf) > 3 else ''}): GGUF is"
            " llama.cpp's format, not a conversion source; convert the safetensors checkpoint it was made from",
            kind=FailureKind.EXPORT_UNSUPPORTED,
        )


def _check_quantization(config: dict[str, Any], entry: ManifestEntry) -> None:
    """A quantized checkpoint's weights are packed for its method's kernels: not a source whose fp32 graph we can verify."""
    quant = config.get("quantization_config")
    if not quant:
        return
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    raise ExportError(
        f"{entry.source}: config.json has a quantization_config ({method or 'method not named'}): a quantized"
        " checkpoint is not a conversion source (its weights are packed for that method's kernels, with no float"
        " graph to verify against); convert the unquantized checkpoint it was made from, and take int8/q4 from here",
        kind=FailureKind.EXPORT_UNSUPPORTED,
    )


def _check_shards(path: Path, entry: ManifestEntry) -> None:
    """Every shard a weights index names is in the folder: else name the missing files (a fetch-time fact)."""
    for index in sorted([*path.glob("*.safetensors.index.json"), *path.glob("pytorch_model*.bin.index.json")]):
        found = _json_file(index, entry)
        weight_map = found.get("weight_map") if isinstance(found, dict) else None
        if not isinstance(weight_map, dict):
            raise FetchError(f"{entry.source}: {index.name} has no weight_map")
        missing = sorted({str(f) for f in weight_map.values() if not os.path.isfile(path / str(f))})
        if missing:
            raise FetchError(
                f"{entry.source}: {index.name} names {len(missing)} shard(s) that are not in the checkpoint:"
                f" {', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}"
            )


def _check_weights(path: Path, entry: ManifestEntry) -> None:
    safe = sorted(path.glob("*.safetensors"))
    pickled = [p for pattern in PICKLE_WEIGHTS for p in path.glob(pattern)]
    _check_shards(path, entry)
    if not safe and not pickled:
        _gguf_only([p.name for p in path.glob("*.gguf")], entry)
        raise FetchError(f"{entry.source}: no weights found in {path} (expected *.safetensors)")
    if not safe and not entry.allow_pickle:
        raise UnsafeCheckpointError(
            f"{entry.source}: only pickle weights ({', '.join(p.name for p in pickled)}); "
            "loading them can run arbitrary code — set allow_pickle to accept them"
        )
    for f in safe:
        _check_safetensors(f, entry)


def _check_tokenizer(path: Path, entry: ManifestEntry) -> None:
    """A tokenizer.json that cannot be loaded is the checkpoint's fault, found before anything runs.

    Verification would otherwise fall back to random token ids, pass, and publish the broken file.
    """
    file = path / "tokenizer.json"
    if not file.is_file():
        return
    from tokenizers import Tokenizer

    try:
        Tokenizer.from_file(str(file))
    except Exception as exc:  # noqa: BLE001 - the tokenizers library raises plain Exceptions
        raise FetchError(f"{entry.source}: tokenizer.json cannot be loaded: {first_line(exc)}") from exc


def _check_side_files(path: Path, entry: ManifestEntry) -> None:
    """The side files a user's loader reads beside the graph must load, or they would be published broken.

    Each JSON side file holds an object, vocab.txt is text, and generation_config.json is one
    transformers' GenerationConfig accepts; the failure names the file (``fetch_error``).
    """
    for name in _JSON_SIDE_FILES:
        file = path / name
        if os.path.lexists(file) and not isinstance(parsed := _json_file(file, entry), dict):
            raise FetchError(f"{entry.source}: {name} holds a JSON {type(parsed).__name__}, not an object")
    vocab = path / "vocab.txt"
    if os.path.lexists(vocab):
        with open_regular(vocab) as f:
            raw = f.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FetchError(f"{entry.source}: vocab.txt is not UTF-8 text: {exc}") from exc
        if "\0" in text:
            raise FetchError(f"{entry.source}: vocab.txt is not text: it holds NUL bytes")
    if os.path.lexists(path / "generation_config.json"):
        from transformers import GenerationConfig

        try:
            GenerationConfig.from_pretrained(path)
        except Exception as exc:  # noqa: BLE001 - transformers raises ValueError, TypeError, OSError...
            raise FetchError(f"{entry.source}: generation_config.json cannot be loaded: {first_line(exc)}") from exc


def _check_safetensors(file: Path, entry: ManifestEntry) -> None:
    """Catch truncated or corrupt files before torch does, with a message that says which."""
    try:
        st = file.stat()
        if stat.S_ISDIR(st.st_mode):
            raise FetchError(f"{entry.source}: {file.name} is not a regular file")
        if not stat.S_ISREG(st.st_mode):  # checked before opening: opening a FIFO would wait for ever
            raise UnsafeCheckpointError(f"{entry.source}: {file.name} is not a regular file: it is never opened")
        size = st.st_size
        with file.open("rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise FetchError(f"{entry.source}: {file.name} is truncated ({size} bytes, no header)")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise FetchError(f"{entry.source}: {file.name} is truncated (header of {n} bytes, file of {size})")
            if n > _MAX_SAFETENSORS_HEADER:
                raise FetchError(f"{entry.source}: {file.name} has a corrupt header: {n} bytes long")
            raw = fh.read(n)
    except OSError as exc:
        raise FetchError(f"{entry.source}: cannot read {file.name}: {exc.strerror or exc}") from exc
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep to parse
        raise FetchError(f"{entry.source}: {file.name} has a corrupt header: {type(exc).__name__}: {exc}") from exc
    end = _tensors_end(header, f"{entry.source}: {file.name} has a corrupt header")
    if 8 + n + end != size:
        raise FetchError(f"{entry.source}: {file.name} is truncated: tensors need {8 + n + end} bytes, file has {size}")


def _tensors_end(header: object, corrupt: str) -> int:
    """The end of the last tensor's bytes, from a header checked to be what the format says."""
    if not isinstance(header, dict):
        raise FetchError(f"{corrupt}: a JSON {type(header).__name__}, not an object")
    end = 0
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        offsets = tensor.get("data_offsets") if isinstance(tensor, dict) else None
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(type(o) is int for o in offsets)
            and 0 <= offsets[0] <= offsets[1]
        ):
            raise FetchError(f"{corrupt}: tensor {name[:100]!r} has no valid data_offsets (two byte offsets)")
        end = max(end, offsets[1])
    return end


def infer_task(config: dict[str, Any], model_type: str, library: str, source: str) -> str:
    """The task from ``config.architectures``, upgraded to its ``-with-past`` form where optimum has one."""
    import optimum.exporters.onnx.model_configs  # noqa: F401 - registers the ONNX configs with TasksManager
    from optimum.exporters.tasks import TasksManager

    if library == "timm":
        return "image-classification"
    architectures = config.get("architectures") or []
    mappings = TasksManager._TRANSFORMERS_TASKS_TO_MODEL_MAPPINGS
    # A seq2seq class is also listed under fill-mask (BART); the generative task is what people export.
    order = [t for t in _PREFERRED_TASKS if t in mappings] + [t for t in mappings if t not in _PREFERRED_TASKS]
    task = next((t for arch in architectures for t in order if arch in mappings[t].values()), None)
    if task is None:
        raise ExportError(
            f"{source}: cannot infer a task from architectures {architectures or '(none)'}; give the task explicitly",
            kind=FailureKind.EXPORT_UNSUPPORTED,
        )
    name: str = TasksManager.map_from_synonym(task)
    try:
        supported = TasksManager.get_supported_tasks_for_model_type(model_type, "onnx", library_name=library)
    except KeyError:
        return name
    return f"{name}-with-past" if f"{name}-with-past" in supported else name

