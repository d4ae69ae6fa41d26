"""Symbolic observations stored exactly and compactly (datasets' observation columns)."""

from __future__ import annotations

from fused.envspec import EnvSpec


class ObsCodec:
    """Symbolic observations stored exactly and compactly: the map part (0/1 one-hots and flags)
    as packed bits, the rest float32; envs without a layout keep their float32 vector."""

    def __init__(self, spec: EnvSpec):
        self.dim = spec.obs_dim
        self.map_size = spec.layout.map_size if spec.layout is not None else 0

    def encode(self, xp, obs):
        """obs [N, D] float32 -> (columns, exact [N] bool)."""
        if not self.map_size:
            return {"obs": obs}, xp.ones(obs.shape[0], bool)
        m = obs[:, :self.map_size]
        exact = xp.all((m == 0) | (m == 1), axis=-1)
        bits = xp.packbits((m > 0.5).astype(xp.uint8), axis=-1)
        return {"obs_bits": bits, "obs_aux": obs[:, self.map_size:]}, exact

    def decode(self, xp, cols: dict):
        """Columns -> obs [N, D] float32 (exactly what was encoded)."""
        if not self.map_size:
            return cols["obs"]
        m = xp.unpackbits(cols["obs_bits"], axis=-1, count=self.map_size).astype(xp.float32)
        return xp.concatenate([m, cols["obs_aux"].astype(xp.float32)], axis=-1)
