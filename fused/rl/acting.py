"""One acting step for every rollout: PPO's, dataset generation's, evaluation's, video's.

A `Policy` acts one step at a time on N envs and carries state between steps (a feed-forward
policy's carry is None); whether it is recurrent is decided once, here, by its network. A
`Rollout` joins a policy, its `PolicyInput` and the vectorised envs into `step`: view the
observation, act, step the envs, value the final observation where an episode was truncated,
restart the carry where an episode starts, and update the input state. Callers keep only what
is theirs (PPO's transitions and exploration bonus, a dataset's records, evaluation's episode
sums). An LLM that acts is one more `Policy`.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from fused.rl.networks import is_recurrent
from fused.rl.policy_input import PolicyInput
from fused.rl.vec_env import VecEnv, VecEnvState, VecStep, per_env_keys


def categorical_log_prob(logits, action):
    """logits: [B, A], action: [B] -> [B]."""
    logp = jax.nn.log_softmax(logits)
    return jnp.take_along_axis(logp, action[:, None], axis=-1)[:, 0]


def categorical_entropy(logits):
    logp = jax.nn.log_softmax(logits)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


# --- how an action is drawn from logits: (keys [N], logits [N, A]) -> (action, log_prob) -----

def sample(keys, logits):
    """An action from the policy's distribution, one key per env."""
    action = jax.vmap(jax.random.categorical)(keys, logits)
    return action, categorical_log_prob(logits, action)


def greedy(keys, logits):
    """The most likely action (keys unused)."""
    action = logits.argmax(-1).astype(jnp.int32)
    return action, categorical_log_prob(logits, action)


def epsilon_mixture(epsilon: float, num_actions: int) -> Callable:
    """pi'(a) = (1 - eps) pi(a) + eps / A; the log-prob is of that mixture (what really acted)."""
    if not epsilon:
        return sample

    def draw(keys, logits):
        probs = (1 - epsilon) * jax.nn.softmax(logits) + epsilon / num_actions
        return sample(keys, jnp.log(probs))

    return draw


def uniform(num_actions: int) -> Callable:
    """Uniform over actions, whatever the logits."""

    def draw(keys, logits):
        action = jax.vmap(lambda k: jax.random.randint(k, (), 0, num_actions))(keys)
        return action, jnp.full(keys.shape[:1], -jnp.log(num_actions), jnp.float32)

    return draw


class Policy(NamedTuple):
    """A policy for N envs; params come from the caller, so one Policy serves every checkpoint.

    `forward` acts on one step: `keys` [N] (one per env) are for a policy that draws while it
    acts (an LLM sampling its reply), which then acts deterministically in `sample` (`chosen`);
    any other policy ignores them there and draws in `sample`. `critic` values x under the carry
    held before acting on it; `batch` is the learner's form: x [B, ...] for a feed-forward
    policy (carry and resets unused), x [T, B, ...] replayed from carry [B, W] with resets
    [T, B] for a recurrent one, giving logits [T*B, A] and values [T*B] in time-major order.
    A policy with a carry (`recurrent`) starts each episode from `carry(n)`'s; `stats`, where
    given, reads per-env figures of the step just acted ({name: [N]}) from the carry after it
    (an LLM's tokens generated, its unparsable replies), which evaluation sums per episode."""

    recurrent: bool
    carry: Callable  # n -> the carry of n fresh episodes (None for a feed-forward policy)
    forward: Callable  # (params, carry, x [N, ...], keys [N] | None) -> (carry, logits [N, A],
    #                     value [N] or None)
    critic: Callable  # (params, carry, x [N, ...]) -> value [N]
    batch: Callable  # (params, carry, x, resets) -> (logits [B, A], value [B])
    sample: Callable = sample  # (keys [N], logits) -> (action [N], log_prob [N])
    stats: Callable | None = None  # carry after acting -> {name: [N]} (None: no figures)
    # a feed-forward policy whose `forward` gives V(x) with the logits (one CNN torso for both):
    # PPO keeps those values instead of valuing the whole rollout again in one batch
    value_on_the_way: bool = False

    def with_sample(self, draw: Callable) -> "Policy":
        return self._replace(sample=draw)


def chosen(keys, logits):
    """The action a policy already chose in `forward` (its logits are 0 there, -inf elsewhere):
    no draw; its probability is not known (an LLM's reply), so the log-prob is NaN."""
    action = logits.argmax(-1).astype(jnp.int32)
    return action, jnp.full(action.shape, jnp.nan, jnp.float32)


def restart(policy: Policy, carry, starts):
    """`carry` with the envs where `starts` [N] (a new episode begins) back at a fresh carry."""
    fresh = policy.carry(starts.shape[0])
    return jax.tree.map(
        lambda new, h: jnp.where(starts.reshape(starts.shape + (1,) * (h.ndim - 1)), new, h),
        fresh, carry)


def network_policy(network: nn.Module, draw: Callable = sample) -> Policy:
    """The policy of an actor-critic network (`fused.rl.networks`). A feed-forward one acts with
    its actor alone and gives no value on the way (PPO values the whole rollout in one batch
    after it), unless actor and critic share a CNN torso: then one pass over the frames gives
    both, as the public pixel PPO computes them (and a whole rollout of frames in one batch
    would need the first convolution's output for all of it at once: 120 GB at 1,024 envs of
    Craftax-Pixels). A recurrent one runs one GRU step and gives the value with the logits."""
    if not is_recurrent(network):
        actor = partial(network.apply, method=type(network).actor)
        critic = partial(network.apply, method=type(network).critic)
        shared = bool(getattr(network, "shares_torso", False))

        def forward(params, carry, x, keys=None):
            if shared:
                return (carry, *network.apply(params, x))
            return carry, actor(params, x), None

        return Policy(recurrent=False, carry=lambda n: None, forward=forward,
                      critic=lambda params, carry, x: critic(params, x),
                      batch=lambda params, carry, x, resets: network.apply(params, x),
                      sample=draw, value_on_the_way=shared)

    def forward(params, carry, x, keys=None):
        one = jax.tree.map(lambda a: a[None], x)
        carry, logits, value = network.apply(params, carry, one,
                                             jnp.zeros((1, carry.shape[0]), bool))
        return carry, logits[0], value[0]

    def batch(params, carry, x, resets):
        _, logits, value = network.apply(params, carry, x, resets)
        return logits.reshape(-1, logits.shape[-1]), value.reshape(-1)

    return Policy(recurrent=True, carry=network.initial_carry, forward=forward,
                  critic=lambda params, carry, x: forward(params, carry, x)[2], batch=batch,
                  sample=draw)


def random_policy(num_actions: int) -> Policy:
    """Uniform actions, no parameters, no critic (values NaN)."""

    def nan(x):
        return jnp.full((jax.tree.leaves(x)[0].shape[0],), jnp.nan, jnp.float32)

    return Policy(recurrent=False, carry=lambda n: None,
                  forward=lambda params, carry, x, keys=None: (
                      carry, jnp.zeros((nan(x).shape[0], num_actions)), nan(x)),
                  critic=lambda params, carry, x: nan(x), batch=None,
                  sample=uniform(num_actions))


class Acted(NamedTuple):
    """What one step of N envs did."""

    x: Any  # the network input acted on ([N, D], or a pytree of [N, ...])
    action: jax.Array  # [N] int32
    log_prob: jax.Array  # [N]
    value: jax.Array | None  # [N] V(x) where the policy gives it on the way (else None)
    env: VecStep  # the envs' step (final observation, reward, ends, episode sums)
    truncation_value: jax.Array  # [N] V(final obs) where truncated, else 0
    done: jax.Array  # [N] bool: terminated or truncated
    input_metrics: dict  # the policy input's per-step metrics
    policy_stats: dict  # {name: [N]} the policy's figures of this step (`Policy.stats`)


class Rollout(NamedTuple):
    """A policy acting on `local_envs` of `num_envs` envs through its policy input.

    Random streams: the step key splits into (act, env, pool, input); act and env keys are one
    per global env (`per_env_keys`: sharding never changes an env's key), the pool and input keys
    are folded with the device index under `axis_name`. `values`: V(x) of every step even where
    the policy gives none on the way (a dataset stores it)."""

    policy: Policy
    inputs: PolicyInput
    envs: VecEnv
    num_envs: int  # global
    local_envs: int
    axis_name: str | None = None
    values: bool = False

    def keys(self, key: jax.Array) -> jax.Array:
        return per_env_keys(key, self.num_envs, self.local_envs, self.axis_name)

    def fold(self, key: jax.Array) -> jax.Array:
        if self.axis_name is None:
            return key
        return jax.random.fold_in(key, jax.lax.axis_index(self.axis_name))

    def step(self, params, frozen, env: VecEnvState, inputs, carry, key: jax.Array,
             t: jax.Array) -> tuple[tuple[VecEnvState, Any, Any], Acted]:
        """Act on env.obs (stream step t) and step. Returns (env, input state, carry) for the
        observations acted on next, and what happened."""
        pol = self.policy
        k_act, k_env, k_pool, k_inp = jax.random.split(key, 4)
        x = self.inputs.view(inputs, env.obs)
        keys = self.keys(k_act)
        acted_carry, logits, value = pol.forward(params, carry, x, keys)
        if self.values and value is None:
            value = pol.critic(params, carry, x)
        action, log_prob = pol.sample(keys, logits)
        stats = {} if pol.stats is None else pol.stats(acted_carry)
        env_state, out = self.envs.step(self.keys(k_env), self.fold(k_pool), env, action)
        # V(final obs) is needed only where an episode was truncated: skip the pass otherwise.
        final_x = self.inputs.view(inputs, out.final_obs)
        trunc_value = jax.lax.cond(
            out.truncated.any(),
            lambda: jnp.where(out.truncated, pol.critic(params, acted_carry, final_x), 0.0),
            lambda: jnp.zeros(out.reward.shape, jnp.float32))
        done = out.terminated | out.truncated
        # Where an env's next observation starts a new episode (never, without resets).
        starts = done if self.envs.resets else jnp.zeros_like(done)
        if pol.recurrent:
            acted_carry = restart(pol, acted_carry, starts)
        inputs, input_metrics = self.inputs.step(frozen, inputs, env_state.obs, starts, t + 1,
                                                 self.fold(k_inp), self.axis_name)
        acted = Acted(x, action, log_prob, value, out, trunc_value, done, input_metrics, stats)
        return (env_state, inputs, acted_carry), acted
