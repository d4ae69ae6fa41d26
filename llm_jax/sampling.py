"""How the next token is drawn: one config, one validation, one draw, for every caller
(`python -m llm_jax generate`, `play.py llm`, imagination in train.py and label.py).

`SamplingFlags` are what a user gives (every field optional); `resolve_sampling` turns them and
the checkpoint's `generation_config.json` into a `Sampling` (static: part of the compiled
program) and records where each value came from. The defaults are the model's own, as HF
transformers' `generate` and vLLM (`--generation-config auto`) apply them:
- no flag: the checkpoint's generation_config.json (Qwen3: `do_sample`, temperature 0.6, top-k
  20, top-p 0.95); `do_sample` false or absent means greedy (HF's reading); a sampling field it
  leaves out takes HF's `GenerationConfig` default (temperature 1, top-k 50, top-p 1);
- no generation_config.json (a random model, a folder without one): greedy;
- each flag overrides its value; a sampling flag over a greedy default samples, the fields not
  given then off (temperature 1, all tokens, top-p 1); `--greedy` or temperature 0 is greedy
  and takes no other sampling flag.

The draw (`sample_tokens`) applies temperature, then top-k, then top-p on what top-k kept, as
HF does. Top-p without top-k sorts only the `TOP_P_CANDIDATES` most likely tokens when they
hold the nucleus (their mass reaches top-p: the tokens after them are never kept), which is
exact; a step where some row's candidates fall short (a nearly flat distribution) sorts the
whole vocabulary (`lax.cond`: one of the two runs).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp

TOP_P_CANDIDATES = 1024
# HF transformers' GenerationConfig defaults for the fields a generation_config.json leaves out.
HF_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0}
OFF = {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
FIELDS = ("temperature", "top_k", "top_p")


class GenerateError(ValueError):
    """Generation settings that cannot work (one line: the problem and the fix)."""


def _named(prefix: str, field: str, value) -> str:
    """A value as the caller names it: a flag (`prefix` "--": `--top-p 1.5`) or a field
    (`prefix` "" or "llm.imagine.": `top_p=1.5`)."""
    if prefix.startswith("-"):
        return f"{prefix}{field.replace('_', '-')} {value}"
    return f"{prefix}{field}={value}"


def _greedy(prefix: str) -> str:
    return f"{prefix}greedy" if prefix.startswith("-") else f"{prefix}greedy=True"


def check_sampling(temperature: float, top_k: int, top_p: float, prefix: str = "") -> None:
    """GenerateError unless temperature >= 0, top_k >= 0 and 0 < top_p <= 1 (`prefix`: how
    the caller names the values, `_named`)."""
    if not temperature >= 0:
        raise GenerateError(f"{_named(prefix, 'temperature', temperature)} is negative; use 0 "
                            "(greedy) or more")
    if top_k < 0:
        raise GenerateError(f"{_named(prefix, 'top_k', top_k)} is negative; use 0 (all tokens) "
                            "or a count")
    if not 0 < top_p <= 1:
        raise GenerateError(f"{_named(prefix, 'top_p', top_p)} lies outside (0, 1]; use 1 to "
                            "keep all tokens")


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How the next token is drawn (static: part of the compiled program). Applied as HF
    transformers does: temperature, then top-k, then top-p on what top-k kept."""

    temperature: float = 1.0
    """Divides the logits; 0 means greedy (argmax, no randomness)."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 (or >= vocab) keeps all."""
    top_p: float = 1.0
    """Nucleus: keep the most likely tokens, in order, while the probability of those before a
    token is below top_p (so at least one); 1 keeps all."""

    def __post_init__(self):
        check_sampling(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = Sampling(temperature=0.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingFlags:
    """The sampling flags of every command that generates (unset: the model's own defaults)."""

    greedy: bool = False
    """Greedy tokens (argmax); no sampling flag may be given with it."""
    temperature: float | None = None
    """Sampling temperature (0: greedy). Unset: the checkpoint's generation_config.json (Qwen3:
    0.6), greedy where there is none."""
    top_k: int | None = None
    """Sample among the k most likely tokens (0: all). Unset: generation_config.json's (with
    none, or where it says do_sample false: greedy, or all tokens under a sampling flag)."""
    top_p: float | None = None
    """Nucleus sampling threshold in (0, 1] (1: off). Unset: generation_config.json's (with
    none: greedy, or off under a sampling flag)."""


class Resolved(NamedTuple):
    sampling: Sampling
    source: dict[str, str]  # field -> "flag", "generation_config.json", "default" or "greedy"

    def record(self) -> dict:
        """The values used and where they came from (for a run's JSON)."""
        s = self.sampling
        return {"greedy": s.greedy, "temperature": s.temperature, "top_k": s.top_k,
                "top_p": s.top_p, "source": dict(self.source)}

    def describe(self) -> str:
        s = self.sampling
        if s.greedy:
            return f"greedy: {self.source['temperature']}"
        where = sorted(set(self.source.values()))
        return (f"temperature {s.temperature}, top-k {s.top_k or 'all'}, top-p {s.top_p} "
                f"({', '.join(where)})")


def generation_config(folder: str | Path | None) -> dict | None:
    """The checkpoint folder's generation_config.json, or None where it has none."""
    path = None if folder is None else Path(folder) / "generation_config.json"
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise GenerateError(f"{path} is not valid JSON ({e}); fix or remove it") from None


def check_flags(f: SamplingFlags, prefix: str = "--") -> None:
    """The one validation of sampling flags (before anything loads)."""
    given = [n for n in FIELDS if getattr(f, n) is not None]
    if f.greedy and given:
        flags = ", ".join(_named(prefix, n, getattr(f, n)) for n in given)
        raise GenerateError(f"{_greedy(prefix)} with {flags}: greedy "
                            "tokens take no sampling flag; drop one or the other")
    check_sampling(OFF["temperature"] if f.temperature is None else f.temperature,
                   OFF["top_k"] if f.top_k is None else f.top_k,
                   OFF["top_p"] if f.top_p is None else f.top_p, prefix)
    if f.temperature == 0 and any(getattr(f, n) is not None for n in ("top_k", "top_p")):
        raise GenerateError(f"{_named(prefix, 'temperature', 0)} is greedy and takes no top-k or "
                            "top-p; drop them or give a temperature above 0")


def resolve_sampling(f: SamplingFlags, folder: str | Path | None,
                     prefix: str = "--") -> Resolved:
    """The `Sampling` the flags and the checkpoint's generation_config.json give (module
    docstring: the rules), with where each value came from."""
    check_flags(f, prefix)
    if f.greedy or f.temperature == 0:
        why = _greedy(prefix) if f.greedy else _named(prefix, "temperature", 0)
        return Resolved(GREEDY, {n: why for n in FIELDS})
    gc = generation_config(folder)
    samples = bool(gc and gc.get("do_sample"))
    given = {n: getattr(f, n) for n in FIELDS if getattr(f, n) is not None}
    if not samples and not given:
        why = ("generation_config.json (do_sample false)" if gc
               else "default (no generation_config.json)")
        return Resolved(GREEDY, {n: why for n in FIELDS})
    values, source = {}, {}
    for n in FIELDS:
        if n in given:
            values[n], source[n] = given[n], "flag"
        elif samples and gc.get(n) is not None:
            values[n], source[n] = gc[n], "generation_config.json"
        elif samples:
            values[n], source[n] = HF_DEFAULTS[n], "default (HF GenerationConfig)"
        else:
            values[n], source[n] = OFF[n], "default (off)"
    try:
        return Resolved(Sampling(float(values["temperature"]), int(values["top_k"]),
                                 float(values["top_p"])), source)
    except GenerateError as e:
        raise GenerateError(f"{e} (from {Path(folder) / 'generation_config.json'})") from None


def first_argmax(x):
    """jnp.argmax over the last axis of [B, V] (the first index of the maximum), in blocks: the
    largest block size <= 512 dividing V, each block's max, the first block holding the row's
    maximum, then the argmax inside it. XLA:CPU's argmax (a variadic reduction) takes 22 ms on
    [64, 151680] where this takes 0.9 ms; padding V to a block multiple would cost 14 ms, hence
    a divisor."""
    b, v = x.shape
    size = next(d for d in range(min(v, 512), 0, -1) if v % d == 0)
    blocks = x.reshape(b, v // size, size)
    first = jnp.argmax(jnp.max(blocks, axis=-1), axis=-1)  # [B]
    inside = jnp.take_along_axis(blocks, first[:, None, None], axis=1)[:, 0]  # [B, size]
    return (first * size + jnp.argmax(inside, axis=-1)).astype(jnp.int32)


def _nucleus(vals, top_p: float, total=None):
    """vals [B, K] descending logits: those outside the nucleus set to -inf. Probabilities are
    of the whole row when `total` (its logsumexp [B]) is given, else of the K kept."""
    total = jax.nn.logsumexp(vals, axis=-1) if total is None else total
    p = jnp.exp(vals - total[:, None])
    before = jnp.cumsum(p, axis=-1) - p  # probability of the tokens ranked above
    return jnp.where(before < top_p, vals, -jnp.inf)


def _draw(keys, vals, idx):
    choice = jax.vmap(jax.random.categorical)(keys, vals)  # [B]
    return jnp.take_along_axis(idx, choice[:, None], axis=-1)[:, 0].astype(jnp.int32)


def _top_p_only(x, keys, top_p: float):
    """Top-p over the whole vocabulary, sorting TOP_P_CANDIDATES tokens where they hold the
    nucleus: a token past them has at least their mass before it (>= top_p), so it is never
    kept, and the draw is exactly the full sort's. Otherwise every row is sorted whole."""
    v = x.shape[-1]
    total = jax.nn.logsumexp(x, axis=-1)  # [B]
    vals, idx = jax.lax.top_k(x, min(TOP_P_CANDIDATES, v))
    held = jnp.exp(jax.nn.logsumexp(vals, axis=-1) - total) >= top_p

    def candidates():
        return _draw(keys, _nucleus(vals, top_p, total), idx)

    def whole():
        full, fidx = jax.lax.top_k(x, v)
        return _draw(keys, _nucleus(full, top_p, total), fidx)

    if TOP_P_CANDIDATES >= v:
        return candidates()
    return jax.lax.cond(held.all(), candidates, whole)


def sample_tokens(logits, keys, sampling: Sampling):
    """One token per row. logits: [B, V] float32; keys: [B] PRNG keys (one per row; unused when
    greedy). Returns [B] int32."""
    if sampling.greedy:
        return first_argmax(logits)
    x = logits / sampling.temperature
    v = x.shape[-1]
    top_k = sampling.top_k if 0 < sampling.top_k < v else 0
    if top_k == 0 and sampling.top_p == 1:  # the whole vocabulary, no sort: the Gumbel-max draw
        noise = jax.vmap(lambda k: jax.random.gumbel(k, (v,), x.dtype))(keys)
        return first_argmax(x + noise)
    if top_k == 0:
        return _top_p_only(x, keys, sampling.top_p)
    vals, idx = jax.lax.top_k(x, top_k)  # [B, k], descending
    if sampling.top_p < 1:
        vals = _nucleus(vals, sampling.top_p)
    return _draw(keys, vals, idx)
