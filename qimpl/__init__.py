"""Durable agent runs: API, workflows and storage.

``qimpl`` never imports ``qualify``; the harness reaches it only through processes,
HTTP, the database, settings and crash-point directives.
"""

__version__ = "0.1.0"
