"""The policy input that adds an LLM's hidden state of each env's observation
(`fused.rl.policy_input.PolicyInput`): when to call the LLM, what the policy sees, ablations.

Every `skip_n` env steps (counted globally, so any skip_n works) all envs are encoded; between
calls, envs whose episode ended are refreshed in calls sized by `fused.llm.batching` (see
`llm_step`), so no env acts on a previous episode's state for long. The policy sees the hidden
state normalised by running moments kept in the state (and so in checkpoints).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import PartitionSpec as P

from fused.llm.encoder import Encoder
from fused.llm.norm import RunningNorm, init_norm, normalize, update_norm

COUNTS = ("llm/calls", "llm/refreshed", "llm/tokens")  # per-step metrics, summed over steps
LOAD = "llm/expert_load"  # [L_sparse, E] per step (MoE models), summed, then `load_metrics`


@struct.dataclass
class LLMState:
    hidden: jax.Array  # [N, H] float32, raw (un-normalised) hidden state per env
    age: jax.Array  # [N] int32: steps since the env's episode ended unencoded (0 = up to date)
    norm: RunningNorm


def init_llm_state(hidden_size: int, num_envs: int) -> LLMState:
    return LLMState(jnp.zeros((num_envs, hidden_size), jnp.float32),
                    jnp.ones(num_envs, jnp.int32),  # never encoded yet: waiting
                    init_norm(hidden_size))


def policy_hidden(enc: Encoder, s: LLMState) -> jax.Array:
    """What the policy sees: [N, H] normalised (if enabled) hidden states. Without LLM calls
    (`constant_hidden`) the state is zero whatever was restored, so every row is the same."""
    h = jnp.zeros_like(s.hidden) if enc.cfg.constant_hidden else s.hidden
    return normalize(s.norm, h) if enc.cfg.normalize else h


def llm_step(enc: Encoder, frozen, s: LLMState, obs, done, step, key, microbatch,
             refresh_rows, axis_name=None, first: bool = False):
    """Hidden states for the observations `obs` [N, D] about to be acted on.

    `done` [N]: the episode of the env ended on the previous step (so `obs` starts a new one);
    `step`: global env-step count. Every `skip_n` steps all envs are encoded in micro-batches of
    `microbatch`. Between those calls, envs whose episode ended are refreshed once
    `refresh_rows` of them wait or one has waited `refresh_wait` steps: every waiting env is then
    encoded, oldest first, in calls of `refresh_rows` rows (`fused.llm.batching` sizes both).
    `first`: `step` is the stream's step 0, where every env is encoded (the branch taken at any
    step a multiple of skip_n), so the other branches are not traced (a smaller init program).
    Returns (state, metrics dict of scalars)."""
    c = enc.cfg
    n = obs.shape[0]
    stale = (s.age > 0) | (done & c.refresh_on_reset)
    age = jnp.where(stale, s.age + 1, 0)
    zero = jnp.zeros((), jnp.float32)
    zeros = {k: zero for k in COUNTS}
    if enc.load_shape is not None:  # tokens routed to each expert, summed over the step's calls
        zeros[LOAD] = jnp.zeros(enc.load_shape, jnp.float32)
    if c.constant_hidden:
        return s.replace(age=jnp.zeros_like(age)), zeros
    k_full, k_part = jax.random.split(key)
    k_imagine_full = k_imagine_part = None
    if enc.draws:  # (keys of their own, so the rest of the stream is as without)
        k_full, k_imagine_full = jax.random.split(k_full)
        k_part, k_imagine_part = jax.random.split(k_part)

    def full(s):
        keys = None if k_imagine_full is None else jax.random.split(k_imagine_full, n)
        h, tokens, load = _encode(enc, frozen, obs, microbatch, keys)
        h = enc.shuffle(frozen, h, k_full)
        norm = update_norm(s.norm, h, jnp.ones(n), axis_name)
        return (LLMState(h, jnp.zeros_like(age), norm),
                _step_metrics(jnp.float32(1), zero, tokens, load))

    def refresh(s):
        r = min(refresh_rows, n)
        order = jnp.argsort(-age, stable=True)  # longest-waiting first
        # Whole calls of r rows; the last one is topped up with the first envs (done by then).
        order = jnp.concatenate([order, order[:-n % r]]).reshape(-1, r)
        calls = (stale.sum() + r - 1) // r

        def one_call(j, carry):
            hidden, done_rows, tokens, load = carry
            idx = order[j]
            valid = stale[idx] & ~done_rows[idx]
            keys = (None if k_imagine_part is None
                    else jax.random.split(jax.random.fold_in(k_imagine_part, j), r))
            h, t, lj = _encode(enc, frozen, obs[idx], None, keys)
            h = enc.shuffle(frozen, h, jax.random.fold_in(k_part, j))
            hidden = hidden.at[idx].set(jnp.where(valid[:, None], h, hidden[idx]))
            load = None if load is None else load + lj
            return hidden, done_rows.at[idx].set(done_rows[idx] | valid), tokens + t, load

        # A loop with as many calls as this device needs; collectives stay outside it.
        hidden, refreshed, tokens, load = jax.lax.fori_loop(
            0, calls, one_call, (s.hidden, jnp.zeros(n, bool), jnp.int32(0), zeros.get(LOAD)))
        norm = update_norm(s.norm, hidden, refreshed, axis_name)
        return (LLMState(hidden, jnp.where(refreshed, 0, age), norm),
                _step_metrics(zero, refreshed.sum().astype(jnp.float32), tokens, load))

    def keep(s):
        return s.replace(age=age), zeros

    if first:
        return full(s)
    due = (stale.sum() >= min(refresh_rows, n)) | (age.max() >= c.refresh_wait)
    if axis_name is not None:  # every device must take the same branch (collectives inside)
        due = jax.lax.psum(due.astype(jnp.int32), axis_name) > 0
    branch = jnp.where(step % c.skip_n == 0, 0, jnp.where(due, 1, 2))
    return jax.lax.switch(branch, [full, refresh, keep], s)


def _encode(enc: Encoder, frozen, obs, microbatch, keys):
    """(hidden, tokens, router load as float32 or None) of one call."""
    with jax.named_scope("llm"):  # in profiles: `bench/trace_report.py` groups by it
        e = enc.encode(frozen, obs, microbatch, keys)
    return e.hidden, e.tokens, None if e.load is None else e.load.astype(jnp.float32)


def _step_metrics(calls, refreshed, tokens, load) -> dict:
    m = {"llm/calls": calls, "llm/refreshed": refreshed,
         "llm/tokens": tokens.astype(jnp.float32)}
    if load is not None:
        m[LOAD] = load
    return m


def load_metrics(load: jax.Array) -> dict:
    """Balance of the router over an update from load [L_sparse, E] (tokens routed to each
    expert of each sparse layer, summed over the update's calls): `llm/expert_load_max`, the
    busiest expert's share over an even share (1 = balanced, E / k = every token on the same k
    experts), the worst layer's; `llm/expert_load_cv`, the coefficient of variation of the
    experts' loads, averaged over layers. 0 when no token was encoded. Nothing is dropped (no
    capacity limit), so these describe routing, not lost tokens."""
    mean = load.mean(-1)  # [L_sparse]
    some = mean > 0
    safe = jnp.where(some, mean, 1.0)
    peak = jnp.where(some, load.max(-1) / safe, 0.0)
    cv = jnp.where(some, load.std(-1) / safe, 0.0)
    return {"llm/expert_load_max": peak.max(), "llm/expert_load_cv": cv.mean()}


def hidden_metrics(h: jax.Array) -> dict:
    """Statistics of raw hidden states h [N, H] across envs."""
    n = h.shape[0]
    norms = jnp.linalg.norm(h, axis=-1)
    unit = h / jnp.maximum(norms[:, None], 1e-12)
    total = jnp.sum(unit, axis=0)
    cos = (jnp.dot(total, total) - n) / max(n * (n - 1), 1)
    per_dim = h.std(axis=0)
    return {"hidden/mean": h.mean(), "hidden/std": h.std(), "hidden/norm": norms.mean(),
            "hidden/active_dims": jnp.mean(per_dim > 1e-2 * jnp.maximum(per_dim.mean(), 1e-12)),
            "hidden/mean_cosine": cos}


class LLMInput:
    """Observation + the LLM's (normalised) hidden state: network input {"obs", "hidden"}."""

    def __init__(self, encoder: Encoder, microbatch: int, refresh_rows: int, num_envs: int):
        self.encoder = encoder
        self.frozen = encoder.frozen
        self.microbatch = microbatch  # envs per LLM microbatch (per device)
        self.refresh_rows = refresh_rows  # envs per refresh call (per device)
        self.num_envs = num_envs  # global
        self._call_seconds: float | None = None

    def init(self, frozen, obs, key, axis_name):
        k_run, k_llm = jax.random.split(key)
        n = obs.shape[0]
        state, _ = llm_step(self.encoder, frozen, init_llm_state(self.encoder.hidden_size, n),
                            obs,
                            jnp.zeros(n, bool), jnp.int32(0), k_llm, self.microbatch,
                            self.refresh_rows, axis_name, first=True)
        return state, k_run

    def step(self, frozen, state, obs, done, t, key, axis_name):
        return llm_step(self.encoder, frozen, state, obs, done, t, key, self.microbatch,
                        self.refresh_rows, axis_name)

    def view(self, state: LLMState, obs):
        return {"obs": obs, "hidden": policy_hidden(self.encoder, state)}

    def example(self, obs):
        return {"obs": obs, "hidden": jnp.zeros((obs.shape[0], self.encoder.hidden_size))}

    def summary(self, state: LLMState, step_totals: dict, axis_name) -> dict:
        # Every device takes the same branch at every step: calls are counted once, the rest
        # (rows refreshed, tokens encoded) summed over devices.
        psum = (lambda v: jax.lax.psum(v, axis_name)) if axis_name else (lambda v: v)
        pmean = (lambda v: jax.lax.pmean(v, axis_name)) if axis_name else (lambda v: v)
        out = {"llm/calls": step_totals["llm/calls"],
               "llm/refreshed": psum(step_totals["llm/refreshed"]),
               "llm/tokens": psum(step_totals["llm/tokens"])}
        out.update({k: pmean(v) for k, v in hidden_metrics(state.hidden).items()})
        if LOAD in step_totals:
            out.update(load_metrics(psum(step_totals[LOAD])))
        return out

    def state_specs(self, state: LLMState, env_axis: str):
        return LLMState(P(env_axis), P(env_axis), jax.tree.map(lambda _: P(), state.norm))

    def host_metrics(self, row: dict, chunk_seconds: float, rows_in_chunk: int, obs) -> dict:
        """`llm/tokens_per_encode`, and `llm/time_share_est`: this update's encodes x the time
        of one call over all envs (the jitted encoder alone, timed once after a warm-up) / the
        update's share of the chunk time (XLA gives no per-op clock inside a compiled chunk);
        none for an encoder that times its own calls (the vLLM host)."""
        encodes = row["llm/calls"] * self.num_envs + row["llm/refreshed"]
        out = {"llm/tokens_per_encode": row["llm/tokens"] / max(encodes, 1.0)}
        if isinstance(obs, jax.Array) and not obs.is_fully_addressable:
            return out  # (one host's estimate: not across processes)
        if self._call_seconds is None:
            self._call_seconds = self.encoder.call_seconds(obs, self.microbatch) or 0.0
        if self._call_seconds:
            out["llm/time_share_est"] = min(1.0, encodes / self.num_envs * self._call_seconds
                                            * rows_in_chunk / chunk_seconds)
        return out

    def record(self, state: LLMState) -> dict:
        """The raw hidden state each env's policy acted on (before normalisation)."""
        return {"hidden": state.hidden}

    def adopt(self, fresh: LLMState, trained: LLMState) -> LLMState:
        """The trained run's running normaliser, so the policy sees what it saw in training."""
        return fresh.replace(norm=trained.norm)
