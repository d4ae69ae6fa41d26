"""How many observations one LLM call encodes, sized from the env count and a cost model of one
call instead of fixed numbers (`--llm.microbatch 0` and `--llm.refresh-batch 0` choose here).

- A periodic call over all envs runs in micro-batches as large as the activation budget allows:
  every row is real work, so a larger micro-batch is never slower until memory runs out.
- A refresh (envs whose episode ended, encoded between periodic calls, `fused.llm.policy_input`)
  fires once `refresh` envs wait or the oldest has waited `refresh_wait` steps, and encodes every
  waiting env in calls of `refresh` rows. With envs ending at `lambda` per step, calls of
  `lambda * refresh_wait` rows cost least per refreshed env: smaller calls pay a call's fixed
  cost (every weight read, every kernel launched) more often, larger ones encode padding rows.
  `lambda` is the env count over the typical episode length `EPISODE_STEPS`, so 1,024 envs
  refresh in calls of 32 rows where a fixed 8 ran the whole model four times as often.

One call on `r` rows costs about `fixed + r * per_row` (`call_cost`: weight bytes over memory
bandwidth plus launches; the rows' matmul FLOPs over the measured matmul rate); `efficiency`
reports how much of a refresh call is row work, so a run says when its refreshes are dominated
by the fixed cost. The sizes depend only on the device kind, the model's shape and the env count
(never on timings taken at start-up), so one config trains the same way on one kind of machine
and a resumed run recomputes the same sizes.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import NamedTuple

import jax

from fused.errors import ConfigError
from fused.llm.config import LLMConfig
from llm_jax.config import Qwen3Config
from llm_jax.memory import activation_bytes

log = logging.getLogger(__name__)


class DeviceCost(NamedTuple):
    matmul_flops: float  # bf16 matmul FLOP/s (f32 runs at `f32_factor` of it)
    f32_factor: float
    bandwidth: float  # bytes/s from device memory
    kernel_s: float  # fixed cost of one kernel launch
    activation_bytes: float  # budget for one micro-batch's activations


# A platform's cost model (f32 on a GPU runs as TF32; bf16 on a CPU is emulated); each figure's
# source: docs/BENCHMARKS.md, "LLM call cost model".
DEVICE_COSTS = {
    "gpu": DeviceCost(6.6e14, 0.5, 3.35e12, 5e-6, 16 * 2**30),
    "tpu": DeviceCost(1.97e14, 0.25, 8.2e11, 2e-6, 8 * 2**30),
    "cpu": DeviceCost(4.6e10, 4.0, 2e10, 2e-6, 2 * 2**30),
}


def gpu_kinds(path: str) -> dict[str, DeviceCost]:
    """The cost models of a `--llm.device-costs` file: {"gpu_kinds": {NAME: [the DeviceCost
    fields, in order]}}, a GPU matched by NAME within its device_kind (the longest match);
    "" for none. A missing or malformed file is a ConfigError naming it."""
    if not path:
        return {}
    try:
        table = json.loads(Path(path).expanduser().read_text())["gpu_kinds"]
        return {str(k): DeviceCost(*map(float, v)) for k, v in table.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"llm.device_costs={path!r}: not a readable cost table ({e!r}); "
                          "pass a file like docs/gpu/device_costs.json, or none") from None


def device_cost(device=None, kinds: dict[str, DeviceCost] | None = None) -> DeviceCost:
    """The cost model of `device` (default this process's first): its platform's, a GPU's by
    its kind where `kinds` (`gpu_kinds`) names it; the activation budget at most a quarter of
    the memory the device reports."""
    device = device or jax.local_devices()[0]
    dev = DEVICE_COSTS.get(device.platform, DEVICE_COSTS["gpu"])
    if device.platform == "gpu":
        kind = getattr(device, "device_kind", "")
        known = [k for k in (kinds or {}) if k in kind]
        if known:
            dev = kinds[max(known, key=len)]
        else:
            log.info(f"notice: no cost model for the GPU {kind!r}; LLM call sizes are the generic "
                     "GPU's (--llm.device-costs FILE costs it by its kind; --llm.microbatch / "
                     "--llm.refresh-batch set the sizes)")
    try:
        limit = (device.memory_stats() or {}).get("bytes_limit")
    except Exception:  # platforms without memory statistics
        limit = None
    if limit:
        dev = dev._replace(activation_bytes=min(dev.activation_bytes, limit / 4))
    return dev

KERNELS_PER_LAYER = 14  # norms, q/k/v/o, rope, attention, gate/up/down, residuals (order of)
EPISODE_STEPS = 150  # Craftax-Classic episodes in the cpu preset's training: 130-230 steps


class Batching(NamedTuple):
    microbatch: int  # rows per micro-batch of a periodic call over all envs
    refresh: int  # rows per refresh call
    efficiency: float  # share of a refresh call's estimated time spent on its rows


def call_cost(q: Qwen3Config, layers: int, tokens: int, dtype: str,
              dev: DeviceCost) -> tuple[float, float]:
    """(fixed, per_row) seconds of one call whose rows have `tokens` tokens each: every weight
    read once (a MoE's every expert: a call over many rows touches them all), the FLOPs of the
    weights a token uses (its k experts)."""
    bytes_per = 2 if dtype == "bfloat16" else 4
    flops = dev.matmul_flops * (1.0 if dtype == "bfloat16" else dev.f32_factor)
    fixed = (q.block_params(layers) * bytes_per / dev.bandwidth
             + layers * KERNELS_PER_LAYER * dev.kernel_s)
    return fixed, 2.0 * q.block_params(layers, active=True) * tokens / flops


def row_activation_bytes(q: Qwen3Config, tokens: int, prefix: int, dtype: str) -> int:
    """Live activations of one row in one layer (`llm_jax.memory.activation_bytes`): residual
    stream and projections, the MLP's intermediate (a MoE's routed copies), and attention
    scores against prefix + own keys (the unfused forms hold them)."""
    return activation_bytes(q, 1, tokens, prefix, dtype)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def plan(q: Qwen3Config, layers: int, local_envs: int, refresh_wait: int, tokens: int,
         max_tokens: int, prefix: int, dtype: str, device: str | DeviceCost,
         extra_row_bytes: float = 0) -> Batching:
    """Micro-batch and refresh sizes (divisors of `local_envs`, the envs per device) for rows of
    typically `tokens` and at most `max_tokens` tokens after a `prefix`-token prompt, on
    `device` (a platform's name, "cpu", "gpu", "tpu", or a device's `device_cost`);
    `extra_row_bytes`: what else a row holds at once (a VL model's vision tower)."""
    dev = device if isinstance(device, DeviceCost) else DEVICE_COSTS.get(device,
                                                                        DEVICE_COSTS["gpu"])
    divs = divisors(local_envs)
    row_bytes = row_activation_bytes(q, max_tokens, prefix, dtype) + extra_row_bytes
    cap = max(1, int(dev.activation_bytes // row_bytes))
    microbatch = max(d for d in divs if d <= cap)
    waiting = local_envs * refresh_wait / EPISODE_STEPS  # envs ending within refresh_wait steps
    refresh = min(min(divs, key=lambda d: (abs(d - waiting), d)), microbatch)
    fixed, per_row = call_cost(q, max(layers, 1), tokens, dtype, dev)
    return Batching(microbatch, refresh, refresh * per_row / (fixed + refresh * per_row))


class CallShape(NamedTuple):
    """What sizes an encoder's calls: its model and computed layers, the tokens of a row
    (typically and at most) after a `prefix`-token shared prompt, the compute dtype, the device
    bytes left for a call's activations (None: not checked), and what else a row holds at once
    (a vision tower's activations)."""

    qcfg: Qwen3Config
    layers: int
    typical: int
    max_tokens: int
    prefix: int
    dtype: str
    room: float | None = None
    extra_row_bytes: float = 0


def for_calls(shape: CallShape, cfg: LLMConfig, local_envs: int,
              platform: str | None = None) -> Batching:
    """`plan` for calls of `shape` on this process's backend (or `platform`), the config's
    explicit --llm.microbatch / --llm.refresh-batch (non-zero) taking precedence."""
    dev = platform or device_cost(kinds=gpu_kinds(cfg.device_costs))
    if platform is None and shape.room is not None:  # what the weights leave
        dev = dev._replace(activation_bytes=min(dev.activation_bytes, shape.room))
    auto = plan(shape.qcfg, shape.layers, local_envs, cfg.refresh_wait, shape.typical,
                shape.max_tokens, shape.prefix, shape.dtype, dev, shape.extra_row_bytes)
    microbatch = cfg.microbatch or auto.microbatch
    refresh = min(cfg.refresh_batch or auto.refresh, local_envs)
    return auto._replace(microbatch=microbatch, refresh=refresh)


def padded_batches(obs, keys, batch: int):
    """(rows, keys, n) of `batch` rows at a time of `obs` [M, ...] and `keys` [M, ...], the last
    batch topped up with copies of its first row (one compiled shape), n its real rows."""
    import numpy as np

    for s in range(0, len(obs), batch):
        chunk, k = obs[s:s + batch], keys[s:s + batch]
        n = len(chunk)
        if n < batch:
            chunk = np.concatenate([chunk, np.repeat(chunk[:1], batch - n, 0)])
            k = np.concatenate([k, np.repeat(k[:1], batch - n, 0)])
        yield chunk, k, n
