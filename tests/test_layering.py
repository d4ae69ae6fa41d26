"""The package layering, read from the sources' import statements: kernels import neither llm_jax
nor fused; llm_jax never imports fused;
the RL core (fused.rl) never imports the LLM glue, the text observations or the assembly above
it; text never imports the LLM glue; and no module imports another that imports it back."""

import ast
from pathlib import Path

from conftest import ROOT


def module_imports() -> dict[str, set[str]]:
    """{module: project modules it imports (at any depth of the file)}."""
    graph = {}
    for pkg in ("fused", "llm_jax", "kernels"):
        for path in (ROOT / pkg).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            deps = set()
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module:
                    deps.add(node.module)
                elif isinstance(node, ast.Import):
                    deps.update(a.name for a in node.names)
            graph[name] = {d for d in deps if d.split(".")[0] in ("fused", "llm_jax", "kernels")}
    return graph


def test_one_way_imports():
    graph = module_imports()
    assert "fused.rl.ppo" in graph and "kernels.prefix_attention" in graph
    rules = {  # importer prefix -> prefixes it must not import
        "kernels": ("fused", "llm_jax"),
        "llm_jax": ("fused",),
        "fused.envspec": ("fused.rl", "fused.text", "fused.llm", "fused.runs", "fused.agent",
                          "fused.online"),
        "fused.rl": ("fused.llm", "fused.text", "fused.agent", "fused.online", "fused.data"),
        "fused.text": ("fused.llm", "fused.agent", "fused.online", "fused.data"),
        "fused.llm": ("fused.agent", "fused.online", "fused.data"),
        "fused.runs": ("fused.rl", "fused.text", "fused.llm", "fused.agent", "fused.online",
                       "fused.data"),
    }
    bad = [(m, d) for m, deps in graph.items() for d in deps for src, banned in rules.items()
           if m.startswith(src) and d.startswith(banned)]
    assert not bad, bad


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
    assert Path(ROOT / "fused" / "rl" / "probes.py").exists()
