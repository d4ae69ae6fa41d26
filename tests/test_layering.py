"""The package layering, read from the sources' import statements: kernels import neither llm_jax
nor fused; llm_jax never imports fused; the pure core (fused.envspec, fused.errors, fused.rl)
imports nothing of the LLM, the text observations, datasets, run machinery or the commands above
it, and importing its PPO module loads no llm_jax; text never imports the LLM glue; and no
module imports another that imports it back."""

import ast
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

PACKAGES = ("fused", "llm_jax", "kernels")


def module_names() -> set[str]:
    return {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def module_imports() -> dict[str, set[str]]:
    """{module: project modules it imports (at any depth of the file)}. `from pkg import mod`
    counts as importing pkg.mod where that is a module, and pkg otherwise."""
    names = module_names()
    graph = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            graph[name] = imports_of(path.read_text(), names)
    return graph


def imports_of(source: str, names: set[str]) -> set[str]:
    """Imports that run: those under `if TYPE_CHECKING:` (annotations only) are left out."""
    tree = ast.parse(source)
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and getattr(block.test, "id", None) == "TYPE_CHECKING"
                   for n in ast.walk(block)}
    deps = set()
    for node in (n for n in ast.walk(tree) if id(n) not in typing_only):
        if isinstance(node, ast.ImportFrom) and node.module:
            subs = {f"{node.module}.{a.name}" for a in node.names} & names
            deps.update(subs | ({node.module} if len(subs) < len(node.names) else set()))
        elif isinstance(node, ast.Import):
            deps.update(a.name for a in node.names)
    return {d for d in deps if d.split(".")[0] in PACKAGES}


def test_from_package_import_module_is_an_edge_to_the_module():
    names = module_names()
    assert imports_of("from fused.runs import config_io", names) == {"fused.runs.config_io"}
    assert imports_of("from fused.rl import acting, nothing_here", names) == {
        "fused.rl.acting", "fused.rl"}
    assert imports_of("from llm_jax.loader import resolve_folder", names) == {"llm_jax.loader"}


def test_one_way_imports():
    graph = module_imports()
    assert "fused.rl.ppo" in graph and "kernels.prefix_attention" in graph
    rules = {  # importer prefix -> prefixes it must not import
        "kernels": ("fused", "llm_jax"),
        "llm_jax": ("fused",),
        "fused.envspec": ("fused.rl", "fused.text", "fused.llm", "fused.runs", "fused.agent"),
        "fused.errors": ("fused.", "llm_jax"),
        "fused.rl": ("fused.llm", "fused.text", "fused.agent", "fused.data", "fused.runs",
                     "fused.trained_policy", "fused.video", "llm_jax"),
        "fused.text": ("fused.llm", "fused.agent", "fused.data"),
        "fused.llm": ("fused.agent", "fused.data"),
        "fused.runs": ("fused.rl", "fused.text", "fused.llm", "fused.agent", "fused.data"),
    }
    bad = [(m, d) for m, deps in graph.items() for d in deps for src, banned in rules.items()
           if m.startswith(src) and d.startswith(banned)]
    # the commands sit on top: no library module imports one
    bad += [(m, d) for m, deps in graph.items() for d in deps
            if d.startswith("fused.commands") and not m.startswith("fused.commands")]
    assert not bad, bad


def test_importing_the_core_loads_no_llm_code():
    """The import statements above miss what a module loads indirectly: ask Python."""
    code = ("import sys, fused.rl.ppo, fused.rl.trainer, fused.rl.collect, fused.rl.evaluate, "
            "fused.rl.awr, fused.rl.sharding; "
            "print(sorted(m for m in sys.modules if m.startswith(('llm_jax', 'fused.llm', "
            "'fused.text', 'fused.data', 'fused.runs', 'fused.commands'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]", out


def test_no_import_cycles():
    graph = module_imports()

    def resolve(d):  # "fused.rl" (a package) -> its __init__ module, which is empty
        return d if d in graph else None

    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(m, path):
        state[m] = 1
        for d in filter(None, map(resolve, graph[m])):
            assert state.get(d) != 1, " -> ".join(path + [m, d])
            if d not in state:
                visit(d, path + [m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [])
    assert Path(ROOT / "fused" / "rl" / "diagnostic_envs.py").exists()
