"""The `s3` test set: a real S3-compatible server on 127.0.0.1 (tests/s3_server.py)."""

from __future__ import annotations

from tests.s3_server import s3_server  # noqa: F401  (the session fixture)
