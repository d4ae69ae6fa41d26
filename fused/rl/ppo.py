"""PPO pieces as top-level pure functions: GAE, the clipped loss, one rollout step, one update.

Everything here is plain JAX over explicit state; `fused.rl.trainer.make_train` assembles it
into the jitted chunk. Arrays are time-major `[T, N, ...]` as in PureJaxRL. Acting is `fused.rl.acting`'s
one step; what the network sees comes from its `PolicyInput`, and nothing here knows which.
"""

from __future__ import annotations

from typing import Any, Generic, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
import optax
from flax import struct

from fused.rl.config import PPOConfig
from fused.rl.acting import Policy, Rollout, categorical_entropy, categorical_log_prob
from fused.rl.explore import Explorer, Step
from fused.rl.policy_input import PolicyInput
from fused.rl.vec_env import VecEnvState

S = TypeVar("S")


class Transition(NamedTuple):
    obs: Any  # network input: [T, N, D], or a pytree of [T, N, ...] (PolicyInput.view)
    action: jax.Array  # [T, N] int32
    log_prob: jax.Array  # [T, N]
    value: jax.Array  # [T, N]
    reward: jax.Array  # [T, N]
    terminated: jax.Array  # [T, N] bool
    truncated: jax.Array  # [T, N] bool
    truncation_value: jax.Array  # [T, N] V(final obs) where truncated, else 0


class EpisodeStats(NamedTuple):
    """Sums over the episodes that ended in one update (host divides by `episodes`)."""

    episodes: jax.Array  # []
    return_sum: jax.Array  # []
    length_sum: jax.Array  # []
    achievement_sum: jax.Array  # [A]
    reset_reuse: jax.Array  # []


@struct.dataclass
class RunnerState(Generic[S]):
    params: Any
    opt_state: Any
    env: VecEnvState
    rng: jax.Array  # replicated across devices
    update_step: jax.Array  # [] int32, updates done so far
    inputs: S  # the PolicyInput's state (None for the plain observation)
    carry: Any = None  # [N, W] a recurrent policy's carry for the obs acted on next (else None)
    explore: Any = None  # the exploration bonus's state (`fused.rl.explore`), None without one


def gae(reward, value, terminated, truncated, truncation_value, last_value, gamma, lam):
    """Generalised advantage estimation, bootstrapping through truncation.

    All inputs [T, N] except last_value [N] (V of the obs after the last step). At a terminated
    step the next value is 0; at a truncated step it is V(final obs); the trace is cut at both.
    Returns (advantages, returns), each [T, N].
    """
    next_value = jnp.concatenate([value[1:], last_value[None]], axis=0)
    next_value = jnp.where(truncated, truncation_value, next_value)
    next_value = jnp.where(terminated, 0.0, next_value)
    delta = reward + gamma * next_value - value
    carry_on = 1.0 - (terminated | truncated).astype(jnp.float32)

    def backward(acc, x):
        d, c = x
        acc = d + gamma * lam * c * acc
        return acc, acc

    _, adv = jax.lax.scan(backward, jnp.zeros_like(last_value), (delta, carry_on), reverse=True)
    return adv, adv + value


def ppo_loss(logits, value, action, old_log_prob, old_value, advantage, target,
             clip_eps, vf_coef, ent_coef):
    """Clipped PPO objective with clipped value loss. Arrays [B]; advantage already normalised.
    Returns (loss, metrics dict)."""
    log_prob = categorical_log_prob(logits, action)
    ratio = jnp.exp(log_prob - old_log_prob)
    pg = -jnp.minimum(ratio * advantage, jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps) * advantage)
    v_clipped = old_value + jnp.clip(value - old_value, -clip_eps, clip_eps)
    v_loss = 0.5 * jnp.maximum((value - target) ** 2, (v_clipped - target) ** 2)
    entropy = categorical_entropy(logits)
    loss = pg.mean() + vf_coef * v_loss.mean() - ent_coef * entropy.mean()
    metrics = {
        "loss/policy": pg.mean(), "loss/value": v_loss.mean(), "loss/entropy": entropy.mean(),
        "loss/approx_kl": ((ratio - 1) - (log_prob - old_log_prob)).mean(),
        "loss/clip_frac": (jnp.abs(ratio - 1) > clip_eps).mean(),
        "loss/ratio_dev": jnp.abs(ratio - 1).max(),  # 0 at an epoch's first minibatch
    }
    return loss, metrics


class Ctx(NamedTuple):
    """Static pieces the pure step/update functions close over."""

    rollout: Rollout  # the policy, its input and the envs, acting one step
    tx: optax.GradientTransformation
    cfg: PPOConfig
    explorer: Explorer | None = None

    @property
    def policy(self) -> Policy:
        return self.rollout.policy

    @property
    def inputs(self) -> PolicyInput:
        return self.rollout.inputs

    @property
    def axis_name(self) -> str | None:
        return self.rollout.axis_name


def _pmean(x, axis_name):
    return jax.lax.pmean(x, axis_name) if axis_name else x


def _psum(x, axis_name):
    return jax.lax.psum(x, axis_name) if axis_name else x


def rollout_step(ctx: Ctx, params, frozen, carry, xs):
    """One env step for all local envs (`Rollout.step`) as a PPO transition. carry:
    (VecEnvState, input state, policy carry, explorer state or None); xs: (key, global env step
    of this step). A feed-forward policy's values come after the rollout, in one batch (but for
    one whose actor and critic share a CNN torso: `Policy.value_on_the_way`). With an
    explorer, the step's intrinsic reward and what the explorer trains on come out beside it."""
    env, inputs, h, ex = carry
    key, step = xs
    (env_state, inputs, h), a = ctx.rollout.step(params, frozen, env, inputs, h, key, step)
    out = a.env
    tr = Transition(a.x, a.action, a.log_prob,
                    jnp.zeros_like(a.log_prob) if a.value is None else a.value,
                    out.reward, out.terminated, out.truncated, a.truncation_value)
    explored = None
    if ctx.explorer is not None:
        step_in = Step(env.obs, a.action, out.final_obs, a.done)
        ex, bonus = ctx.explorer.bonus(ex, step_in)
        explored = (step_in, bonus)
    done = a.done
    stats = EpisodeStats(
        done.sum(), jnp.sum(out.episode_return * done), jnp.sum(out.episode_length * done),
        jnp.sum(out.achievements * done[:, None], axis=0), out.reset_reuse)
    return (env_state, inputs, h, ex), (tr, stats, a.input_metrics, explored)


def minibatch_step(ctx: Ctx, carry, mb):
    """One gradient step on one minibatch. carry: (params, opt_state); mb: dict of [B, ...]."""
    params, opt_state = carry
    if ctx.policy.recurrent:  # sequences [T, B, ...]: the loss sees them flattened, time-major
        mb = {k: v if k in ("obs", "carry", "resets") else v.reshape(-1)
              for k, v in mb.items()}
    adv = mb["advantage"]
    if ctx.cfg.norm_adv:  # statistics of the global minibatch, across devices
        mean = _pmean(adv.mean(), ctx.axis_name)
        var = _pmean(((adv - mean) ** 2).mean(), ctx.axis_name)
        adv = (adv - mean) / (jnp.sqrt(var) + 1e-8)

    def loss_fn(p):
        # A recurrent policy replays the minibatch's envs from their carry at the rollout's start.
        logits, value = ctx.policy.batch(p, mb.get("carry"), mb["obs"], mb.get("resets"))
        c = ctx.cfg
        return ppo_loss(logits, value, mb["action"], mb["log_prob"], mb["value"], adv,
                        mb["target"], c.clip_eps, c.vf_coef, c.ent_coef)

    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    grads = _pmean(grads, ctx.axis_name)
    updates, opt_state = ctx.tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    metrics["grad_norm"] = optax.tree.norm(grads)
    return (params, opt_state), metrics


def epoch_step(ctx: Ctx, batch, carry, key):
    """One pass over the local batch in shuffled minibatches. batch: dict of [T*N_local, ...]
    (transitions shuffled), or for a recurrent policy [T, N_local, ...] plus the carry
    [N_local, W] at the rollout's start (whole env sequences shuffled)."""
    if ctx.axis_name is not None:
        key = jax.random.fold_in(key, jax.lax.axis_index(ctx.axis_name))
    k = ctx.cfg.num_minibatches
    if ctx.policy.recurrent:
        n = batch["carry"].shape[0]
        perm = jax.random.permutation(key, n)

        def split(path, x):
            if path[0].key == "carry":
                return x[perm].reshape((k, n // k) + x.shape[1:])
            x = x[:, perm].reshape((x.shape[0], k, n // k) + x.shape[2:])
            return jnp.moveaxis(x, 1, 0)

        mbs = jax.tree_util.tree_map_with_path(split, batch)
        carry, metrics = jax.lax.scan(lambda c, mb: minibatch_step(ctx, c, mb), carry, mbs)
        return carry, metrics
    n = batch["action"].shape[0]
    perm = jax.random.permutation(key, n).reshape(k, n // k)
    # Each minibatch gathers its rows inside the scan: no shuffled copy of the whole batch
    # (at 1,024 envs of Craftax-Pixels the rollout's frames alone are 11 GB).
    carry, metrics = jax.lax.scan(
        lambda c, idx: minibatch_step(ctx, c, jax.tree.map(lambda x: x[idx], batch)),
        carry, perm)
    return carry, metrics


def update_step(ctx: Ctx, rs: RunnerState, frozen=None) -> tuple[RunnerState, dict]:
    """Collect `num_steps` of experience, compute GAE, run epochs x minibatches.
    frozen: the PolicyInput's device arrays (`ctx.inputs.frozen`)."""
    cfg = ctx.cfg
    rng, k_roll, k_epochs = jax.random.split(rs.rng, 3)
    steps = rs.update_step * cfg.num_steps + jnp.arange(cfg.num_steps)
    (env_state, inputs, h, ex), (traj, stats, input_metrics, explored) = jax.lax.scan(
        lambda c, x: rollout_step(ctx, rs.params, frozen, c, x),
        (rs.env, rs.inputs, rs.carry, rs.explore),
        (jax.random.split(k_roll, cfg.num_steps), steps))
    extrinsic = traj.reward
    if ctx.explorer is not None:  # GAE on reward + coef * bonus
        traj = traj._replace(reward=traj.reward + ctx.explorer.cfg.coef * explored[1])
    t, n = traj.action.shape
    flat = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
    last_value = ctx.policy.critic(rs.params, h, ctx.inputs.view(inputs, env_state.obs))
    if not (ctx.policy.recurrent or ctx.policy.value_on_the_way):  # the rollout's, in one batch
        value = ctx.policy.critic(rs.params, None, jax.tree.map(flat, traj.obs)).reshape(t, n)
        traj = traj._replace(value=value)
    adv, target = gae(traj.reward, traj.value, traj.terminated, traj.truncated,
                      traj.truncation_value, last_value, cfg.gamma, cfg.gae_lambda)
    if ctx.policy.recurrent:  # whole sequences; the carry restarts after each episode's last step
        done = traj.terminated | traj.truncated
        batch = {"obs": traj.obs, "action": traj.action, "log_prob": traj.log_prob,
                 "value": traj.value, "advantage": adv, "target": target, "carry": rs.carry,
                 "resets": jnp.concatenate([jnp.zeros((1, n), bool), done[:-1]])}
    else:
        batch = {"obs": jax.tree.map(flat, traj.obs), "action": flat(traj.action),
                 "log_prob": flat(traj.log_prob), "value": flat(traj.value),
                 "advantage": flat(adv), "target": flat(target)}
    with jax.named_scope("update"):  # in profiles (`bench/trace_report.py`)
        (params, opt_state), metrics = jax.lax.scan(
            lambda c, k: epoch_step(ctx, batch, c, k), (rs.params, rs.opt_state),
            jax.random.split(k_epochs, cfg.update_epochs))
    metrics = _pmean(jax.tree.map(jnp.mean, metrics), ctx.axis_name)
    ep = EpisodeStats(*[_psum(x.sum(0), ctx.axis_name) for x in stats])
    metrics["value_mean"] = _pmean(traj.value.mean(), ctx.axis_name)
    metrics["reward_mean"] = _pmean(extrinsic.mean(), ctx.axis_name)
    if ctx.explorer is not None:
        ex, ex_metrics = ctx.explorer.update(ex, explored[0], jax.random.fold_in(k_epochs, 1),
                                             cfg.num_minibatches, ctx.axis_name)
        metrics.update(ex_metrics)
        metrics["explore/intrinsic_mean"] = _pmean(explored[1].mean(), ctx.axis_name)
    metrics.update(ctx.inputs.summary(inputs, jax.tree.map(lambda v: v.sum(0), input_metrics),
                                      ctx.axis_name))
    rs = rs.replace(params=params, opt_state=opt_state, env=env_state, rng=rng,
                    update_step=rs.update_step + 1, inputs=inputs, carry=h, explore=ex)
    return rs, {"ppo": metrics, "episodes": ep._asdict()}
