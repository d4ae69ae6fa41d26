"""Two env steps side by side from the same states and keys: are they equal, bit for bit, and
if not, which field differs first.

A step here is `(key, state, action) -> (obs, state, reward, done, info)` (Craftax's `step_env`
with its params bound). `make_parity_run` plays `num_envs` envs for `steps` steps with a policy,
steps every env with both from the same state, key and action, counts the elements that differ
in each leaf (obs, every state field, reward, done, every info entry; floats compared by their
bits), and carries on from the reference's state, so a difference is counted where it arises and
does not spread. Ended episodes restart from worlds the reference's reset made (a pool renewed
every `pool_every` steps), so resets and the first steps of episodes are compared too. `edit`
(optional) rewrites states before they are stepped: curated states (night, sleep, mobs close,
arrows in flight, the map's edge, low health) reached more often than random play reaches them.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

Step = Callable[[jax.Array, Any, jax.Array], tuple]


def _strong(tree):
    """Arrays without weak types (Craftax's reset leaves Python scalars that its step returns as
    int32 / float32 arrays: a scan's carry must keep one type)."""
    return jax.tree.map(lambda x: jax.lax.convert_element_type(x, jnp.asarray(x).dtype), tree)


def leaf_names(tree) -> list[str]:
    """'state.zombies.position', 'info[\"score\"]', ...: one per leaf, in tree order."""
    paths, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [jax.tree_util.keystr(p, simple=True, separator=".") for p, _ in paths]


def _bits(x: jax.Array) -> jax.Array:
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.floating):
        return jax.lax.bitcast_convert_type(x, {2: jnp.uint16, 4: jnp.uint32,
                                                8: jnp.uint64}[x.dtype.itemsize])
    return x


def differing(a, b) -> jax.Array:
    """Elements that differ (bitwise), per leaf: [L] int32. Trees of different structure, or
    leaves of different shape or dtype, raise."""
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    if ta != tb:
        raise ValueError(f"the two steps give different trees:\n{ta}\n{tb}")
    out = []
    for x, y in zip(la, lb):
        x, y = jnp.asarray(x), jnp.asarray(y)
        if x.shape != y.shape or x.dtype != y.dtype:
            raise ValueError(f"leaf {x.shape} {x.dtype} vs {y.shape} {y.dtype}")
        out.append(jnp.sum(_bits(x) != _bits(y), dtype=jnp.int32))
    return jnp.stack(out)


def first_difference(a, b, names: list[str] | None = None) -> str | None:
    """On the host: the first leaf (tree order) where a and b differ, with its first differing
    element and both values; None where equal."""
    names = names or leaf_names(a)
    for name, x, y in zip(names, jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        bx = np.asarray(_bits(x))
        by = np.asarray(_bits(y))
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"{name}: {x.shape} {x.dtype} vs {y.shape} {y.dtype}"
        if (bx != by).any():
            at = tuple(int(i) for i in np.argwhere(bx != by)[0])
            return f"{name}{list(at)}: {x[at]!r} (reference) vs {y[at]!r}"
    return None


class Outcome(NamedTuple):
    obs: jax.Array
    state: Any
    reward: jax.Array
    done: jax.Array
    info: dict


def outcome(result) -> Outcome:
    return Outcome(*result)


class ParityReport(NamedTuple):
    differing: np.ndarray  # [L] elements that differed over the run, per leaf
    first_step: np.ndarray  # [L] the first step a leaf differed (-1: never)
    transitions: int  # env steps compared
    episode_ends: int  # ended episodes among them (each followed by a reset)
    names: list[str]

    def first(self) -> str | None:
        """The leaf that differed first, or None. Ties: a state field before what is computed
        from the state (the observation, reward, done, info), then tree order."""
        first = self.first_step.astype(np.int64)  # (int32: the int64 sentinel would wrap to -1)
        if (first < 0).all():
            return None
        derived = [not n.startswith("state.") for n in self.names]
        k = min((int(s), d, i) for i, (s, d) in enumerate(zip(first, derived)) if s >= 0)[2]
        return (f"{self.names[k]} (first at step {int(self.first_step[k])}; "
                f"{int(self.differing[k])} elements over the run)")


def random_policy(num_actions: int, weights=None):
    """Uniform actions, or drawn by `weights` [A] (e.g. more DO and crafting than moves)."""
    logits = None if weights is None else jnp.log(jnp.asarray(weights, jnp.float32))

    def act(key, obs, state):
        n = obs.shape[0]
        if logits is None:
            return jax.random.randint(key, (n,), 0, num_actions)
        return jax.random.categorical(key, logits, shape=(n,)).astype(jnp.int32)

    return act


def make_parity_run(reference: Step, candidate: Step, reset: Callable, observe: Callable,
                    num_envs: int, steps: int, policy: Callable, pool: int = 64,
                    pool_every: int = 50, edit: Callable | None = None):
    """-> (worlds, run, transitions, names): `worlds(key)` is the reference's reset of every
    world the run starts from (the envs', and a pool of `pool` for each block), `run(key,
    worlds) -> (differing [L], first_step [L], ends)` with the same key. Jit each on its own:
    world generation is much of Craftax's program, and apart from the two steps the two programs
    compile in less time than the one did. Also the env steps `run` compares and its leaves'
    names. `steps` is rounded up to whole blocks of `pool_every` steps, ended episodes
    restarting on the block's pool; `edit(key, state)` (one env's) rewrites every state at the
    start of each block, `observe(state)` renders it."""
    blocks = -(-steps // pool_every)
    step_ref, step_new = jax.vmap(reference), jax.vmap(candidate)

    def body(carry, k, pool_obs, pool_state):
        obs, state, t, diff, first, ends = carry
        k_act, k_step, k_pick = jax.random.split(k, 3)
        action = policy(k_act, obs, state)
        keys = jax.random.split(k_step, num_envs)
        ref = outcome(step_ref(keys, state, action))
        new = outcome(step_new(keys, state, action))
        d = differing(ref, new)
        first = jnp.where((first < 0) & (d > 0), t, first)
        # Ended episodes start on a pool world (the reference's reset).
        pick = jax.random.randint(k_pick, (num_envs,), 0, pool)
        done = ref.done

        def restart(fresh, live):
            m = done.reshape(done.shape + (1,) * (live.ndim - 1))
            return jnp.where(m, fresh[pick], live)

        state = jax.tree.map(restart, pool_state, ref.state)
        obs = restart(pool_obs, ref.obs)
        return (obs, state, t + 1, diff + d, first, ends + done.sum()), None

    def block(carry, xs):
        k, (pool_obs, pool_state) = xs
        obs, state, t, diff, first, ends = carry
        _, k_edit, k_steps = jax.random.split(k, 3)  # (the first: the block's pool, `worlds`')
        if edit is not None:
            state = _strong(jax.vmap(edit)(jax.random.split(k_edit, num_envs), state))
            obs = jax.vmap(observe)(state)
        carry = (obs, state, t, diff, first, ends)
        carry, _ = jax.lax.scan(lambda c, kk: body(c, kk, pool_obs, pool_state), carry,
                                jax.random.split(k_steps, pool_every))
        return carry, None

    def worlds(key):
        k_reset, k_blocks = jax.random.split(key)
        envs = _strong(jax.vmap(reset)(jax.random.split(k_reset, num_envs)))
        pools = jax.lax.map(  # (a block at a time: a vmapped reset's bits follow its batch)
            lambda k: _strong(jax.vmap(reset)(jax.random.split(jax.random.split(k, 3)[0], pool))),
            jax.random.split(k_blocks, blocks))
        return envs, pools

    def shapes(key):
        obs, state = _strong(jax.vmap(reset)(jax.random.split(key, num_envs)))
        return outcome(step_ref(jax.random.split(key, num_envs), state,
                                jnp.zeros((num_envs,), jnp.int32)))

    names = leaf_names(jax.eval_shape(shapes, jax.random.PRNGKey(0)))

    def run(key, worlds):
        (obs, state), pools = worlds
        n = len(names)
        carry = (obs, state, jnp.int32(0), jnp.zeros((n,), jnp.int32),
                 jnp.full((n,), -1, jnp.int32), jnp.int32(0))
        carry, _ = jax.lax.scan(block, carry, (jax.random.split(jax.random.split(key)[1], blocks),
                                               pools))
        _, _, _, diff, first, ends = carry
        return diff, first, ends

    return worlds, run, blocks * pool_every * num_envs, names
