"""``os.environ`` changed for the length of a block: the one helper for code that starts child processes
(vLLM's engine, a notebook kernel) which inherit this process's environment."""

from __future__ import annotations

import contextlib
import os


@contextlib.contextmanager
def environment(set_: dict, unset: tuple = ()):
    """``os.environ`` with ``set_`` and without ``unset`` inside the block; every variable named is restored
    (or removed again) afterwards, also on an exception."""
    saved = {k: os.environ.get(k) for k in (*set_, *unset)}
    try:
        for k in unset:
            os.environ.pop(k, None)
        os.environ.update(set_)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
