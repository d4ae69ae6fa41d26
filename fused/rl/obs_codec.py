"""Observations stored compactly in datasets: symbolic ones exactly, frames as bytes."""

from __future__ import annotations

from fused.envspec import EnvSpec


class ObsCodec:
    """How a dataset stores an env's observations: a symbolic map part (0/1 one-hots and flags)
    as packed bits and the rest float32 (exact); a pixel env's frames as uint8, round(255 x)
    (a quarter of float32's bytes; at most 1/510 from the frame the policy acted on); envs
    without either keep their float32 vector."""

    def __init__(self, spec: EnvSpec):
        self.dim = spec.obs_dim
        self.pixels = spec.is_pixels
        self.map_size = spec.layout.map_size if spec.layout is not None else 0
        self.columns = (["frame"] if self.pixels else
                        ["obs_bits", "obs_aux"] if self.map_size else ["obs"])
        self.exact = not self.pixels  # decode(encode(x)) == x

    @property
    def row_bytes(self) -> int:
        """Bytes of one stored observation (its columns)."""
        if self.pixels:
            return self.dim
        if not self.map_size:
            return 4 * self.dim
        return -(-self.map_size // 8) + 4 * (self.dim - self.map_size)

    def encode(self, xp, obs):
        """obs [N, D] float32 -> (columns, [N] bool: the map part was 0/1, as bits need)."""
        if self.pixels:  # the frame (a text twin's observation after it is not stored)
            frame = xp.round(xp.clip(obs[:, :self.dim], 0.0, 1.0) * 255.0).astype(xp.uint8)
            return {"frame": frame}, xp.ones(obs.shape[0], bool)
        if not self.map_size:
            return {"obs": obs}, xp.ones(obs.shape[0], bool)
        m = obs[:, :self.map_size]
        exact = xp.all((m == 0) | (m == 1), axis=-1)
        bits = xp.packbits((m > 0.5).astype(xp.uint8), axis=-1)
        return {"obs_bits": bits, "obs_aux": obs[:, self.map_size:]}, exact

    def decode(self, xp, cols: dict):
        """Columns -> obs [N, D] float32 (exactly what was encoded, frames as k / 255)."""
        if self.pixels:
            return cols["frame"].astype(xp.float32) / 255.0
        if not self.map_size:
            return cols["obs"]
        m = xp.unpackbits(cols["obs_bits"], axis=-1, count=self.map_size).astype(xp.float32)
        return xp.concatenate([m, cols["obs_aux"].astype(xp.float32)], axis=-1)
