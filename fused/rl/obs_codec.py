"""Observations stored compactly in datasets: symbolic ones exactly, frames as pictures."""

from __future__ import annotations

from fused.envspec import EnvSpec

FRAME_LAYOUT = "HWC RGB, round(255 x)"


class ObsCodec:
    """How a dataset stores an env's observations: a symbolic map part (0/1 one-hots and flags)
    as packed bits and the rest float32 (exact); a pixel env's frames as uint8 pictures
    [N, H, W, C], round(255 x) (a quarter of float32's bytes; at most 1/510 from the frame the
    policy acted on; read as images by zarr, numpy, Pillow and video tools); envs without either
    keep their float32 vector. The policy always sees the flat float vector [N, D]."""

    def __init__(self, spec: EnvSpec):
        self.dim = spec.obs_dim
        self.image = spec.image  # (H, W, C) of a pixel env's frame, else None
        self.pixels = spec.is_pixels
        self.map_size = spec.layout.map_size if spec.layout is not None else 0
        self.columns = (["frame"] if self.pixels else
                        ["obs_bits", "obs_aux"] if self.map_size else ["obs"])
        self.exact = not self.pixels  # decode(encode(x)) == x

    @property
    def layouts(self) -> dict[str, dict]:
        """Each stored column's row: {column: {"shape", "dtype", "layout"}} (the dataset card
        records it, so a reader needs no code of ours to know what the bytes are)."""
        if self.pixels:
            return {"frame": {"shape": list(self.image), "dtype": "uint8",
                              "layout": FRAME_LAYOUT}}
        if not self.map_size:
            return {"obs": {"shape": [self.dim], "dtype": "float32",
                            "layout": "the observation vector"}}
        m = self.map_size
        return {"obs_bits": {"shape": [-(-m // 8)], "dtype": "uint8",
                             "layout": f"the observation's first {m} entries (0/1), as bits "
                                       "(numpy packbits, first entry in the high bit)"},
                "obs_aux": {"shape": [self.dim - m], "dtype": "float32",
                            "layout": f"the observation's entries {m} on"}}

    @property
    def row_bytes(self) -> int:
        """Bytes of one stored observation (its columns)."""
        if self.pixels:
            return self.dim
        if not self.map_size:
            return 4 * self.dim
        return -(-self.map_size // 8) + 4 * (self.dim - self.map_size)

    def encode(self, xp, obs):
        """obs [N, D] float32 -> (columns, [N] bool: the map part was 0/1, as bits need);
        a frame column is [N, H, W, C] uint8."""
        if self.pixels:  # the frame (a text twin's observation after it is not stored)
            frame = xp.round(xp.clip(obs[:, :self.dim], 0.0, 1.0) * 255.0).astype(xp.uint8)
            return ({"frame": frame.reshape((obs.shape[0],) + tuple(self.image))},
                    xp.ones(obs.shape[0], bool))
        if not self.map_size:
            return {"obs": obs}, xp.ones(obs.shape[0], bool)
        m = obs[:, :self.map_size]
        exact = xp.all((m == 0) | (m == 1), axis=-1)
        bits = xp.packbits((m > 0.5).astype(xp.uint8), axis=-1)
        return {"obs_bits": bits, "obs_aux": obs[:, self.map_size:]}, exact

    def decode(self, xp, cols: dict):
        """Columns ([..., H, W, C] frames) -> obs [..., D] float32 (exactly what was encoded,
        frames as k / 255)."""
        if self.pixels:
            frame = cols["frame"]
            return frame.reshape(frame.shape[:-3] + (self.dim,)).astype(xp.float32) / 255.0
        if not self.map_size:
            return cols["obs"]
        m = xp.unpackbits(cols["obs_bits"], axis=-1, count=self.map_size).astype(xp.float32)
        return xp.concatenate([m, cols["obs_aux"].astype(xp.float32)], axis=-1)
