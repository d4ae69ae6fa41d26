"""A map with point writes kept beside it, read and written with jnp's indexing rules, so a step
that edits a map at a few cells in sequence (Craftax: a mined block, a placed one, a mob's move)
reads every intermediate map exactly, and writes the map once, with one scatter.

jnp's rules, which Craftax's `map[i, j]` and `map.at[i, j].set(v)` follow and `Grid` keeps: an
index below 0 counts from the end once (-1 is the last row); a read then clamps to the edge, a
write outside the map is dropped. Under `vmap` each `.at[].set` is a scatter (a kernel, and a
copy of the map where the old one is still read); a read through `Grid.at` is a gather and a
few selects, and `Grid.array` one scatter of the writes that last (later writes to a cell win).
A map-wide quantity of the edited map (where a mob may spawn) is computed on the map as it was
and corrected at the written cells (`Grid.written`, `scatter`), so nothing passes over the map
once per write."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


def wrap(i: jax.Array, n: int) -> jax.Array:
    """jnp's index normalisation: i < 0 counts from the end, once."""
    return jnp.where(i < 0, i + n, i)


def read_index(i: jax.Array, n: int) -> jax.Array:
    """The row a read of index i gets: wrapped, then clamped."""
    return jnp.clip(wrap(i, n), 0, n - 1)


class Write(NamedTuple):
    cell: jax.Array  # [] int32: row * W + col, -1 where the write does nothing
    value: jax.Array  # []


class Grid(NamedTuple):
    """`base` [H, W] with `writes` applied in order (a tuple: static length)."""

    base: jax.Array
    writes: tuple[Write, ...] = ()

    def cell(self, pos: jax.Array) -> jax.Array:
        """The cell a read of pos [2] gets (jnp's rules), as row * W + col."""
        h, w = self.base.shape
        return read_index(pos[0], h) * w + read_index(pos[1], w)

    def at(self, pos: jax.Array) -> jax.Array:
        """`base.at[...]` after the writes, at pos [2] (what `map[pos[0], pos[1]]` reads)."""
        v = self.base[pos[0], pos[1]]
        if self.writes:
            cell = self.cell(pos)
            for x in self.writes:
                v = jnp.where(x.cell == cell, x.value, v)
        return v

    def set(self, pos: jax.Array, value, when=True) -> "Grid":
        """`map.at[pos[0], pos[1]].set(value)` where `when` (else nothing)."""
        h, w = self.base.shape
        r, c = wrap(pos[0], h), wrap(pos[1], w)
        where = jnp.where((r >= 0) & (r < h) & (c >= 0) & (c < w), r * w + c, -1)
        value = jnp.asarray(value, self.base.dtype)
        return self._replace(writes=self.writes + (Write(jnp.where(when, where, -1), value),))

    def flat(self) -> "Grid":
        """The same map with its writes applied (`array`) and none pending."""
        return Grid(self.array())

    def dense(self) -> jax.Array:
        """`array()` as selects over every cell, one per write: for a map-wide expression that
        reads a map with one or two writes (XLA fuses it into the expression; no scatter)."""
        h, w = self.base.shape
        cells = (jax.lax.broadcasted_iota(jnp.int32, (h, w), 0) * w
                 + jax.lax.broadcasted_iota(jnp.int32, (h, w), 1))
        out = self.base
        for x in self.writes:
            out = jnp.where(cells == x.cell, x.value, out)
        return out

    def array(self) -> jax.Array:
        """The map with every write applied: [H, W] (one scatter: each cell's last write)."""
        if not self.writes:
            return self.base
        h, w = self.base.shape
        cells, values = [], []
        for k, x in enumerate(self.writes):
            last = x.cell >= 0
            for y in self.writes[k + 1:]:
                last = last & (y.cell != x.cell)
            cells.append(jnp.where(last, x.cell, h * w + k))  # the others outside: dropped
            values.append(x.value)
        return scatter(self.base, cells, values, unique=True)


def scatter(base: jax.Array, cells: list, values: list, unique: bool = False) -> jax.Array:
    """`base` [H, W] with `values` at the flat `cells` (outside [0, H * W): dropped); a cell
    named twice must get the same value twice unless `unique`."""
    h, w = base.shape
    cells = jnp.stack(cells)
    cells = jnp.where(cells < 0, h * w, cells)  # (a negative index would count from the end)
    flat = base.reshape(-1).at[cells].set(
        jnp.stack(values).astype(base.dtype), mode="drop", unique_indices=unique)
    return flat.reshape(h, w)


def take(vec: jax.Array, i: jax.Array) -> jax.Array:
    """`vec[i]` for a traced i (jnp's rules: wrapped, clamped)."""
    return vec[i]


def put(vec: jax.Array, i: jax.Array, value) -> jax.Array:
    """`vec.at[i].set(value)` along the first axis, elementwise (no scatter)."""
    n = vec.shape[0]
    hit = jnp.arange(n) == wrap(i, n)  # an index outside [0, n) matches no row: dropped
    return jnp.where(hit.reshape((n,) + (1,) * (vec.ndim - 1)), jnp.asarray(value, vec.dtype),
                     vec)


def spawn_into(mobs, directions, when, direction, **values):
    """Craftax's `spawn_projectile` on one table of slots: the first slot whose mask is off (slot
    0 if none) takes `values` (fields of `mobs`), a set mask and `direction` where `when`, and
    keeps its own otherwise. -> (mobs, directions)."""
    slot = first_true(~mobs.mask)

    def fill(old, new):
        return put(old, slot, jax.lax.select(when, new, take(old, slot)))

    mobs = mobs.replace(mask=fill(mobs.mask, True),
                        **{k: fill(getattr(mobs, k), v) for k, v in values.items()})
    return mobs, fill(directions, direction)


def link(x: jax.Array, k: int) -> jax.Array:
    """`x[k]` as a link of an unrolled chain; on a CPU `x[k:k + 1]` (its axis kept, the chain's
    end reshaped once): XLA moves a squeeze's reshape down such a chain one link per round of its
    simplification passes, each round every pass again, while a GPU fuses the squeezes into
    fewer kernels. jax's default backend picks (shapes differ, so not `platform_dependent`), as
    for `draws.RunningSums`."""
    return x[k:k + 1] if jax.default_backend() == "cpu" else x[k]


def one_of(x: jax.Array, values) -> jax.Array:
    """`(x == v0) | (x == v1) | ...` of an integer x, the values ints in [0, 64): bits of two
    constant masks, shifted by x (XLA's logical shift by 32 or more is 0, so an x outside
    [0, 64) is none of them); not a chain as long as `values` (see `link`)."""
    bits = 0
    for v in values:
        if not 0 <= int(v) < 64:
            raise ValueError(f"one_of: {int(v)} is outside [0, 64)")
        bits |= 1 << int(v)
    u = x.astype(jnp.uint32)
    shift = jax.lax.shift_right_logical
    low = shift(jnp.uint32(bits & 0xFFFFFFFF), u)
    high = shift(jnp.uint32(bits >> 32), u - jnp.uint32(32))  # (an x below 32 wraps: 0)
    return ((low | high) & jnp.uint32(1)) == jnp.uint32(1)


def first_true(mask: jax.Array) -> jax.Array:
    """`jnp.argmax(mask)` of a bool vector (the first True, 0 if none), as selects."""
    out = jnp.int32(0)
    for k in reversed(range(mask.shape[0])):
        out = jnp.where(link(mask, k), jnp.int32(k), out)
    return out.reshape(())


def any_of(mask: jax.Array) -> jax.Array:
    """`mask.sum() > 0` / `mask.any()` of a short bool vector, unrolled."""
    out = link(mask, 0)
    for k in range(1, mask.shape[0]):
        out = out | link(mask, k)
    return out.reshape(())


def once(tree, floats: bool = False):
    """`fence(tree, floats)` where the program is compiled for a CPU, `tree` as it is elsewhere
    (a GPU's program as without it). XLA fuses a cheap value into each kernel that reads it; on a
    CPU each such copy is compiled code, and a value read by many makes the program larger and
    slower to compile; on a GPU a fence is one more kernel to launch."""
    return jax.lax.platform_dependent(tree, cpu=lambda t: fence(t, floats),
                                      default=lambda t: t)


def fence(tree, floats: bool = False):
    """`tree` as is, computed once. XLA fuses a cheap elementwise value into every expression
    that reads it, so a long chain of small steps (mobs moving one after another) read in many
    places is copied into each: quadratic code (`lax.optimization_barrier` is gone before XLA
    fuses). An integer division by a value XLA cannot fold is not cheap, so XLA computes it once:
    the small integer (of 32 bits or fewer) and bool leaves, packed into one vector a dtype (one
    division, one kernel), are divided by 1, a 1 made from one of them (x | 1 is odd: never 0).
    Floats (unless `floats`: those of 16 and 32 bits, as their bits), wider integers and arrays
    of more than 64 elements (maps) pass as they are."""
    if floats:
        leaves, treedef = jax.tree.flatten(tree)
        width = {2: jnp.uint16, 4: jnp.uint32}
        small = [jnp.issubdtype(x.dtype, jnp.floating) and x.size <= 64
                 and x.dtype.itemsize in width for x in leaves]
        fenced = fence([jax.lax.bitcast_convert_type(x, width[x.dtype.itemsize]) if f else x
                        for x, f in zip(leaves, small)])
        return treedef.unflatten([jax.lax.bitcast_convert_type(y, x.dtype) if f else y
                                  for x, y, f in zip(leaves, fenced, small)])
    leaves, treedef = jax.tree.flatten(tree)
    groups: dict = {}
    for i, x in enumerate(leaves):  # (integers of up to 32 bits and bools: int32 holds them)
        if (x.size <= 64 and x.dtype.itemsize <= 4
                and (jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_)):
            kind = jnp.uint32 if x.dtype == jnp.uint32 else jnp.int32
            groups.setdefault(kind, []).append(i)
    sized = [leaves[i] for members in groups.values() for i in members if leaves[i].size]
    if not sized:
        return tree
    first = sized[0]
    odd = first.reshape(-1)[0].astype(jnp.int32) | 1
    one = jax.lax.div(odd, odd)
    out = list(leaves)
    for kind, members in groups.items():
        flat = jnp.concatenate([leaves[i].reshape(-1).astype(kind) for i in members])
        flat = jax.lax.div(flat, one.astype(kind))
        at = 0
        for i in members:
            x = leaves[i]
            out[i] = flat[at:at + x.size].reshape(x.shape).astype(x.dtype)
            at += x.size
    return treedef.unflatten(out)
