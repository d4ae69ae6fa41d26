"""Configs on the command line and on disk: presets + flags through tyro, saved as JSON and read
back through pydantic (types and Literals checked), and resuming a run with flags applied over
its saved config (tyro takes the saved config as the defaults)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, TypeVar

import pydantic
import tyro

from fused.errors import ConfigError
from llm_jax.cli import closest, help_paragraphs, typos_in_one_line

C = TypeVar("C")


def to_dict(cfg) -> dict:
    return pydantic.TypeAdapter(type(cfg)).dump_python(cfg, mode="json")


def to_json(cfg) -> str:
    return json.dumps(to_dict(cfg), indent=2) + "\n"


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}"""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


# Fields that moved since a version that wrote run folders still in use: {old: new} (dotted).
# A saved config is read with each old field under its new name, so old runs resume.
MOVED = {"ppo.layer_width": "policy.layer_width", "ppo.num_layers": "policy.num_layers",
         "layer_width": "policy.layer_width", "num_layers": "policy.num_layers"}


def _sampling_flags(d: dict) -> dict:
    """Sampling fields saved before they became optional flags (`SamplingFlags`): a section
    with temperature, top_k and top_p and no `greedy` held resolved values, temperature 0 for
    greedy. Greedy becomes `greedy: true` (its other values were unused); any other values stay
    as given, so the run samples as it did."""
    out = {k: _sampling_flags(v) if isinstance(v, dict) else v for k, v in d.items()}
    if {"temperature", "top_k", "top_p"} <= set(out) and "greedy" not in out:
        if out["temperature"] == 0:
            out.update(greedy=True, temperature=None, top_k=None, top_p=None)
        else:
            out["greedy"] = False
    return out


def upgrade(d: dict) -> dict:
    """A saved config's dict with the fields of `MOVED` under their new names and old sampling
    fields as flags."""
    d = _sampling_flags(d)
    flat = flatten(d)
    if not any(k in flat for k in MOVED):
        return d
    for old, new in MOVED.items():
        if old in flat and new not in flat:
            flat[new] = flat.pop(old)
    out: dict = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def from_json(cls: type[C], text: str, source: str) -> C:
    """A config written by `to_json`; fields it lacks take today's defaults, fields unknown
    today or values of the wrong type are errors naming them."""
    try:
        d = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"{source} is not a valid {cls.__name__} ({e})") from None
    return from_dict(cls, d, source)


def from_dict(cls: type[C], d: dict, source: str) -> C:
    """`from_json` of a parsed dict."""
    try:
        d = upgrade(d) if isinstance(d, dict) else d
        cfg = pydantic.TypeAdapter(cls).validate_python(d)
    except (ValueError, pydantic.ValidationError) as e:
        first = str(e).splitlines()
        raise ConfigError(f"{source} is not a valid {cls.__name__} "
                          f"({'; '.join(first[:3])})") from None
    unknown = sorted(set(flatten(d)) - set(flatten(to_dict(cfg))))
    if unknown:
        raise ConfigError(f"{source} has fields this version does not know: {unknown}; was it "
                          "written by another version of craftax-fused?")
    return cfg


def changes(old, new) -> dict[str, tuple[Any, Any]]:
    """Fields whose values differ: {"a.b": (old, new)}."""
    a, b = flatten(to_dict(old)), flatten(to_dict(new))
    return {k: (a.get(k), b[k]) for k in b if a.get(k) != b[k]}


def cli(cls: type[C], args: list[str], description: str | None = None,
        prog: str | None = None, default: C | None = None) -> C:
    """tyro.cli with docstrings as paragraphs in --help, and typos as one line."""
    with help_paragraphs(), typos_in_one_line(cls, prog):
        return tyro.cli(cls, args=args, description=description, prog=prog, default=default)


def parse(cls: type[C], presets: dict[str, tuple[str, C]], default_preset: str, argv: list[str],
          description: str, prog: str | None = None) -> C:
    """`[PRESET] [--flags]`: a preset name may lead (default `default_preset`); flags override
    it; `--help` lists every field with its docstring and the preset's value (the default
    preset's without a name), and the presets in the description."""
    if argv and not argv[0].startswith("-") and argv[0] not in presets:
        raise ConfigError(f"no preset {argv[0]!r}; did you mean {closest(argv[0], presets)}? "
                          f"(the presets: {', '.join(presets)})")
    if not argv or argv[0] not in presets:
        if "-h" in argv or "--help" in argv:
            print(f"{description}\npresets (name one first; default {default_preset}):\n"
                  + "".join(f"  {k}: {v[0]}\n" for k, v in presets.items())
                  + f"the flags below show the {default_preset} preset's values:\n")
        argv = [default_preset, *argv]
    with help_paragraphs(), typos_in_one_line(cls, prog):
        return tyro.extras.overridable_config_cli(presets, args=argv, prog=prog,
                                                  description=description)


def resume(cls: type[C], saved_path: Path, argv: list[str], presets: dict,
           fixed: tuple[str, ...], free: tuple[str, ...] = ()) -> tuple[C, dict]:
    """The config saved at `saved_path` with `argv`'s flags applied over it, and what they
    changed. Fields under a `fixed` prefix (shapes of the saved state, the run's identity) may
    not change, unless listed in `free`."""
    if not saved_path.is_file():
        raise ConfigError(f"--resume {saved_path.parent}: no config.json there; pass a run folder "
                          "written by this tool")
    if argv and argv[0] in presets:
        raise ConfigError(f"preset {argv[0]!r} with --resume: the run's saved config is the base; "
                          "drop the preset name and give only the flags to change")
    saved = from_json(cls, saved_path.read_text(), str(saved_path))
    cfg = cli(cls, argv, default=saved)
    diff = {k: v for k, v in changes(saved, cfg).items() if k != "resume"}
    bad = [k for k in diff if k.startswith(fixed) and k not in free]
    if bad:
        k = bad[0]
        raise ConfigError(f"{k} cannot change when resuming (saved {diff[k][0]!r}, given "
                          f"{diff[k][1]!r}): it fixes the saved state or the run's identity; "
                          "start a new run instead")
    return cfg, diff
