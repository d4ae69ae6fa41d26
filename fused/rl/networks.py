"""Actor-critic networks: the prior system's separate tanh MLPs (orthogonal init), the public
Craftax baselines' CNN for frames (`ConvActorCritic`) and their PPO-RNN (`RecurrentActorCritic`,
over a CNN's features for frames)."""

from __future__ import annotations

from typing import Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


def dense(features: int, gain: float, name: str | None = None) -> nn.Dense:
    return nn.Dense(features, kernel_init=nn.initializers.orthogonal(gain),
                    bias_init=nn.initializers.zeros, name=name)


class MLP(nn.Module):
    """`num_layers` x `width` tanh (or relu) layers, then a linear head of `out` units."""

    width: int
    num_layers: int
    out: int
    out_gain: float
    relu: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        act = nn.relu if self.relu else nn.tanh
        for i in range(self.num_layers):
            x = act(dense(self.width, np.sqrt(2), f"hidden_{i}")(x))
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


ConvForm = Literal["auto", "im2col", "lax"]
IM2COL = {"auto": None, "im2col": True, "lax": False}  # `Conv.im2col` of each form


class Conv(nn.Module):
    """`nn.Conv(features, (k, k))` with "SAME" padding and the same parameters (kernel
    [k, k, C, F] drawn as nn.Conv draws it, bias [F]). On XLA:CPU it computes the k * k shifted
    copies of the input (im2col) and one matmul: XLA:CPU runs the gradients of a convolution
    inside the training loop through a slow generic loop (docs/BENCHMARKS.md, PPO on frames).
    Elsewhere `lax.conv` (cuDNN on GPUs). The
    copies cost k * k times the input's memory (kept for the gradient): a 130 x 110 frame's
    first two layers about 9 MB, so big minibatches of full-game frames on a CPU need RAM."""

    features: int
    size: int = 5
    im2col: bool | None = None  # None: on the CPU backend

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        k, c = self.size, x.shape[-1]
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (k, k, c, self.features))
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        im2col = jax.default_backend() == "cpu" if self.im2col is None else self.im2col
        if not im2col:
            y = jax.lax.conv_general_dilated(x, kernel, (1, 1), "SAME",
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"))
            return y + bias
        h, w = x.shape[1], x.shape[2]
        lo = (k - 1) // 2
        xp = jnp.pad(x, ((0, 0), (lo, k - 1 - lo), (lo, k - 1 - lo), (0, 0)))
        cols = jnp.concatenate([xp[:, i:i + h, j:j + w] for i in range(k) for j in range(k)], -1)
        return cols @ kernel.reshape(k * k * c, self.features) + bias


@jax.custom_vjp
def max_pool3(x: jax.Array) -> jax.Array:
    """`nn.max_pool(x, (3, 3), strides=(3, 3))` (VALID: the last rows / columns beyond a multiple
    of 3 dropped) over [B, H, W, C], as a reshape and a max, with the same gradient: each window's
    gradient goes to its first maximal element in row-major order, as XLA's select-and-scatter
    gives it. That gradient is elementwise here; reduce_window's is a scatter (on XLA:CPU with
    four int32 index arrays the size of the input: 60 GB for a minibatch of 8,192 full-game
    frames' first convolution). Reverse mode only (a custom VJP): no jvp / jacfwd through it."""
    b, h, w, c = x.shape
    return x[:, :h - h % 3, :w - w % 3].reshape(b, h // 3, 3, w // 3, 3, c).max((2, 4))


def _max_pool3_fwd(x):
    y = max_pool3(x)
    return y, (x, y)


def _max_pool3_bwd(res, g):
    x, y = res
    b, h, w, c = x.shape
    windows = x[:, :h - h % 3, :w - w % 3].reshape(b, h // 3, 3, w // 3, 3, c)
    taken = jnp.zeros(y.shape, bool)  # the window's maximum already given its gradient
    rows = []
    for i in range(3):
        row = []
        for j in range(3):
            hit = windows[:, :, i, :, j] == y
            row.append(jnp.where(hit & ~taken, g, 0).astype(x.dtype))
            taken = taken | hit
        rows.append(jnp.stack(row, 3))
    dx = jnp.stack(rows, 2).reshape(b, h - h % 3, w - w % 3, c)
    return (jnp.pad(dx, ((0, 0), (0, h % 3), (0, w % 3), (0, 0))),)


max_pool3.defvjp(_max_pool3_fwd, _max_pool3_bwd)


class ConvTorso(nn.Module):
    """A frame's features, as the public baselines' `ActorCriticConv` computes them: three times
    [Conv 32 filters 5 x 5 (same padding), ReLU, max-pool 3 x 3 stride 3], flattened (512
    features at 130 x 110, 128 at 63 x 63). x: [B, H * W * C] (frames flattened, as every env
    observation is a vector; anything after the frame, the text twin's observation an LLM
    reads, is not the CNN's) -> [B, F]."""

    image: tuple[int, int, int]
    conv: ConvForm = "auto"  # how the convolutions compute (`Conv`): auto, im2col or lax

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = x[:, :int(np.prod(self.image))].reshape(x.shape[0], *self.image)
        for i in range(3):
            x = nn.relu(Conv(32, im2col=IM2COL[self.conv], name=f"conv_{i}")(x))
            x = max_pool3(x)
        return x.reshape(x.shape[0], -1)


def conv_features(image: tuple[int, int, int]) -> int:
    """Features `ConvTorso` gives for frames of `image` (H, W, C)."""
    h, w = image[0], image[1]
    for _ in range(3):
        h, w = h // 3, w // 3
    return 32 * h * w


class ConvActorCritic(nn.Module):
    """The public baselines' `ActorCriticConv`: one CNN torso (`ConvTorso`) shared by the actor
    (Dense(width) -> ReLU -> Dense(A) -> ReLU -> Dense(A)) and the critic (Dense(width) -> ReLU
    -> Dense(1)), orthogonal init (gain 2, 0.01 on the action heads, 1 on the value). The
    rollout runs the torso once a step for both (`shares_torso`: the policy's forward gives the
    value with the logits)."""

    num_actions: int
    image: tuple[int, int, int]
    width: int = 512
    conv: ConvForm = "auto"
    shares_torso = True  # (a class attribute: not a field)

    def setup(self):
        self.torso = ConvTorso(self.image, self.conv)
        self.actor_hidden = dense(self.width, 2.0)
        self.actor_mid = dense(self.num_actions, 0.01)
        self.actor_head = dense(self.num_actions, 0.01)
        self.critic_hidden = dense(self.width, 2.0)
        self.critic_head = dense(1, 1.0)

    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        """obs: [B, H * W * C] -> (logits [B, A], value [B]); the torso once for both."""
        x = self.torso(obs)
        return self._actor(x), self._critic(x)

    def actor(self, obs: jax.Array) -> jax.Array:
        return self._actor(self.torso(obs))

    def critic(self, obs: jax.Array) -> jax.Array:
        return self._critic(self.torso(obs))

    def _actor(self, x: jax.Array) -> jax.Array:
        return self.actor_head(nn.relu(self.actor_mid(nn.relu(self.actor_hidden(x)))))

    def _critic(self, x: jax.Array) -> jax.Array:
        return self.critic_head(nn.relu(self.critic_hidden(x)))[:, 0]


class ConcatDense(nn.Module):
    """`dense` over concat([a, b], -1), with the same parameters (kernel [A + B, F], bias), where
    b may be one row shared by every row of a: then b's part of the product is computed once."""

    features: int
    gain: float

    @nn.compact
    def __call__(self, a: jax.Array, b: jax.Array) -> jax.Array:
        na = a.shape[-1]
        kernel = self.param("kernel", nn.initializers.orthogonal(self.gain),
                            (na + b.shape[-1], self.features))
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        if b.shape[0] == a.shape[0]:
            return jnp.concatenate([a, b], axis=-1) @ kernel + bias
        return a @ kernel[:na] + (b @ kernel[na:] + bias)


class AugmentedMLP(nn.Module):
    """obs -> Dense+tanh, hidden state -> [LayerNorm] Dense+tanh, concatenated, then
    `num_layers - 1` Dense+tanh layers and a linear head (the prior system's augmented network).

    `constant_hidden`: every row's hidden state is the same (LLM never called, or the zero
    ablation), so the hidden branch and its share of the first joint layer run on one row."""

    width: int
    num_layers: int
    out: int
    out_gain: float
    layernorm: bool
    constant_hidden: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array, hidden: jax.Array) -> jax.Array:
        """obs: [B, D] (or a frame's CNN features), hidden [B, H] (or [1, H])."""
        x = nn.tanh(dense(self.width, np.sqrt(2), "obs_proj")(obs))
        if self.constant_hidden:
            hidden = hidden[:1]
        if self.layernorm:
            hidden = nn.LayerNorm(name="hidden_norm")(hidden)
        h = nn.tanh(dense(self.width, np.sqrt(2), "hidden_proj")(hidden))
        for i in range(self.num_layers):  # the first takes concat([x, h]); the last is the head
            last = i == self.num_layers - 1
            name, features, gain = (("head", self.out, self.out_gain) if last
                                    else (f"hidden_{i}", self.width, np.sqrt(2)))
            x = (ConcatDense(features, gain, name=name)(x, h) if i == 0
                 else dense(features, gain, name)(x))
            x = x if last else nn.tanh(x)
        return x


class AugmentedActorCritic(nn.Module):
    """Separate actor and critic over (observation, a per-env feature vector such as an LLM
    hidden state). Inputs are dicts {"obs": [B, D], "hidden": [B, H]} so PPO code handles them
    like plain observations. With `image` the observation is a frame: one CNN torso
    (`ConvTorso`, shared by actor and critic as in `ConvActorCritic`) gives the features the
    two MLPs join with the hidden state (the prior's ActorCriticConvAug)."""

    num_actions: int
    width: int = 512
    num_layers: int = 3
    layernorm: bool = False
    constant_hidden: bool = False
    image: tuple[int, int, int] | None = None
    conv: ConvForm = "auto"

    def setup(self):
        self.actor_mlp = AugmentedMLP(self.width, self.num_layers, self.num_actions, 0.01,
                                      self.layernorm, self.constant_hidden)
        self.critic_mlp = AugmentedMLP(self.width, self.num_layers, 1, 1.0, self.layernorm,
                                       self.constant_hidden)
        if self.image is not None:
            self.torso = ConvTorso(self.image, self.conv)

    @property
    def shares_torso(self) -> bool:
        """Actor and critic read one CNN torso's features (frames): `__call__` gives both."""
        return self.image is not None

    def _obs(self, inp: dict) -> jax.Array:
        return inp["obs"] if self.image is None else self.torso(inp["obs"])

    def __call__(self, inp: dict) -> tuple[jax.Array, jax.Array]:
        if self.image is None:
            return self.actor(inp), self.critic(inp)
        x = self._obs(inp)  # the torso once for both
        return (self.actor_mlp(x, inp["hidden"]),
                self.critic_mlp(x, inp["hidden"])[:, 0])

    def actor(self, inp: dict) -> jax.Array:
        return self.actor_mlp(self._obs(inp), inp["hidden"])

    def critic(self, inp: dict) -> jax.Array:
        return self.critic_mlp(self._obs(inp), inp["hidden"])[:, 0]


class Embed(nn.Module):
    """A recurrent policy's first layer: Dense+relu of the observation (of a frame's CNN
    features, `ConvTorso`, with `image`), or for inputs {"obs", "hidden"} (an LLM state beside
    it) the augmented network's two projections joined by one Dense+relu, so a GRU takes the
    LLM state as the MLP does."""

    width: int
    layernorm: bool = False
    constant_hidden: bool = False
    image: tuple[int, int, int] | None = None
    conv: ConvForm = "auto"

    @nn.compact
    def __call__(self, x) -> jax.Array:
        if not isinstance(x, dict):
            if self.image is not None:
                x = ConvTorso(self.image, self.conv, name="torso")(x)
            return nn.relu(dense(self.width, np.sqrt(2), "embed")(x))
        o = (x["obs"] if self.image is None
             else ConvTorso(self.image, self.conv, name="torso")(x["obs"]))
        o = nn.relu(dense(self.width, np.sqrt(2), "obs_proj")(o))
        h = x["hidden"][:1] if self.constant_hidden else x["hidden"]
        if self.layernorm:
            h = nn.LayerNorm(name="hidden_norm")(h)
        h = nn.relu(dense(self.width, np.sqrt(2), "hidden_proj")(h))
        return nn.relu(ConcatDense(self.width, np.sqrt(2), name="joint")(o, h))


class ResetGRU(nn.Module):
    """One GRU step whose carry restarts from zeros where an episode starts."""

    width: int

    @nn.compact
    def __call__(self, carry: jax.Array, xs) -> tuple[jax.Array, jax.Array]:
        e, reset = xs
        carry = jnp.where(reset[:, None], 0.0, carry)
        return nn.GRUCell(self.width, name="cell")(carry, e)


class RecurrentActorCritic(nn.Module):
    """PPO-RNN (the public Craftax baselines' recurrent agent): embedding -> GRU -> separate
    actor and critic heads of `num_layers - 1` relu layers. Over sequences: carry [B, W],
    x [T, B, ...] (or a dict of them), resets [T, B] (the carry restarts before that step) ->
    (carry after the last step, logits [T, B, A], value [T, B])."""

    num_actions: int
    width: int = 512
    num_layers: int = 3
    layernorm: bool = False
    constant_hidden: bool = False
    image: tuple[int, int, int] | None = None  # frames: the GRU runs over their CNN features
    conv: ConvForm = "auto"

    @nn.compact
    def __call__(self, carry, x, resets):
        t, b = resets.shape
        flat = jax.tree.map(lambda a: a.reshape((t * b,) + a.shape[2:]), x)
        e = Embed(self.width, self.layernorm, self.constant_hidden, self.image, self.conv,
                  name="embed")(flat)
        scan = nn.scan(ResetGRU, variable_broadcast="params", split_rngs={"params": False},
                       in_axes=0, out_axes=0)
        carry, y = scan(self.width, name="gru")(carry, (e.reshape(t, b, -1), resets))
        y = y.reshape(t * b, -1)
        heads = max(self.num_layers - 1, 1)
        logits = MLP(self.width, heads, self.num_actions, 0.01, relu=True, name="actor")(y)
        value = MLP(self.width, heads, 1, 1.0, relu=True, name="critic")(y)
        return carry, logits.reshape(t, b, -1), value.reshape(t, b)

    def initial_carry(self, n: int) -> jax.Array:
        return jnp.zeros((n, self.width), jnp.float32)


def is_recurrent(network: nn.Module) -> bool:
    """The network carries state across steps (`RecurrentActorCritic`)."""
    return hasattr(network, "initial_carry")


def init_network(network: nn.Module, key: jax.Array, example):
    """Parameters for a network input like `example` ([1, ...] rows), recurrent or not."""
    if is_recurrent(network):
        one = jax.tree.map(lambda a: a[None], example)
        return network.init(key, network.initial_carry(1), one, jnp.zeros((1, 1), bool))
    return network.init(key, example)
