"""Text format goldens (hand-written expected text on hand-built observations), the device
renderer's exact token equality with `tokenizer.encode(reference text)` on those and on thousands
of real rollout states, and the prompt split into cached prefix + observation + tail."""

import jax
import numpy as np
import pytest

from fused.envspec import BLOCKS_FULL, ITEMS_FULL, MOBS_FULL
from fused.rl.envs import rollout_observations
from fused.text.format import get_layout, render_text
from fused.text.prompt import full_prompt, prompt_parts
from fused.text.buckets import PACK_SIZES
from fused.text.render import make_renderer, render_tokens
from llm_jax.tokenizer import load_tokenizer

FULL = "Craftax-Symbolic-v1"
CLASSIC = "Craftax-Classic-Symbolic-v1"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


@pytest.fixture(scope="module")
def renderers(tok):
    return {env: make_renderer(env, tok) for env in (FULL, CLASSIC)}


def full_obs(cells=None, default="grass", **aux):
    """A Craftax-Symbolic observation built by hand: every cell lit `default` unless `cells`
    maps (r, c) (player-relative) to dict(block=, item=, mob=, lit=)."""
    lay = get_layout(FULL)
    grid = np.zeros((9, 11, 83), np.float32)
    for r in range(9):
        for c in range(11):
            spec = {"block": default, **(cells or {}).get((r - 4, c - 5), {})}
            if not spec.get("lit", True):
                continue  # the env zeroes every channel of an unlit tile, light included
            grid[r, c, BLOCKS_FULL.index(spec["block"])] = 1
            grid[r, c, 37 + ITEMS_FULL.index(spec.get("item", "none"))] = 1
            if "mob" in spec:
                grid[r, c, 42 + MOBS_FULL.index(spec["mob"])] = 1
            grid[r, c, 82] = 1
    a = np.zeros(51, np.float32)
    a[0] = np.sqrt(aux.get("wood", 0)) / 10  # scaled as craftax's render_craftax_symbolic does
    a[1] = np.sqrt(aux.get("stone", 0)) / 10
    a[11] = aux.get("pickaxe", 0) / 4
    a[22] = np.float32(aux.get("health", 9.0)) / 10
    a[23:31] = np.array([9, 9, 9, 9, 0, 1, 1, 1], np.float32) / 10
    a[31 + aux.get("direction", 0)] = 1
    a[43] = aux.get("light", 1.0)
    a[49] = 1  # ladder open
    assert grid.size + a.size == lay.obs_dim
    return np.concatenate([grid.reshape(-1), a])


INVENTORY_DEFAULT = (
    "Inventory: Wood:0, Stone:0, Coal:0, Iron:0, Diamond:0, Sapphire:0, Ruby:0, Sapling:0, "
    "Torch:0, Arrow:0, Book:0, Pickaxe:0, Sword:0, Sword Enchantment:0, Bow Enchantment:0, Bow:0, "
    "Red Potion:0, Green Potion:0, Blue Potion:0, Pink Potion:0, Cyan Potion:0, Yellow Potion:0, "
    "Health:9.0, Food:9, Drink:9, Energy:9, Mana:9, XP:0, Dexterity:1, Strength:1, "
    "Intelligence:1, Direction:left, Helmet Armour:0, Chestplate Armour:0, Leggings Armour:0, "
    "Boots Armour:0, Helmet Enchantment:0, Chestplate Enchantment:0, Leggings Enchantment:0, "
    "Boots Enchantment:0, Light:1.000, Is Sleeping:False, Is Resting:False, "
    "Learned Fireball:False, Learned Iceball:False, Floor:0, Ladder Open:True, "
    "Is Boss Vulnerable:False")

GOLDEN = {
    "all_background": (
        full_obs(),
        "Map: [No interesting tiles in view - all background]\n\n" + INVENTORY_DEFAULT),
    "background_kinds_dropped": (
        full_obs({(-4, -5): {"block": "sand"}, (0, 1): {"block": "gravel"},
                  (2, 2): {"block": "fire_grass"}, (4, 5): {"block": "ice_grass"}}),
        "Map: [No interesting tiles in view - all background]\n\n" + INVENTORY_DEFAULT),
    "darkness_and_stacks": (
        full_obs({(-4, -5): {"lit": False}, (-4, -4): {"lit": False, "mob": "zombie"},
                  (0, 1): {"block": "tree"}, (1, 2): {"block": "path", "item": "ladder_down",
                                                      "mob": "zombie"},
                  (2, -3): {"item": "torch"}, (3, 0): {"mob": "cow"},
                  (4, 5): {"block": "crafting_table", "mob": "player_fireball"}}),
        "Map (interesting tiles only): -4, -5:darkness, -4, -4:darkness, 0, 1:tree, "
        "1, 2:zombie on ladder_down on path, 2, -3:torch on grass, 3, 0:cow on grass, "
        "4, 5:player_fireball on crafting_table\n\n" + INVENTORY_DEFAULT),
    "inventory_values": (
        full_obs({(0, 0): {"block": "stone"}}, wood=8, stone=17, pickaxe=2, health=5.3,
                 direction=2, light=0.131),
        "Map (interesting tiles only): 0, 0:stone\n\n" + INVENTORY_DEFAULT
        .replace("Wood:0, Stone:0", "Wood:8, Stone:17").replace("Pickaxe:0", "Pickaxe:2")
        .replace("Health:9.0", "Health:5.3").replace("Direction:left", "Direction:up")
        .replace("Light:1.000", "Light:0.131")),
}


@pytest.mark.parametrize("name", list(GOLDEN))
def test_golden_text(name, tok, renderers):
    obs, want = GOLDEN[name]
    assert render_text(get_layout(FULL), obs) == want
    tokens, lengths = jax.jit(lambda o: render_tokens(renderers[FULL], o))(obs[None])
    assert np.asarray(tokens)[0, :int(lengths[0])].tolist() == tok.encode(want)


def test_every_block_type(tok, renderers):
    """All 37 blocks in one view, row-major from the top-left; background ones dropped."""
    cells, expected = {}, []
    for i, block in enumerate(BLOCKS_FULL):
        r, c = divmod(i, 11)
        cells[(r - 4, c - 5)] = {"block": block}
        if block not in ("grass", "sand", "gravel", "fire_grass", "ice_grass"):
            expected.append(f"{r - 4}, {c - 5}:{block}")
    obs = full_obs(cells, default="sand")
    text = render_text(get_layout(FULL), obs)
    assert text.split("\n")[0] == "Map (interesting tiles only): " + ", ".join(expected)
    assert text.startswith("Map (interesting tiles only): -4, -5:invalid, -4, -4:out_of_bounds, "
                           "-4, -2:water, -4, -1:stone, -4, 0:tree")
    assert len(expected) == 32
    tokens, lengths = jax.jit(lambda o: render_tokens(renderers[FULL], o))(obs[None])
    assert np.asarray(tokens)[0, :int(lengths[0])].tolist() == tok.encode(text)
    assert int(lengths[0]) <= renderers[FULL].max_tokens


def test_worst_case_fits_l_max(tok, renderers):
    """Every tile lit and interesting with the longest names: within the documented bound."""
    cells = {(r, c): {"block": "enchantment_table_fire", "item": "ladder_down_blocked",
                      "mob": "player_slimeball"} for r in range(-4, 5) for c in range(-5, 6)}
    obs = full_obs(cells, wood=99, health=10.0, light=0.999)
    text = render_text(get_layout(FULL), obs)
    tokens, lengths = jax.jit(lambda o: render_tokens(renderers[FULL], o))(obs[None])
    assert np.asarray(tokens)[0, :int(lengths[0])].tolist() == tok.encode(text)
    assert int(lengths[0]) <= renderers[FULL].max_tokens
    assert int(lengths[0]) > max(PACK_SIZES)  # packed at L_max, not a smaller width


def test_packing_width_does_not_change_tokens(tok, renderers):
    """A short observation alone is packed below L_max, next to the worst case at
    L_max: the same tokens and padding either way, each equal to the reference."""
    short = full_obs({(0, 1): {"block": "tree"}})
    worst = full_obs({(r, c): {"block": "enchantment_table_fire", "item": "ladder_down_blocked",
                               "mob": "player_slimeball"}
                      for r in range(-4, 5) for c in range(-5, 6)})
    f = jax.jit(lambda o: render_tokens(renderers[FULL], o))
    alone, n_alone = (np.asarray(x) for x in f(short[None]))
    both, n_both = (np.asarray(x) for x in f(np.stack([short, worst])))
    assert int(n_alone[0]) <= max(PACK_SIZES)  # packed below L_max
    np.testing.assert_array_equal(alone[0], both[0])
    assert n_alone[0] == n_both[0]
    assert alone[0, :n_alone[0]].tolist() == tok.encode(render_text(get_layout(FULL), short))
    assert both[1, :n_both[1]].tolist() == tok.encode(render_text(get_layout(FULL), worst))


def assert_rollout_states_match(env, renderer, tok, n, seed):
    obs = rollout_observations(env, n, seed, 16)
    tokens, lengths = jax.jit(lambda o: render_tokens(renderer, o))(obs)
    tokens, lengths = np.asarray(tokens), np.asarray(lengths)
    layout = get_layout(env)
    texts = [render_text(layout, o) for o in obs]
    for i, text in enumerate(texts):
        assert tokens[i, :lengths[i]].tolist() == tok.encode(text), text
    return texts


@pytest.mark.slow
def test_device_renderer_classic_rollouts(tok, renderers):
    texts = assert_rollout_states_match(CLASSIC, renderers[CLASSIC], tok, 3000, 0)
    assert any(" on grass" in t for t in texts)  # mobs were seen


@pytest.mark.slow
def test_device_renderer_symbolic_rollouts(tok, renderers):
    texts = assert_rollout_states_match(FULL, renderers[FULL], tok, 3000, 7)
    assert any("darkness" in t for t in texts) and any("Floor:0" in t for t in texts)


def test_prompt_splits_into_prefix_observation_tail(tok, renderers):
    for env in (FULL, CLASSIC):
        parts = prompt_parts(tok, env)
        obs = GOLDEN["darkness_and_stacks"][0] if env == FULL else rollout_like_classic()
        text = render_text(get_layout(env), obs)
        whole = tok.encode(full_prompt(tok, env, text))
        tokens, n = jax.jit(lambda o: render_tokens(renderers[env], o))(obs[None])
        assert whole == (parts.prefix.tolist() + np.asarray(tokens)[0, :int(n[0])].tolist()
                         + parts.tail.tolist())
        assert "Current observation:" in parts.prefix_text and "<|im_start|>system" in parts.prefix_text
        assert parts.tail_text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def rollout_like_classic():
    """A hand-built Classic observation: a zombie on grass at (1, -2), water at (0, 1)."""
    lay = get_layout(CLASSIC)
    grid = np.zeros((7, 9, 21), np.float32)
    grid[..., 2] = 1  # grass
    grid[3, 5, 2], grid[3, 5, 3] = 0, 1  # (0, 1) water
    grid[4, 2, 17] = 1  # zombie at (1, -2)
    aux = np.zeros(22, np.float32)
    aux[12:16] = 0.9
    aux[17] = 1  # facing right
    aux[20] = 0.5
    obs = np.concatenate([grid.reshape(-1), aux])
    assert render_text(lay, obs).startswith(
        "Map (interesting tiles only): 0, 1:water, 1, -2:zombie on grass\n\nInventory: Wood:0")
    return obs
