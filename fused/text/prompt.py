"""The prompt around an observation: system rules, worked examples, instruction, chat template.

Everything before the observation is the same for every env and step, so it is encoded once
into a prefix cache; the device renders only the observation and appends the fixed tail
(instruction + the template's generation prompt). `prompt_parts` returns those three pieces as
token ids; tests check `prefix + observation + tail == tokenizer.encode(full prompt)`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fused.envspec import spec, text_env

SLOT = "\x00OBSERVATION\x00"  # never produced by the renderer or the template

SYSTEM = """You are an expert player of {game}, a 2D open-world survival game on a grid, seen from above.

Rules: collect resources, craft tools, survive and unlock achievements. Health falls when food, drink or energy run out, and when mobs hit you; it recovers slowly while they are kept up. Drink water, eat cows or plants, sleep when energy is low (at night, ideally enclosed by blocks). Trees give wood; a crafting table (wood) enables wooden tools; a pickaxe mines stone, stone mines coal and iron, iron needs a furnace (stone) near a table, diamonds need an iron pickaxe. Zombies and skeletons attack; lava kills at once.{extra}

Observation format: "Map (interesting tiles only):" lists tiles as "row, col:tile" relative to you at 0, 0. Rows grow downwards (negative rows are up/north), columns grow to the right (negative columns are left/west). Rows run from -{rmax} to {rmax}, columns from -{cmax} to {cmax}. A tile reads "[mob on ][item on ]block"; "darkness" is a tile you cannot see. Plain ground ({background}) is left out unless something stands on it. The "Inventory:" line lists items, vitals (Health, Food, Drink, Energy out of 9), the direction you face and the light level (1 = day, 0 = night).

Actions (id:NAME): {actions}"""

EXTRA_FLOORS = (" The world has 9 floors reached by ladders; a floor's ladder opens after 8 of its"
              " monsters are killed. Deeper floors hold sapphires, rubies, enchantment tables,"
              " potions and stronger monsters; the necromancer waits on the last floor.")

EXAMPLES = {
    "Craftax-Classic-Symbolic-v1": [
        ("Map (interesting tiles only): -3, 2:tree, -1, -4:water, 0, 1:tree, 2, 3:cow on grass\n\n"
         "Inventory: Wood:0, Stone:0, Coal:0, Iron:0, Diamond:0, Sapling:0, Wood Pickaxe:0, "
         "Stone Pickaxe:0, Iron Pickaxe:0, Wood Sword:0, Stone Sword:0, Iron Sword:0, Health:9, "
         "Food:9, Drink:8, Energy:9, Direction:right, Light:1.000, Is Sleeping:False",
         "A tree is directly to my right (0, 1) and I face right, so I can collect wood now. "
         "Action: 5:DO"),
        ("Map (interesting tiles only): -4, -4:zombie on grass, 1, 0:stone, 1, 1:stone, "
         "2, 0:crafting_table\n\n"
         "Inventory: Wood:3, Stone:0, Coal:0, Iron:0, Diamond:0, Sapling:1, Wood Pickaxe:1, "
         "Stone Pickaxe:0, Iron Pickaxe:0, Wood Sword:0, Stone Sword:0, Iron Sword:0, Health:7, "
         "Food:6, Drink:5, Energy:8, Direction:down, Light:0.412, Is Sleeping:False",
         "Stone is just below me (1, 0) and I face down with a wood pickaxe, so I mine it; the "
         "zombie is still far away. Action: 5:DO"),
    ],
    "Craftax-Symbolic-v1": [
        ("Map (interesting tiles only): -2, 3:tree, 0, -1:water, 1, 4:cow on grass\n\n"
         "Inventory: Wood:0, Stone:0, Coal:0, Iron:0, Diamond:0, Sapphire:0, Ruby:0, Sapling:0, "
         "Torch:0, Arrow:0, Book:0, Pickaxe:0, Sword:0, Sword Enchantment:0, Bow Enchantment:0, "
         "Bow:0, Red Potion:0, Green Potion:0, Blue Potion:0, Pink Potion:0, Cyan Potion:0, "
         "Yellow Potion:0, Health:9.0, Food:8, Drink:4, Energy:9, Mana:9, XP:0, Dexterity:1, "
         "Strength:1, Intelligence:1, Direction:left, Helmet Armour:0, Chestplate Armour:0, "
         "Leggings Armour:0, Boots Armour:0, Helmet Enchantment:0, Chestplate Enchantment:0, "
         "Leggings Enchantment:0, Boots Enchantment:0, Light:0.954, Is Sleeping:False, "
         "Is Resting:False, Learned Fireball:False, Learned Iceball:False, Floor:0, "
         "Ladder Open:True, Is Boss Vulnerable:False",
         "Drink is low and water is directly to my left (0, -1), which I face, so I drink. "
         "Action: 5:DO"),
        ("Map (interesting tiles only): -1, 0:zombie on path, 0, 2:ladder_down on path, "
         "3, -5:darkness, 3, -4:darkness\n\n"
         "Inventory: Wood:4, Stone:12, Coal:2, Iron:1, Diamond:0, Sapphire:0, Ruby:0, Sapling:0, "
         "Torch:3, Arrow:0, Book:0, Pickaxe:2, Sword:2, Sword Enchantment:0, Bow Enchantment:0, "
         "Bow:0, Red Potion:0, Green Potion:0, Blue Potion:0, Pink Potion:0, Cyan Potion:0, "
         "Yellow Potion:0, Health:5.3, Food:6, Drink:7, Energy:6, Mana:8, XP:0, Dexterity:1, "
         "Strength:1, Intelligence:1, Direction:up, Helmet Armour:0, Chestplate Armour:0, "
         "Leggings Armour:0, Boots Armour:0, Helmet Enchantment:0, Chestplate Enchantment:0, "
         "Leggings Enchantment:0, Boots Enchantment:0, Light:0.998, Is Sleeping:False, "
         "Is Resting:False, Learned Fireball:False, Learned Iceball:False, Floor:1, "
         "Ladder Open:False, Is Boss Vulnerable:False",
         "A zombie is directly above me (-1, 0) and I face up with a stone sword: attack it, it "
         "also counts towards opening the ladder. Action: 5:DO"),
    ],
}
INSTRUCTION = ("Think about what matters most in this situation, then name the single best next "
               "action.")


IMAGINE_INSTRUCTION = ("Imagine how the next few steps could go from here: what you would do, "
                       "what would happen, and why.")


def user_message(env_name: str, observation: str, instruction: str = INSTRUCTION) -> str:
    env_name = text_env(env_name) or env_name
    examples = "\n\n".join(f"Example {i + 1}:\n{obs}\nAnswer: {answer}"
                           for i, (obs, answer) in enumerate(EXAMPLES[env_name]))
    return f"{examples}\n\nCurrent observation:\n{observation}\n\n{instruction}"


def prompt_messages(env_name: str, observation: str,
                    instruction: str = INSTRUCTION) -> list[dict]:
    """The prompt's conversation; a pixel env's is its text twin's (an LLM reads text)."""
    env_name = text_env(env_name) or env_name
    s = spec(env_name)
    layout = s.layout
    system = SYSTEM.format(
        game=s.title, extra=EXTRA_FLOORS if s.floors > 1 else "",
        rmax=layout.rows // 2, cmax=layout.cols // 2, background=", ".join(layout.background),
        actions=", ".join(s.action_names))
    return [{"role": "system", "content": system},
            {"role": "user", "content": user_message(env_name, observation, instruction)}]


def full_prompt(tokenizer, env_name: str, observation: str, instruction: str = INSTRUCTION,
                thinking: bool = False) -> str:
    """The whole prompt text for one observation (thinking off: the template closes an empty
    <think></think> block, so the last token ends the prompt the model would answer from)."""
    return tokenizer.apply_chat_template(prompt_messages(env_name, observation, instruction),
                                         add_generation_prompt=True, enable_thinking=thinking)


class PromptParts(NamedTuple):
    prefix: np.ndarray  # [P] int32, everything before the observation
    tail: np.ndarray  # [K] int32, everything after it
    prefix_text: str
    tail_text: str


def prompt_parts(tokenizer, env_name: str, instruction: str = INSTRUCTION,
                 thinking: bool = False) -> PromptParts:
    text = full_prompt(tokenizer, env_name, SLOT, instruction, thinking)
    prefix, tail = text.split(SLOT)
    return PromptParts(np.array(tokenizer.encode(prefix), np.int32),
                       np.array(tokenizer.encode(tail), np.int32), prefix, tail)


def garbage_prefix(parts: PromptParts, tokenizer, seed: int = 0) -> np.ndarray:
    """The `garbage-prompt` ablation: the prefix's ordinary tokens shuffled in place (same length
    and token statistics, no meaning); the chat template's special tokens stay where they are."""
    special = {tokenizer.tokenizer.token_to_id(t) for t in ("<|im_start|>", "<|im_end|>")}
    ids = parts.prefix.copy()
    movable = np.array([i for i, t in enumerate(ids) if int(t) not in special])
    ids[movable] = ids[np.random.default_rng(seed).permutation(movable)]
    return ids


# --- Playing: the LLM chooses the action itself (`play.py llm`) ---------------------------------

PLAY_INSTRUCTION = ("Choose the single best next action. Answer with at most one short sentence "
                    "of reasoning, then the action as `Action: <id>:<NAME>`.")
REPLY = "\x00REPLY\x00"


def play_system(env_name: str) -> str:
    """The system turn of the player's conversation: the rules, the observation format, the
    actions, and the worked examples with their answers."""
    env_name = text_env(env_name) or env_name
    system = prompt_messages(env_name, "")[0]["content"]
    examples = "\n\n".join(f"Example {i + 1}:\n{obs}\nAnswer: {answer}"
                           for i, (obs, answer) in enumerate(EXAMPLES[env_name]))
    return f"{system}\n\n{examples}"


def shot_reply(action: str) -> str:
    """A few-shot turn's answer for an action taken (`id:NAME`), as the player is asked to
    answer."""
    return f"Action: {action}"


def play_messages(env_name: str, turns: list[tuple[str, str]], observation: str,
                  shots: tuple[tuple[str, str], ...] = ()) -> list[dict]:
    """The conversation the player answers: `shots` (observation, reply) turns of golden
    examples, earlier (observation, reply) turns of the episode, then the current observation,
    each observation followed by the instruction."""
    msgs = [{"role": "system", "content": play_system(env_name)}]
    for obs, reply in (*shots, *turns):
        msgs += [{"role": "user", "content": f"{obs}\n\n{PLAY_INSTRUCTION}"},
                 {"role": "assistant", "content": reply}]
    return msgs + [{"role": "user", "content": f"{observation}\n\n{PLAY_INSTRUCTION}"}]


class PlayParts(NamedTuple):
    """Token ids of the fixed pieces of the player's conversation, cut from the official chat
    template, so that prefix + (user_open + obs + user_close + reply + reply_close) per earlier
    turn + user_open + obs + user_close + think is the template's text, token for token."""

    prefix: np.ndarray  # [P] the system turn and the few-shot turns (one prefix cache)
    user_open: np.ndarray  # "<|im_start|>user\n"
    user_close: np.ndarray  # "\n\n<instruction><|im_end|>\n<|im_start|>assistant\n"
    think: np.ndarray  # thinking off: the empty "<think>\n\n</think>\n\n"; on: nothing
    reply_close: np.ndarray  # "<|im_end|>\n"


def play_parts(tokenizer, env_name: str, thinking: bool,
               shots: tuple[tuple[str, str], ...] = ()) -> PlayParts:
    text = tokenizer.apply_chat_template(play_messages(env_name, [(SLOT, REPLY)], SLOT, shots),
                                         add_generation_prompt=True, enable_thinking=thinking)
    head, user_close, between, last = text.replace(REPLY, SLOT).split(SLOT)
    user_open = "<|im_start|>user\n"
    if not (head.endswith(user_open) and between.endswith(user_open)
            and last.startswith(user_close)):
        raise ValueError("the chat template does not lay turns out as Qwen3's does")
    enc = lambda s: np.array(tokenizer.encode(s), np.int32)  # noqa: E731
    return PlayParts(enc(head[:-len(user_open)]), enc(user_open), enc(user_close),
                     enc(last[len(user_close):]), enc(between[:-len(user_open)]))
