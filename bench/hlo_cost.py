"""What a compiled XLA:GPU program launches, read from its text (`compiled.as_text()`): every
kernel with its kind, the bytes it moves and the FLOPs of its matmuls and convolutions, how many
times one run (or one iteration of a loop) launches it, and where copies come from.

    prog = parse(compiled.as_text())
    loops(prog)                  # a row per while loop: its kernels by kind, bytes, FLOPs
    launches(prog, prog.entry)   # every kernel of a run with its count (loops times trip counts)

Kinds: `fusion` (XLA's generated kernels), `gemm` (a matmul: Triton GEMM fusion or cuBLAS),
`conv` (cuDNN), `copy`, `custom-call` (a Pallas/Triton kernel or other library call),
`conditional` (the branch choice: the predicate read to the host), `other`. A conditional's
branches are counted: `weights(instruction, branch kernels)` picks how often each runs (default:
the heaviest every time, an upper bound). A loop whose trip count XLA does not know is counted
once, its condition too (on a GPU a host round trip an iteration), and named in `launches`'
`inexact`. Bytes follow XLA's cost analysis for fusions: an operand read only through
slices counts the slices, an output written in place by a dynamic-update-slice counts the update;
FLOPs count dots and convolutions only (2 per multiply-add); Pallas/Triton custom calls count
their operands and results as bytes and no FLOPs (their bodies are not HLO), but for our prefix
attention kernel (`kernels/`), whose FLOPs follow from its shapes."""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from typing import Callable

NOT_KERNELS = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "after-all",
               "opt-barrier", "partition-id", "replica-id", "add-dependency", "domain"}
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s4": 0.5, "u4": 0.5, "s16": 2, "u16": 2, "f16": 2,
          "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
          "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1, "f8e5m2fnuz": 1,
          "f8e4m3fnuz": 1, "f8e4m3b11fnuz": 1, "token": 0}
_ARRAY = re.compile(r"\b(" + "|".join(sorted(_BYTES, key=len, reverse=True)) + r")\[([\d,]*)\]")
_INSTR = re.compile(r"^\s*(ROOT )?%(\S+) = (.*?)\s([a-z][\w-]*)\((.*)$")
_MATH_CLASS = {"bf16": "bf16", "f16": "bf16", "f32": "tf32", "f8e4m3fn": "fp8", "f8e5m2": "fp8",
               "s8": "int8", "f64": "f64"}


def shape_bytes(shape: str) -> float:
    """Bytes of an HLO shape (`f32[8,16]{1,0}`, a tuple sums its arrays)."""
    return sum(_BYTES[t] * math.prod(int(d) for d in dims.split(",") if d)
               for t, dims in _ARRAY.findall(shape))


def _dims(shape: str) -> tuple[str, list[int]]:
    m = _ARRAY.search(shape)
    return (m.group(1), [int(d) for d in m.group(2).split(",") if d]) if m else ("", [])


@dataclasses.dataclass
class Instr:
    name: str
    shape: str
    opcode: str
    operands: list[str]
    attrs: str  # everything after the operand list
    root: bool
    frame: int | None


@dataclasses.dataclass
class Program:
    comps: dict[str, list[Instr]]
    entry: str
    frames: dict[int, tuple[str, str, int, int]]  # id: (file, function, line, parent id)

    def by_name(self, comp: str) -> dict[str, Instr]:
        return {i.name: i for i in self.comps.get(comp, [])}


@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str
    kind: str
    bytes: float
    flops: float
    math: str | None  # the matmul's input type class (bf16, tf32, fp8, int8), None: no matmul


def _split_operands(rest: str) -> tuple[list[str], str]:
    depth = 0
    for k, ch in enumerate(rest):
        if ch in "({":
            depth += 1
        elif ch in ")}":
            if depth == 0:
                return re.findall(r"%([\w.\-]+)", rest[:k]), rest[k + 1:]
            depth -= 1
    return re.findall(r"%([\w.\-]+)", rest), ""


def parse(text: str) -> Program:
    """The computations of a compiled module's text and its stack-frame tables."""
    comps: dict[str, list[Instr]] = {}
    tables: dict[str, dict[int, str]] = {}
    cur = table = None
    entry = ""
    for line in text.splitlines():
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            table, cur = tables.setdefault(line, {}), None
            continue
        m = re.match(r"^(ENTRY )?%(\S+) .*\{$", line)
        if m:
            cur, table = comps.setdefault(m.group(2), []), None
            entry = m.group(2) if m.group(1) else entry
            continue
        if table is not None:
            t = re.match(r"^(\d+) (.*)$", line)
            if t:
                table[int(t.group(1))] = t.group(2)
            continue
        if line.strip() == "}":
            cur = None
        elif cur is not None:
            m = _INSTR.match(line)
            if m:
                ops, attrs = _split_operands(m.group(5))
                f = re.search(r"stack_frame_id=(\d+)", attrs)
                cur.append(Instr(m.group(2), m.group(3), m.group(4), ops, attrs,
                                 bool(m.group(1)), int(f.group(1)) if f else None))
    frames = {}
    for i, f in tables.get("StackFrames", {}).items():
        loc = tables["FileLocations"][int(re.search(r"file_location_id=(\d+)", f).group(1))]
        get = lambda key, s=loc: int(re.search(rf"\b{key}=(\d+)", s).group(1))  # noqa: E731
        frames[i] = (tables["FileNames"][get("file_name_id")].strip('"'),
                     tables["FunctionNames"][get("function_name_id")].strip('"'), get("line"),
                     int(re.search(r"parent_frame_id=(\d+)", f).group(1)) - 1)
    return Program(comps, entry, frames)


def _called(i: Instr, key: str) -> str | None:
    m = re.search(rf"\b{key}=%([^,\s}}]+)", i.attrs)
    return m.group(1) if m else None


def _dot_flops(d: Instr, table: dict[str, Instr]) -> tuple[float, str | None]:
    lhs = table.get(d.operands[0]) if d.operands else None
    if lhs is None:
        return 0.0, None
    t, dims = _dims(lhs.shape)
    k = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", d.attrs)
    contract = math.prod(dims[int(c)] for c in k.group(1).split(",") if c) if k else 1
    return 2.0 * math.prod(_dims(d.shape)[1]) * contract, _MATH_CLASS.get(t, "f32")


def _conv_flops(c: Instr, table: dict[str, Instr]) -> tuple[float, str | None]:
    kernel = table.get(c.operands[1]) if len(c.operands) > 1 else None
    labels = re.search(r"dim_labels=\w+_(\w+)->", c.attrs)
    if kernel is None or labels is None:
        return 0.0, None
    t, kdims = _dims(kernel.shape)
    per_out = math.prod(kdims) / max(kdims[labels.group(1).index("o")], 1)
    return 2.0 * math.prod(_dims(c.shape.split("(")[-1])[1]) * per_out, _MATH_CLASS.get(t, "f32")


def _matmul_flops(prog: Program, comp: str) -> tuple[float, str | None, bool]:
    """FLOPs of the dots and convolutions in `comp` and the computations it calls, their input
    type class, and whether a convolution is among them."""
    flops, math_class, conv = 0.0, None, False
    table = prog.by_name(comp)
    for i in prog.comps.get(comp, []):
        f, m = ((_dot_flops(i, table) if i.opcode == "dot" else
                 _conv_flops(i, table) if i.opcode == "convolution" else (0.0, None)))
        flops, math_class, conv = flops + f, math_class or m, conv or i.opcode == "convolution"
        for key in ("calls", "to_apply"):
            inner = _called(i, key)
            if inner and inner != comp:
                f, m, c = _matmul_flops(prog, inner)
                flops, math_class, conv = flops + f, math_class or m, conv or c
    return flops, math_class, conv


def _fusion_bytes(prog: Program, fusion: Instr) -> float:
    """XLA's rule: a parameter read only through (dynamic) slices or gathers counts what they
    read; a parameter updated in place by a dynamic-update-slice reads nothing; an output that
    is such an update writes only the update."""
    comp = _called(fusion, "calls")
    instrs = prog.comps.get(comp, [])
    table = {i.name: i for i in instrs}
    users: dict[str, list[Instr]] = {}
    for i in instrs:
        for o in i.operands:
            users.setdefault(o, []).append(i)

    def read(name: str, seen: int = 0) -> float:
        total = 0.0
        for u in users.get(name, []):
            if u.opcode in ("bitcast", "reshape") and seen < 4:
                total += read(u.name, seen + 1)
            elif u.opcode in ("slice", "dynamic-slice", "gather") and u.operands[0] == name:
                total += shape_bytes(u.shape)
            elif u.opcode == "dynamic-update-slice" and u.operands[0] == name:
                continue
            else:
                return shape_bytes(table[name].shape)
        return total

    def written(i: Instr) -> float:
        if i.opcode == "tuple":
            return sum(written(table[o]) for o in i.operands if o in table)
        if i.opcode == "dynamic-update-slice" and len(i.operands) > 1 and i.operands[1] in table:
            return shape_bytes(table[i.operands[1]].shape)
        return shape_bytes(i.shape)

    params = [i for i in instrs if i.opcode == "parameter"]
    root = next((i for i in instrs if i.root), None)
    if not params or root is None:  # no body to read: operands and result
        return shape_bytes(fusion.shape)
    return sum(read(p.name) for p in params) + written(root)


def kernel(prog: Program, i: Instr, table: dict[str, Instr]) -> Kernel:
    """The cost of one launching instruction of a non-fused computation."""
    operand_bytes = sum(shape_bytes(table[o].shape) for o in i.operands if o in table)
    if i.opcode == "fusion":
        flops, m, conv = _matmul_flops(prog, _called(i, "calls"))
        kind = "conv" if conv else "gemm" if flops else "fusion"
        return Kernel(i.name, kind, _fusion_bytes(prog, i), flops, m)
    if i.opcode == "custom-call":
        target = (re.search(r'custom_call_target="([^"]+)"', i.attrs) or [None, ""])[1]
        out = i.shape.split("{")[0] if i.shape.startswith("(") else i.shape
        result = shape_bytes(_ARRAY.search(out).group(0)) if _ARRAY.search(out) else 0.0
        if "gemm" in target or "matmul" in target:
            lhs = table.get(i.operands[0])
            t, dims = _dims(lhs.shape) if lhs else ("", [])
            k = re.search(r'"lhs_contracting_dimensions":\["?([\d",]*)\]', i.attrs)
            contract = math.prod(dims[int(c)] for c in re.findall(r"\d+", k.group(1))) \
                if k and dims else 0
            flops = 2.0 * math.prod(_dims(out)[1]) * contract
            return Kernel(i.name, "gemm", operand_bytes + result, flops, _MATH_CLASS.get(t))
        if "conv" in target:
            flops, m = _conv_flops(i, table)
            return Kernel(i.name, "conv", operand_bytes + result, flops, m)
        if "prefix_attention" in i.attrs and len(i.operands) >= 6:  # kernels/: our Pallas
            # attention, q [R, Hkv, T, G, D] after a prefix of P keys (k [Hkv, P, D]): 4 FLOPs a
            # query element and key, the suffix's keys causal (half of T on average)
            t, q = _dims(i.shape)
            prefix = _dims(table[i.operands[4]].shape)[1] if i.operands[4] in table else []
            if len(q) == 5 and len(prefix) == 3:
                flops = 4.0 * math.prod(q) * (prefix[1] + q[2] / 2)
                return Kernel(i.name, "custom-call", operand_bytes + shape_bytes(i.shape), flops,
                              _MATH_CLASS.get(t))
        return Kernel(i.name, "custom-call", operand_bytes + shape_bytes(i.shape), 0.0, None)
    if i.opcode == "copy":
        return Kernel(i.name, "copy", 2 * shape_bytes(i.shape), 0.0, None)
    if i.opcode in ("dot", "convolution"):
        flops, m = (_dot_flops if i.opcode == "dot" else _conv_flops)(i, table)
        return Kernel(i.name, "gemm" if i.opcode == "dot" else "conv",
                      operand_bytes + shape_bytes(i.shape), flops, m)
    return Kernel(i.name, "other", operand_bytes + shape_bytes(i.shape), 0.0, None)


def trip_count(i: Instr) -> int | None:
    m = re.search(r'"known_trip_count":\{"n":"(\d+)"', i.attrs)
    return int(m.group(1)) if m else None


def branches(i: Instr) -> list[str]:
    m = re.search(r"branch_computations=\{([^}]*)\}", i.attrs)
    if m:
        return re.findall(r"%([^,\s]+)", m.group(1))
    return [c for c in (_called(i, "true_computation"), _called(i, "false_computation")) if c]


Weights = Callable[[Instr, list[int]], list[float]]


def heaviest(_: Instr, sizes: list[int]) -> list[float]:
    """Every conditional takes its branch of most kernels (an upper bound)."""
    return [1.0 if k == sizes.index(max(sizes)) else 0.0 for k in range(len(sizes))]


def launches(prog: Program, comp: str, weights: Weights = heaviest,
             inexact: list | None = None) -> Counter:
    """{Kernel: launches} of one run of `comp`: loops times their trip counts, calls inline,
    each conditional one `conditional` launch plus its branches by `weights`; the loops of
    unknown trip count are appended to `inexact` (the result is shared with later calls: read
    it, do not change it)."""
    memo = prog.__dict__.setdefault("_launches", {})
    if (comp, weights) not in memo:
        found: list = []
        memo[comp, weights] = (_launches(prog, comp, weights, found), found)
    counts, found = memo[comp, weights]
    if inexact is not None:
        inexact.extend(found)
    return counts


def _launches(prog: Program, comp: str, weights: Weights, inexact: list) -> Counter:
    out: Counter = Counter()
    table = prog.by_name(comp)
    for i in prog.comps.get(comp, []):
        if i.opcode in NOT_KERNELS:
            continue
        if i.opcode == "while":
            n = trip_count(i)
            if n is None:  # the condition runs each iteration too (and a sync: see module doc)
                inexact.append(i.name)
                out.update(launches(prog, _called(i, "condition"), weights, inexact))
            for k, c in launches(prog, _called(i, "body"), weights, inexact).items():
                out[k] += c * (n or 1)
        elif i.opcode == "call" and _called(i, "to_apply"):
            out.update(launches(prog, _called(i, "to_apply"), weights, inexact))
        elif i.opcode == "conditional":
            out[Kernel(i.name, "conditional", 0.0, 0.0, None)] += 1
            inner = [launches(prog, b, weights, inexact) for b in branches(i)]
            for w, b in zip(weights(i, [sum(b.values()) for b in inner]), inner):
                for k, c in b.items():
                    out[k] += c * w
        else:
            out[kernel(prog, i, table)] += 1
    return out


def summary(counts: Counter) -> dict:
    """Kernels by kind, bytes and FLOPs of a {Kernel: launches}."""
    by_kind: Counter = Counter()
    for k, c in counts.items():
        by_kind[k.kind] += c
    return {"kernels": round(sum(by_kind.values()), 2),
            "by_kind": {k: round(v, 2) for k, v in by_kind.most_common()},
            "bytes": sum(k.bytes * c for k, c in counts.items()),
            "flops": sum(k.flops * c for k, c in counts.items())}


def lightest(_: Instr, sizes: list[int]) -> list[float]:
    """Every conditional takes its branch of fewest kernels (a lower bound)."""
    return [1.0 if k == sizes.index(min(sizes)) else 0.0 for k in range(len(sizes))]


def loops(prog: Program, weights: Weights = heaviest) -> list[dict]:
    """One row per while loop of the program (nested ones too; `outer`: one of the entry
    computation's): one iteration of its body with the conditionals' branches as `weights`
    picks them (`summary`'s kernels, by kind, bytes, FLOPs), at their lightest and at their
    heaviest (`kernels_min`, `kernels_max`)."""
    out = []
    for comp, instrs in prog.comps.items():
        for i in instrs:
            if i.opcode != "while":
                continue
            body = _called(i, "body")
            inexact: list = []
            chosen = launches(prog, body, weights, inexact)
            out.append({"loop": i.name, "comp": comp, "outer": comp == prog.entry,
                        "body": body, "trip_count": trip_count(i),
                        "kernels_max": sum(launches(prog, body, heaviest).values()),
                        "kernels_min": sum(launches(prog, body, lightest).values()),
                        "exact": not inexact, **summary(chosen)})
    return out


def where(prog: Program, frame: int | None, keep: Callable[[str], bool]) -> str:
    """`file:function:line` of the innermost stack frame whose file `keep` accepts."""
    seen = set()
    while frame and frame in prog.frames and frame not in seen:
        seen.add(frame)
        file, fn, line, parent = prog.frames[frame]
        if keep(file):
            return f"{file}:{fn}:{line}"
        frame = parent
    return ""


def copy_sources(prog: Program, body: str, keep: Callable[[str], bool],
                 weights: Weights = heaviest) -> Counter:
    """The copies one iteration of loop body `body` launches (nested loops times their trips,
    branches by `weights`), by where they come from: `carried[i] SHAPE` where a copy reads or
    writes element i of a loop's carried tuple (a buffer XLA could not update in place; `in
    WHERE` for a loop nested in the step), else the function (`where`) of the copy, of its first
    reader or of what it copies, else the end of their jax name stack."""
    out: Counter = Counter()

    def label(i: Instr, table, readers, param, root, loop: str | None) -> str:
        src = table.get(i.operands[0]) if i.operands else None
        slot = None
        if loop is not None and src is not None and src.opcode == "get-tuple-element" \
                and src.operands == [param]:
            slot = re.search(r"index=(\d+)", src.attrs).group(1)
        elif loop is not None and root is not None and root.opcode == "tuple" \
                and i.name in root.operands:
            slot = str(root.operands.index(i.name))
        if slot is not None:
            return f"carried[{slot}] {i.shape.split('{')[0]}" + (f" in {loop}" if loop else "")
        near = [i] + readers.get(i.name, []) + ([src] if src is not None else [])
        for w in (where(prog, x.frame, keep) for x in near):
            if w:
                return w
        for x in near:
            m = re.search(r'op_name="([^"]+)"', x.attrs)
            if m:
                return "/".join(m.group(1).split("/")[-3:])
        return "(no metadata)"

    def visit(comp: str, mult: float, loop: str | None) -> None:
        instrs = prog.comps.get(comp, [])
        table = {i.name: i for i in instrs}
        param = next((i.name for i in instrs if i.opcode == "parameter"), None)
        root = next((i for i in instrs if i.root), None)
        readers: dict[str, list[Instr]] = {}
        for i in instrs:
            for o in i.operands:
                readers.setdefault(o, []).append(i)
        for i in instrs:
            if i.opcode == "while":
                visit(_called(i, "body"), mult * (trip_count(i) or 1),
                      where(prog, i.frame, keep) or "a nested loop")
            elif i.opcode == "call" and _called(i, "to_apply"):
                visit(_called(i, "to_apply"), mult, None)
            elif i.opcode == "conditional":
                names = branches(i)
                sizes = [sum(launches(prog, b, weights).values()) for b in names]
                for w, b in zip(weights(i, sizes), names):
                    if w:
                        visit(b, mult * w, None)
            elif i.opcode == "copy":
                out[label(i, table, readers, param, root, loop)] += mult

    visit(body, 1.0, "")
    return out
