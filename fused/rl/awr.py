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

A recurrent network (`fused.rl.networks.RecurrentActorCritic`) trains on sequences instead
(`Sequences`): each of batch_size / length windows starts at a uniformly drawn valid row, is
preceded by up to `burn_in` rows that only warm the GRU's carry up from zeros (the carry
restarts where an episode starts, as when acting), and counts in the loss the valid rows from
its drawn row on; gradients flow through the whole window.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from fused.rl.acting import categorical_log_prob, network_policy
from fused.rl.networks import init_network
from fused.rl.updates import scan_updates


class AWRSettings(NamedTuple):
    algo: str  # "awr" | "bc"
    beta: float
    max_weight: float
    value_coef: float


class Sequences(NamedTuple):
    """How a recurrent policy samples: windows of `burn_in + length` consecutive rows."""

    length: int  # rows from the drawn row on (batch_size / length windows per minibatch)
    burn_in: int  # rows before the drawn one that only warm the carry up


def awr_weights(advantage: jax.Array, beta: float, max_weight: float,
                mask: jax.Array | None = None) -> jax.Array:
    """exp((A - mean A) / beta), clipped at max_weight (the mean over the rows in `mask`)."""
    centred = advantage - masked_mean(advantage, mask)
    return jnp.minimum(jnp.exp(centred / beta), max_weight)


def masked_mean(x: jax.Array, mask: jax.Array | None) -> jax.Array:
    if mask is None:
        return x.mean()
    return jnp.where(mask, x, 0.0).sum() / jnp.maximum(mask.sum(), 1)


def offline_loss(forward: Callable, s: AWRSettings, params, x, action: jax.Array,
                 rtg: jax.Array, mask: jax.Array | None = None) -> tuple[jax.Array, dict]:
    """The AWR or BC loss of one minibatch: `forward(params, x)` -> (logits [B, A], value [B]),
    action [B], return-to-go [B]; `mask` [B] (optional) picks the rows that count."""
    logits, value = forward(params, x)
    log_prob = categorical_log_prob(logits, action)
    if s.algo == "awr":
        weight = jax.lax.stop_gradient(awr_weights(rtg - value, s.beta, s.max_weight, mask))
    else:
        weight = jnp.ones_like(log_prob)
    mean = lambda v: masked_mean(v, mask)  # noqa: E731
    actor = -mean(weight * log_prob)
    critic = 0.5 * mean((rtg - value) ** 2)
    probs = jax.nn.softmax(logits)
    entropy = mean(-(probs * jax.nn.log_softmax(logits)).sum(-1))
    return actor + s.value_coef * critic, {
        "loss/actor": actor, "loss/value": critic, "entropy": entropy,
        "weight/mean": mean(weight),
        "weight/max": (weight if mask is None else jnp.where(mask, weight, 0.0)).max(),
        "weight/clipped": mean(weight >= s.max_weight) if s.algo == "awr" else 0.0,
        "log_prob": mean(log_prob),
        "accuracy": mean(logits.argmax(-1) == action)}


def sequence_windows(key: jax.Array, data: dict, num_windows: int, seq: Sequences):
    """Row indices [T, W] of `num_windows` windows (T = burn_in + length), the carry restarts
    [T, W] and the rows that count in the loss [T, W]: each window starts `burn_in` rows before
    a uniformly drawn valid row (clamped at the data's first row) and counts that row and the
    valid rows after it."""
    pick = jax.random.randint(key, (num_windows,), 0, data["num_valid"])
    drawn = data["valid_index"][pick]
    n = data["rows"]["action"].shape[0]
    t = jnp.arange(seq.burn_in + seq.length)[:, None]
    idx = jnp.maximum(drawn - seq.burn_in, 0)[None] + t
    inside = idx < n
    idx = jnp.minimum(idx, n - 1)
    resets = (t == 0) | data["rows"]["episode_start"][idx]
    counted = inside & (idx >= drawn[None]) & data["rows"]["valid"][idx]
    return idx, resets, counted


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
                       inputs_of: Callable[[dict, dict, Any], Any],
                       seq: Sequences | None = None) -> OfflineTrainer:
    """`inputs_of(rows, data, norm)` turns sampled rows ([N] along axis 0) into the network
    input (decoding observations, looking up and normalising hidden states); `data` holds
    `rows` (with `action` and `rtg`; for a recurrent network also `valid` and
    `episode_start`), `valid_index` [V] with `num_valid` (entries past it are padding) and
    whatever else `inputs_of` reads (a hidden-state table). A recurrent network needs `seq`."""
    policy = network_policy(network)
    recurrent = policy.recurrent
    if recurrent != (seq is not None):
        raise ValueError("a recurrent network trains on sequences (seq), a feed-forward one not")

    def init(key, example, norm=None):
        k_init, k_run = jax.random.split(key)
        params = init_network(network, k_init, example)
        return OfflineState(params, tx.init(params), k_run, jnp.int32(0), norm)

    def minibatch(key, data, norm):
        """(network input, action, rtg, mask) of one minibatch; forward(params, input)."""
        if not recurrent:
            pick = jax.random.randint(key, (batch_size,), 0, data["num_valid"])
            rows = jax.tree.map(lambda a: a[data["valid_index"][pick]], data["rows"])
            return inputs_of(rows, data, norm), rows["action"], rows["rtg"], None
        idx, resets, counted = sequence_windows(key, data, batch_size // seq.length, seq)
        rows = jax.tree.map(lambda a: a[idx.reshape(-1)], data["rows"])
        x = jax.tree.map(lambda a: a.reshape(idx.shape + a.shape[1:]),
                         inputs_of(rows, data, norm))
        return (x, resets), rows["action"], rows["rtg"], counted.reshape(-1)

    def forward(params, x):
        if not recurrent:
            return policy.batch(params, None, x, None)
        x, resets = x
        return policy.batch(params, policy.carry(resets.shape[1]), x, resets)

    def one_update(state: OfflineState, data) -> tuple[OfflineState, dict]:
        rng, k = jax.random.split(state.rng)
        x, action, rtg, mask = minibatch(k, data, state.norm)
        grad_fn = jax.value_and_grad(
            lambda p: offline_loss(forward, settings, p, x, action, rtg, mask), has_aux=True)
        (loss, metrics), grads = grad_fn(state.params)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = dict(metrics, loss=loss, grad_norm=optax.tree.norm(grads))
        return OfflineState(params, opt_state, rng, state.update + 1, state.norm), metrics

    def chunk(state: OfflineState, data):
        def update(s, data):  # (a skipped update reports active False, its zero)
            s, m = one_update(s, data)
            return s, dict(m, active=jnp.bool_(True))

        return scan_updates(update, state, data, updates_per_chunk,
                            lambda s: s.update < total_updates)

    return OfflineTrainer(init, chunk)
