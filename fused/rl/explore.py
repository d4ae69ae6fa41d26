"""Exploration bonuses inside the jitted PPO update (`--explore.kind rnd|icm|e3b`), as the public
Craftax baselines run them: an intrinsic reward per env step, added to the extrinsic one as
`reward + coef * intrinsic`, and the bonus's own networks trained on each rollout with their own
optimiser after the PPO epochs. Explorers see the raw observation (never the LLM state).

- RND (Burda et al. 2018): a fixed random network and a predictor trained to match it on the
  next observations; the bonus is the prediction's squared error (novel states are predicted
  badly).
- ICM (Pathak et al. 2017): an encoder trained by predicting the action from (phi(s), phi(s'))
  (the inverse loss), and a forward model predicting phi(s') from (phi(s), a) on the encoder's
  frozen features; the bonus is the forward model's squared error.
- E3B (Henaff et al. 2022) on ICM's encoder: per env the inverse of
  `lambda * I + sum phi phi^T` over the episode so far, updated each step by Sherman-Morrison and
  restarted at each episode; the bonus is the elliptical norm `phi^T C phi` of the current
  state's features before they are added.

On frames (pixel envs) each explorer network reads a CNN's features (`ConvTorso`, of its own:
RND's target and predictor, ICM's encoder), not the raw pixels.

Bonuses are zero on the step where an episode ends (as published); transitions that end an
episode are left out of the explorers' training.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from fused.rl.config import ExploreConfig
from fused.rl.networks import ConvForm, ConvTorso


class Net(nn.Module):
    """`num_layers` relu layers of `width`, then `out` linear units (the baselines' explorers);
    with `image`, over a frame's CNN features."""

    width: int
    num_layers: int
    out: int
    image: tuple[int, int, int] | None = None
    conv: ConvForm = "auto"

    @nn.compact
    def __call__(self, x):
        if self.image is not None:
            x = ConvTorso(self.image, self.conv)(x)
        for _ in range(self.num_layers):
            x = nn.relu(nn.Dense(self.width)(x))
        return nn.Dense(self.out)(x)


@struct.dataclass
class ExploreState:
    params: Any  # trained: {"predictor"} (RND) or {"encoder", "forward", "inverse"} (ICM/E3B)
    opt_state: Any
    target: Any  # RND's fixed random network (never trained); None otherwise
    cov: Any  # E3B: [N, d, d] per-env inverse covariance of this episode's features; else None


class Step(NamedTuple):
    """What an explorer trains on, per env step ([T, N] leading axes once stacked)."""

    obs: jax.Array  # [N, D] the observation acted on
    action: jax.Array  # [N]
    next_obs: jax.Array  # [N, D] the observation the action led to (the final one at an end)
    done: jax.Array  # [N] bool


def _pmean(x, axis_name):
    return jax.lax.pmean(x, axis_name) if axis_name else x


class Explorer:
    def __init__(self, cfg: ExploreConfig, obs_dim: int, num_actions: int, local_envs: int,
                 image: tuple[int, int, int] | None = None, conv: ConvForm = "auto"):
        self.cfg, self.obs_dim, self.num_actions = cfg, obs_dim, num_actions
        self.local_envs = local_envs
        c = cfg
        if c.kind == "rnd":
            self.nets = {"predictor": Net(c.layer_width, c.num_layers, c.rnd_output, image, conv)}
            self.target_net = Net(c.layer_width, c.num_layers, c.rnd_output, image, conv)
        else:
            self.nets = {"encoder": Net(c.layer_width, c.num_layers, c.latent, image, conv),
                         "forward": Net(c.layer_width, c.num_layers, c.latent),
                         "inverse": Net(c.layer_width, c.num_layers, num_actions)}
        self.tx = optax.adam(c.lr, eps=1e-5)

    def init(self, key) -> ExploreState:
        c = self.cfg
        obs = jnp.zeros((1, self.obs_dim))
        keys = jax.random.split(key, 4)
        if c.kind == "rnd":
            params = {"predictor": self.nets["predictor"].init(keys[0], obs)}
            target = self.target_net.init(keys[1], obs)
        else:
            z = jnp.zeros((1, c.latent))
            params = {"encoder": self.nets["encoder"].init(keys[0], obs),
                      "forward": self.nets["forward"].init(
                          keys[1], jnp.zeros((1, c.latent + self.num_actions))),
                      "inverse": self.nets["inverse"].init(keys[2], jnp.concatenate([z, z], -1))}
            target = None
        cov = self.fresh_cov(self.local_envs) if c.kind == "e3b" else None
        return ExploreState(params, self.tx.init(params), target, cov)

    def fresh_cov(self, n: int) -> jax.Array:
        d = self.cfg.latent
        return jnp.broadcast_to(jnp.eye(d) / self.cfg.e3b_lambda, (n, d, d))

    def _encode(self, params, obs):
        return self.nets["encoder"].apply(params["encoder"], obs)

    def _forward(self, params, z, action):
        x = jnp.concatenate([z, jax.nn.one_hot(action, self.num_actions)], -1)
        return self.nets["forward"].apply(params["forward"], x)

    def bonus(self, s: ExploreState, step: Step) -> tuple[ExploreState, jax.Array]:
        """Intrinsic reward [N] of one env step of every env, and the state after it."""
        c, live = self.cfg, ~step.done
        if c.kind == "rnd":
            err = (self.nets["predictor"].apply(s.params["predictor"], step.next_obs)
                   - self.target_net.apply(s.target, step.next_obs))
            return s, jnp.where(live, jnp.square(err).mean(-1), 0.0)
        z = self._encode(s.params, step.obs)
        if c.kind == "icm":
            err = self._forward(s.params, z, step.action) - self._encode(s.params, step.next_obs)
            return s, jnp.where(live, jnp.square(err).mean(-1), 0.0)
        u = jnp.einsum("nij,nj->ni", s.cov, z)  # C phi
        b = jnp.einsum("ni,ni->n", z, u)  # phi^T C phi
        cov = s.cov - u[:, :, None] * u[:, None, :] / (1.0 + b)[:, None, None]
        cov = jnp.where(step.done[:, None, None], self.fresh_cov(z.shape[0]), cov)
        return s.replace(cov=cov), jnp.where(live, b, 0.0)

    def loss(self, params, target, mb: Step):
        c, w = self.cfg, (~mb.done).astype(jnp.float32)
        denom = jnp.maximum(w.sum(), 1.0)
        if c.kind == "rnd":
            err = (self.nets["predictor"].apply(params["predictor"], mb.next_obs)
                   - self.target_net.apply(target, mb.next_obs))
            loss = (w * jnp.square(err).mean(-1)).sum() / denom
            return loss, {"explore/rnd_loss": loss}
        z, z_next = self._encode(params, mb.obs), self._encode(params, mb.next_obs)
        logits = self.nets["inverse"].apply(params["inverse"], jnp.concatenate([z, z_next], -1))
        logp = jnp.take_along_axis(jax.nn.log_softmax(logits), mb.action[:, None], -1)[:, 0]
        inverse = -(w * logp).sum() / denom
        pred = self._forward(params, jax.lax.stop_gradient(z), mb.action)
        forward = (w * jnp.square(pred - jax.lax.stop_gradient(z_next)).mean(-1)).sum() / denom
        loss = c.icm_inverse_coef * inverse + c.icm_forward_coef * forward
        return loss, {"explore/inverse_loss": inverse, "explore/forward_loss": forward}

    def update(self, s: ExploreState, steps: Step, key, num_minibatches: int,
               axis_name: str | None) -> tuple[ExploreState, dict]:
        """`update_epochs` passes over this device's [T, N] steps in shuffled minibatches
        (gradients averaged over devices)."""
        flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), steps)
        n, k = flat.action.shape[0], num_minibatches
        if axis_name is not None:
            key = jax.random.fold_in(key, jax.lax.axis_index(axis_name))

        def minibatch(carry, mb):
            params, opt_state = carry
            (_, metrics), grads = jax.value_and_grad(self.loss, has_aux=True)(params, s.target,
                                                                              mb)
            grads = _pmean(grads, axis_name)
            updates, opt_state = self.tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), metrics

        def epoch(carry, key):
            perm = jax.random.permutation(key, n)
            mbs = jax.tree.map(lambda x: x[perm].reshape((k, n // k) + x.shape[1:]), flat)
            return jax.lax.scan(minibatch, carry, mbs)

        (params, opt_state), metrics = jax.lax.scan(
            epoch, (s.params, s.opt_state), jax.random.split(key, self.cfg.update_epochs))
        metrics = _pmean(jax.tree.map(jnp.mean, metrics), axis_name)
        return s.replace(params=params, opt_state=opt_state), metrics


def make_explorer(cfg: ExploreConfig, obs_dim: int, num_actions: int, local_envs: int,
                  image: tuple[int, int, int] | None = None,
                  conv: ConvForm = "auto") -> Explorer | None:
    """The explorer of `cfg` (None for none); `image`: observations are frames of that shape
    (`conv`: how their convolutions compute)."""
    return None if cfg.kind == "none" else Explorer(cfg, obs_dim, num_actions, local_envs,
                                                    image, conv)
