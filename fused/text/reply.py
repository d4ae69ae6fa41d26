"""An LLM's reply turned into an action, on the device (`play.py llm`'s player acts in one jit).

The rule (`parse_text` is the same rule in plain Python, the reference the tests hold it to):
1. Only the answer counts: with thinking on, the text after the last `</think>`.
2. After the last `Action:` (spaces, backticks and asterisks skipped): an id (1-3 digits) below
   the number of actions, or failing that an action's NAME written as a whole word.
3. With no `Action:`, the first action NAME written as a whole word anywhere (the longest one
   where two start at the same place).
4. Otherwise the reply is invalid: the player takes `DEFAULT_ACTION` (NOOP) and counts it.
A whole word is not preceded or followed by a letter, digit or underscore; names are matched
as written in the prompt's action list (upper case).

On the device the reply's tokens become bytes through a table of each token's UTF-8 bytes (up
to `TOKEN_BYTES` per token: no token needed to spell an action is longer), packed without gaps.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

TOKEN_BYTES = 16
DEFAULT_ACTION = 0  # NOOP
MARK = b"Action:"
SKIPPED = b" `*"


class ReplyParser(NamedTuple):
    """Device tables (numpy; jit constants or arguments)."""

    token_bytes: np.ndarray  # [V, TOKEN_BYTES] uint8
    token_len: np.ndarray  # [V] int32, bytes of each token (capped at TOKEN_BYTES)
    names: np.ndarray  # [A, W] uint8: each action's NAME, zero-padded
    name_len: np.ndarray  # [A] int32
    think_end: int  # the `</think>` token id (-1 if the vocabulary has none)


def _byte_decoder() -> dict[str, int]:
    """Byte-level BPE's printable stand-ins for bytes (GPT-2's table), inverted."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def make_parser(tokenizer, action_names: tuple[str, ...]) -> ReplyParser:
    """Tables for a Qwen3 tokenizer and an env's actions (`EnvSpec.action_names`, "id:NAME")."""
    tok = tokenizer.tokenizer
    vocab = tok.get_vocab_size(with_added_tokens=True)
    decoder = _byte_decoder()
    table = np.zeros((vocab, TOKEN_BYTES), np.uint8)
    length = np.zeros(vocab, np.int32)
    special = {t.content for t in tok.get_added_tokens_decoder().values()}
    for i in range(vocab):
        piece = tok.id_to_token(i)
        if piece is None:
            continue
        raw = piece.encode() if piece in special else bytes(decoder.get(c, 0) for c in piece)
        raw = raw[:TOKEN_BYTES]
        table[i, :len(raw)] = np.frombuffer(raw, np.uint8)
        length[i] = len(raw)
    names = [n.split(":", 1)[1].encode() for n in action_names]
    width = max(map(len, names))
    name_table = np.zeros((len(names), width), np.uint8)
    for a, n in enumerate(names):
        name_table[a, :len(n)] = np.frombuffer(n, np.uint8)
    think = tok.token_to_id("</think>")
    return ReplyParser(table, length, name_table, np.array([len(n) for n in names], np.int32),
                       -1 if think is None else think)


def _word_char(b):
    return ((b >= ord("a")) & (b <= ord("z"))) | ((b >= ord("A")) & (b <= ord("Z"))) \
        | ((b >= ord("0")) & (b <= ord("9"))) | (b == ord("_"))


def _matches(buf, n, pattern, plen):
    """[S] bool: pattern [W] (plen bytes of it) starts at each position of buf [S] (n bytes)."""
    s, w = buf.shape[0], pattern.shape[0]
    padded = jnp.concatenate([buf, jnp.zeros(w, buf.dtype)])
    windows = jax.vmap(lambda p: jax.lax.dynamic_slice(padded, (p,), (w,)))(jnp.arange(s))
    same = (windows == pattern[None]) | (jnp.arange(w)[None] >= plen)
    return same.all(-1) & (jnp.arange(s) + plen <= n)


def _reply_bytes(p: ReplyParser, tokens, num):
    """One reply's answer as bytes: tokens [M] (num of them) -> (buf [M * TOKEN_BYTES], n)."""
    m = tokens.shape[0]
    pos = jnp.arange(m)
    live = pos < num
    if p.think_end >= 0:  # only what follows the last </think>
        last = jnp.max(jnp.where(live & (tokens == p.think_end), pos, -1))
        live &= pos > last
    lens = jnp.where(live, jnp.asarray(p.token_len)[tokens], 0)
    start = jnp.cumsum(lens) - lens
    raw = jnp.asarray(p.token_bytes)[tokens]  # [M, TOKEN_BYTES]
    j = jnp.arange(TOKEN_BYTES)
    size = m * TOKEN_BYTES
    where = jnp.where(j[None] < lens[:, None], start[:, None] + j[None], size)
    buf = jnp.zeros(size, jnp.uint8).at[where].set(raw, mode="drop")
    return buf, lens.sum()


def _parse_one(p: ReplyParser, tokens, num):
    buf, n = _reply_bytes(p, tokens, num)
    s = buf.shape[0]
    idx = jnp.arange(s)
    mark = jnp.frombuffer(MARK, np.uint8)
    at_mark = _matches(buf, n, jnp.asarray(mark), len(MARK))
    last = jnp.max(jnp.where(at_mark, idx, -1))
    skip = jnp.isin(buf, jnp.frombuffer(SKIPPED, np.uint8))
    after = jnp.argmax((idx >= last + len(MARK)) & ~skip & (idx < n))
    after = jnp.where(((idx >= last + len(MARK)) & ~skip & (idx < n)).any(), after, n)
    digit = lambda b: (b >= ord("0")) & (b <= ord("9"))  # noqa: E731
    d = jax.lax.dynamic_slice(jnp.concatenate([buf, jnp.zeros(4, buf.dtype)]), (after,), (4,))
    d = jnp.where(after + jnp.arange(4) < n, d, 0)
    count = jnp.argmin(jnp.concatenate([digit(d[:3]), jnp.array([False])]))  # leading digits
    place = 10 ** jnp.maximum(count - 1 - jnp.arange(3), 0)
    value = jnp.sum(jnp.where(jnp.arange(3) < count, (d[:3].astype(jnp.int32) - 48) * place, 0))
    num_actions = p.names.shape[0]
    id_ok = (last >= 0) & (count > 0) & ~digit(d[3]) & (value < num_actions)
    # whole-word names at every position: [S, A]
    names = jax.vmap(lambda w, k: _matches(buf, n, w, k), out_axes=1)(
        jnp.asarray(p.names), jnp.asarray(p.name_len))
    before_ok = jnp.concatenate([jnp.array([True]), ~_word_char(buf[:-1])])
    end = idx[:, None] + jnp.asarray(p.name_len)[None]
    after_char = jnp.concatenate([buf, jnp.zeros(1, buf.dtype)])[jnp.minimum(end, s)]
    words = names & before_ok[:, None] & ((end >= n) | ~_word_char(after_char))
    longest = jnp.argmax(jnp.where(words, jnp.asarray(p.name_len)[None], -1), axis=1)  # [S]
    name_at_after = words[jnp.minimum(after, s - 1)].any() & (after < n)
    first = jnp.argmax(words.any(1))
    any_name = words.any()
    action = jnp.where(
        id_ok, value,
        jnp.where((last >= 0) & name_at_after, longest[jnp.minimum(after, s - 1)],
                  jnp.where((last < 0) & any_name, longest[first], DEFAULT_ACTION)))
    valid = id_ok | ((last >= 0) & name_at_after) | ((last < 0) & any_name)
    return action.astype(jnp.int32), valid


def parse_replies(parser: ReplyParser, tokens, num):
    """tokens [N, M] generated replies, num [N] tokens of each -> (action [N] int32, valid [N])."""
    return jax.vmap(lambda t, k: _parse_one(parser, t, k))(tokens, num)


def parse_text(text: str, action_names: tuple[str, ...]) -> int | None:
    """The rule in plain Python (the reference): the action id, or None for an invalid reply."""
    names = [n.split(":", 1)[1] for n in action_names]
    text = text.rsplit("</think>", 1)[-1]
    word = "|".join(sorted(map(re.escape, names), key=len, reverse=True))
    named = re.compile(rf"(?<![A-Za-z0-9_])({word})(?![A-Za-z0-9_])")
    if MARK.decode() in text:
        rest = text.rsplit(MARK.decode(), 1)[1].lstrip(SKIPPED.decode())
        m = re.match(r"(\d{1,3})(?!\d)", rest)
        if m and int(m.group(1)) < len(names):
            return int(m.group(1))
        m = named.match(rest)
        return names.index(m.group(1)) if m else None
    m = named.search(text)
    return names.index(m.group(1)) if m else None
