"""The fast step against Craftax's own over many transitions: equal bit for bit or the first
differing field named (fused/envs/parity.py's run, in chunks).

    python bench/env_parity.py --env Craftax-Classic-Symbolic-v1 --transitions 10_000_000

Chunks of `--num-envs` x `--chunk-steps` transitions take the settings in turn (one program,
the setting an argument of it, compiled once; the chunk's worlds made by another): uniform
random play, and DO-heavy random play with every env's state edited by hand at the start of
each 25-step block (`fused.envs.curated`: night, sleep, mobs close, arrows in flight, the map's
edge, low health); with `--policy RUN`, a trained run's policy playing (its actions sampled
from the reference's observations: the states a learning agent reaches). Ended episodes restart
on worlds Craftax's reset made. Each chunk has its own seed. Prints a line a chunk; `--out`
gets one JSON row (written again after each chunk, atomically: a run cut short keeps what it
compared)."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import tyro

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fused.commands  # noqa: E402,F401  (a command's XLA settings, before Craftax loads)
from fused.envs import has_fast_step, make_craftax_env  # noqa: E402
from fused.envs.curated import classic_edit, full_edit  # noqa: E402
from fused.envs.parity import ParityReport, make_parity_run, random_policy  # noqa: E402
from fused.envspec import spec  # noqa: E402
from fused.errors import ConfigError  # noqa: E402
from fused.runs.files import atomic_write_json, require_writable  # noqa: E402

# Classic's actions, drawn more often where the step does more: DO, placing, crafting.
CLASSIC_WEIGHTS = [0.5, 1, 1, 1, 1, 3, 0.3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]
# The full game's: DO and shooting more, sleep and rest less (the floors' ladders as others).
FULL_WEIGHTS = [0.5, 1, 1, 1, 1, 3, 0.3] + [1] * 10 + [0.3] + [1] * 6 + [2, 1, 2, 2] + [1] * 15


def edits(name: str):
    """The hand-made states and action weights of the edited setting, by game."""
    return (full_edit, FULL_WEIGHTS) if spec(name).floors > 1 else (classic_edit, CLASSIC_WEIGHTS)


@dataclasses.dataclass
class Args:
    env: str = "Craftax-Classic-Symbolic-v1"
    """A game with a fast step (fused.envs.has_fast_step)."""
    transitions: int = 10_000_000
    """Env steps compared in all (rounded up to whole chunks)."""
    num_envs: int = 1024
    chunk_steps: int = 500
    """Steps a chunk (a multiple of 25: the edit and reset-pool block)."""
    seed: int = 0
    policy: str | None = None
    """A run folder (train.py or offline.py) whose trained policy plays a third setting: a
    feed-forward policy on the observation alone (no LLM, no GRU), trained on --env."""
    checkpoint: int | None = None
    """The --policy run's checkpoint (its update); default: its latest."""
    out: str | None = None
    """Write the result here as JSON."""


def trained(a: Args):
    """(act, params, source) of the --policy run: act(params) is a parity policy sampling the
    run's actions from the observations. Refused in one line: a run of another env, an LLM or
    a recurrent policy (their inputs carry state from step to step, which a parity step, always
    restarted from the reference's state, does not keep)."""
    from fused.rl.acting import network_policy, sample
    from fused.rl.policy_input import Identity
    from fused.trained_policy import load_policy

    pol = load_policy(a.policy, a.num_envs, a.checkpoint)
    if pol.cfg.env.name != a.env:
        raise ConfigError(f"--policy {a.policy} was trained on {pol.cfg.env.name}, not --env "
                          f"{a.env}")
    policy = network_policy(pol.agent.network)
    if not isinstance(pol.agent.inputs, Identity) or policy.recurrent:
        raise ConfigError(f"--policy {a.policy}: an LLM or GRU policy keeps a state between "
                          "steps; pass a run of a feed-forward policy on the observation alone")

    def act(params):
        def draw(key, obs, state):
            n = obs.shape[0]
            _, logits, _ = policy.forward(params, None, obs.reshape(n, -1))
            return sample(jax.random.split(key, n), logits)[0].astype(jnp.int32)
        return draw

    return act, pol.params, {"policy": str(pol.run_dir), "checkpoint": pol.step}


def runs(a: Args, policy=None):
    """(worlds(key), run(key, worlds, setting, weights), the settings' names, transitions a
    chunk, leaf names), both jitted: `worlds` makes the chunk's starting and pool worlds
    (Craftax's reset), `run` steps them; one program for every setting (uniform, edited and,
    with `policy`, `trained`'s run playing), the setting's index and the policy's weights
    arguments of it."""
    ref, new = make_craftax_env(a.env, "craftax"), make_craftax_env(a.env, "fast")
    params = ref.default_params
    edit_state, weights = edits(a.env)
    draws = [random_policy(ref.num_actions), random_policy(ref.num_actions, weights)]
    settings = ["uniform", "edited"] + (["policy"] if policy is not None else [])

    def parity_run(act, edit):
        return make_parity_run(
            lambda k, s, x: ref.step_env(k, s, x, params),
            lambda k, s, x: new.step_env(k, s, x, params),
            lambda k: ref.reset_env(k, params), ref.get_obs, a.num_envs, a.chunk_steps,
            act, pool=64, pool_every=25, edit=edit)

    def run(key, worlds, setting, weights):
        def act(k, obs, state):
            acts = [lambda d=d: d(k, obs, state) for d in draws]
            if policy is not None:
                acts.append(lambda: policy[0](weights)(k, obs, state))
            return jax.lax.switch(setting, acts)

        def edit(k, state):  # (the uniform and policy settings' states unedited)
            return jax.lax.cond(setting == 1, edit_state, lambda _, s: s, k, state)

        return parity_run(act, edit)[1](key, worlds)

    worlds, _, total, names = parity_run(draws[0], None)
    return jax.jit(worlds), jax.jit(run), settings, total, names


def main(a: Args) -> int:
    if not has_fast_step(a.env):
        raise SystemExit(f"error: --env {a.env} has no fast step yet")
    if a.chunk_steps <= 0 or a.chunk_steps % 25:
        raise SystemExit(f"error: --chunk-steps {a.chunk_steps}: a positive multiple of 25")
    for flag, value in (("--transitions", a.transitions), ("--num-envs", a.num_envs)):
        if value <= 0:
            raise SystemExit(f"error: {flag} {value}: at least 1")
    try:
        if a.out:  # (before anything compiles: no chunk compared only to be lost)
            require_writable(a.out, "--out")
        policy = trained(a) if a.policy else None
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    if a.out:
        Path(a.out).expanduser().parent.mkdir(parents=True, exist_ok=True)
    worlds, run, settings, total, names = runs(a, policy)
    weights = policy[1] if policy else None
    diff, first = np.zeros(len(names), np.int64), np.full(len(names), -1, np.int64)
    done, ends, chunk, t0 = 0, 0, 0, time.perf_counter()
    row: dict = {}
    try:
        while done < a.transitions:
            setting = chunk % len(settings)
            key = jax.random.PRNGKey(a.seed * 1_000_003 + chunk)
            d, f, e = jax.device_get(run(key, worlds(key), np.int32(setting), weights))
            f = np.where(f >= 0, f + done // a.num_envs, -1)  # steps counted over the whole run
            first = np.where(first >= 0, first, f)
            diff += d
            done, ends, chunk = done + total, ends + int(e), chunk + 1
            report = ParityReport(diff, first, done, ends, names)
            row = {"name": "env_parity", "env": a.env, "num_envs": a.num_envs,
                   "transitions": done, "episode_ends": ends, "chunks": chunk,
                   "equal": report.first() is None, "first_difference": report.first(),
                   "seconds": time.perf_counter() - t0, "jax": jax.__version__,
                   **(policy[2] if policy else {})}
            print(f"{done:>12,} transitions ({settings[setting]}), {ends:,} episodes ended: "
                  f"{'equal' if row['equal'] else report.first()}", flush=True)
            if a.out:
                atomic_write_json(a.out, row)
    except KeyboardInterrupt:  # Ctrl-C: one line; --out keeps the chunks compared
        print(f"stopped after {done:,} transitions"
              + (f" ({'equal' if row['equal'] else row['first_difference']}; the row: {a.out})"
                 if row and a.out else ""), file=sys.stderr)
        return 130
    print(json.dumps(row))
    return 0 if row["equal"] else 1


if __name__ == "__main__":
    sys.exit(main(tyro.cli(Args)))
