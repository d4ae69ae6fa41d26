"""Files that are whole or absent, and JAX's persistent compilation cache: the two host chores
every entry point, benchmark and test shares."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Iterator

from fused.errors import ConfigError

DEFAULT_CACHE = "~/.cache/craftax-fused/jax"


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; once the block ends without an exception, the file
    written there replaces `path` in one rename (readers see the old file or the new one, never
    half of one). The temporary keeps the suffix, so writers that go by it (savefig, np.savez)
    write the right format."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}{path.suffix}")
    try:
        yield tmp
        with open(tmp, "rb+") as f:  # on disk before the rename, so a crash keeps one version
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(path: str | Path, data: str | bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)


def atomic_write_json(path: str | Path, obj, indent: int | None = 1) -> None:
    atomic_write(path, json.dumps(obj, indent=indent) + "\n")


def require_writable(path: str | Path, what: str) -> None:
    """ConfigError (one line) unless a file can be created in `path` (or, if it does not exist
    yet, in its nearest existing parent): checked before any work, so nothing is computed only
    to be lost at the first write."""
    folder = Path(path).expanduser().absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ConfigError(f"{what} {path}: {folder} is not a folder")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as e:
        raise ConfigError(f"{what} {path} is not writable ({folder}: {e.strerror}); choose "
                          "a folder you can write to or fix its permissions") from None
