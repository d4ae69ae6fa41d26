"""An LLM that plays: one more `Policy` (`fused.rl.acting`) behind the shared acting step.

Each step, for every env at once, in one jitted function: the observation is rendered to tokens
on the device (`fused.text.render`), put in a conversation after the system turn (rules,
actions, examples: one prefix cache shared by every env) and the last `history` turns of the
episode (observation, reply), the LLM writes a reply (`llm_jax.decode.generate`), and the reply
is parsed into an action on the device (`fused.text.reply`); an unparsable reply takes NOOP and
is counted. The history is the policy's carry: it starts empty with each episode.

The conversation is Qwen3's chat template token for token (`fused.text.prompt.play_parts`;
tested against the template). Prompts are padded to the smallest of a few lengths that holds
the longest (each length compiled once), not to the worst case.
"""

from __future__ import annotations

import dataclasses
import logging
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fused.errors import ConfigError
from fused.envspec import spec
from fused.llm.config import ModelConfig, model_config
from fused.llm.encoder import coarse_buckets, load_llm_params
from fused.rl.acting import Policy, chosen
from fused.text.prompt import PlayParts, play_parts
from fused.text.render import Renderer, at_smallest_fit, make_renderer, render_tokens
from fused.text.reply import ReplyParser, make_parser, parse_replies
from llm_jax.config import Qwen3Config
from llm_jax.decode import Sampling, generate
from llm_jax.model import AttentionConfig, PrefixCache, prefill
from llm_jax.tokenizer import eos_ids, load_tokenizer

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PlayerSettings:
    """How the LLM plays (static: part of the compiled step)."""

    history: int = 2
    """Earlier turns of the episode (observation and reply) in each prompt."""
    max_new_tokens: int = 48
    """Tokens of a reply at most (a reply stops earlier at the end-of-turn token)."""
    temperature: float = 0.7
    """Sampling temperature of the replies (Qwen3's suggestion without thinking)."""
    top_k: int = 20
    """Sample among the k most likely tokens (0: all)."""
    top_p: float = 0.8
    """Nucleus sampling threshold (1: off)."""
    greedy: bool = False
    """Greedy replies (argmax); the sampling flags must then stay at their defaults."""
    thinking: bool = False
    """Let the model think (<think>...</think>) before answering; only the answer is parsed
    and kept in the history (needs a larger --max-new-tokens)."""

    @property
    def sampling(self) -> Sampling:
        return Sampling(0.0) if self.greedy else Sampling(self.temperature, self.top_k,
                                                          self.top_p)


SAMPLING_FLAGS = ("temperature", "top_k", "top_p")


def check_settings(s: PlayerSettings) -> None:
    """One line for settings that cannot work."""
    if s.history < 0:
        raise ConfigError(f"history={s.history} must be >= 0")
    if s.max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens={s.max_new_tokens} must be at least 1")
    if s.greedy:
        given = [f for f in SAMPLING_FLAGS
                 if getattr(s, f) != getattr(PlayerSettings(), f)]
        if given:
            raise ConfigError(f"--greedy with sampling flags ({', '.join('--' + f.replace('_', '-') for f in given)}): "
                              "greedy replies take no sampling settings; drop one or the other")
    from llm_jax.decode import GenerateError, check_sampling

    try:
        check_sampling(s.temperature, s.top_k, s.top_p)
    except GenerateError as e:
        raise ConfigError(str(e)) from None


class PlayerParams(NamedTuple):
    """The player's device arrays: what `Policy.forward` takes as params."""

    llm: Any  # Qwen3 params, every layer and the output head
    prefix: PrefixCache  # the system turn, every layer


class PlayerCarry(NamedTuple):
    """Per env: the episode's earlier turns (oldest first; empty turns have length 0) and what
    the last step did."""

    obs: jax.Array  # [N, H, Lo] int32: observation tokens of earlier turns
    obs_len: jax.Array  # [N, H]
    reply: jax.Array  # [N, H, M] int32: their answers (thinking and the stop token left out)
    reply_len: jax.Array  # [N, H]
    last_reply: jax.Array  # [N, M] the last step's whole reply (as generated)
    tokens: jax.Array  # [N] tokens generated at the last step
    invalid: jax.Array  # [N] bool: the last reply named no action


class Player(NamedTuple):
    """Host-side pieces (tables, shapes) of an LLM player for one env."""

    settings: PlayerSettings
    qcfg: Qwen3Config
    tokenizer: Any
    renderer: Renderer
    parts: PlayParts
    parser: ReplyParser
    stop_ids: tuple[int, ...]
    attn: AttentionConfig
    prompt_max: int  # tokens of the longest possible prompt after the prefix
    buckets: tuple[int, ...]  # padded prompt lengths compiled
    num_actions: int
    params: PlayerParams

    @property
    def policy(self) -> Policy:
        return player_policy(self)

    def text(self, tokens) -> str:
        """A reply's text (host)."""
        return self.tokenizer.decode([int(t) for t in tokens])


def prompt_budget(parts: PlayParts, max_obs: int, history: int, max_new: int) -> int:
    """The longest prompt after the prefix: `history` full turns and the current one."""
    turn = len(parts.user_open) + max_obs + len(parts.user_close)
    return history * (turn + max_new + len(parts.reply_close)) + turn + len(parts.think)


def make_player(model: ModelConfig, settings: PlayerSettings, env_name: str,
                seed: int = 0) -> Player:
    """Host setup: weights (or the random model), tokenizer, renderer, the conversation's pieces
    and the system turn prefilled. Problems are ConfigErrors before anything compiles."""
    check_settings(settings)
    s = spec(env_name)
    if not s.has_text:
        raise ConfigError(f"env {env_name!r} has no text renderer; the LLM plays Craftax envs")
    tok = load_tokenizer(model.weights)
    renderer = make_renderer(env_name, tok)
    parts = play_parts(tok, env_name, settings.thinking)
    qcfg = model_config(model)
    budget = prompt_budget(parts, renderer.max_tokens, settings.history,
                           settings.max_new_tokens)
    context = len(parts.prefix) + budget + settings.max_new_tokens
    if context > qcfg.max_position_embeddings:
        raise ConfigError(
            f"history={settings.history}: the system turn ({len(parts.prefix)} tokens), "
            f"{settings.history} earlier turns and the current one (up to {budget} tokens with "
            f"observations of up to {renderer.max_tokens}) and a reply of {settings.max_new_tokens}"
            f" need {context} tokens, past the model's context "
            f"({qcfg.max_position_embeddings}); lower --history or --max-new-tokens")
    params = load_llm_params(model, qcfg, seed)
    attn = AttentionConfig(model.attention)
    prefix = jax.jit(partial(prefill, cfg=qcfg, attn=attn))(
        params, prefix_tokens=jnp.asarray(parts.prefix))
    folder = None
    if model.weights is not None:
        from llm_jax.loader import resolve_folder

        folder = resolve_folder(model.weights)
    return Player(settings, qcfg, tok, renderer, parts, make_parser(tok, s.action_names),
                  eos_ids(folder, tok, qcfg.vocab_size), attn, budget, coarse_buckets(budget),
                  s.num_actions, PlayerParams(params, prefix))


def _put(buf, offset, piece, length):
    """Rows of buf [N, T] with piece [N, W] (its first `length` [N] tokens) written at offset
    [N]; the piece's padding lands where the next piece goes (or past the prompt)."""
    return jax.vmap(lambda b, o, p: jax.lax.dynamic_update_slice(b, p, (o,)))(
        buf, offset, piece), offset + length


def assemble(player: Player, carry: PlayerCarry, obs_tokens, obs_len):
    """Prompts after the prefix: the filled earlier turns, then the current observation.
    obs_tokens [N, Lo], obs_len [N] -> (tokens [N, prompt_max], lengths [N])."""
    p = player.parts
    n = obs_tokens.shape[0]
    widest = max(obs_tokens.shape[1], carry.reply.shape[2], *(x.size for x in p))
    width = player.prompt_max + widest  # room for the last piece's padding
    buf = jnp.zeros((n, width), jnp.int32)
    off = jnp.zeros(n, jnp.int32)

    def fixed(ids, on):
        return jnp.broadcast_to(jnp.asarray(ids), (n, ids.size)), jnp.where(on, ids.size, 0)

    for h in range(player.settings.history):
        on = carry.obs_len[:, h] > 0
        for piece, length in (fixed(p.user_open, on), (carry.obs[:, h], carry.obs_len[:, h]),
                              fixed(p.user_close, on), (carry.reply[:, h], carry.reply_len[:, h]),
                              fixed(p.reply_close, on)):
            buf, off = _put(buf, off, piece, length)
    on = jnp.ones(n, bool)
    for piece, length in (fixed(p.user_open, on), (obs_tokens, obs_len),
                          fixed(p.user_close, on), fixed(p.think, on)):
        if piece.shape[1]:
            buf, off = _put(buf, off, piece, length)
    return buf[:, :player.prompt_max], off


def answer(player: Player, reply, num):
    """The part of replies [N, M] kept in the history: after the last </think> (and the blank
    line the template puts there), without the stop token. Returns (tokens [N, M], lengths)."""
    m = reply.shape[1]
    pos = jnp.arange(m)[None]
    live = pos < num[:, None]
    stop = jnp.isin(reply, jnp.asarray(player.stop_ids, jnp.int32)) & live
    end = jnp.where(stop.any(1), jnp.argmax(stop, 1), num)
    start = jnp.zeros_like(num)
    if player.settings.thinking and player.parser.think_end >= 0:
        last = jnp.max(jnp.where(live & (reply == player.parser.think_end), pos, -1), axis=1)
        newline = jnp.asarray(player.tokenizer.encode("\n\n"), jnp.int32)[0]
        after = jnp.take_along_axis(reply, jnp.minimum(last + 1, m - 1)[:, None], 1)[:, 0]
        start = jnp.where(last >= 0, last + 1 + (after == newline), 0)
        end = jnp.maximum(end, start)
    idx = jnp.minimum(start[:, None] + pos, m - 1)
    kept = jnp.take_along_axis(reply, idx, 1)
    length = end - start
    return jnp.where(pos < length[:, None], kept, 0), length


def act(player: Player, params: PlayerParams, carry: PlayerCarry, obs, keys):
    """One step of N envs: (new carry, action [N], tokens generated [N], valid [N])."""
    s = player.settings
    obs_tokens, obs_len = render_tokens(player.renderer, obs)
    prompt, lengths = assemble(player, carry, obs_tokens, obs_len)

    def at(size):
        def run(tokens, lengths, keys):
            return generate(params.llm, player.qcfg, tokens[:, :size], lengths, None,
                            max_new_tokens=s.max_new_tokens, sampling=s.sampling,
                            stop_ids=player.stop_ids, prefix=params.prefix, attn=player.attn,
                            row_keys=keys)
        return run

    out = at_smallest_fit(player.buckets, lengths.max(), at, prompt, lengths, keys)
    reply, num = out.tokens, out.num_tokens
    ends = jnp.take_along_axis(reply, (num - 1)[:, None], 1)[:, 0]
    stopped = jnp.isin(ends, jnp.asarray(player.stop_ids, jnp.int32))
    action, valid = parse_replies(player.parser, reply, num - stopped)
    kept, kept_len = answer(player, reply, num)
    h = s.history
    if h:
        carry = carry._replace(
            obs=jnp.concatenate([carry.obs[:, 1:], obs_tokens[:, None]], 1),
            obs_len=jnp.concatenate([carry.obs_len[:, 1:], obs_len[:, None]], 1),
            reply=jnp.concatenate([carry.reply[:, 1:], kept[:, None]], 1),
            reply_len=jnp.concatenate([carry.reply_len[:, 1:], kept_len[:, None]], 1))
    return carry._replace(last_reply=reply, tokens=num, invalid=~valid), action, num, valid


def player_policy(player: Player) -> Policy:
    """The player as a `Policy`: carry = the episode's history, params = `PlayerParams`,
    x = the observation [N, D] (`Identity` input); no critic (values NaN)."""
    s = player.settings
    lo, m, h = player.renderer.max_tokens, s.max_new_tokens, s.history

    def carry(n):
        return PlayerCarry(jnp.zeros((n, h, lo), jnp.int32), jnp.zeros((n, h), jnp.int32),
                           jnp.zeros((n, h, m), jnp.int32), jnp.zeros((n, h), jnp.int32),
                           jnp.zeros((n, m), jnp.int32), jnp.zeros(n, jnp.int32),
                           jnp.zeros(n, bool))

    def forward(params, c, x, keys=None):
        c, action, _, _ = act(player, params, c, x, keys)
        logits = jnp.where(jnp.arange(player.num_actions)[None] == action[:, None], 0.0,
                           -jnp.inf)
        return c, logits, None

    def critic(params, c, x):
        return jnp.full((x.shape[0],), jnp.nan, jnp.float32)

    def stats(c):
        return {"tokens": c.tokens, "invalid": c.invalid.astype(jnp.int32)}

    return Policy(True, carry, forward, critic, None, chosen, stats)
