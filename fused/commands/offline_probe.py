"""`offline.py probe`: does a policy rely on its LLM's hidden state? Value and action
distribution on curated states, made by editing real env states, under several hidden states.

States: `states` envs reset from fixed seeds and stepped `warmup` uniform-random steps (real
mid-episode states). A recurrent policy reads every probed observation with the carry it built
reading that history (one carry per state, the same for each of its edits). Edits (each changes one thing the text would mention; `probe_obs_diff`
in the tests checks that the observation changes only there): an arrow one tile away or four
tiles away, low food / drink / energy, iron or diamond two tiles to the right, a ladder down
there (Craftax-Symbolic), a zombie on the tile below.

Hidden-state variants, for an LLM-augmented policy: `real` (the state encoded as the policy
would), `zero`, `shuffle` (real states permuted across the probe states), `garbage` (the
observation after a shuffled prompt prefix) and, for the threats, `counterfactual` (the
unedited observation with the hidden state of the edited one: the text describes a threat
that is not on the map). A plain policy has only `real`; a Qwen3-VL-augmented one (its
prompt is the frame and one instruction) has no `garbage`.

Reported per edit and variant: mean V(edited) - V(base) and mean KL(pi(base) || pi(edited));
per edit, the ablation's effect against `real` on the same edited states (value change, KL);
and the evaluation return under each ablation (whole episodes, `fused.commands.offline_eval`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fused.errors import ConfigError
from fused.agent import needs_text
from fused.commands.offline_eval import EvalConfig, evaluate
from fused.envspec import spec
from fused.llm.encoders import make_encoder
from fused.llm.norm import normalize
from fused.trained_policy import load_policy
from fused.rl.acting import network_policy
from fused.rl.envs import make_env
from fused.rl.evaluate import ci_text, episode_keys
from fused.runs.files import atomic_write, atomic_write_json
from fused.runs.metrics import save_figure


@dataclasses.dataclass(frozen=True)
class ProbeConfig:
    run: str
    """Run folder (train.py or offline.py)."""
    states: int = 64
    """Real states probed (each edit applied to each)."""
    warmup: int = 20
    """Uniform-random steps from reset to each real state."""
    seed: int = 0
    """Seed of the states (and of the ablation evaluations)."""
    eval_episodes: int = 32
    """Episodes of the evaluation under each ablation (0 skips it)."""
    eval_max_steps: int | None = None
    """Step cap of those evaluations (censored episodes are reported)."""
    checkpoint: int | None = None
    """Checkpoint to probe; default the newest good one."""
    allow_mismatch: bool = False
    """Evaluate an offline LLM policy even if its model or prompt now differs from its label
    set's (see `offline.py eval`)."""


# --- edits of Craftax states ---------------------------------------------------------------------

def _full(state) -> bool:
    return state.map.ndim == 3


def _set_block(state, dr: int, dc: int, block: int):
    r, c = state.player_position[0] + dr, state.player_position[1] + dc
    if _full(state):
        return state.replace(map=state.map.at[state.player_level, r, c].set(block))
    return state.replace(map=state.map.at[r, c].set(block))


def _clear_walkable(state, dr: int, dc: int):
    """Grass under a placed mob (it must stand on a walkable tile to be valid)."""
    return _set_block(state, dr, dc, 2)  # BlockType.GRASS in both envs


def _place_mob(state, field: str, dr: int, dc: int, direction=None, type_id: int = 0):
    """Slot 0 of a mob array at player + (dr, dc) (on the player's floor)."""
    pos = state.player_position + jnp.array([dr, dc])
    mobs = getattr(state, field)
    if _full(state):
        lv = state.player_level
        mobs = mobs.replace(position=mobs.position.at[lv, 0].set(pos),
                            mask=mobs.mask.at[lv, 0].set(True),
                            health=mobs.health.at[lv, 0].set(jnp.maximum(mobs.health.max(), 1)),
                            type_id=mobs.type_id.at[lv, 0].set(type_id))
        mob_map = state.mob_map.at[lv, pos[0], pos[1]].set(True)
    else:
        mobs = mobs.replace(position=mobs.position.at[0].set(pos), mask=mobs.mask.at[0].set(True),
                            health=mobs.health.at[0].set(jnp.maximum(mobs.health.max(), 1)))
        mob_map = state.mob_map.at[pos[0], pos[1]].set(True)
    state = _clear_walkable(state, dr, dc).replace(**{field: mobs}, mob_map=mob_map)
    if direction is not None:
        dfield = "mob_projectile_directions" if _full(state) else "arrow_directions"
        dirs = getattr(state, dfield)
        d = jnp.array(direction)
        dirs = dirs.at[state.player_level, 0].set(d) if _full(state) else dirs.at[0].set(d)
        state = state.replace(**{dfield: dirs})
    return state


def _arrow(distance: int):
    def edit(state):
        field = "mob_projectiles" if _full(state) else "arrows"
        return _place_mob(state, field, 0, distance, direction=(0, -1))  # flying at the player
    return edit


def _zombie(state):
    return _place_mob(state, "melee_mobs" if _full(state) else "zombies", 1, 0)


def _ladder(state):
    r, c = state.player_position[0], state.player_position[1] + 2
    return state.replace(item_map=state.item_map.at[state.player_level, r, c].set(2))


EDITS: dict[str, tuple[Callable, bool]] = {  # name -> (edit, a threat: has a counterfactual)
    "arrow_adjacent": (_arrow(1), True),
    "arrow_far": (_arrow(4), True),
    "zombie_adjacent": (_zombie, True),
    "food_low": (lambda s: s.replace(player_food=jnp.asarray(1, s.player_food.dtype)), False),
    "drink_low": (lambda s: s.replace(player_drink=jnp.asarray(1, s.player_drink.dtype)), False),
    "energy_low": (lambda s: s.replace(player_energy=jnp.asarray(1, s.player_energy.dtype)),
                   False),
    "iron_in_view": (lambda s: _set_block(s, 0, 2, 9), False),  # BlockType.IRON
    "diamond_in_view": (lambda s: _set_block(s, 0, 2, 10), False),  # BlockType.DIAMOND
    "ladder_in_view": (_ladder, False),
}


def edits_for(env_name: str) -> list[str]:
    full = spec(env_name).floors > 1
    return [n for n in EDITS if full or n != "ladder_in_view"]


def probe_states(env, n: int, seed: int, warmup: int):
    """n real states: reset from fixed seeds, then `warmup` uniform-random steps."""
    _, states = jax.vmap(env.reset)(episode_keys(jax.random.PRNGKey(seed), n))

    def body(s, k):
        ka, ks = jax.random.split(k)
        a = jax.random.randint(ka, (n,), 0, env.num_actions)
        return jax.vmap(env.step)(jax.random.split(ks, n), s, a).state, None

    states, _ = jax.lax.scan(body, states, jax.random.split(jax.random.PRNGKey(seed + 1), warmup))
    return states


def history_carry(env, policy, inputs, params, frozen, trained, n: int, seed: int, warmup: int):
    """The policy's carry after reading the observations of `probe_states`' history (the same
    resets and uniform-random actions), its policy input stepped along as when acting."""
    obs, states = jax.vmap(env.reset)(episode_keys(jax.random.PRNGKey(seed), n))
    istate, _ = inputs.init(frozen, obs, jax.random.PRNGKey(seed + 2), None)
    if trained is not None:
        istate = inputs.adopt(istate, trained)

    def body(c, xs):
        s, obs, istate, carry = c
        k, t = xs
        ka, ks = jax.random.split(k)
        carry, _, _ = policy.forward(params, carry, inputs.view(istate, obs))
        a = jax.random.randint(ka, (n,), 0, env.num_actions)
        res = jax.vmap(env.step)(jax.random.split(ks, n), s, a)
        istate, _ = inputs.step(frozen, istate, res.obs, jnp.zeros(n, bool), t + 1,
                                jax.random.fold_in(ka, 1), None)
        return (res.state, res.obs, istate, carry), None

    keys = jax.random.split(jax.random.PRNGKey(seed + 1), warmup)
    (_, _, _, carry), _ = jax.lax.scan(body, (states, obs, istate, policy.carry(n)),
                                       (keys, jnp.arange(warmup)))
    return carry


# --- the probe ------------------------------------------------------------------------------------

def kl(p_logits, q_logits):
    p = jax.nn.log_softmax(p_logits)
    q = jax.nn.log_softmax(q_logits)
    return (jnp.exp(p) * (p - q)).sum(-1)


def run_probe(c: ProbeConfig, console) -> dict:
    if c.states < 2 or c.warmup < 0:
        raise ConfigError("states must be >= 2 and warmup >= 0")
    run_dir = Path(c.run).expanduser()
    pol = load_policy(run_dir, c.states, c.checkpoint)
    env_name = pol.cfg.env.name
    if spec(env_name).family != "craftax":
        raise ConfigError(f"probes edit Craftax states; {run_dir} plays {env_name}")
    env = make_env(pol.cfg.env, needs_text(pol.cfg))
    policy = network_policy(pol.agent.network)
    base = jax.jit(probe_states, static_argnums=(0, 1, 2, 3))(env, c.states, c.seed, c.warmup)
    # A recurrent policy reads each probed observation with the carry of the history that led
    # to the base state (the same one for every edit); a feed-forward one has no carry.
    pin = pol.agent.inputs
    carry = (jax.jit(lambda p, f, tr: history_carry(env, policy, pin, p, f, tr, c.states,
                                                    c.seed, c.warmup))(
        pol.params, pin.frozen, pol.inputs_state) if policy.recurrent else None)

    @jax.jit
    def forward(params, x):
        _, logits, value = policy.forward(params, carry, x)
        return (policy.critic(params, carry, x) if value is None else value), logits
    observe = jax.jit(jax.vmap(env.observe))
    names = edits_for(env_name)
    obs = {"base": observe(base)}
    for n in names:
        obs[n] = observe(jax.jit(jax.vmap(EDITS[n][0]))(base))
    llm = pol.cfg.llm.active_backend != "none"
    # the garbage-prompt variant where the encoder builds one (a Qwen3-VL's prompt is the frame
    # and one instruction: none)
    garbage = llm and "garbage-prompt" in pol.agent.inputs.encoder.ablations
    variants = (["real", "zero", "shuffle"] + (["garbage"] if garbage else []) + ["counterfactual"]
                if llm else ["real"])
    inputs = hidden_inputs(pol, obs, c.seed, garbage=garbage) if llm else None

    def outputs(name, variant):
        if not llm:
            x = obs[name]
        else:
            x = {"obs": obs["base"] if variant == "counterfactual" else obs[name],
                 "hidden": inputs(name, variant)}
        value, logits = forward(pol.params, x)
        return np.asarray(value), np.asarray(logits)

    results: dict = {"run": str(run_dir), "env": env_name, "states": c.states,
                     "edits": {}, "ablations": {}}
    for v in variants:
        if v == "counterfactual":
            continue
        v0, l0 = outputs("base", v)
        for n in names:
            v1, l1 = outputs(n, v)
            results["edits"].setdefault(n, {})[v] = {
                "value_change": float((v1 - v0).mean()),
                "kl": float(np.asarray(kl(l0, l1)).mean())}
    if llm:
        for n in ["base"] + names:
            vr, lr = outputs(n, "real")
            row = {}
            for v in variants[1:]:
                if v == "counterfactual" and (n == "base" or not EDITS[n][1]):
                    continue
                va, la = outputs(n, v)
                row[v] = {"value_change": float((va - vr).mean()) if v != "counterfactual"
                          else float((va - outputs("base", "real")[0]).mean()),
                          "kl": float(np.asarray(kl(lr if v != "counterfactual"
                                                    else outputs("base", "real")[1], la)).mean())}
            results["ablations"][n] = row
    if c.eval_episodes and llm:
        results["eval"] = ablation_returns(c, run_dir, console, pol.agent, garbage=garbage)
    out = run_dir / "probe.json"
    atomic_write_json(out, results)
    atomic_write(run_dir / "probe.md", table(results))
    plot(results, run_dir / "probe.png")
    console.print(table(results))
    console.print(f"-> {out}, probe.md, probe.png")
    return results


def hidden_inputs(pol, obs: dict, seed: int, garbage: bool = True) -> Callable:
    """(edit name, variant) -> the normalised hidden states the policy would see [S, H]
    (`garbage`: the garbage-prompt variant is built)."""
    enc = pol.agent.inputs.encoder
    mb = pol.agent.inputs.microbatch
    enc_real = jax.jit(lambda f, o: enc.encode(f, o, mb).hidden)
    raw = {n: enc_real(enc.frozen, o) for n, o in obs.items()}
    garbled = {}  # each state's garbage-prompt states (the edits and the ablations read them)
    if garbage:
        other = make_encoder(dataclasses.replace(pol.cfg.llm, hidden="garbage-prompt"),
                             pol.cfg.env.name, pol.cfg.seed, like=enc)
        enc_garbage = jax.jit(lambda f, o: other.encode(f, o, mb).hidden)
        garbled = {n: enc_garbage(other.frozen, o) for n, o in obs.items()}
    norm = pol.inputs_state.norm if pol.inputs_state is not None else None
    perm = jax.random.permutation(jax.random.PRNGKey(seed), next(iter(obs.values())).shape[0])

    def view(h):
        return normalize(norm, h) if (norm is not None and pol.cfg.llm.normalize) else h

    def get(name, variant):
        if variant == "real":
            return view(raw[name])
        if variant == "zero":
            return view(jnp.zeros_like(raw[name]))
        if variant == "shuffle":
            return view(raw[name][perm])
        if variant == "garbage":
            return view(garbled[name])
        return view(raw[name])  # counterfactual: the edited state's text, the base's obs

    return get


def ablation_returns(c: ProbeConfig, run_dir: Path, console, like, garbage: bool = True
                     ) -> dict:
    """Evaluation returns under each hidden-state ablation, all on `like`'s LLM weights
    (`garbage`: garbage-prompt among them)."""
    out = {}
    for hidden in ("real", "zero", "shuffle") + (("garbage-prompt",) if garbage else ()):
        ev = EvalConfig(run=str(run_dir), episodes=c.eval_episodes, seed=c.seed,
                        max_steps=c.eval_max_steps, checkpoint=c.checkpoint, plot=False,
                        allow_mismatch=c.allow_mismatch or hidden != "real",
                        out=str(run_dir / f"probe_eval_{hidden}.json"))
        r = evaluate(ev, console, llm_overrides=None if hidden == "real" else {"hidden": hidden},
                     like=like)
        out[hidden] = {"return_mean": r["return_mean"], "return_ci95": r["return_ci95"],
                       "censored": r["censored"]}
    return out


def table(r: dict) -> str:
    variants = sorted({v for e in r["edits"].values() for v in e},
                      key=["real", "zero", "shuffle", "garbage"].index)
    head = "| edit | " + " | ".join(f"{v}: dV, KL" for v in variants) + " |"
    rows = [head, "|---|" + "---|" * len(variants)]
    for n, e in r["edits"].items():
        rows.append(f"| {n} | " + " | ".join(
            f"{e[v]['value_change']:+.3f}, {e[v]['kl']:.3f}" for v in variants) + " |")
    if r["ablations"]:
        kinds = [k for k in ("zero", "shuffle", "garbage", "counterfactual")
                 if any(k in a for a in r["ablations"].values())]
        rows += ["", "| state | " + " | ".join(f"{k} vs real: dV, KL" for k in kinds) + " |",
                 "|---|" + "---|" * len(kinds)]
        for n, a in r["ablations"].items():
            rows.append(f"| {n} | " + " | ".join(
                f"{a[k]['value_change']:+.3f}, {a[k]['kl']:.3f}" if k in a else "-"
                for k in kinds) + " |")
    if "eval" in r:
        rows += ["", "| hidden state | eval return | 95% CI |", "|---|---|---|"]
        for k, e in r["eval"].items():
            rows.append(f"| {k} | {e['return_mean']:.2f} | {ci_text(*e['return_ci95'])} |")
    return "\n".join(rows) + "\n"


def plot(r: dict, path: Path) -> None:
    import matplotlib  # (a slow import: plotting only)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(r["edits"])
    variants = list(next(iter(r["edits"].values())))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    w = 0.8 / len(variants)
    for i, v in enumerate(variants):
        x = np.arange(len(names)) + i * w
        axes[0].bar(x, [r["edits"][n][v]["value_change"] for n in names], w, label=v)
        axes[1].bar(x, [r["edits"][n][v]["kl"] for n in names], w, label=v)
    for ax, title in zip(axes, ("V(edited) - V(base)", "KL(pi(base) || pi(edited))")):
        ax.set_xticks(np.arange(len(names)) + 0.4 - w / 2, names, rotation=40, fontsize=7,
                      ha="right")
        ax.set_title(title)
    axes[0].legend(fontsize=7)
    save_figure(fig, path)
