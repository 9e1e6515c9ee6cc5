"""Publishing: verified artifact folders -> one HuggingFace Hub repo per model.

Beside the pipeline, not a stage of it: it reads what a farm run recorded and
pushes it. For every model of a run that passed verification, :func:`publish_run`
builds the repo a runtime loads directly (``onnx/*.onnx`` with external data,
the config, tokenizer and processor files, and a ``README.md`` model card) and
pushes it as ONE commit, so a repo is never half-published. Before committing it
compares each local file's sha256 (git blob sha1 for non-LFS files) with what
the Hub already has: when every artifact matches, nothing is uploaded and no
commit is made, so a nightly rerun costs one request per model, and a run that
stopped half-way resumes by publishing only what is still missing.

    candidates.py   the results DB -> Candidate (through store.queries)
    files.py        which files a repo holds, and their hashes
    card.py         the model card
    hub.py          the Hub calls, retried after 429 / 5xx (Retry-After first)
    publisher.py    publish_run / publish_candidate, PublicationStatus

The Hub token is passed in explicitly (the CLI reads ``--token``, ``HF_TOKEN`` or
the huggingface_hub login); it is never logged, stored or written into a card,
and any message recorded is scrubbed of it.
"""

from .candidates import Candidate, VariantRow, load_candidates
from .card import model_card
from .files import repo_files
from .hub import HubClient
from .publisher import (
    DEFAULT_MAX_TIME_S,
    DEFAULT_REPO_TEMPLATE,
    TEMPLATE_FIELDS,
    Publication,
    PublicationStatus,
    PublishOptions,
    Selection,
    publish_candidate,
    publish_run,
    repo_id_for,
    select,
)

__all__ = [
    "DEFAULT_MAX_TIME_S",
    "DEFAULT_REPO_TEMPLATE",
    "TEMPLATE_FIELDS",
    "Selection",
    "select",
    "Candidate",
    "HubClient",
    "Publication",
    "PublicationStatus",
    "PublishOptions",
    "VariantRow",
    "load_candidates",
    "model_card",
    "publish_candidate",
    "publish_run",
    "repo_files",
    "repo_id_for",
]
