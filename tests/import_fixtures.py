"""The package's import graph, read with ``ast`` from every module under src/scalelong (nothing is
imported): what tests/product/test_imports.py checks, and what other tests read one module's imports
from."""

import ast
from pathlib import Path

import scalelong

ROOT = "scalelong"
SOURCE = Path(scalelong.__file__).parent


def module_names() -> dict[str, Path]:
    names = {}
    for path in sorted(SOURCE.rglob("*.py")):
        parts = [ROOT, *path.relative_to(SOURCE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imported(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The package's modules that ``source`` (the text of ``module``) imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package that holds ``module``
                package = module.split(".") if is_package else module.split(".")[:-1]
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    edges = set()
    for name in found:
        parts = name.split(".")
        # importing a.b.c runs a.b first (the root package's re-exports aside)
        edges.update(".".join(parts[:i]) for i in range(2, len(parts) + 1))
    # a module's own packages have started importing before its first line runs: no edge to them
    parts = module.split(".")
    own_packages = {".".join(parts[:i]) for i in range(1, len(parts))}
    return {e for e in edges if e in known and e != module and e not in own_packages}


def import_graph() -> dict[str, set[str]]:
    names = module_names()
    known = set(names)
    return {
        name: imported(path.read_text(), name, path.name == "__init__.py", known)
        for name, path in names.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None."""
    state: dict[str, str] = {}  # "open" while on the stack, "done" after
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None
