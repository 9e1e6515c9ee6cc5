"""DuckDB -> a static, offline dashboard: ``index.html`` plus drill-down chunks under ``details/``.

The page's CSS, JS and data are inlined into ``index.html``; a model's
drill-down is a ``details/chunk-N.js`` script loaded on demand (a script tag
works from ``file://`` too, where fetch() of a local file does not).
"""

from __future__ import annotations

import functools
import http.server
import json
import math
import re
import shutil
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..store import ResultStore
from .data import collect

ASSETS = Path(__file__).with_name("assets")
CHUNK = 200
_MARKER = re.compile(r"/\*(CSS|DATA|JS)\*/")
_CHUNK = re.compile(r"chunk-\d+\.js")
_TITLE = "<title>zoo_convert: ONNX compatibility</title>"  # page.html's: how an earlier dashboard is known
_UNSAFE = {ord(c): f"\\u{ord(c):04x}" for c in "<>&"}
DETAIL_KEYS = {"detail_variants": "variants", "detail_outputs": "outputs", "detail_census": "census",
               "detail_stages": "stages", "detail_history": "history", "detail_publication": "publication",
               "detail_targets": "targets"}
_ONE_ROW = ("stages", "publication")  # one row per model; the others are lists


def build_site(db: str | Path, out_dir: str | Path, *, timer: Callable[[str, float], None] | None = None) -> Path:
    """Write the dashboard for ``db`` into ``out_dir``; returns the index.html path."""
    out = Path(out_dir)
    _check_out(out)
    store = ResultStore(db, read_only=True)
    with store.connect() as con:
        data = collect(con, timer)
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "details", ignore_errors=True)
    (out / "details").mkdir()
    details = _split_details(data)
    for chunk, models in details.items():
        (out / "details" / f"chunk-{chunk}.js").write_text(f"ZOO.details({_js(models)});\n")
    data["generated_at"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    data["chunk"] = CHUNK
    index = out / "index.html"
    index.write_text(render_page(data))
    return index


def _check_out(out: Path) -> None:
    """``out`` is new, empty, or an earlier dashboard (its index.html and details/chunk-*.js, nothing else):
    rebuilding replaces details/ whole, and must never delete a user's files (UsageError)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder")
    foreign = [p.name for p in out.iterdir() if p.name not in ("index.html", "details")]
    details = out / "details"
    if details.is_dir() and not details.is_symlink():
        foreign += [f"details/{p.name}" for p in details.iterdir() if not _CHUNK.fullmatch(p.name) or not p.is_file()]
    elif details.exists() or details.is_symlink():
        foreign.append("details")
    index = out / "index.html"
    if index.exists() and (not index.is_file() or _TITLE not in _head(index)):
        foreign.append("index.html")
    if foreign:
        shown = ", ".join(sorted(foreign)[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise UsageError(f"--out {out} holds files that are no dashboard's ({shown}); give an empty or new folder")


def _head(path: Path) -> str:
    with path.open("rb") as f:
        return f.read(2000).decode("utf-8", "replace")


def render_page(data: dict[str, Any]) -> str:
    """The page template with its CSS, data and JS filled in.

    One pass over the template: text put in is never scanned for markers again,
    so a model called ``/*JS*/`` stays a name.
    """
    parts = {
        "CSS": (ASSETS / "dashboard.css").read_text(),
        "DATA": _js(data),
        "JS": (ASSETS / "dashboard.js").read_text(),
    }
    return _MARKER.sub(lambda m: parts[m.group(1)], (ASSETS / "page.html").read_text())


def serve(out_dir: str | Path, *, port: int = 8000) -> http.server.ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1 for the built site (call serve_forever on it)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out_dir))
    return http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)


def _split_details(data: dict[str, Any]) -> dict[int, dict[int, dict[str, Any]]]:
    """Move the detail rows out of ``data`` into {chunk: {model id: {variants, outputs, census, stages, ...}}}."""
    chunks: dict[int, dict[int, dict[str, Any]]] = {}
    for query, key in DETAIL_KEYS.items():
        for row in data.pop(query):
            model_id = row.pop("id")
            model = chunks.setdefault(model_id // CHUNK, {}).setdefault(model_id, {})
            if key == "census":
                model[key] = row["ops"]
            elif key in _ONE_ROW:
                model[key] = row
            else:
                model.setdefault(key, []).append(row)
    return chunks


def _js(obj: object) -> str:
    """JSON in which no character can end or open markup (``</script>``, ``<!--``) wherever it is embedded.

    ``<``, ``>`` and ``&`` become ``\\u`` escapes, which JSON.parse and JS read back as
    the same characters (everything outside ASCII is escaped by json.dumps already).
    """
    text = json.dumps(_clean(obj), default=str, separators=(",", ":"))
    return text.translate(_UNSAFE)


def _clean(obj: object) -> object:
    """JSON has no inf/nan: they become null, and floats lose digits nobody reads."""
    if isinstance(obj, float):
        return float(f"{obj:.6g}") if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj
