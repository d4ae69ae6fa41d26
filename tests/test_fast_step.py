"""fused.envs' steps against Craftax's own (craftax 1.6.1), bit for bit: observations, every state
field, rewards, dones and infos equal from the same states, keys and actions, through resets,
from random play and from hand-made states (`fused.envs.curated`); a difference names its field.
The pieces (point writes, the unrolled search, the probability draw) against the jnp / jax.random
calls they replace. The 10-million-transition run is `bench/env_parity.py` (docs/BENCHMARKS.md;
here shrunk)."""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from command_runner import run_command
from conftest import ROOT, subprocess_env
from craftax.craftax_classic.constants import DIRECTIONS, Action, BlockType

import fused.envs.classic_step as classic_step
from fused.envs import keys as fast_keys
from fused.envs import make_craftax_env
from fused.envs.classic import _in_bounds, move
from fused.envs.curated import classic_edit
from fused.envs.draws import RunningSums, choice, search_left
from fused.envs.grid import Grid, any_of, fence, first_true, one_of, put
from fused.envs.parity import (ParityReport, first_difference, leaf_names, make_parity_run,
                                outcome, random_policy)

CLASSIC = "Craftax-Classic-Symbolic-v1"
FULL = "Craftax-Symbolic-v1"
# Classic's actions, drawn more often where the step does more: DO, placing, crafting.
CLASSIC_WEIGHTS = [0.5, 1, 1, 1, 1, 3, 0.3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]


def parity(name, num_envs, steps, seed=0, edit=None, weights=None, candidate=None):
    """The report of Craftax's step against `candidate` (default: the fast step)."""
    ref = make_craftax_env(name, "craftax")
    new = candidate or make_craftax_env(name, "fast")
    params = ref.default_params
    worlds, run, total, names = make_parity_run(
        lambda k, s, a: ref.step_env(k, s, a, params), lambda k, s, a: new.step_env(k, s, a, params),
        lambda k: ref.reset_env(k, params), ref.get_obs, num_envs, steps,
        random_policy(ref.num_actions, weights), pool=8, pool_every=25, edit=edit)
    key = jax.random.PRNGKey(seed)
    diff, first, ends = jax.jit(run)(key, jax.jit(worlds)(key))
    return ParityReport(np.asarray(diff), np.asarray(first), total, int(ends), names)


# --- the pieces ---------------------------------------------------------------------------------

def test_grid_reads_and_writes_as_jnp_indexing():
    """Point writes (negative, outside, gated) then reads, as a sequence of .at[].set would."""
    base = jnp.arange(36, dtype=jnp.int32).reshape(6, 6)
    rng = np.random.default_rng(0)

    @jax.jit
    def both(writes, gates, reads):
        g, ref = Grid(base), base
        for k in range(writes.shape[0]):
            g = g.set(writes[k], 100 + k, gates[k])
            ref = jnp.where(gates[k], ref.at[writes[k, 0], writes[k, 1]].set(100 + k), ref)
        got = jnp.stack([g.at(r) for r in reads])
        want = jnp.stack([ref[r[0], r[1]] for r in reads])
        return g.array(), g.dense(), ref, got, want

    for _ in range(20):
        writes = jnp.asarray(rng.integers(-8, 9, (7, 2)), jnp.int32)
        writes = writes.at[3].set(writes[1])  # a cell written twice: the later one stays
        gates = jnp.asarray(rng.random(7) < 0.8)
        reads = jnp.asarray(np.concatenate([np.asarray(writes), rng.integers(-9, 10, (6, 2))]),
                            jnp.int32)
        array, dense, ref, got, want = both(writes, gates, reads)
        np.testing.assert_array_equal(array, ref)
        np.testing.assert_array_equal(dense, ref)
        np.testing.assert_array_equal(got, want)
    v = jnp.arange(4)
    for i in range(-5, 6):
        np.testing.assert_array_equal(put(v, jnp.int32(i), 9), v.at[i].set(9))
    for mask in ([0, 0, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0]):
        assert first_true(jnp.asarray(mask, bool)) == jnp.argmax(jnp.asarray(mask, bool))


def test_one_of_any_of_and_first_true_are_their_jnp_forms():
    """The unrolled reads of the fast step (on a CPU their links keep an axis, `grid.link`):
    `one_of` is jnp.isin for any int32 (the solid blocks of both games; values at 0, 31, 32 and
    63; x outside [0, 64) and at int32's ends), `any_of` is .any() and `first_true` jnp.argmax,
    each vmapped under jit; a value outside [0, 64) is refused."""
    from craftax.craftax.constants import SOLID_BLOCKS as FULL_SOLID
    from craftax.craftax_classic.constants import SOLID_BLOCKS

    ends = [2**31 - 1, -2**31, -2**31 + 5, 2**31 - 33]
    x = jnp.asarray(np.concatenate([np.arange(-300, 300), ends]), jnp.int32)
    for values in ([int(b) for b in SOLID_BLOCKS], [int(b) for b in FULL_SOLID], [0, 31, 32, 63],
                   [5]):
        got = jax.jit(jax.vmap(lambda v: one_of(v, values)))(x)
        np.testing.assert_array_equal(got, np.isin(np.asarray(x), values), err_msg=str(values))
    with pytest.raises(ValueError, match="one_of: 64 is outside"):
        one_of(x, [3, 64])
    masks = jnp.asarray(np.random.default_rng(3).random((64, 9)) < 0.15)
    masks = masks.at[0].set(False).at[1].set(True)
    np.testing.assert_array_equal(jax.jit(jax.vmap(any_of))(masks), masks.any(1))
    np.testing.assert_array_equal(jax.jit(jax.vmap(first_true))(masks), jnp.argmax(masks, 1))


def test_fence_gives_every_value_back_bit_for_bit():
    """`fence` (with `floats`: floats' bits too) returns its tree as it was: integers of 8 to 32
    bits at their extremes, bools, floats of 16 and 32 bits with NaN, -0 and infinities, an empty
    leaf, and maps (float and int) passed as they are."""
    rng = np.random.default_rng(5)
    floats = np.array([np.nan, -0.0, 0.0, np.inf, -np.inf, 1e-45, -3.5, 7e30], np.float32)
    tree = {"i": jnp.asarray(rng.integers(-2**31, 2**31 - 1, (3, 2)), jnp.int32),
            "u": jnp.asarray(rng.integers(0, 2**32 - 1, (5,)), jnp.uint32),
            "b": jnp.asarray(rng.random(4) < 0.5), "f": jnp.asarray(floats),
            "h": jnp.asarray([np.nan, -0.0, np.inf, 6e-8, -3.5, 6e4], jnp.float16),
            "map": jnp.arange(4096.0).reshape(64, 64), "s": jnp.int8(-7),
            "imap": jnp.asarray(rng.integers(-9, 9, (64, 64)), jnp.int32),
            "u8": jnp.asarray([0, 255, 7], jnp.uint8),
            "i16": jnp.asarray([-32768, 32767], jnp.int16),
            "u16": jnp.asarray([0, 65535, 40000], jnp.uint16),
            "a_empty": jnp.zeros((0,), jnp.int32)}  # (the first leaf: "a_" sorts first)

    def bits(x):
        width = {2: jnp.uint16, 4: jnp.uint32}.get(x.dtype.itemsize)
        return jax.lax.bitcast_convert_type(x, width) if x.dtype in (jnp.float16,
                                                                       jnp.float32) else x

    for floats_too in (False, True):
        got = jax.jit(jax.vmap(lambda t: fence(t, floats=floats_too)))(
            jax.tree.map(lambda x: jnp.stack([x, x]), tree))
        for k, x in tree.items():
            assert got[k].dtype == x.dtype, k
            np.testing.assert_array_equal(bits(got[k][1]), bits(x), err_msg=k)


def test_search_left_is_jnp_searchsorted():
    """The unrolled search gives jnp.searchsorted's index on sorted arrays, on arrays that go back
    (as a blocked float cumsum can), with NaN and -0."""
    rng = np.random.default_rng(1)
    arrays = [np.sort(rng.random(n)).astype(np.float32) for n in (1, 2, 5, 64, 4096)]
    arrays += [rng.random(n).astype(np.float32) for n in (2, 7, 100)]
    arrays += [np.array([0.0, -0.0, 0.0, np.nan], np.float32),
               np.cumsum((rng.random(4096) < 0.1) / 409.0).astype(np.float32)]
    f = jax.jit(jax.vmap(lambda a, q: search_left(lambda i: a[i], a.shape[0], q), (None, 0)))
    for a in arrays:
        queries = np.concatenate([a, rng.random(20), [0.0, -0.0, np.nan, np.inf, -1.0]])
        queries = jnp.asarray(queries, jnp.float32)
        np.testing.assert_array_equal(f(jnp.asarray(a), queries),
                                      jnp.searchsorted(jnp.asarray(a), queries))


def test_unrolled_keys_draw_as_raw_keys():
    """A raw key and its `keys.wrap`: the same splits, bits and the draws Craftax makes (uniform,
    randint, choice with p, permutation), and `unwrap` gives the raw key back."""
    assert fast_keys.UNROLLED is not None  # (this jax has the pieces)

    def draws(k):
        a, b = jax.random.split(k)
        return (fast_keys.unwrap(a) if a.dtype != jnp.uint32 else a,
                jax.random.uniform(b, (5,)), jax.random.randint(a, (3,), 0, 64),
                jax.random.choice(b, 9, (2,), p=jnp.arange(9.0) / 36),
                jax.random.permutation(a, 6), jax.random.bits(b, (4,)))

    raw = jax.random.split(jax.random.PRNGKey(11), 16)
    want = jax.jit(jax.vmap(draws))(raw)
    got = jax.jit(jax.vmap(lambda k: draws(fast_keys.wrap(k))))(raw)
    for w, g in zip(want, got):
        np.testing.assert_array_equal(w, g)
    back = jax.vmap(lambda k: fast_keys.unwrap(fast_keys.wrap(k)))(raw)
    np.testing.assert_array_equal(back, raw)


def test_running_sums_are_jnp_cumsum():
    """Every element, read one by one, equals jnp.cumsum's, and a search of it is
    jnp.searchsorted's: spawn probabilities (0 or 1 / count) and arbitrary floats, at the lengths
    that take the blocked form (256, 4,096 and 65,536 also its cheaper search) and one that does
    not."""
    rng = np.random.default_rng(4)
    for n in (4096, 256, 65536, 100):
        mask = rng.random((8, n)) < rng.random((8, 1))
        xs = np.concatenate([mask / np.maximum(mask.sum(-1, keepdims=True), 1),
                             rng.standard_normal((8, n))]).astype(np.float32)
        xs[-1, n // 3], xs[-2, n // 5], xs[-2, n // 2] = np.nan, np.inf, -np.inf
        idx = jnp.arange(n, dtype=jnp.uint32)
        got = jax.jit(jax.vmap(lambda x: jax.vmap(RunningSums(x).at)(idx)))(jnp.asarray(xs))
        sums = jnp.cumsum(jnp.asarray(xs), -1)
        np.testing.assert_array_equal(got, sums)
        # its search (cheaper reads where n / 16 is a power of 2): jnp.searchsorted's index on
        # the cumulative sum, for queries at every 7th element's value (ties) and between
        queries = jnp.concatenate([sums[:, ::7], sums[:, ::7] + 1e-4, sums[:, -1:] * 0.999,
                                   jnp.tile(jnp.asarray([np.nan, np.inf, -np.inf, 0.0, -0.0],
                                                        jnp.float32), (len(xs), 1))], -1)
        got = jax.jit(jax.vmap(lambda x, q: jax.vmap(RunningSums(x).search_left)(q)))(
            jnp.asarray(xs), queries)
        np.testing.assert_array_equal(got, jax.vmap(jnp.searchsorted)(sums, queries))


def test_choice_is_jax_random_choice():
    rng = np.random.default_rng(2)
    keys = jax.random.split(jax.random.PRNGKey(3), 64)
    for n, shape in ((2, ()), (64, (1,)), (4096, (1,))):
        p = jnp.asarray(rng.random(n) < 0.3, jnp.float32)
        p = p.at[0].set(1.0) / jnp.maximum(p.sum(), 1.0)
        a = jnp.arange(n)
        mine = jax.jit(jax.vmap(lambda k: choice(k, a, p, shape)))(keys)
        theirs = jax.jit(jax.vmap(lambda k: jax.random.choice(k, a, shape, p=p)))(keys)
        np.testing.assert_array_equal(mine, theirs)


def test_parity_report_names_the_earliest_difference():
    """The leaf that differed first, from int32 step counts as the jitted run returns them; on a
    tie, the state's field."""
    names = ["obs", "state.map", "state.player_position", "reward"]
    first = np.array([5, -1, 7, 3], np.int32)
    report = ParityReport(np.array([4, 0, 2, 1]), first, 10, 0, names)
    assert report.first() == "reward (first at step 3; 1 elements over the run)"
    # a tie: the state field, not the observation drawn from it
    report = ParityReport(np.array([4, 0, 2, 1]), np.array([3, -1, 3, 3], np.int32), 10, 0, names)
    assert report.first() == "state.player_position (first at step 3; 2 elements over the run)"
    assert ParityReport(np.zeros(4), np.full(4, -1, np.int32), 10, 0, names).first() is None


# --- the whole step -----------------------------------------------------------------------------

def test_fast_env_is_chosen_by_impl():
    from fused.envs import has_fast_step
    from fused.envspec import spec
    from fused.rl.envs import CraftaxEnv

    assert type(CraftaxEnv(spec(CLASSIC), impl="fast")._env).__name__ == "FastClassicSymbolic"
    assert "fused" not in type(CraftaxEnv(spec(CLASSIC))._env).__module__
    assert type(CraftaxEnv(spec(FULL), impl="fast")._env).__name__ == "FastSymbolic"
    assert has_fast_step(CLASSIC) and has_fast_step(FULL) and not has_fast_step("probe-constant")
    with pytest.raises(ValueError, match="impl"):
        make_craftax_env(CLASSIC, "fastest")


@pytest.mark.slow
def test_a_broken_rule_is_named(monkeypatch):
    """The player walks on water in the fast step (Craftax: water is solid): one step of each
    from a Craftax world with water put left of the player, who moves left; the first difference
    named is the player's position, and the observation drawn from it differs too. (One world,
    not a batch: a program that compiles faster.)"""
    def move_onto_water(state, action, blocks, mob_map):
        to = state.player_position + DIRECTIONS[action]
        wet = _in_bounds(to, blocks.base.shape) & (blocks.at(to) == BlockType.WATER.value)
        moved = move(state, action, blocks, mob_map)
        return moved.replace(player_position=jnp.where(wet, to, moved.player_position))

    monkeypatch.setattr(classic_step, "move", move_onto_water)
    ref, new = make_craftax_env(CLASSIC, "craftax"), make_craftax_env(CLASSIC, "fast")
    params, left = ref.default_params, Action.LEFT.value

    def both(key):
        k_reset, k_step = jax.random.split(key)
        _, state = ref.reset_env(k_reset, params)
        state = jax.tree.map(jnp.asarray, state)  # (the reset's Python scalars as arrays)
        to = state.player_position + DIRECTIONS[left]
        state = state.replace(map=state.map.at[to[0], to[1]].set(BlockType.WATER.value))
        return [(o.state, o.obs) for o in (
            outcome(env.step_env(k_step, state, left, params)) for env in (ref, new))]

    theirs, ours = jax.jit(both)(jax.random.PRNGKey(0))
    first = first_difference(theirs, ours, ["state." + n for n in leaf_names(theirs[0])]
                             + ["obs"])
    assert first is not None and first.startswith("state.player_position"), first
    assert first_difference(theirs[1], ours[1]) is not None


@pytest.mark.slow
def test_classic_step_equals_craftax(tmp_path, smoke_run):
    """The 10-million-transition command (bench/env_parity.py), shrunk: 64 envs x 100 steps of
    uniform play, then as many of DO-heavy play from states edited by hand, then of a trained
    run's policy (`--policy`: the session's smoke run), through resets. A policy trained on
    another game is refused in one line."""
    out = tmp_path / "parity.json"
    # (under the suite's XLA flags: at LLVM's O1, with or without XLA's fusion emitters, its
    # compile costs more CPU time than the faster run saves at this size)
    p = run_command([sys.executable, "bench/env_parity.py", "--transitions", "19200",
                     "--num-envs", "64", "--chunk-steps", "100", "--policy", str(smoke_run),
                     "--out", str(out)], cwd=ROOT,
                    env=subprocess_env(), capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    row = json.loads(out.read_text())
    assert row["equal"] and row["first_difference"] is None, row
    assert row["transitions"] == 19_200 and row["chunks"] == 3 and row["episode_ends"] > 0
    assert "(policy)" in p.stdout and row["policy"] == str(smoke_run), (p.stdout, row)
    assert row["checkpoint"] == 6, row  # the run's latest (6 updates)
    p = run_command([sys.executable, "bench/env_parity.py", "--env", "Craftax-Classic-Pixels-v1",
                     "--policy", str(smoke_run)], cwd=ROOT, env=subprocess_env(),
                    capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [
        f"error: --policy {smoke_run} was trained on Craftax-Classic-Symbolic-v1, not --env "
        "Craftax-Classic-Pixels-v1"], p.stderr[-2000:]


@pytest.mark.slow  # (the session's smoke run: trained for the slow tests)
def test_parity_policy_acts_with_the_runs_network(smoke_run, tmp_path):
    """`bench/env_parity.py --policy`'s actions are the run's actor's: a head biased hard
    towards one action plays that action everywhere, the run's own head plays several. A folder
    that is not a run is one line without load_policy's hint of `random` (label.py's)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from env_parity import Args, trained

    from fused.errors import ConfigError

    with pytest.raises(ConfigError, match="no config.json there; pass a run folder written by "
                                          "train.py or offline.py$"):
        trained(Args(policy=str(tmp_path)))

    act, params, source = trained(Args(policy=str(smoke_run), num_envs=64))
    assert source == {"policy": str(smoke_run), "checkpoint": 6}
    obs = jax.random.uniform(jax.random.PRNGKey(1), (64, 1345))
    draw = jax.jit(lambda p, k: act(p)(k, obs, None))
    assert len(np.unique(np.asarray(draw(params, jax.random.PRNGKey(2))))) > 1
    head = params["params"]["actor_mlp"]["head"]
    biased = jax.tree.map(lambda x: x, params)
    biased["params"]["actor_mlp"]["head"] = dict(head, bias=head["bias"].at[5].add(1e4))
    assert (np.asarray(draw(biased, jax.random.PRNGKey(2))) == 5).all()


def test_parity_command_refuses_bad_sizes_in_one_line(tmp_path):
    """`bench/env_parity.py` with no transitions, no envs, a chunk that is not a positive
    multiple of 25 or an --out it cannot write: one line naming the flag, before anything
    compiles."""
    sys.path.insert(0, str(ROOT / "bench"))
    from env_parity import Args, main

    for args, line in ((dict(transitions=0), "error: --transitions 0: at least 1"),
                       (dict(num_envs=-3), "error: --num-envs -3: at least 1"),
                       (dict(chunk_steps=0), "error: --chunk-steps 0: a positive multiple of 25"),
                       (dict(chunk_steps=13), "error: --chunk-steps 13: a positive multiple of 25")):
        with pytest.raises(SystemExit) as e:
            main(Args(**args))
        assert str(e.value) == line
    (tmp_path / "file").write_text("")  # --out under a file: no folder can be made there
    with pytest.raises(SystemExit, match=r"^error: --out .*file/parity.json: .* is not a folder$"):
        main(Args(out=str(tmp_path / "file" / "parity.json")))


@pytest.mark.slow
def test_classic_pixels_step_equals_craftax():
    """The pixel env: the fast step's state through Craftax's renderer. Bit for bit under the
    suite's XLA flags (LLVM's optimisation off); at XLA's default optimisation two copies of
    Craftax's own renderer in one program round differently (docs/BENCHMARKS.md)."""
    report = parity("Craftax-Classic-Pixels-v1", 4, 25, edit=classic_edit,
                    weights=CLASSIC_WEIGHTS)
    assert report.first() is None, report.first()


# --- the full game ------------------------------------------------------------------------------

@pytest.mark.slow
def test_full_game_parts_equal_craftax():
    """The full game's parts written for the compiler (the actions: `fused.envs.full_actions`;
    the mobs' and projectiles' moves, then the spawns: `fused.envs.full_mobs`; the plants, the
    inventory's achievements and the observation: `fused.envs.full_step`) against Craftax's
    functions, in Craftax's order, bit for bit, over 32 of Craftax's worlds edited by hand
    (`full_edit`: every kind of mob and projectile next to the player, on every floor, the
    boss's and its waves too), 16 rounds, each from the reference's last states edited anew (DO
    half the time, else another action). The rounds do what is rare in play: recipes, every
    block mined, chests looted, potions, books and spells, mobs struck and the necromancer hurt,
    blows and shots at the player, a sleeper woken, kills, tables broken, arrows fired, mobs
    spawned, plants ripened (a broken rule named: test_full_game_actions_equal_craftax; each
    part was seen to fail with a rule of its own broken)."""
    import fused.envs.full_actions as full_actions
    import fused.envs.full_mobs as full_mobs
    import fused.envs.full_step as full_step
    from craftax.craftax import game_logic
    from craftax.craftax.constants import Action
    from craftax.craftax.renderer import render_craftax_symbolic

    from fused.envs.curated import full_edit
    from fused.envs.parity import first_difference

    env = make_craftax_env(FULL, "craftax")
    params, static = env.default_params, env.static_env_params
    n = 32
    _, start = jax.jit(jax.vmap(lambda k: env.reset_env(k, params)))(
        jax.random.split(jax.random.PRNGKey(0), n))
    edit = jax.jit(jax.vmap(full_edit))

    # Craftax's order, each part with what it takes besides the state and action.
    PARTS = (("do_crafting", None), ("do_action", "both"), ("place_block", "static"),
             ("shoot_projectile", "static"), ("cast_spell", "static"), ("drink_potion", None),
             ("read_book", "key"), ("enchant", "key"))
    ACTS = [a.value for a in Action if a.name.startswith(
        ("MAKE_", "PLACE_", "SHOOT_", "CAST_", "DRINK_", "READ_", "ENCHANT_"))]

    def parts(acting, update_mobs, spawn_mobs, update_plants, inventory_achievements,
              observe):
        def run(key, state):
            k_parts, k_move, k_spawn, k_act, k_any = jax.random.split(key, 5)
            action = jax.random.choice(k_any, jnp.array(ACTS))
            action = jnp.where(jax.random.bernoulli(k_act, 0.5), Action.DO.value, action)
            for (name, extra), k in zip(PARTS, jax.random.split(k_parts, len(PARTS))):
                state = {None: lambda f: f(state, action),
                         "key": lambda f: f(k, state, action),
                         "both": lambda f: f(k, state, action, static),
                         "static": lambda f: f(state, action, static)}[extra](acting[name])
            done = state
            moved = update_mobs(k_move, done, params, static)
            state = spawn_mobs(moved, k_spawn, params, static)
            state = inventory_achievements(update_plants(state, static))
            return done, moved, state, observe(state)
        return jax.jit(jax.vmap(run))

    ref = parts({name: getattr(game_logic, name) for name, _ in PARTS},
                game_logic.update_mobs, game_logic.spawn_mobs, game_logic.update_plants,
                game_logic.calculate_inventory_achievements, render_craftax_symbolic)

    def rounds(count):
        new = parts({name: getattr(full_actions, name) for name, _ in PARTS},
                    full_mobs.update_mobs, full_mobs.spawn_mobs, full_step.update_plants,
                    full_step.calculate_inventory_achievements, full_step.observe)
        state, key = start, jax.random.PRNGKey(1)
        seen = dict.fromkeys((
            "crafted", "mined or placed", "shot or cast", "potion, book or enchantment",
            "looted", "struck", "necromancer", "hurt", "woken", "killed", "broken", "fired",
            "spawned", "ripened", "achieved", "boss"), 0)
        for _ in range(count):
            key, k_edit, k_mobs = jax.random.split(key, 3)
            before = edit(jax.random.split(k_edit, n), state)
            keys = jax.random.split(k_mobs, n)
            done, moved, state, obs = ref(keys, before)
            difference = first_difference((done, moved, state, obs), new(keys, before),
                                          ["done." + x for x in leaf_names(done)]
                                          + ["moved." + x for x in leaf_names(moved)]
                                          + leaf_names(state) + ["obs"])
            if difference:
                return difference, seen
            for event, count in (
                    ("crafted", (done.inventory.wood < before.inventory.wood)
                     | (done.inventory.arrows > before.inventory.arrows)),
                    ("mined or placed", (done.map != before.map).any((1, 2, 3))),
                    ("shot or cast", done.player_projectiles.mask.sum((1, 2))
                     > before.player_projectiles.mask.sum((1, 2))),
                    ("potion, book or enchantment",
                     (done.inventory.potions.sum(1) < before.inventory.potions.sum(1))
                     | (done.inventory.books < before.inventory.books)
                     | (done.player_mana < before.player_mana - 2)),
                    ("looted", (done.chests_opened != before.chests_opened).any(1)),
                    ("struck", (done.monsters_killed > before.monsters_killed).any(1)),
                    ("necromancer", done.boss_progress > before.boss_progress),
                    ("hurt", moved.player_health < done.player_health),
                    ("woken", done.is_sleeping & ~moved.is_sleeping),
                    ("killed", (moved.monsters_killed > done.monsters_killed).any(1)),
                    ("broken", (moved.map != done.map).any((1, 2, 3))),
                    ("fired", moved.mob_projectiles.mask.sum((1, 2))
                     > done.mob_projectiles.mask.sum((1, 2))),
                    ("spawned", sum(m.mask.sum((1, 2)) for m in (
                        state.melee_mobs, state.passive_mobs, state.ranged_mobs))
                     > sum(m.mask.sum((1, 2)) for m in (
                         moved.melee_mobs, moved.passive_mobs, moved.ranged_mobs))),
                    ("ripened", (state.map[:, 0] != moved.map[:, 0]).any((1, 2))),
                    ("achieved", (state.achievements != moved.achievements).any(1)),
                    ("boss", before.player_level == static.num_levels - 1)):
                seen[event] += int(count.sum())
        return None, seen

    difference, seen = rounds(16)
    assert difference is None, difference
    assert min(seen.values()) >= 3, seen


def test_full_step_calls_craftax_in_craftax_order(monkeypatch):
    """The full game's step is Craftax's `craftax_step` but for the parts it writes itself:
    with Craftax's own functions put back, its program (jaxpr) is Craftax's `craftax_step`'s,
    the same operations in the same order, keys and reward included (the parts' equality:
    test_full_game_parts_equal_craftax and test_full_game_actions_equal_craftax; the whole
    step's over millions of transitions: bench/env_parity.py)."""
    import fused.envs.full_step as full_step
    from craftax.craftax import game_logic

    env = make_craftax_env(FULL, "craftax")
    params, static = env.default_params, env.static_env_params
    _, state = jax.eval_shape(lambda k: env.reset_env(k, params), jax.random.PRNGKey(0))
    args = (jax.random.PRNGKey(1), state, jnp.int32(5))

    def program(step):
        return str(jax.make_jaxpr(lambda k, s, a: step(k, s, a, params, static))(*args))

    assert program(full_step.craftax_step) != program(game_logic.craftax_step)
    for name in ("do_crafting", "do_action", "place_block", "shoot_projectile", "cast_spell",
                 "drink_potion", "read_book", "enchant", "update_mobs", "spawn_mobs",
                 "update_plants", "calculate_inventory_achievements"):
        monkeypatch.setattr(full_step, name, getattr(game_logic, name))
    assert program(full_step.craftax_step) == program(game_logic.craftax_step)


def test_full_game_actions_equal_craftax(monkeypatch):
    """The actions besides DO (`fused.envs.full_actions`: crafting, placing, shooting, spells,
    potions, books, enchanting) against Craftax's functions, bit for bit, for 2,048 players
    each taking one of them, with an inventory drawn around the costs, tables, furnaces,
    enchantment tables, water, items and mobs around it or not (on the map's edge too), so
    that every action is done and refused. A broken rule (torches placed on water) is named."""
    import fused.envs.full_actions as full_actions
    from craftax.craftax import game_logic
    from craftax.craftax.constants import Action, BlockType as Full, ItemType

    from fused.envs.parity import differing

    env = make_craftax_env(FULL, "craftax")
    static = env.static_env_params
    _, shapes = jax.eval_shape(lambda k: env.reset_env(k, env.default_params),
                               jax.random.PRNGKey(0))
    blank = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    kinds = {name: [a for a in Action if a.name.startswith(prefix)] for name, prefix in (
        ("do_crafting", "MAKE_"), ("place_block", "PLACE_"), ("shoot_projectile", "SHOOT_"),
        ("cast_spell", "CAST_"), ("drink_potion", "DRINK_"), ("read_book", "READ_"),
        ("enchant", "ENCHANT_"))}
    levels, h, w = blank.map.shape
    ground = jnp.array([b.value for b in (Full.GRASS, Full.GRASS, Full.SAND, Full.PATH,
                                          Full.WATER, Full.LAVA, Full.STONE, Full.TREE,
                                          Full.CRAFTING_TABLE, Full.FURNACE,
                                          Full.CRAFTING_TABLE, Full.FURNACE,
                                          Full.ENCHANTMENT_TABLE_FIRE,
                                          Full.ENCHANTMENT_TABLE_ICE,
                                          Full.ENCHANTMENT_TABLE_FIRE,
                                          Full.ENCHANTMENT_TABLE_ICE)])

    def player(key):
        ks = jax.random.split(key, 20)
        level = jax.random.randint(ks[0], (), 0, levels)
        pos = jax.random.randint(ks[1], (2,), -1, h + 1).clip(0, h - 1)  # edges often
        inv = blank.inventory
        inv = inv.replace(**{k: jax.random.randint(kk, (), 0, 5) for k, kk in zip(
            ("wood", "stone", "coal", "iron", "diamond", "sapling", "ruby", "sapphire", "bow",
             "books"), jax.random.split(ks[3], 10))},
            potions=jax.random.randint(ks[12], (6,), 0, 2),
            pickaxe=jax.random.randint(ks[4], (), 0, 5), sword=jax.random.randint(ks[5], (), 0, 5),
            armour=jax.random.randint(ks[6], (4,), 0, 3),
            arrows=jax.random.randint(ks[7], (), 96, 100),
            torches=jax.random.randint(ks[7], (), 0, 3) + 97 * (pos[0] % 3 == 0))
        state = blank.replace(
            map=jax.random.choice(ks[2], ground, (levels, h, w)),
            item_map=jax.random.choice(ks[8], jnp.array([0, 0, 0, ItemType.TORCH.value]),
                                       (levels, h, w)),
            mob_map=jax.random.bernoulli(ks[9], 0.15, (levels, h, w)),
            light_map=jax.random.uniform(ks[10], (levels, h, w)) * 0.5,
            growing_plants_mask=jax.random.bernoulli(ks[11], 0.8, blank.growing_plants_mask.shape),
            player_level=level, player_position=pos, inventory=inv,
            player_direction=jax.random.randint(ks[4], (), 1, 5),
            player_mana=jax.random.randint(ks[13], (), 5, 12),
            learned_spells=jax.random.bernoulli(ks[14], 0.5, (2,)),
            potion_mapping=jax.random.permutation(ks[15], 6),
            armour_enchantments=jax.random.randint(ks[16], (4,), 0, 3),
            player_projectiles=blank.player_projectiles.replace(
                mask=jax.random.bernoulli(ks[17], 0.5, blank.player_projectiles.mask.shape)))
        acts = [a.value for group in kinds.values() for a in group]
        return state, jax.random.choice(key, jnp.array(acts))

    made = jax.jit(jax.vmap(player))

    def compare(name):
        def act(module, k, s, a):
            f = getattr(module, name)
            if name in ("read_book", "enchant"):
                return f(k, s, a)
            return f(s, a) if name in ("do_crafting", "drink_potion") else f(s, a, static)

        def run(keys, states, actions):  # -> (elements differing by leaf, whether it acted)
            ref = jax.vmap(lambda k, s, a: act(game_logic, k, s, a))(keys, states, actions)
            ours = jax.vmap(lambda k, s, a: act(full_actions, k, s, a))(keys, states, actions)
            acted = sum(jax.tree.leaves(jax.tree.map(
                lambda x, y: (x != y).reshape(x.shape[0], -1).any(1), ref, states))) > 0
            return differing(ref, ours), acted
        return jax.jit(run)

    programs = {name: compare(name) for name in kinds}
    done_by = {a.value: [] for group in kinds.values() for a in group}
    for chunk in range(2):  # (a state holds 9 floors of maps: 1,024 players at a time)
        states, actions = made(jax.random.split(jax.random.PRNGKey(chunk), 1024))
        keys = jax.random.split(jax.random.PRNGKey(100 + chunk), 1024)
        for name, program in programs.items():
            counts, done = program(keys, states, actions)
            wrong = [n for n, c in zip(leaf_names(states), np.asarray(counts)) if c]
            assert not wrong, f"{name} differs in {wrong}"
            for a in kinds[name]:
                done_by[a.value].append(np.asarray(done[actions == a.value]))
    for group in kinds.values():
        for a in group:
            done = np.concatenate(done_by[a.value])
            assert done.any() and not done.all(), a.name  # done and refused
    # A broken rule: torches placed on water too.
    monkeypatch.setattr(full_actions, "CAN_PLACE_ITEM_MAPPING",
                        full_actions.CAN_PLACE_ITEM_MAPPING.at[Full.WATER.value].set(True))
    counts, _ = compare("place_block")(keys, states, actions)
    wrong = [n for n, c in zip(leaf_names(states), np.asarray(counts)) if c]
    assert "item_map" in wrong and "inventory.torches" in wrong, wrong
