"""A Qwen3-VL's weights as typed pytrees: the vision tower's blocks (`VisionBlock`) and mergers
(`Merger`), the tower (`VisionWeights`) and the whole model (`VLWeights`: the text model's
`llm_jax.weights.Weights` beside the tower's).

Each tower weight is described once (`VISION`: a `VisionWeights` whose leaves are `Tensor`s, the
HF name within its block or merger, the HF shape, the conversion), from which the names and
shapes a checkpoint must hold (`vision_tensors`) and reading (`read_vision_params`) derive.
Linear weights are ours as [in, out]; the patch embedding's Conv3d is one [C * T * P * P, h]
matrix (its kernel covers a patch exactly); blocks and DeepStack mergers are stacked on a
leading axis.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from llm_jax.weights import Weights, weights_type

if TYPE_CHECKING:  # (annotations only: `llm_jax.vision` imports this module)
    from llm_jax.vision import VisionConfig


@weights_type
class VisionBlock:
    """One pre-LayerNorm block of the tower ([depth, ...] stacked in `VisionWeights`)."""

    norm1_w: jax.Array  # [h]
    norm1_b: jax.Array  # [h]
    norm2_w: jax.Array  # [h]
    norm2_b: jax.Array  # [h]
    qkv_w: jax.Array  # [h, 3h]
    qkv_b: jax.Array  # [3h]
    proj_w: jax.Array  # [h, h]
    proj_b: jax.Array  # [h]
    fc1_w: jax.Array  # [h, f]
    fc1_b: jax.Array  # [f]
    fc2_w: jax.Array  # [f, h]
    fc2_b: jax.Array  # [h]


@weights_type
class Merger:
    """A merger: each merge block's patches side by side (g = h x merge^2 wide) -> one token of
    the text model's width o. Its LayerNorm is over h (the main merger: per patch) or over g
    (the DeepStack mergers: after grouping)."""

    norm_w: jax.Array  # [h or g]
    norm_b: jax.Array  # [h or g]
    fc1_w: jax.Array  # [g, g]
    fc1_b: jax.Array  # [g]
    fc2_w: jax.Array  # [g, o]
    fc2_b: jax.Array  # [o]


@weights_type
class VisionWeights:
    """The vision tower (`llm_jax.vision.vision_tower`)."""

    patch_w: jax.Array  # [C * T * P * P, h]
    patch_b: jax.Array  # [h]
    pos_embed: jax.Array  # [num_position_embeddings, h]
    blocks: VisionBlock  # [depth, ...]
    merger: Merger
    deepstack: Merger | None  # [S, ...] one per `deepstack_visual_indexes` entry; None if none


@weights_type
class VLWeights:
    """A Qwen3-VL: its text model (a Qwen3's weights) and its vision tower."""

    text: Weights
    vision: VisionWeights


def _linear(a: np.ndarray) -> np.ndarray:
    """HF's Linear weight [out, in] -> ours [in, out]; other tensors as they are."""
    return a.T if a.ndim == 2 else a


@dataclasses.dataclass(frozen=True)
class Tensor:
    """One of the tower's arrays: the HF tensor `name` (after its block's or merger's prefix) of
    `shape`, converted by `to_ours`. A pytree leaf."""

    name: str
    shape: Callable[[VisionConfig], tuple[int, ...]]
    to_ours: Callable[[np.ndarray], np.ndarray] = _linear


def _merger(norm: Callable[[VisionConfig], int]) -> Merger:
    return Merger(norm_w=Tensor("norm.weight", lambda c: (norm(c),)),
                  norm_b=Tensor("norm.bias", lambda c: (norm(c),)),
                  fc1_w=Tensor("linear_fc1.weight", lambda c: (c.merged_size, c.merged_size)),
                  fc1_b=Tensor("linear_fc1.bias", lambda c: (c.merged_size,)),
                  fc2_w=Tensor("linear_fc2.weight", lambda c: (c.out_hidden_size, c.merged_size)),
                  fc2_b=Tensor("linear_fc2.bias", lambda c: (c.out_hidden_size,)))


_h = lambda c: (c.hidden_size,)  # noqa: E731
VISUAL = "model.visual."
VISION = VisionWeights(
    patch_w=Tensor("patch_embed.proj.weight", lambda c: (
        c.hidden_size, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size),
        lambda a: a.reshape(a.shape[0], -1).T),
    patch_b=Tensor("patch_embed.proj.bias", _h, lambda a: a),
    pos_embed=Tensor("pos_embed.weight", lambda c: (c.num_position_embeddings, c.hidden_size),
                     lambda a: a),
    blocks=VisionBlock(
        norm1_w=Tensor("norm1.weight", _h), norm1_b=Tensor("norm1.bias", _h),
        norm2_w=Tensor("norm2.weight", _h), norm2_b=Tensor("norm2.bias", _h),
        qkv_w=Tensor("attn.qkv.weight", lambda c: (3 * c.hidden_size, c.hidden_size)),
        qkv_b=Tensor("attn.qkv.bias", lambda c: (3 * c.hidden_size,)),
        proj_w=Tensor("attn.proj.weight", lambda c: (c.hidden_size, c.hidden_size)),
        proj_b=Tensor("attn.proj.bias", _h),
        fc1_w=Tensor("mlp.linear_fc1.weight", lambda c: (c.intermediate_size, c.hidden_size)),
        fc1_b=Tensor("mlp.linear_fc1.bias", lambda c: (c.intermediate_size,)),
        fc2_w=Tensor("mlp.linear_fc2.weight", lambda c: (c.hidden_size, c.intermediate_size)),
        fc2_b=Tensor("mlp.linear_fc2.bias", _h)),
    merger=_merger(lambda c: c.hidden_size),
    deepstack=_merger(lambda c: c.merged_size))


def _prefixes(cfg: VisionConfig) -> Iterator[tuple[str, object]]:
    """(HF prefix, description) of each block, the merger and each DeepStack merger."""
    for i in range(cfg.depth):
        yield f"{VISUAL}blocks.{i}.", VISION.blocks
    yield VISUAL + "merger.", VISION.merger
    for j in range(len(cfg.deepstack_visual_indexes)):
        yield f"{VISUAL}deepstack_merger_list.{j}.", VISION.deepstack


def vision_tensors(cfg: VisionConfig) -> dict[str, tuple[int, ...]]:
    """HF name -> shape of every tensor of the vision tower."""
    out = {VISUAL + t.name: t.shape(cfg) for t in (VISION.patch_w, VISION.patch_b,
                                                    VISION.pos_embed)}
    for prefix, desc in _prefixes(cfg):
        out.update({prefix + t.name: t.shape(cfg) for t in jax.tree.leaves(desc)})
    return out


def read_vision_params(read: Callable[[str], np.ndarray], cfg: VisionConfig,
                       dtype=jnp.float32) -> VisionWeights:
    """The tower's weights from `read(HF name)`, converted as `VISION` says, in `dtype`."""
    def put(a):
        return jnp.asarray(np.asarray(a).astype(dtype))

    def one(t: Tensor, prefix: str = VISUAL):
        return t.to_ours(read(prefix + t.name))

    def stack(desc, prefixes):
        parts = [jax.tree.map(lambda t, p=p: one(t, p), desc) for p in prefixes]
        return jax.tree.map(lambda *a: put(np.stack(a)), *parts)

    patch_w, patch_b, pos_embed = (put(one(t)) for t in (VISION.patch_w, VISION.patch_b,
                                                          VISION.pos_embed))
    merger = jax.tree.map(lambda t: put(one(t, VISUAL + "merger.")), VISION.merger)
    blocks = stack(VISION.blocks, [f"{VISUAL}blocks.{i}." for i in range(cfg.depth)])
    n = len(cfg.deepstack_visual_indexes)
    deepstack = (stack(VISION.deepstack, [f"{VISUAL}deepstack_merger_list.{j}."
                                          for j in range(n)]) if n else None)
    return VisionWeights(patch_w, patch_b, pos_embed, blocks, merger, deepstack)
