"""``paused_gc()``: no cyclic garbage collection while a compile step builds its trees.

Compiling a long program keeps hundreds of thousands of small IR objects alive, and every few
percent of growth CPython's collector walks all of them looking for cycles that the immutable IR
does not make (a 5,000-statement chain spent a quarter of its compile time there). Inside
``paused_gc()`` the collector is off; it is back on (as it was) when the last thread using it
leaves, and the few cycles made meanwhile are collected later as usual. Reference counting, which
frees nearly everything, is untouched.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_users = 0  # threads inside paused_gc() now
_was_enabled = False  # the collector's state when the first of them came in


@contextmanager
def paused_gc() -> Iterator[None]:
    global _users, _was_enabled
    with _lock:
        if _users == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0 and _was_enabled:
                gc.enable()
