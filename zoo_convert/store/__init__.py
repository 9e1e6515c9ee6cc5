"""The compatibility database: schema and migrations (schema.py), the single writer (db.py)."""

from .db import ResultStore

__all__ = ["ResultStore"]
