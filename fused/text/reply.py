"""An LLM's reply turned into an action, on the device (`play.py llm`'s player acts in one jit).

The rule (`parse_text` is the same rule in plain Python, the reference the tests hold it to):
1. Only the answer counts: the text after the last `</think>`. With thinking on, a reply with
   no `</think>` is an unfinished thought (cut by the token budget): invalid, and counted.
2. After the last `Action:` (spaces, backticks and asterisks skipped): an id (1-3 ASCII digits
   not followed by a 4th) below the number of actions, or failing that an action's NAME written
   as a whole word.
3. With no `Action:`, the first action NAME written as a whole word anywhere (the longest one
   where two start at the same place).
4. Otherwise the reply is invalid: the player takes `DEFAULT_ACTION` (NOOP) and counts it.
A whole word is not preceded or followed by an ASCII letter, digit or underscore; names are
matched as written in the prompt's action list (upper case). A reply ends before its stop token;
its text is the decoded text users see (special tokens such as <|im_start|> left out).

On the device the reply's tokens become bytes through a table of each token's UTF-8 bytes,
packed without gaps. A token longer than `TOKEN_BYTES` keeps its first and last `TOKEN_BYTES / 2`
bytes: in Qwen3's vocabulary no such token holds an action name, a digit or `Action:` in the
bytes dropped, and its ends, which meet the neighbouring tokens, are whole (the reference test
puts every one of them beside names, ids and marks).
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
THINK_END = "</think>"


class ReplyParser(NamedTuple):
    """Device tables (numpy; jit constants) and the tokens that end a reply or a thought."""

    token_bytes: np.ndarray  # [V, TOKEN_BYTES] uint8
    token_len: np.ndarray  # [V] int32, bytes of each token (capped at TOKEN_BYTES)
    names: np.ndarray  # [A, W] uint8: each action's NAME, zero-padded
    name_len: np.ndarray  # [A] int32
    think_end: int  # the `</think>` token id (-1 if the vocabulary has none)
    blank: int  # the blank line's token ("\n\n") the template puts after `</think>`
    stop_ids: tuple[int, ...]  # a reply ends at the first of these (not part of the answer)
    thinking: bool  # replies start inside a thought: one without `</think>` is unfinished


class Span(NamedTuple):
    """Where each reply's answer lies among its tokens (`answer_span`)."""

    start: jax.Array  # [N] its first token: after the last </think> and the blank line
    end: jax.Array  # [N] one past its last: the stop token, or the reply's end
    stopped: jax.Array  # [N] bool: the reply ended at a stop token
    unfinished: jax.Array  # [N] bool: thinking on and no </think> (the thought was cut)


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


def token_bytes(tokenizer) -> list[bytes]:
    """Every token id's UTF-8 bytes in decoded text: special tokens (<|im_end|>, ...) have none,
    as `decode` leaves them out; added ones that are not special (<think>) as written; b"" for
    unused ids."""
    tok = tokenizer.tokenizer
    decoder = _byte_decoder()
    added = {t.content: t.special for t in tok.get_added_tokens_decoder().values()}
    out = []
    for i in range(tok.get_vocab_size(with_added_tokens=True)):
        piece = tok.id_to_token(i)
        out.append(b"" if piece is None or added.get(piece) else piece.encode() if piece in added
                   else bytes(decoder.get(c, 0) for c in piece))
    return out


def make_parser(tokenizer, action_names: tuple[str, ...], stop_ids: tuple[int, ...] = (),
                thinking: bool = False) -> ReplyParser:
    """Tables for a Qwen3 tokenizer and an env's actions (`EnvSpec.action_names`, "id:NAME");
    `stop_ids` end a reply, `thinking`: the replies start inside a thought."""
    pieces = token_bytes(tokenizer)
    table = np.zeros((len(pieces), TOKEN_BYTES), np.uint8)
    length = np.zeros(len(pieces), np.int32)
    half = TOKEN_BYTES // 2
    for i, raw in enumerate(pieces):
        if len(raw) > TOKEN_BYTES:
            raw = raw[:half] + raw[-half:]
        table[i, :len(raw)] = np.frombuffer(raw, np.uint8)
        length[i] = len(raw)
    names = [n.split(":", 1)[1].encode() for n in action_names]
    width = max(map(len, names))
    name_table = np.zeros((len(names), width), np.uint8)
    for a, n in enumerate(names):
        name_table[a, :len(n)] = np.frombuffer(n, np.uint8)
    tok = tokenizer.tokenizer
    think = tok.token_to_id(THINK_END)
    blank = tokenizer.encode("\n\n")
    return ReplyParser(table, length, name_table, np.array([len(n) for n in names], np.int32),
                       -1 if think is None else think, blank[0] if len(blank) == 1 else -1,
                       tuple(int(i) for i in stop_ids), thinking)


def answer_span(p: ReplyParser, tokens, num) -> Span:
    """tokens [N, M] replies (num [N] tokens each, a stop token among them) -> their answers'
    spans: what the rule parses and a history keeps."""
    m = tokens.shape[1]
    pos = jnp.arange(m)[None]
    live = pos < num[:, None]
    stop = jnp.isin(tokens, jnp.asarray(p.stop_ids, jnp.int32)) & live if p.stop_ids \
        else jnp.zeros_like(live)
    stopped = stop.any(1)
    end = jnp.where(stopped, jnp.argmax(stop, 1), num)
    start = jnp.zeros_like(num)
    closed = jnp.zeros(num.shape, bool)
    if p.think_end >= 0:
        last = jnp.max(jnp.where(live & (pos < end[:, None]) & (tokens == p.think_end), pos, -1),
                       axis=1)
        after = jnp.take_along_axis(tokens, jnp.minimum(last + 1, m - 1)[:, None], 1)[:, 0]
        blank = (after == p.blank) & (last + 1 < end)
        closed = last >= 0
        start = jnp.where(closed, last + 1 + blank, 0)
    return Span(start, jnp.maximum(end, start), stopped, p.thinking & ~closed)


def _word_char(b):
    return ((b >= ord("a")) & (b <= ord("z"))) | ((b >= ord("A")) & (b <= ord("Z"))) \
        | ((b >= ord("0")) & (b <= ord("9"))) | (b == ord("_"))


def _starts(buf, n, patterns, lengths):
    """[P, S] bool: pattern p (its first lengths[p] bytes of patterns [P, W]) starts at each
    position of buf [S] (n bytes) and ends by n. One comparison per pattern byte, no windows."""
    s, w = buf.shape[0], patterns.shape[1]
    padded = jnp.concatenate([buf, jnp.zeros(w, buf.dtype)])
    hit = jnp.ones((patterns.shape[0], s), bool)
    for k in range(w):
        hit &= (padded[None, k:k + s] == patterns[:, k:k + 1]) | (k >= lengths[:, None])
    return hit & (jnp.arange(s)[None] + lengths[:, None] <= n)


def _bytes(text: bytes):
    return jnp.asarray(np.frombuffer(text, np.uint8))[None], jnp.asarray([len(text)])


def _reply_bytes(p: ReplyParser, tokens, start, end):
    """One reply's tokens [M] from `start` to `end` as bytes -> (buf [M * TOKEN_BYTES], n)."""
    m = tokens.shape[0]
    pos = jnp.arange(m)
    lens = jnp.where((pos >= start) & (pos < end), jnp.asarray(p.token_len)[tokens], 0)
    offset = jnp.cumsum(lens) - lens
    raw = jnp.asarray(p.token_bytes)[tokens]  # [M, TOKEN_BYTES]
    j = jnp.arange(TOKEN_BYTES)
    size = m * TOKEN_BYTES
    where = jnp.where(j[None] < lens[:, None], offset[:, None] + j[None], size)
    buf = jnp.zeros(size, jnp.uint8).at[where].set(raw, mode="drop")
    return buf, lens.sum()


def _parse_one(p: ReplyParser, tokens, start, end):
    """One reply (tokens [M], its answer's token span) -> (action, valid, closed): `closed`,
    a `</think>` was written (as its token, or spelt out in the answer's bytes)."""
    buf, n = _reply_bytes(p, tokens, start, end)
    s = buf.shape[0]
    idx = jnp.arange(s)
    think = _starts(buf, n, *_bytes(THINK_END.encode()))[0]
    base = jnp.max(jnp.where(think, idx + len(THINK_END), 0))  # the answer's first byte
    at_mark = _starts(buf, n, *_bytes(MARK))[0] & (idx >= base)
    last = jnp.max(jnp.where(at_mark, idx, -1))
    skip = jnp.isin(buf, jnp.frombuffer(SKIPPED, np.uint8))
    rest = (idx >= last + len(MARK)) & ~skip & (idx < n)
    after = jnp.where(rest.any(), jnp.argmax(rest), n)  # the first byte after the mark
    digit = lambda b: (b >= ord("0")) & (b <= ord("9"))  # noqa: E731
    d = jax.lax.dynamic_slice(jnp.concatenate([buf, jnp.zeros(4, buf.dtype)]), (after,), (4,))
    d = jnp.where(after + jnp.arange(4) < n, d, 0)
    count = jnp.argmin(jnp.concatenate([digit(d[:3]), jnp.array([False])]))  # leading digits
    place = 10 ** jnp.maximum(count - 1 - jnp.arange(3), 0)
    value = jnp.sum(jnp.where(jnp.arange(3) < count, (d[:3].astype(jnp.int32) - 48) * place, 0))
    num_actions = p.names.shape[0]
    # the id ends where the digits do: the byte after them (a 4th digit makes no id)
    id_ok = (last >= 0) & (count > 0) & ~digit(d[count]) & (value < num_actions)
    # whole-word names at every position of the answer: [S, A]
    names = _starts(buf, n, jnp.asarray(p.names), jnp.asarray(p.name_len)).T & (
        idx >= base)[:, None]
    before_ok = jnp.concatenate([jnp.array([True]), ~_word_char(buf[:-1])]) | (idx == base)
    stop = idx[:, None] + jnp.asarray(p.name_len)[None]
    after_char = jnp.concatenate([buf, jnp.zeros(1, buf.dtype)])[jnp.minimum(stop, s)]
    words = names & before_ok[:, None] & ((stop >= n) | ~_word_char(after_char))
    longest = jnp.argmax(jnp.where(words, jnp.asarray(p.name_len)[None], -1), axis=1)  # [S]
    at_after = jnp.minimum(after, s - 1)
    name_at_after = words[at_after].any() & (after < n)
    first = jnp.argmax(words.any(1))
    any_name = words.any()
    action = jnp.where(
        id_ok, value,
        jnp.where((last >= 0) & name_at_after, longest[at_after],
                  jnp.where((last < 0) & any_name, longest[first], DEFAULT_ACTION)))
    valid = id_ok | ((last >= 0) & name_at_after) | ((last < 0) & any_name)
    return action.astype(jnp.int32), valid, think.any()


class Parsed(NamedTuple):
    action: jax.Array  # [N] int32 (DEFAULT_ACTION where invalid)
    valid: jax.Array  # [N] bool: the reply named an action
    span: Span  # where each answer lies


def parse_replies(parser: ReplyParser, tokens, num) -> Parsed:
    """tokens [N, M] generated replies (num [N] tokens each, their stop token included)."""
    span = answer_span(parser, tokens, num)
    action, valid, spelt = jax.vmap(lambda t, a, b: _parse_one(parser, t, a, b))(
        tokens, span.start, span.end)
    span = span._replace(unfinished=span.unfinished & ~spelt)
    valid &= ~span.unfinished
    return Parsed(jnp.where(valid, action, DEFAULT_ACTION), valid, span)


def parse_text(text: str, action_names: tuple[str, ...], thinking: bool = False) -> int | None:
    """The rule in plain Python (the reference): the action id, or None for an invalid reply.
    `text` is the reply without its stop token."""
    names = [n.split(":", 1)[1] for n in action_names]
    if thinking and THINK_END not in text:
        return None
    text = text.rsplit(THINK_END, 1)[-1]
    word = "|".join(sorted(map(re.escape, names), key=len, reverse=True))
    named = re.compile(rf"(?<![A-Za-z0-9_])({word})(?![A-Za-z0-9_])")
    if MARK.decode() in text:
        rest = text.rsplit(MARK.decode(), 1)[1].lstrip(SKIPPED.decode())
        m = re.match(r"([0-9]{1,3})(?![0-9])", rest)
        if m and int(m.group(1)) < len(names):
            return int(m.group(1))
        m = named.match(rest)
        return names.index(m.group(1)) if m else None
    m = named.search(text)
    return names.index(m.group(1)) if m else None
