"""Environment variables set for a block of code and put back afterwards.

Libraries that ortlab drives (ONNX Runtime's ORTModule, the experiment trackers, a child process started inside the
block) read their switches from the environment rather than from arguments; the block sets them and restores every
variable exactly as it was, removing the ones that were unset.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def temporary_env(values: dict[str, str]) -> Iterator[None]:
    """Set `values` in os.environ for the block; restore each variable (or its absence) afterwards."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
