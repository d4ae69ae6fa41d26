"""Command lines through tyro as this project's commands parse them: field docstrings as
paragraphs in --help, and a mistyped flag or choice, or a missing flag, as one line naming the
closest valid ones instead of tyro's box. Shared by `python -m llm_jax` and fused's commands."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import inspect
import typing

import tyro
from tyro import _strings


@contextlib.contextmanager
def help_paragraphs():
    """tyro 1.0.17 keeps each source line break of a field's docstring whose continuation
    lines are indented (as every docstring under a dataclass field is), so --help broke
    sentences mid-way; cleaning the indentation first (inspect.cleandoc) lets it join them.
    Patched for the parse only and put back after."""
    original = _strings.remove_single_line_breaks
    _strings.remove_single_line_breaks = lambda text: original(inspect.cleandoc(text))
    try:
        yield
    finally:
        _strings.remove_single_line_breaks = original


def flag_names(cls: type, prefix: str = "") -> list[str]:
    """The flags tyro makes of a config dataclass: `--a.b-c` for each leaf field (nested
    dataclasses as dotted prefixes), and `--a.no-b` beside each boolean."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        name, kind = f.name.replace("_", "-"), hints[f.name]
        if dataclasses.is_dataclass(kind):
            out += flag_names(kind, f"{prefix}{name}.")
        else:
            out.append(f"--{prefix}{name}")
            if kind is bool:
                out.append(f"--{prefix}no-{name}")
    return out


def closest(word: str, choices, n: int = 3) -> str:
    """The choices nearest `word` (difflib), else all of them, as `'a', 'b' or 'c'`."""
    near = [repr(c) for c in difflib.get_close_matches(word, list(choices), n=n, cutoff=0.5)
            or list(choices)]
    return " or ".join([", ".join(near[:-1]), near[-1]] if len(near) > 1 else near)


def _typo_line(event, errors, cls: type, more: str) -> str | None:
    """One line for a tyro parse-error event, or None (tyro's own box) for events unknown."""
    if isinstance(event, errors.InvalidChoice):
        flag = event.argument.lowered.name_or_flags[0]
        return (f"error: {flag} {event.value!r} is not one of its values; did you mean "
                f"{closest(event.value, event.choices)}? ({more})")
    tokens = (event.tokens if isinstance(event, errors.UnrecognizedArgs) else
              event.unrecognized_tokens if isinstance(event, errors.MissingArgs) else [])
    flags = [t.split("=")[0] for t in tokens if t.startswith("-")]
    if flags:
        return (f"error: no flag {flags[0]}; did you mean "
                f"{closest(flags[0], flag_names(cls))}? ({more})")
    if tokens:
        return f"error: unexpected {' '.join(tokens)!r}: give values after their flags ({more})"
    if isinstance(event, errors.MissingArgs):
        missing = [a.arg.lowered.name_or_flags[0] for a in event.missing_arguments]
        return f"error: {', '.join(missing)} must be given ({more})"
    return None


@contextlib.contextmanager
def typos_in_one_line(cls: type, prog: str | None):
    """A mistyped flag or choice, or a missing flag, of config dataclass `cls` ends in one line
    naming the closest valid ones (exit 1), not tyro's box: through tyro's parse-error hook (a
    private module of tyro's; where this tyro lacks it or its events changed, tyro's own box)."""
    errors = getattr(tyro, "_errors", None)
    if errors is None or not hasattr(errors, "on_parse_error"):
        yield
        return
    more = f"{prog or 'the command'} --help lists them"

    def hook(event) -> None:
        try:
            line = _typo_line(event, errors, cls, more)
        except (AttributeError, IndexError, TypeError):  # events of another tyro: its box
            return
        if line is not None:
            raise SystemExit(line)

    with errors.on_parse_error(hook):
        yield
