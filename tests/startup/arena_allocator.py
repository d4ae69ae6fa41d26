"""CPython's arena allocator swapped, in the test processes, for arena.c's, which keeps a few freed
blocks for reuse: CPython 3.11 maps and unmaps a frame-stack chunk each time the call depth goes
back and forth over a chunk's edge, tens of thousands of times in a command, mostly while JAX
traces. The programs and every number they compute are the same (only where Python's own
objects live changes).

tests/conftest.py builds the library once a session (`build`, with the system's C compiler; none,
no swap) and names it in $FUSED_TEST_ARENA for the processes it starts; each loads it at
start-up (tests/startup/sitecustomize.py calls `keep`). FUSED_TEST_ARENA=0 turns it off."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("arena.c")


class Allocator(ctypes.Structure):  # PyObjectArenaAllocator
    _fields_ = [("ctx", ctypes.c_void_p), ("alloc", ctypes.c_void_p), ("free", ctypes.c_void_p)]


_installed: list = []  # the library and the struct CPython points at, kept alive


def build() -> str | None:
    """arena.c compiled into a shared library in the temporary folder (once per source: the file
    name holds its hash, written under another name and renamed, so concurrent sessions agree);
    None without a C compiler, or when the compile or the folder fails."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    folder = Path(tempfile.gettempdir()) / f"fused-tests-{os.getuid()}"
    lib = folder / f"arena-{digest}.so"
    part = lib.with_suffix(f".{os.getpid()}.part")
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if folder.stat().st_uid != os.getuid():  # (a library another user put there: not loaded)
            return None
        if lib.is_file():
            return str(lib)
        done = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(part), str(SOURCE)],
                              capture_output=True)
        if done.returncode != 0:
            part.unlink(missing_ok=True)
            return None
        os.replace(part, lib)
    except OSError:  # (a temporary folder that cannot be written: no swap)
        return None
    return str(lib)


def keep(path: str) -> bool:
    """Make this process's arena allocator the library's at `path`. True once swapped."""
    if _installed:
        return True
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return False
    allocator = Allocator(None, ctypes.cast(lib.arena_alloc, ctypes.c_void_p),
                           ctypes.cast(lib.arena_free, ctypes.c_void_p))
    ctypes.pythonapi.PyObject_SetArenaAllocator(ctypes.byref(allocator))
    _installed.extend((lib, allocator))
    return True
