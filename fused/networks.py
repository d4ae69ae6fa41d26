"""Actor-critic networks (the prior system's: separate tanh MLPs, orthogonal init)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


def dense(features: int, gain: float, name: str | None = None) -> nn.Dense:
    return nn.Dense(features, kernel_init=nn.initializers.orthogonal(gain),
                    bias_init=nn.initializers.zeros, name=name)


class MLP(nn.Module):
    """`num_layers` x `width` tanh layers, then a linear head of `out` units."""

    width: int
    num_layers: int
    out: int
    out_gain: float

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for i in range(self.num_layers):
            x = nn.tanh(dense(self.width, np.sqrt(2), f"hidden_{i}")(x))
        return dense(self.out, self.out_gain, "head")(x)


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs. `actor` and `critic` can be applied alone
    (`method=ActorCritic.actor`): the rollout needs only the actor each step and evaluates the
    critic on the whole rollout in one batch, which XLA runs far more efficiently than 64
    small matmuls against the 8268-wide first layer."""

    num_actions: int
    width: int = 512
    num_layers: int = 3

    def setup(self):
        self.actor_mlp = MLP(self.width, self.num_layers, self.num_actions, 0.01)
        self.critic_mlp = MLP(self.width, self.num_layers, 1, 1.0)

    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        """obs: [B, D] -> (logits [B, A], value [B])."""
        return self.actor(obs), self.critic(obs)

    def actor(self, obs: jax.Array) -> jax.Array:
        return self.actor_mlp(obs)

    def critic(self, obs: jax.Array) -> jax.Array:
        return self.critic_mlp(obs)[:, 0]


class AugmentedMLP(nn.Module):
    """obs -> Dense+tanh, hidden state -> [LayerNorm] Dense+tanh, concatenated, then
    `num_layers - 1` Dense+tanh layers and a linear head (BRIEF section 4)."""

    width: int
    num_layers: int
    out: int
    out_gain: float
    layernorm: bool

    @nn.compact
    def __call__(self, obs: jax.Array, hidden: jax.Array) -> jax.Array:
        x = nn.tanh(dense(self.width, np.sqrt(2), "obs_proj")(obs))
        if self.layernorm:
            hidden = nn.LayerNorm(name="hidden_norm")(hidden)
        h = nn.tanh(dense(self.width, np.sqrt(2), "hidden_proj")(hidden))
        x = jnp.concatenate([x, h], axis=-1)
        for i in range(self.num_layers - 1):
            x = nn.tanh(dense(self.width, np.sqrt(2), f"hidden_{i}")(x))
        return dense(self.out, self.out_gain, "head")(x)


class AugmentedActorCritic(nn.Module):
    """Separate actor and critic over (symbolic obs, LLM hidden state). Inputs are dicts
    {"obs": [B, D], "hidden": [B, H]} so PPO code handles them like plain observations."""

    num_actions: int
    width: int = 512
    num_layers: int = 3
    layernorm: bool = False

    def setup(self):
        self.actor_mlp = AugmentedMLP(self.width, self.num_layers, self.num_actions, 0.01,
                                      self.layernorm)
        self.critic_mlp = AugmentedMLP(self.width, self.num_layers, 1, 1.0, self.layernorm)

    def __call__(self, inp: dict) -> tuple[jax.Array, jax.Array]:
        return self.actor(inp), self.critic(inp)

    def actor(self, inp: dict) -> jax.Array:
        return self.actor_mlp(inp["obs"], inp["hidden"])

    def critic(self, inp: dict) -> jax.Array:
        return self.critic_mlp(inp["obs"], inp["hidden"])[:, 0]
