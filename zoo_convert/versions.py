"""Toolchain versions: part of every result and of every job's cache key."""

from __future__ import annotations

import functools
from importlib import metadata

import zoo_convert

# timm builds the timm models: a new release may change an architecture, so it is part of the cache key too.
PACKAGES = ("torch", "timm", "transformers", "optimum", "optimum-onnx", "onnx", "onnxruntime", "onnxruntime-gpu")


@functools.cache
def toolchain_versions() -> dict[str, str]:
    """Installed versions, read from package metadata so the driver needs no torch import."""
    found = {"zoo_convert": zoo_convert.__version__}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found
