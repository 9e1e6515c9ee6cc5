"""The bundled tiny zoo: random checkpoints of many architectures, built locally.

``build(dir)`` writes one folder per model (config.json, model.safetensors, and
the tokenizer / image processor / feature extractor files its task needs) plus
``manifest.parquet`` in the farm's manifest schema. Nothing is downloaded:
tokenizer vocabularies are learned from a fixed synthetic English corpus and
weights come from ``from_config`` right after seeding torch with the model's
:func:`model_seed`, so every build writes the same bytes.

    catalogue   the models (:data:`ZOO`, one :class:`ZooModel` each)
    tokenizers  the WordPiece / BPE / Unigram tokenizers they use
    builder     checkpoints, processors and the manifest
"""

from __future__ import annotations

from .builder import REPO_MANIFEST_PREFIX, build, build_model, manifest_table, model_seed, select, write_repo_manifest
from .catalogue import ZOO, ZooModel
from .tokenizers import TokenizerSpec, corpus, make_tokenizer

__all__ = [
    "REPO_MANIFEST_PREFIX",
    "ZOO",
    "TokenizerSpec",
    "ZooModel",
    "build",
    "build_model",
    "corpus",
    "make_tokenizer",
    "manifest_table",
    "model_seed",
    "select",
    "write_repo_manifest",
]
