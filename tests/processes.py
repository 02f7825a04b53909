"""Process checks shared by the test sets."""

from __future__ import annotations

import os


def process_gone(pid: int | None) -> bool:
    """Whether no process ``pid`` exists any more (signal 0 finds none)."""
    try:
        os.kill(pid or 0, 0)
    except ProcessLookupError:
        return True
    return False
