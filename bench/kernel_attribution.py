"""Which parts of a program a compiled loop's kernels come from: the compiled program's text
(`compiled.as_text()`, XLA:GPU's after fusion) read instruction by instruction, each kernel one
loop iteration launches given the scopes its HLO metadata names (`op_name`: jax's name stack,
`jax.named_scope`s included; `scoped` wraps a module's functions in scopes of their names) and,
for a copy, why XLA made it.

    from kernel_attribution import attribute
    kernels = attribute(compiled.as_text())   # the outermost while loop's body, one iteration

Counting follows `gpu_target.loop_kernels` (a call's body inline, a nested loop times its trip
count, a conditional one kernel), so the totals agree with it. A kernel's `where` is its
op_name split at "/" (outermost first); a copy, which has none, takes that of the first
instruction that reads it (a nested loop's initial values: of the loop; else of the instruction
it copies). The stack frames XLA also keeps are not used: jax traces a jitted helper (jnp.where,
a random draw) once and reuses its jaxpr with the source lines of that first call, wherever it is
called from; the name stack is composed at each call. A copy's `why`:

- `loop-init`: it goes into a nested loop's initial values (a `lax.scan` / `fori_loop` inside
  the step: the loop updates its carry in place, so a value still read elsewhere is copied in);
- `before-update`: it feeds a scatter or dynamic-update-slice while the original is still read
  later (the update cannot happen in place);
- `carried`: it goes into the loop's own result (a carried buffer that cannot be updated in
  place);
- `other`."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

NOT_KERNELS = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "after-all",
               "opt-barrier", "partition-id", "replica-id"}


@dataclasses.dataclass(frozen=True)
class Instr:
    name: str
    opcode: str
    operands: tuple[str, ...]
    line: str
    frame: int | None

    @property
    def scopes(self) -> tuple[str, ...]:
        m = re.search(r'op_name="([^"]*)"', self.line)
        return tuple(m.group(1).split("/")) if m else ()


@dataclasses.dataclass(frozen=True)
class Kernel:
    opcode: str  # fusion, copy, ...
    where: tuple[str, ...]  # op_name's scopes, outermost first (empty: no metadata)
    why: str  # for copies: loop-init, before-update, carried, other; "" otherwise
    count: int  # launches per outer iteration (nested loops' trip counts multiplied)
    name: str
    within: tuple[str, ...] = ()  # the scopes of the nested loop it runs in (() at the top)


_INSTR = re.compile(r"^\s*(?:ROOT )?%(\S+) = (.*?)\s([a-z][\w-]*)\((.*)$")


def _operands(rest: str) -> tuple[str, ...]:
    depth, out, cur = 0, [], ""
    for ch in rest:
        if ch == "(":
            depth += 1
        elif ch == ")":
            if depth == 0:
                break
            depth -= 1
        cur += ch
    return tuple(re.findall(r"%([\w.\-]+)", cur))


def parse(hlo: str):
    """-> (computations {name: [Instr]}, frames {id: (function, line, parent id)})."""
    comps: dict[str, list[Instr]] = {}
    tables: dict[str, dict[int, str]] = {}
    cur = table = None
    for line in hlo.splitlines():
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            table, cur = tables.setdefault(line, {}), None
            continue
        m = re.match(r"^(?:ENTRY )?%(\S+) .*\{$", line)
        if m:
            cur, table = comps.setdefault(m.group(1), []), None
            continue
        if table is not None:
            t = re.match(r"^(\d+) (.*)$", line)
            if t:
                table[int(t.group(1))] = t.group(2)
            elif not line.strip():
                table = None
            continue
        if line.strip() == "}":
            cur = None
        elif cur is not None:
            m = _INSTR.match(line)
            if m:
                f = re.search(r"stack_frame_id=(\d+)", line)
                cur.append(Instr(m.group(1), m.group(3), _operands(m.group(4)), line,
                                 int(f.group(1)) if f else None))
    frames = {}
    for i, f in tables.get("StackFrames", {}).items():
        loc = tables["FileLocations"][int(re.search(r"file_location_id=(\d+)", f).group(1))]
        fn = tables["FunctionNames"][int(re.search(r"function_name_id=(\d+)", loc).group(1))]
        # parent_frame_id is printed one above the frame it names (0 = none).
        frames[i] = (fn.strip('"'), int(re.search(r"\bline=(\d+)", loc).group(1)),
                     int(re.search(r"parent_frame_id=(\d+)", f).group(1)) - 1)
    return comps, frames


def chain(frames, frame: int | None) -> tuple[str, ...]:
    """The functions of a stack frame, innermost first, up to the first repeat of the innermost
    trace (nested traces repeat their callers)."""
    out: list[str] = []
    seen = set()
    while frame and frame in frames and frame not in seen:
        seen.add(frame)
        fn, _, parent = frames[frame]
        out.append(fn)
        frame = parent
    return tuple(out)


def _trip(line: str) -> int | None:
    m = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
    return int(m.group(1)) if m else None


def attribute(hlo: str, loop: int = -1) -> list[Kernel]:
    """The kernels of one iteration of the `loop`-th while loop of the entry computation (the
    last by default: a scan over env steps), each with its functions and, for copies, why."""
    comps, frames = parse(hlo)
    entry = next(name for name in comps if hlo.find(f"ENTRY %{name} ") >= 0)
    whiles = [i for i in comps[entry] if i.opcode == "while"]
    body = re.search(r"body=%([^,\s]+)", whiles[loop].line).group(1)
    out: list[Kernel] = []

    def visit(comp: str, times: int, context: tuple[str, ...]):
        instrs = comps.get(comp, [])
        by_name = {i.name: i for i in instrs}
        users: dict[str, list[Instr]] = {}
        for i in instrs:
            for o in i.operands:
                users.setdefault(o, []).append(i)
        for i in instrs:
            where = i.scopes
            if i.opcode in NOT_KERNELS:
                continue
            if i.opcode == "while":
                n = _trip(i.line) or 1
                visit(re.search(r"body=%([^,\s]+)", i.line).group(1), times * n, where or context)
                continue
            if i.opcode == "call" and "to_apply=" in i.line:
                visit(re.search(r"to_apply=%([^,\s]+)", i.line).group(1), times, where or context)
                continue
            why = ""
            if i.opcode == "copy":
                why, where = _copy_reason(i, by_name, users, frames)
            out.append(Kernel(i.opcode, where, why, times, i.name, context))

    visit(body, 1, ())
    return out


def _copy_reason(i: Instr, by_name, users, frames):
    src = by_name.get(i.operands[0]) if i.operands else None
    readers = users.get(i.name, [])
    where = i.scopes
    for r in readers:
        where = where or r.scopes
    if src is not None:
        where = where or src.scopes
    while readers and all(r.opcode == "copy" for r in readers):  # a copy of a copy
        readers = [u for r in readers for u in users.get(r.name, [])]
    loops = [u for r in readers if r.opcode == "tuple" for u in users.get(r.name, [])
             if u.opcode == "while"]
    if loops:
        return "loop-init", loops[0].scopes or where
    if any(re.search(r"dynamic[-_]update[-_]slice|scatter", r.name + r.opcode)
           for r in readers):
        return "before-update", where
    if any(r.opcode == "tuple" and "ROOT " in r.line for r in readers):
        return "carried", where
    return "other", where


def table(kernels: list[Kernel], category) -> list[dict]:
    """Rows by `category(where)` (None: by `category(within)`, the loop it runs in; None again:
    "the step's own loop"): kernels, fusions, copies (by why), other ops, most first."""
    rows: dict[str, Counter] = {}
    for k in kernels:
        part = category(k.where) or category(k.within) or "the step's own loop"
        c = rows.setdefault(part, Counter())
        c["kernels"] += k.count
        if k.opcode == "fusion":
            c["fusions"] += k.count
        elif k.opcode == "copy":
            c["copies"] += k.count
            c[f"copy_{k.why}"] += k.count
        else:
            c["other"] += k.count
            c[f"op_{k.opcode}"] += k.count
    return sorted(({"part": p, **c} for p, c in rows.items()), key=lambda r: -r["kernels"])


def scoped(module, names) -> dict:
    """Wrap the functions `names` of `module` (a module, or a class for methods) in
    `jax.named_scope`s of their names, so kernels name them in their op_name; -> the originals
    (`unscoped(module, originals)` puts them back). Callers that look a function up in the
    module's namespace at call time get the scoped one."""
    import functools

    import jax

    originals = {}
    for name in names:
        fn = getattr(module, name)
        originals[name] = fn

        def wrapper(*args, _fn=fn, _name=name, **kwargs):
            with jax.named_scope(_name):
                return _fn(*args, **kwargs)

        setattr(module, name, functools.wraps(fn)(wrapper))
    return originals


def unscoped(module, originals: dict) -> None:
    for name, fn in originals.items():
        setattr(module, name, fn)
