"""Unbiased evaluation: N episodes from N fixed seeds, each played to its end.

Every env plays exactly one episode (no auto-reset); the host calls `block` until all have
ended or a step cap is reached (episodes still running then are reported as censored, never
dropped). Stopping at the first K episodes to finish, as the prior evaluation did, keeps the
short ones and over-represents early deaths; here every seed's episode counts once, so the mean
return estimates the policy's expected return.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fused.rl import acting
from fused.envspec import EnvSpec
from fused.rl.acting import Policy, Rollout
from fused.rl.collect import record_step
from fused.rl.obs_codec import ObsCodec
from fused.rl.env_api import Env
from fused.rl.policy_input import PolicyInput
from fused.rl.vec_env import VecEnv, VecEnvState, Worlds


@struct.dataclass
class EvalState:
    env: VecEnvState  # [N] envs, each in its one episode
    inputs: Any  # the policy input's state
    carry: Any  # the policy's carry (None for a feed-forward one)
    done: jax.Array  # [N] bool: the episode has ended
    ret: jax.Array  # [N] float32, undiscounted return so far
    length: jax.Array  # [N] int32
    achievements: jax.Array  # [N, A] bool, at the episode's end (so far while running)
    terminated: jax.Array  # [N] bool: ended by termination (vs truncation)
    t: jax.Array  # [] int32 steps taken
    rng: jax.Array  # the run's key: step t acts with fold_in(rng, t)
    stats: dict  # {name: [N]} the policy's per-step figures (`Policy.stats`) summed per episode
    spent: dict  # the same figures summed over every step computed, the envs whose episode has
    #              ended (or passed the step cap) included: what the device did

    @property
    def obs(self) -> jax.Array:
        return self.env.obs


class Evaluator(NamedTuple):
    init: Callable  # (seed key, frozen, inputs_state or None, env_state=None) -> EvalState
    block: Callable  # (EvalState, params, frozen) -> EvalState (block_steps steps); with
    #                  `record` or `watch`: (EvalState, {"record": (Record [T, N, ...],
    #                  live [T, N]), "watch": what `watch` returned, [T, ...]}) (the step's
    #                  dataset record, and whether it counts: the episode was still running)
    worlds: Worlds  # the envs `init(key, ...)` starts from (made inside it if not given)


def episode_keys(key: jax.Array, n: int) -> jax.Array:
    """Episode i's reset key depends on (key, i) only: the same seeds for every policy."""
    return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(n))


def make_evaluate(env: Env, policy: Policy, inputs: PolicyInput, num_episodes: int,
                  block_steps: int, greedy: bool = False, max_steps: int | None = None,
                  record: EnvSpec | None = None, watch: Callable | None = None
                  ) -> Evaluator:
    """`policy` acts (`fused.rl.acting`) through the shared acting step, on envs that do not
    reset; `init`'s `trained` is the trained run's policy-input state (its normaliser),
    installed with `inputs.adopt`. Steps past `max_steps` are not counted: episodes running then
    stay not done (censored). With `record` (the env's spec), `block` also returns each step's
    dataset record (`fused.rl.collect.Record`), so the episodes played can be stored; with
    `watch`, `watch(before, after, live, acted)` of each step (the states around it, [N]
    whether it counts, and what it did: `fused.rl.acting.Acted`, V(x) of every step included),
    so what the episodes looked like can be kept (`fused.video.FrameWatch`)."""
    cap = jnp.int32(max_steps if max_steps is not None else jnp.iinfo(jnp.int32).max)
    n_ach = len(env.achievement_names)
    rollout = Rollout(policy.with_sample(acting.greedy) if greedy else policy, inputs,
                      VecEnv(env, None), num_episodes, num_episodes,
                      # a dataset stores V(x) of every step, a video draws it
                      values=record is not None or watch is not None)

    def reset_keys(key):
        k_reset, _ = jax.random.split(key)
        return episode_keys(k_reset, num_episodes), k_reset

    worlds = Worlds(reset_keys, rollout.envs)

    def init(key, frozen, trained=None, env_state=None):
        _, k_run = jax.random.split(key)
        if env_state is None:
            env_state = worlds(key)
        istate, k_run = inputs.init(frozen, env_state.obs, k_run, None)
        if trained is not None:
            istate = inputs.adopt(istate, trained)
        z = jnp.zeros(num_episodes)
        carry = policy.carry(num_episodes)
        stats = {} if policy.stats is None else jax.tree.map(jnp.zeros_like,
                                                              policy.stats(carry))
        return EvalState(env=env_state, inputs=istate, carry=carry, done=z.astype(bool),
                         ret=z.astype(jnp.float32), length=z.astype(jnp.int32),
                         achievements=jnp.zeros((num_episodes, n_ach), bool),
                         terminated=z.astype(bool), t=jnp.int32(0), rng=k_run, stats=stats,
                         spent=stats)

    codec = None if record is None else ObsCodec(record)

    def acted_step(s: EvalState, params, frozen, key):
        (env_state, istate, carry), a = rollout.step(params, frozen, s.env, s.inputs, s.carry,
                                                     key, s.t)
        res = a.env
        live = ~s.done & (s.t < cap)
        ended = live & a.done
        rec = None
        if codec is not None:
            rec = (record_step(codec, s.env.obs, a, s.length, s.achievements,
                               inputs.record(s.inputs)), live)
        new = s.replace(
            env=env_state, inputs=istate, carry=carry, done=s.done | ended,
            ret=s.ret + jnp.where(live, res.reward, 0.0),
            length=s.length + live.astype(jnp.int32),
            achievements=jnp.where(live[:, None], res.achievements.astype(bool),
                                   s.achievements),
            terminated=s.terminated | (live & res.terminated), t=s.t + 1,
            stats={k: v + jnp.where(live, a.policy_stats[k], 0) for k, v in s.stats.items()},
            spent={k: v + a.policy_stats[k] for k, v in s.spent.items()})
        extras = {} if rec is None else {"record": rec}
        if watch is not None:
            extras["watch"] = watch(s, new, live, a)
        return new, extras

    def block(s: EvalState, params, frozen):
        # step t's key is (run key, t) alone: the episodes are the same whatever the block size
        # (so eval sizes its blocks to end on its step cap: `offline_eval.evaluate`)
        def body(s, _):
            return acted_step(s, params, frozen, jax.random.fold_in(s.rng, s.t))

        s, extras = jax.lax.scan(body, s, None, length=block_steps)
        return (s, extras) if extras else s

    return Evaluator(init, block, worlds)


def mean_ci95(x: np.ndarray) -> tuple[float, float, float]:
    """Mean and a 95% confidence interval (normal approximation, sample standard deviation)."""
    x = np.asarray(x, np.float64)
    m = float(x.mean())
    if len(x) < 2:
        return m, float("nan"), float("nan")
    half = 1.959964 * float(x.std(ddof=1)) / np.sqrt(len(x))
    return m, m - half, m + half


def ci_text(lo: float, hi: float) -> str:
    """An interval as `[-0.81, -0.19]` (a dash between signed bounds reads as one number)."""
    return f"[{lo:.2f}, {hi:.2f}]"


def summarise(s: EvalState, achievement_names, max_steps: int | None,
              only: np.ndarray | None = None) -> dict:
    """eval.json's figures from the final state (host numpy); `only` [N] bool: of those
    episodes alone (an interrupted evaluation's finished ones). Figures of no episode are None."""
    keep = np.ones(np.shape(s.ret), bool) if only is None else np.asarray(only, bool)
    ret, length = np.asarray(s.ret)[keep], np.asarray(s.length)[keep]
    done = np.asarray(s.done)[keep]
    ach = np.asarray(s.achievements)[keep]
    if not len(ret):
        return {"episodes": 0, "return_mean": None, "return_ci95": [None, None],
                "return_std": None, "length_mean": None, "length_max": None, "censored": 0,
                "step_cap": max_steps, "terminated": 0,
                "achievements": {n: None for n in achievement_names}, "returns": [],
                "lengths": []}
    m, lo, hi = mean_ci95(ret)
    nan_free = lambda x: None if np.isnan(x) else x  # noqa: E731  (JSON has no NaN)
    return {
        "episodes": len(ret), "return_mean": m, "return_ci95": [nan_free(lo), nan_free(hi)],
        "return_std": float(ret.std(ddof=1)) if len(ret) > 1 else 0.0,
        "length_mean": float(length.mean()), "length_max": int(length.max()),
        "censored": int((~done).sum()), "step_cap": max_steps,
        "terminated": int(np.asarray(s.terminated)[keep].sum()),
        "achievements": {n: float(ach[:, i].mean()) for i, n in enumerate(achievement_names)},
        "returns": ret.tolist(), "lengths": length.tolist()}
