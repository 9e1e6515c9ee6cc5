"""The static dashboard: DuckDB queries (data.py) rendered into an offline site (site.py, assets/); report.py, the
terminal's summary of one result.

Nothing is imported here: ``convert`` prints its summary with report.py and must not load DuckDB for it.
"""
