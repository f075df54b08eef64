"""The house's shape: layers point down, no import cycles, modules stay small.

Imports are read from the source (module level and inside functions alike: a function-level
import does not make a cycle go away). ARCHITECTURE.md's layer table is this file's LAYERS.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Low to high: a module may import its own layer or any lower one.
LAYERS: list[tuple[str, ...]] = [
    ("commlab.errors", "commlab._config", "commlab._interpreter"),  # base
    ("commlab.runtime",),  # runtime
    ("commlab.language", "commlab.trace"),  # device language, spans
    ("commlab.collectives", "commlab.overlap"),  # collectives
    # observe, measure, torch integration, checking, and the facade beside them
    ("commlab.topology", "commlab.tuning", "commlab.costmodel", "commlab.widgets",
     "commlab.bench", "commlab.testing", "commlab.demo", "commlab.torch_backend",
     "commlab.racecheck", "commlab.elastic", "commlab"),
    ("commlab.engine",),  # notebook engine
    ("commlab.magics",),  # magics (the top-level magics/ folder)
]

# Imports that run against the layers on purpose; each is named in ARCHITECTURE.md.
# (importer, imported): reason
ALLOWED_UPWARD: dict[tuple[str, str], str] = {
    ("commlab", "commlab.magics"): "IPython looks for load_ipython_extension on the package "
                                   "`%load_ext commlab` names; imported only when it is called",
}

MAX_LINES = 450  # "modules of a few hundred lines"


def _source_files() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for base, pkg in ((ROOT / "commlab", "commlab"), (ROOT / "magics", "commlab.magics")):
        for p in base.rglob("*.py"):
            rel = p.relative_to(base).with_suffix("").parts
            name = ".".join((pkg, *rel))
            mods[name.removesuffix(".__init__")] = p
    return mods


MODULES = _source_files()


def _resolve(importer: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".") if is_pkg else importer.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(name: str, path: Path) -> list[tuple[str, int]]:
    """(imported commlab module, line) for every import in the file, at any depth."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = _resolve(name, path.name == "__init__.py", node)
            for a in node.names:
                sub = f"{mod}.{a.name}"
                out.append((sub if sub in MODULES else mod, node.lineno))
    return [(m, line) for m, line in out if m == "commlab" or m.startswith("commlab.")]


def _known(mod: str) -> str:
    """The longest prefix of mod that is a module of the tree."""
    while mod not in MODULES and "." in mod:
        mod = mod.rsplit(".", 1)[0]
    return mod


def _layer(mod: str) -> int:
    best, rank = -1, -1
    for i, names in enumerate(LAYERS):
        for n in names:
            # the root facade is one module, not a prefix of every other
            under = mod.startswith(n + ".") and n != "commlab"
            if (mod == n or under) and len(n) > best:
                best, rank = len(n), i
    return rank


def _graph() -> dict[str, set[tuple[str, int]]]:
    g: dict[str, set[tuple[str, int]]] = {}
    for name, path in MODULES.items():
        g[name] = {(_known(m), line) for m, line in _imports(name, path)}
        g[name].discard((name, 0))
    return g


GRAPH = _graph()


def test_every_module_has_a_layer():
    missing = sorted(m for m in MODULES if _layer(m) < 0)
    assert not missing, f"modules outside every layer (add them to LAYERS): {missing}"


def test_lower_layers_never_import_higher_ones():
    bad = []
    for mod, deps in GRAPH.items():
        for dep, line in deps:
            if mod.startswith(dep + ".") or dep == mod:
                continue  # a package's own __init__ runs first anyway
            if _layer(dep) > _layer(mod) and (mod, dep) not in ALLOWED_UPWARD:
                bad.append(f"{MODULES[mod].relative_to(ROOT)}:{line} {mod} -> {dep}")
    assert not bad, "imports that point up a layer:\n" + "\n".join(sorted(bad))


def test_the_allowed_upward_imports_are_few_and_used():
    assert len(ALLOWED_UPWARD) <= 3
    for (mod, dep) in ALLOWED_UPWARD:
        assert any(d == dep for d, _ in GRAPH.get(mod, ())), f"{mod} -> {dep} is not used"


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def edges(v):
        # `import commlab.x` also runs commlab/__init__; that edge is Python's, not ours.
        return [d for d, _ in GRAPH.get(v, ()) if d in GRAPH and d != v
                and not v.startswith(d + ".")]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def test_there_are_no_import_cycles():
    cycles = _cycles()
    assert not cycles, "import cycles (module or function level):\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_stay_small(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{MODULES[name].relative_to(ROOT)} has {lines} lines; split it"


def test_ranks_never_import_ipython():
    """commlab's core (everything below the engine) never imports IPython."""
    bad = []
    engine = LAYERS.index(("commlab.engine",))
    for name, path in MODULES.items():
        if _layer(name) >= engine or name.startswith("commlab.widgets"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{name}:{node.lineno}" for m in mods if m.split(".")[0] == "IPython"]
    assert not bad, f"IPython imported below the engine: {bad}"
