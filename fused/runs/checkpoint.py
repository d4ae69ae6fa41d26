"""Orbax checkpoints of the full training state, verified by a content digest on restore.

Orbax writes each step to a temporary folder and renames it when complete, so a process killed
mid-save leaves no half checkpoint behind; a checkpoint damaged later (disk, copy) fails the
sha256 of its files recorded at saving (`file_digests.json`, checked before orbax reads it),
its read or its content digest, and is skipped for the previous good one with one warning.
A checkpoint written before the state gained a field that is None unless used
(RunnerState.carry and .explore, added with the GRU and exploration variants) restores into the
current state with that field None, checked against its digest like any other.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from fused.runs.files import atomic_write_json


FILES = "file_digests.json"  # beside orbax's files in each step folder


def file_digests(folder: Path) -> dict[str, str]:
    """sha256 of every file under a checkpoint's folder but the record itself."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != FILES}


class CheckpointError(RuntimeError):
    """No usable checkpoint; the message says where and what to do."""


def state_digest(state: Any) -> str:
    """sha256 over every leaf's dtype, shape and bytes (host copy of the global arrays: with
    several processes each gathers the others' shards, so every process computes the digest a
    single-process run would)."""
    h = hashlib.sha256()
    leaves = jax.tree.leaves(state)
    if any(isinstance(x, jax.Array) and not x.is_fully_addressable for x in leaves):
        leaves = jax.tree.leaves(multihost_utils.process_allgather(state, tiled=True))
    for leaf in jax.device_get(leaves):
        a = np.asarray(leaf)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


class Checkpointer:
    def __init__(self, directory: str | Path, keep: int = 3):
        self.directory = Path(directory).absolute()
        self.manager = ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, step: int, state: Any, meta: dict | None = None) -> None:
        meta = dict(meta or {}, digest=state_digest(state))
        self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
        self.manager.wait_until_finished()
        if jax.process_index() == 0:
            folder = self.directory / str(step)
            atomic_write_json(folder / FILES, file_digests(folder))

    def damaged_files(self, step: int) -> list[str]:
        """Files of checkpoint `step` whose sha256 differs from the one recorded when it was
        saved (missing ones too); [] when it matches or predates the record. Checked before
        orbax reads it: orbax, failing half-way through a damaged checkpoint, leaves thousands
        of tracebacks from its reader threads behind."""
        folder = self.directory / str(step)
        try:
            recorded = json.loads((folder / FILES).read_text())
        except (OSError, ValueError):
            return []
        now = file_digests(folder)
        return sorted(k for k, v in recorded.items() if now.get(k) != v)

    def _target(self, step: int, abstract_state: Any):
        """The restore target of checkpoint `step`: the state itself, or, for a checkpoint that
        predates fields of the state which are None here, a dict of the fields it holds (the
        caller puts them back into the state)."""
        if not dataclasses.is_dataclass(abstract_state):
            return abstract_state
        saved = ocp.StandardCheckpointHandler().metadata(self.directory / str(step) / "state")
        saved = getattr(saved, "tree", saved)
        fields = {f.name: getattr(abstract_state, f.name)
                  for f in dataclasses.fields(abstract_state)}
        missing = [k for k in fields if k not in saved]
        if not missing or any(fields[k] is not None for k in missing):
            return abstract_state  # complete, or not an older layout: restoring says what differs
        return {k: v for k, v in fields.items() if k in saved}

    def restore(self, step: int, abstract_state: Any) -> tuple[int, Any, dict]:
        """Checkpoint `step`, checked against its digest (CheckpointError if it does not read
        back or does not match)."""
        damaged = self.damaged_files(step)
        if damaged:
            raise CheckpointError(f"{len(damaged)} file(s) differ from the sha256 recorded "
                                  f"when it was saved, e.g. {damaged[0]}")
        try:
            target = self._target(step, abstract_state)
            out = self.manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()))
            state = out.state if target is abstract_state else abstract_state.replace(**out.state)
        except Exception as e:  # orbax raises many kinds on damaged files
            raise CheckpointError(f"checkpoint {step} in {self.directory} does not read back "
                                  f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from e
        if state_digest(state) != out.meta.get("digest"):
            raise CheckpointError(f"checkpoint {step} in {self.directory}: content digest "
                                  "mismatch")
        return step, state, dict(out.meta)

    def restore_part(self, step: int, select: Callable[[dict], dict]) -> dict:
        """Part of checkpoint `step`'s state, as saved (nested dicts of arrays on this process's
        first device): `select` picks it from the saved tree of array metadata (e.g. the
        parameters). Checked against the sha256 of the checkpoint's files where recorded (the
        content digest covers the whole state, so it cannot check a part)."""
        damaged = self.damaged_files(step)
        if damaged:
            raise CheckpointError(f"{len(damaged)} file(s) differ from the sha256 recorded "
                                  f"when it was saved, e.g. {damaged[0]}")
        one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        try:
            saved = ocp.StandardCheckpointHandler().metadata(self.directory / str(step) / "state")
            target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one),
                                  select(getattr(saved, "tree", saved)))
            with warnings.catch_warnings():  # orbax notes the handler type it falls back to
                warnings.simplefilter("ignore")
                # the shardings to restore onto are this device's, whatever the saving run's
                # devices were (`restore_args`: orbax reads them there, not from `item`)
                out = self.manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.PyTreeRestore(
                        item=target, partial_restore=True,
                        restore_args=ocp.checkpoint_utils.construct_restore_args(target))))
        except Exception as e:  # orbax raises many kinds on damaged files
            raise CheckpointError(f"checkpoint {step} in {self.directory} does not read back "
                                  f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from e
        return out.state

    def restore_latest_part(self, select: Callable[[dict], dict]) -> tuple[int, dict]:
        """`restore_part` of the newest checkpoint that reads back (each unusable newer one named
        in one warning line)."""
        return self._newest(lambda step: (step, self.restore_part(step, select)))

    def _newest(self, restore: Callable[[int], Any], set_aside: bool = False,
                fix: str = "") -> Any:
        """`restore(step)` of the newest checkpoint for which it raises no CheckpointError; each
        newer one named in one warning line (and, with `set_aside`, moved aside)."""
        steps = self.steps()
        if not steps:
            raise CheckpointError(f"no checkpoint in {self.directory} yet (the run stopped "
                                  "before its first)")
        for step in reversed(steps):
            try:
                return restore(step)
            except CheckpointError as e:  # any damage: fall back to an older checkpoint
                where = ""
                if set_aside and jax.process_index() == 0:
                    where = f"; moved to {self.set_aside(step)}"
                why = str(e.__cause__ or e).splitlines()[0].split(". See full")[0][:200]
                warnings.warn(f"checkpoint {step} in {self.directory} is unusable ({why})"
                              f"{where}; trying the previous one", stacklevel=3)
        raise CheckpointError(f"no checkpoint in {self.directory} ({steps}) reads back (each "
                              f"one's error is in the warnings above){fix}")

    def set_aside(self, step: int) -> Path:
        """Move checkpoint `step` out of the manager's sight (a run that goes on from an older
        one saves this step again), into `damaged-checkpoints/` beside it: kept, not lost."""
        aside = self.directory.parent / "damaged-checkpoints" / f"{step}-{time.time():.0f}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(self.directory / str(step)), aside)
        self.manager.reload()
        return aside

    def restore_latest(self, abstract_state: Any, set_aside: bool = False
                       ) -> tuple[int, Any, dict]:
        """Newest checkpoint that reads back and matches its digest; each unusable newer one is
        named in one warning line (and, with `set_aside`, moved aside: see `set_aside`).

        abstract_state: a pytree of jax.ShapeDtypeStruct (with shardings) of the state."""
        return self._newest(lambda step: self.restore(step, abstract_state), set_aside,
                            "; a run written by a newer craftax-fused needs that version, a "
                            "damaged one a fresh start")

    def close(self) -> None:
        self.manager.close()


def abstract_like(state: Any, shardings: Any | None = None) -> Any:
    """ShapeDtypeStructs of `state` (optionally with given shardings) for restore targets."""
    if shardings is None:
        shardings = jax.tree.map(lambda x: getattr(x, "sharding", None), state)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        state, shardings)
