"""Actor-critic networks (the prior system's: separate tanh MLPs, orthogonal init)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


def dense(features: int, gain: float, name: str | None = None) -> nn.Dense:
    return nn.Dense(features, kernel_init=nn.initializers.orthogonal(gain),
                    bias_init=nn.initializers.zeros, name=name)


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs of `num_layers` x `width` tanh layers.

    The two first layers read the same (wide, mostly one-hot) observation, so they run as one
    matmul against the concatenated kernels: same parameters and math as two Dense layers, but
    one GEMM of twice the width, which XLA's CPU backend runs markedly better.
    """

    num_actions: int
    width: int = 512
    num_layers: int = 3

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        """obs: [B, D] -> (logits [B, A], value [B])."""
        d = obs.shape[-1]
        init = nn.initializers.orthogonal(np.sqrt(2))
        k_actor = self.param("actor_in_kernel", init, (d, self.width))
        k_critic = self.param("critic_in_kernel", init, (d, self.width))
        b = self.param("in_bias", nn.initializers.zeros, (2 * self.width,))
        h = jnp.tanh(obs @ jnp.concatenate([k_actor, k_critic], axis=1) + b)
        a, c = h[:, : self.width], h[:, self.width :]
        for i in range(self.num_layers - 1):
            a = jnp.tanh(dense(self.width, np.sqrt(2), f"actor_{i}")(a))
            c = jnp.tanh(dense(self.width, np.sqrt(2), f"critic_{i}")(c))
        logits = dense(self.num_actions, 0.01, "actor_head")(a)
        value = dense(1, 1.0, "critic_head")(c)[:, 0]
        return logits, value
