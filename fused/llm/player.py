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

from fused.errors import ConfigError
from fused.envspec import spec, text_env
from fused.llm.config import ModelConfig, model_config, sampling_of, tokenizer_of
from fused.llm.weights import load_llm_params
from fused.rl.acting import Policy, chosen
from fused.text.buckets import at_smallest_fit, coarse_buckets
from fused.text.prompt import PlayParts, play_parts
from fused.text.render import Renderer, make_renderer, render_tokens
from fused.text.reply import ReplyParser, make_parser, parse_replies
from llm_jax.config import Qwen3Config
from llm_jax.decode import GenerateSpec, generate
from llm_jax.memory import generation_need
from llm_jax.model import AttentionConfig, PrefixCache, prefill
from llm_jax.sampling import GenerateError, Resolved, SamplingFlags, check_flags
from llm_jax.tokenizer import stop_ids
from llm_jax.weights import Weights

log = logging.getLogger(__name__)


# A thought rarely closes within fewer tokens (Qwen3's own guidance is thousands).
THINKING_BUDGET = 512


@dataclasses.dataclass(frozen=True)
class PlayerSettings(SamplingFlags):
    """How the LLM plays (static: part of the compiled step). Sampling: the checkpoint's
    generation_config.json unless a flag says otherwise (as HF and vLLM do); greedy where it
    has none (the random models)."""

    history: int = 2
    """Earlier turns of the episode (observation and reply) in each prompt."""
    max_new_tokens: int = 48
    """Tokens of a reply at most (a reply stops earlier at the end-of-turn token)."""
    thinking: bool = False
    """Let the model think (<think>...</think>) before answering; only the answer is parsed
    and kept in the history. A reply cut before </think> is invalid (NOOP) and counted in
    eval.json's `unfinished_thought_rate`: give --max-new-tokens room (>= 512)."""


def check_settings(s: PlayerSettings) -> None:
    """One line for settings that cannot work."""
    if s.history < 0:
        raise ConfigError(f"--history {s.history} must be >= 0")
    if s.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens {s.max_new_tokens} must be at least 1")
    try:
        check_flags(s)
    except GenerateError as e:
        raise ConfigError(str(e)) from None


class PlayerParams(NamedTuple):
    """The player's device arrays: what `Policy.forward` takes as params."""

    llm: Weights  # every layer (per layer) and the output head
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
    unfinished: jax.Array  # [N] bool: the last reply's thought was cut (thinking on)


class Player(NamedTuple):
    """Host-side pieces (tables, shapes) of an LLM player for one env."""

    settings: PlayerSettings
    sampling: Resolved  # the sampling used and where its values came from
    dtype: str  # the compute dtype
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

    @property
    def generate_spec(self) -> GenerateSpec:
        """What each step's reply generation does (`llm_jax.decode.generate`)."""
        return GenerateSpec(max_new_tokens=self.settings.max_new_tokens,
                            pad_id=self.tokenizer.pad_id, sampling=self.sampling.sampling,
                            stop_ids=self.stop_ids, attn=self.attn)

    def text(self, tokens) -> str:
        """A reply's text without special tokens (host)."""
        return self.tokenizer.decode(tokens)


def prompt_budget(parts: PlayParts, max_obs: int, history: int, max_new: int) -> int:
    """The longest prompt after the prefix: `history` full turns and the current one."""
    turn = len(parts.user_open) + max_obs + len(parts.user_close)
    return history * (turn + max_new + len(parts.reply_close)) + turn + len(parts.think)


def make_player(model: ModelConfig, settings: PlayerSettings, env_name: str, rows: int,
                seed: int = 0, shots: tuple[tuple[str, str], ...] = ()) -> Player:
    """Host setup for `rows` envs at once: weights (or the random model), tokenizer, renderer,
    the conversation's pieces and the system turn prefilled, with `shots` (observation text,
    reply) as few-shot turns after it (in the prefix: encoded once). Problems, memory among them (the
    weights, every row's KV cache, the prompt pass), are ConfigErrors before anything compiles."""
    check_settings(settings)
    s = spec(env_name)
    if text_env(env_name) is None:
        raise ConfigError(f"env {env_name!r} has no text renderer; the LLM plays Craftax envs")
    tok = tokenizer_of(model.weights)
    renderer = make_renderer(env_name, tok)
    parts = play_parts(tok, env_name, settings.thinking, shots)
    qcfg = model_config(model)
    budget = prompt_budget(parts, renderer.max_tokens, settings.history,
                           settings.max_new_tokens)
    context = len(parts.prefix) + budget + settings.max_new_tokens
    if context > qcfg.max_position_embeddings:
        raise ConfigError(
            f"--history {settings.history}: the system turn"
            f"{f' and {len(shots)} shots' if shots else ''} ({len(parts.prefix)} tokens), "
            f"{settings.history} earlier turns and the current one (up to {budget} tokens with "
            f"observations of up to {renderer.max_tokens}) and a reply of {settings.max_new_tokens}"
            f" need {context} tokens, past the model's context "
            f"({qcfg.max_position_embeddings}); lower --history or --max-new-tokens"
            + (" or --shots" if shots else ""))
    sampling = sampling_of(settings, model)
    dtype = model.compute_dtype
    if settings.thinking and settings.max_new_tokens < THINKING_BUDGET:
        log.info(f"warning: --thinking with --max-new-tokens {settings.max_new_tokens}: most "
                 f"thoughts need more (>= {THINKING_BUDGET}); replies cut before </think> are "
                 "invalid (NOOP), counted in unfinished_thought_rate")
    need = generation_need(qcfg, dtype, None, rows, max(coarse_buckets(budget)),
                           settings.max_new_tokens, len(parts.prefix))
    try:
        params = load_llm_params(model, qcfg, need, generates=True, seed=seed)
    except ConfigError as e:
        raise ConfigError(f"{e}; or fewer --episodes, a shorter --history or --max-new-tokens"
                          ) from None
    attn = AttentionConfig(model.attention)
    prefix = jax.jit(partial(prefill, cfg=qcfg, attn=attn))(
        params, prefix_tokens=jnp.asarray(parts.prefix))
    stops = stop_ids(model.folder, tok, qcfg.vocab_size, chat=True)
    return Player(settings=settings, sampling=sampling, dtype=dtype, qcfg=qcfg, tokenizer=tok,
                  renderer=renderer, parts=parts,
                  parser=make_parser(tok, s.action_names, stops, settings.thinking),
                  stop_ids=stops, attn=attn, prompt_max=budget, buckets=coarse_buckets(budget),
                  num_actions=s.num_actions, params=PlayerParams(params, prefix))


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


def answer(player: Player, reply, span):
    """The part of replies [N, M] kept in the history (`span`: `fused.text.reply.answer_span`:
    after the last </think> and its blank line, without the stop token). Returns (tokens
    [N, M], lengths [N])."""
    m = reply.shape[1]
    pos = jnp.arange(m)[None]
    kept = jnp.take_along_axis(reply, jnp.minimum(span.start[:, None] + pos, m - 1), 1)
    length = span.end - span.start
    return jnp.where(pos < length[:, None], kept, player.tokenizer.pad_id), length


def act(player: Player, params: PlayerParams, carry: PlayerCarry, obs, keys):
    """One step of N envs: (new carry, action [N], tokens generated [N], valid [N])."""
    s = player.settings
    obs_tokens, obs_len = render_tokens(player.renderer, obs)
    prompt, lengths = assemble(player, carry, obs_tokens, obs_len)
    spec = player.generate_spec

    def at(size):
        def run(tokens, lengths, keys):
            return generate(params.llm, player.qcfg, spec, tokens[:, :size], lengths,
                            prefix=params.prefix, row_keys=keys)
        return run

    with jax.named_scope("llm"):
        out = at_smallest_fit(player.buckets, lengths.max(), at, prompt, lengths, keys)
    reply, num = out.tokens, out.num_tokens
    parsed = parse_replies(player.parser, reply, num)
    kept, kept_len = answer(player, reply, parsed.span)
    h = s.history
    if h:
        carry = carry._replace(
            obs=jnp.concatenate([carry.obs[:, 1:], obs_tokens[:, None]], 1),
            obs_len=jnp.concatenate([carry.obs_len[:, 1:], obs_len[:, None]], 1),
            reply=jnp.concatenate([carry.reply[:, 1:], kept[:, None]], 1),
            reply_len=jnp.concatenate([carry.reply_len[:, 1:], kept_len[:, None]], 1))
    carry = carry._replace(last_reply=reply, tokens=num, invalid=~parsed.valid,
                           unfinished=parsed.span.unfinished)
    return carry, parsed.action, num, parsed.valid


def player_policy(player: Player) -> Policy:
    """The player as a `Policy`: carry = the episode's history, params = `PlayerParams`,
    x = the observation [N, D] (`Identity` input); no critic (values NaN)."""
    s = player.settings
    lo, m, h = player.renderer.max_tokens, s.max_new_tokens, s.history

    def carry(n):
        i32 = partial(jnp.zeros, dtype=jnp.int32)
        return PlayerCarry(obs=i32((n, h, lo)), obs_len=i32((n, h)), reply=i32((n, h, m)),
                           reply_len=i32((n, h)), last_reply=i32((n, m)), tokens=i32(n),
                           invalid=jnp.zeros(n, bool), unfinished=jnp.zeros(n, bool))

    def forward(params, c, x, keys=None):
        c, action, _, _ = act(player, params, c, x, keys)
        logits = jnp.where(jnp.arange(player.num_actions)[None] == action[:, None], 0.0,
                           -jnp.inf)
        return c, logits, None

    def critic(params, c, x):
        return jnp.full((x.shape[0],), jnp.nan, jnp.float32)

    def stats(c):
        return {"tokens": c.tokens, "invalid": c.invalid.astype(jnp.int32),
                "unfinished": c.unfinished.astype(jnp.int32)}

    return Policy(recurrent=True, carry=carry, forward=forward, critic=critic, batch=None,
                  sample=chosen, stats=stats)
