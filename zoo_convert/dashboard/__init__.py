"""The static dashboard: DuckDB queries (data.py) rendered into an offline site (site.py, assets/)."""

from .site import build_site, serve

__all__ = ["build_site", "serve"]
