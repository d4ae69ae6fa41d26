"""Offline policy learning from a fixed dataset: advantage-weighted regression (AWR) and behaviour
cloning (BC), as pure functions over the same actor-critic networks online PPO trains, so an
offline policy is evaluated, probed and fine-tuned online with no conversion.

AWR (Peng et al. 2019, in the prior system's form): A = R - V(s) with R the return-to-go,
centred over the minibatch; the actor maximises w * log pi(a|s) with w = min(exp(A / beta),
max_weight) (no gradient through w); the critic regresses R with 0.5 (R - V)^2. BC: the actor
maximises log pi(a|s) (w = 1), the critic the same regression.

`make_offline_train(...)` -> pure `init(key, example, norm)` and `chunk(state, data)`:
`updates_per_chunk` minibatch updates, each sampling `batch_size` rows of `data["rows"]` (device
arrays, rows along axis 0) uniformly among the first `data["num_valid"]` entries of
`data["valid_index"]`, on the device.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from fused.rl.ppo import categorical_log_prob


class AWRSettings(NamedTuple):
    algo: str  # "awr" | "bc"
    beta: float
    max_weight: float
    value_coef: float


def awr_weights(advantage: jax.Array, beta: float, max_weight: float) -> jax.Array:
    """exp((A - mean A) / beta), clipped at max_weight."""
    centred = advantage - advantage.mean()
    return jnp.minimum(jnp.exp(centred / beta), max_weight)


def offline_loss(apply_actor: Callable, apply_critic: Callable, s: AWRSettings, params,
                 x, action: jax.Array, rtg: jax.Array) -> tuple[jax.Array, dict]:
    """The AWR or BC loss of one minibatch (network input x, action [B], return-to-go [B])."""
    logits = apply_actor(params, x)
    value = apply_critic(params, x)
    log_prob = categorical_log_prob(logits, action)
    if s.algo == "awr":
        weight = jax.lax.stop_gradient(awr_weights(rtg - value, s.beta, s.max_weight))
    else:
        weight = jnp.ones_like(log_prob)
    actor = -(weight * log_prob).mean()
    critic = 0.5 * ((rtg - value) ** 2).mean()
    probs = jax.nn.softmax(logits)
    entropy = -(probs * jax.nn.log_softmax(logits)).sum(-1).mean()
    return actor + s.value_coef * critic, {
        "loss/actor": actor, "loss/value": critic, "entropy": entropy,
        "weight/mean": weight.mean(), "weight/max": weight.max(),
        "weight/clipped": (weight >= s.max_weight).mean() if s.algo == "awr" else 0.0,
        "log_prob": log_prob.mean(),
        "accuracy": (logits.argmax(-1) == action).mean()}


@struct.dataclass
class OfflineState:
    params: Any
    opt_state: Any
    rng: jax.Array
    update: jax.Array  # [] int32, minibatch updates done
    norm: Any  # the policy input's normaliser fitted to the training data (None without one)


class OfflineTrainer(NamedTuple):
    init: Callable  # (key, example network input, norm) -> OfflineState
    chunk: Callable  # (OfflineState, data) -> (OfflineState, metrics [updates_per_chunk, ...])


def make_offline_train(network: nn.Module, settings: AWRSettings, tx: optax.GradientTransformation,
                       batch_size: int, updates_per_chunk: int, total_updates: int,
                       inputs_of: Callable[[dict, dict, Any], Any]) -> OfflineTrainer:
    """`inputs_of(rows, data, norm)` turns sampled rows into the network input (decoding
    observations, looking up and normalising hidden states); `data` holds `rows` (with `action`
    and `rtg`), `valid_index` [V] with `num_valid` (entries past it are padding) and whatever
    else `inputs_of` reads (a hidden-state table)."""
    actor = lambda p, x: network.apply(p, x, method=type(network).actor)  # noqa: E731
    critic = lambda p, x: network.apply(p, x, method=type(network).critic)  # noqa: E731

    def init(key, example, norm=None):
        k_init, k_run = jax.random.split(key)
        params = network.init(k_init, example)
        return OfflineState(params, tx.init(params), k_run, jnp.int32(0), norm)

    def one_update(state: OfflineState, data) -> tuple[OfflineState, dict]:
        rng, k = jax.random.split(state.rng)
        pick = jax.random.randint(k, (batch_size,), 0, data["num_valid"])
        rows = jax.tree.map(lambda a: a[data["valid_index"][pick]], data["rows"])
        x = inputs_of(rows, data, state.norm)
        grad_fn = jax.value_and_grad(
            lambda p: offline_loss(actor, critic, settings, p, x, rows["action"], rows["rtg"]),
            has_aux=True)
        (loss, metrics), grads = grad_fn(state.params)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = dict(metrics, loss=loss, grad_norm=optax.tree.norm(grads))
        return OfflineState(params, opt_state, rng, state.update + 1, state.norm), metrics

    def chunk(state: OfflineState, data):
        zeros = jax.eval_shape(lambda s: one_update(s, data)[1], state)
        zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), zeros)

        def body(s, _):
            active = s.update < total_updates  # updates past the end are skipped
            s, m = jax.lax.cond(active, lambda s: one_update(s, data), lambda s: (s, zeros), s)
            return s, dict(m, active=active)

        return jax.lax.scan(body, state, None, length=updates_per_chunk)

    return OfflineTrainer(init, chunk)
