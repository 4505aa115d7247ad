"""The core's layering: no import loop, the allowed directions, short functions.

Every rule reads the source (``ast``), so a function-level import counts as
much as a top-level one. Imports under ``if TYPE_CHECKING:`` never run: the
direction rules leave them out (they are how an annotation names a type of a
higher layer), but they may not close a loop either.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "kvcore"

#: Longest function allowed in ``kvcore/``, in lines of code (its docstring,
#: the contract a caller reads, is not counted).
MAX_FUNCTION_LINES = 80
#: Functions that are argument tables, one ``add_argument`` after the other.
ARGUMENT_TABLES = {("kvcore/_cli", "add_parser")}

#: Layers of the core, by module prefix; see the architecture page.
LAYERS = {
    "pool": ("kvcore._block_pool", "kvcore._blocks", "kvcore._eviction", "kvcore.eviction"),
    "managers": (
        "kvcore.managers",
        "kvcore._coordinator",
        "kvcore._hits",
        "kvcore._kv_cache_manager",
    ),
    "plugin system": (
        "kvcore._registry",
        "kvcore._hook_collection",
        "kvcore._plugin_loader",
        "kvcore._contract",
        "kvcore.hookspecs",
        "kvcore._kv_formats",
    ),
    "planning": ("kvcore._planning", "kvcore.planning"),
    "execution": ("kvcore.reference", "kvcore.executor", "kvcore._exec"),
    "fleet": ("kvcore.cluster",),
    "simulator": ("kvcore._sim",),
}
#: (layer, layer it must never import, why).
NEVER = [
    ("pool", "managers", "the pool serves managers, never calls them"),
    ("pool", "plugin system", "the pool knows no plugin system: policies are injected"),
    ("pool", "planning", "the pool knows no planning"),
    ("plugin system", "planning", "hooks declare what planning calls; planning imports them"),
    ("plugin system", "execution", "the registry knows no executor"),
    ("planning", "simulator", "planning knows no simulator"),
    ("managers", "fleet", "one engine knows no fleet"),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(path): path for path in CORE.rglob("*.py")}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _run_time_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node that can run, skipping the bodies of ``if TYPE_CHECKING:``."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                todo.extend(child.orelse)
            else:
                todo.append(child)


def _known(name: str) -> str | None:
    """The module of ``kvcore/`` that importing ``name`` runs (longest known prefix)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, *, annotations: bool = False) -> list[tuple[str, int]]:
    """The kvcore modules ``module`` imports at run time, with the line of each import.

    ``annotations``: also those under ``if TYPE_CHECKING:``.
    """
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree) if annotations else _run_time_nodes(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names]
            targets = [t if t in MODULES else base for t in targets]
        else:
            continue
        for target in targets:
            if target.split(".")[0] != "kvcore":
                continue
            known = _known(target)
            if known is not None and known != module:
                found.append((known, node.lineno))
    return found


def import_graph(*, annotations: bool = False) -> dict[str, list[tuple[str, int]]]:
    return {module: imports_of(module, annotations=annotations) for module in MODULES}


def cycles(graph: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target, _ in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def describe(component: list[str], graph: dict[str, list[tuple[str, int]]]) -> str:
    members = set(component)
    edges = [
        f"  {MODULES[source].relative_to(REPO)}:{line} imports {target}"
        for source in component
        for target, line in graph[source]
        if target in members
    ]
    return "\n".join(edges)


def test_the_core_has_no_import_loop():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import loops in kvcore/:\n" + "\n\n".join(
        describe(component, graph) for component in found
    )


def test_not_even_annotation_imports_close_a_loop():
    """An annotation-only import may name a higher layer, but none closes a loop."""
    graph = import_graph(annotations=True)
    found = cycles(graph)
    assert not found, "import loops in kvcore/, counting TYPE_CHECKING imports:\n" + "\n\n".join(
        describe(component, graph) for component in found
    )


def test_the_cycle_finder_sees_function_level_imports():
    """A loop closed by an import inside a function is a loop (and one under TYPE_CHECKING not)."""
    source = "def later():\n    from kvcore.b import x\n"
    tree = ast.parse(source)
    assert any(isinstance(node, ast.ImportFrom) for node in _run_time_nodes(tree))
    guarded = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kvcore.b import x\n"
    tree = ast.parse(guarded)
    found = [n for n in _run_time_nodes(tree) if isinstance(n, ast.ImportFrom)]
    assert [n.module for n in found] == ["typing"]
    graph = {"a": [("b", 2)], "b": [("c", 1)], "c": [("a", 5)], "d": [("a", 1)]}
    assert cycles(graph) == [["a", "b", "c"]]


def layer_of(module: str) -> str | None:
    for layer, prefixes in LAYERS.items():
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return layer
    return None


@pytest.mark.parametrize(
    ("layer", "forbidden", "why"), NEVER, ids=[f"{a}-{b}" for a, b, _ in NEVER]
)
def test_a_layer_never_imports_a_layer_it_must_not(layer, forbidden, why):
    graph = import_graph()
    broken = [
        f"{MODULES[source].relative_to(REPO)}:{line} imports {target}"
        for source, targets in graph.items()
        if layer_of(source) == layer
        for target, line in targets
        if layer_of(target) == forbidden
    ]
    assert not broken, f"{why}:\n" + "\n".join(broken)


def _docstring_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    first = node.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return (first.end_lineno or first.lineno) - first.lineno + 1
    return 0


def long_functions(root: Path, limit: int, base: Path = REPO) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        folder = str(path.parent.relative_to(base))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            length = (node.end_lineno or node.lineno) - node.lineno + 1 - _docstring_lines(node)
            if length > limit and (folder, node.name) not in ARGUMENT_TABLES:
                found.append(f"{path.relative_to(base)}:{node.lineno} {node.name}: {length} lines")
    return found


def test_no_function_of_the_core_is_longer_than_a_screen():
    found = long_functions(CORE, MAX_FUNCTION_LINES)
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(found)


def test_the_length_check_counts_code_not_the_docstring(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(85))
    doc = '    """' + "\n" * 100 + '    """'
    short = "\n".join(f"    y{i} = {i}" for i in range(70))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n\ndef documented():\n{doc}\n{short}\n")
    assert long_functions(tmp_path, MAX_FUNCTION_LINES, tmp_path) == ["long.py:1 long: 86 lines"]
