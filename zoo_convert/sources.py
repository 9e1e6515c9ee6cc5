"""A manifest source: a local folder or a Hub repo id, and the one rule for a valid id.

A valid Hub repo id is huggingface_hub's ``validate_repo_id`` (``name`` or
``org/name`` of letters, digits, ``-``, ``_``, ``.``), without the parts that could
walk out of a folder or the Hub cache. The manifest check and the fetch stage both
apply it; :data:`HUB_ID_PATTERN` is valid in both Python's ``re`` and RE2 (Arrow's
regex engine), so the manifest applies it to a whole column at once.
"""

from __future__ import annotations

import os
import re

HUB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,95})?$"
# Never inside an id: ``..`` walks up a path, ``--`` is the Hub cache's folder separator.
HUB_ID_FORBIDDEN = ("..", "--")
HUB_ID_FORBIDDEN_SUFFIX = ".git"

_HUB_ID = re.compile(HUB_ID_PATTERN)


def is_hub_id(source: str) -> bool:
    """Whether ``source`` is a Hub repo id the farm accepts."""
    return (
        bool(_HUB_ID.match(source))
        and not any(part in source for part in HUB_ID_FORBIDDEN)
        and not source.endswith(HUB_ID_FORBIDDEN_SUFFIX)
    )


def is_local(source: str) -> bool:
    """A source is a local folder when it exists or is spelled as an absolute path, else a hub id."""
    return os.path.exists(os.path.expanduser(source)) or source.startswith(("/", "./", "~"))
