"""The package's import graph has no cycle, and its arrows only point down the layers
(CPU tier, static: nothing is imported).

Every ``import`` / ``from ... import`` counts, at module level and inside functions alike: a lazy
import still ties two modules together for a reader following the code. A package's
``__init__`` is not a module of its own here (importing ``pkg.sub`` runs it, but it holds no
code that imports back). Self-contained on purpose: CI's copy of the shared tools may differ.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG_DIR = Path(__file__).resolve().parent.parent / "sglang_fp4ext"


def module_files(pkg_dir: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``pkg_dir``."""
    mods = {}
    for f in sorted(pkg_dir.rglob("*.py")):
        parts = f.relative_to(pkg_dir.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = f
    return mods


def _imported(cur: str, node: ast.AST, mods: dict[str, Path]) -> set[str]:
    """The package modules one import statement of module ``cur`` names."""
    out = set()
    if isinstance(node, ast.Import):
        out = {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = cur.split(".")
            if mods[cur].name != "__init__.py":
                parts = parts[:-1]
            parts = parts[: len(parts) - (node.level - 1)]
            base = ".".join(parts + ([base] if base else []))
        # ``from pkg import sub`` imports the module pkg.sub; ``from mod import name`` only mod.
        out = {base} | {f"{base}.{a.name}" for a in node.names}
    return {m for m in out if m in mods}


def import_graph(pkg_dir: Path) -> dict[str, set[str]]:
    """Module -> the package modules it imports (any depth in the file), ``__init__``s left out."""
    mods = module_files(pkg_dir)
    graph = {}
    for name, f in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            deps |= _imported(name, node, mods)
        graph[name] = {d for d in deps if d != name and mods[d].name != "__init__.py"}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module, as a path
    ``[a, b, ..., a]`` (iterative Tarjan, then a walk inside the component)."""
    index, low, on, stack, comps = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(comp)
    cycles = []
    for comp in comps:
        # Breadth-first from the smallest name back to itself, staying inside the component.
        start = min(comp)
        prev, frontier = {}, [start]
        while start not in prev:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & comp):
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
            frontier = nxt
        path, v = [start], prev[start]
        while v != start:
            path.append(v)
            v = prev[v]
        cycles.append([start] + path[:0:-1] + [start])
    return sorted(cycles)


def test_package_has_no_import_cycle():
    graph = import_graph(PKG_DIR)
    assert len(graph) > 30, f"found only {len(graph)} modules under {PKG_DIR}"
    cycles = find_cycles(graph)
    assert not cycles, "import cycle(s) (module-level and lazy imports count):\n" + "\n".join(
        "  " + " -> ".join(c) for c in cycles
    )


#: The layers, lowest first: a module may import its own layer and the ones below, never one
#: above. Serving code (moe, serving) therefore never reaches bench or testing; it reaches the
#: tuner (tuning at a server's first start) but not its command line. A module is placed by its
#: longest listed prefix; every module must be placed.
LAYERS = (
    (
        "base",
        ("envs", "progress", "gpu_spec", "compare", "graph_timing", "patches", "sglang_hooks"),
    ),
    (
        "facts",
        (
            "target_info",
            "compat",
            "hardware_table",
            "hardware",
            "roofline",
            "projection",
            "shared_fusion",
            "model_shapes",
        ),
    ),
    ("nvfp4", ("nvfp4",)),
    ("moe", ("moe",)),
    ("tuning", ("timed_layer", "tune", "tune_record", "start_tune")),
    (
        "serving",
        (
            "capture_inputs",
            "capture_sizes",
            "capture_policy",
            "capture_hooks",
            "capture_tune",
            "sglang_weights",
            "sglang_backend",
            "plugin",
            "patch_check",
        ),
    ),
    ("tools", ("bench", "testing", "tune_cli")),
    ("cli", ("cli", "__main__")),
)


def layer_of(module: str, layers=LAYERS, root: str = "sglang_fp4ext") -> int | None:
    """Index in ``layers`` of ``module`` (dotted, with the package root), by longest prefix."""
    rel = module.removeprefix(root).lstrip(".")
    best, depth = None, -1
    for i, (_, prefixes) in enumerate(layers):
        for p in prefixes:
            if (rel == p or rel.startswith(p + ".")) and len(p) > depth:
                best, depth = i, len(p)
    return best


def climbing_arrows(graph: dict[str, set[str]], layers=LAYERS, root="sglang_fp4ext"):
    """``(importer, imported)`` pairs whose imported module sits in a higher layer."""
    return sorted(
        (a, b)
        for a, deps in graph.items()
        for b in deps
        if layer_of(b, layers, root) > layer_of(a, layers, root)
    )


def test_every_module_has_a_layer_and_no_arrow_climbs():
    graph = import_graph(PKG_DIR)
    unplaced = sorted(m for m in graph if m != "sglang_fp4ext" and layer_of(m) is None)
    assert not unplaced, f"modules in no layer (add them to LAYERS): {unplaced}"
    climbs = climbing_arrows({m: d for m, d in graph.items() if m != "sglang_fp4ext"})
    assert not climbs, "imports that climb a layer (module-level and lazy imports count):\n" + (
        "\n".join(
            f"  {a} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]})" for a, b in climbs
        )
    )


def test_layer_checker_finds_a_climbing_lazy_import(tmp_path):
    """The checker itself: a function-level import from a low layer into a high one is named; a
    downward import and one within a layer are not."""
    pkg = tmp_path / "pkg"
    (pkg / "moe").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "moe" / "__init__.py").write_text("")
    (pkg / "moe" / "selfcheck.py").write_text("def f():\n    from pkg.bench import make\n")
    (pkg / "moe" / "config.py").write_text("from pkg.moe import selfcheck\nimport pkg.envs\n")
    (pkg / "envs.py").write_text("")
    (pkg / "bench.py").write_text("from pkg.moe.config import X\n")
    layers = (("base", ("envs",)), ("moe", ("moe",)), ("tools", ("bench",)))
    graph = import_graph(pkg)
    assert layer_of("pkg.moe.selfcheck", layers, "pkg") == 1
    assert climbing_arrows(graph, layers, "pkg") == [("pkg.moe.selfcheck", "pkg.bench")]


def test_checker_sees_lazy_relative_and_from_package_imports(tmp_path):
    """The checker itself: a cycle closed by a function-level import, one through a relative
    import and ``from pkg import sub`` are found and named; a one-way import is not a cycle."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg import a\n")
    (pkg / "a.py").write_text("from pkg.b import X\n")
    (pkg / "b.py").write_text("X = 1\ndef f():\n    from pkg import a\n")
    (pkg / "c.py").write_text("from pkg.b import X\n")  # one way: no cycle
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "d.py").write_text("from . import e\n")
    (pkg / "sub" / "e.py").write_text("import pkg.sub.d\n")
    graph = import_graph(pkg)
    assert graph["pkg.c"] == {"pkg.b"} and "pkg" not in graph["pkg.a"]
    assert find_cycles(graph) == [
        ["pkg.a", "pkg.b", "pkg.a"],
        ["pkg.sub.d", "pkg.sub.e", "pkg.sub.d"],
    ]
