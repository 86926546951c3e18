"""The package's layout holds: imports run one way, no cycles, files of one screen or three.

The core (``flashlib/*.py`` and ``flashlib/kernels/``) imports nothing from the subpackages above
it (``teach``, ``course``, ``bench``); no module imports another that imports it back, however
indirectly (imports inside functions count: they are arrows too); no file outside
``flashlib/kernels/`` is over 450 lines.
"""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "flashlib"
UPPER = ("teach", "course", "bench")
MAX_LINES = 450


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """flashlib modules ``path`` imports (absolute or relative, at any depth of the code)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "flashlib"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "flashlib":
                continue
            for alias in node.names:   # `from . import x` imports the module x
                candidate = f"{module}.{alias.name}"
                found.add(candidate if _exists(candidate) else module)
    return found - {name}


def _exists(module: str) -> bool:
    path = PACKAGE.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
GRAPH = {name: {m for m in _imports(p) if m in MODULES} for name, p in MODULES.items()}


def test_the_core_imports_nothing_above_it():
    upward = [(name, m) for name, deps in GRAPH.items() for m in deps
              if name.split(".")[1:2] not in ([u] for u in UPPER) and m.split(".")[1:2] in
              ([u] for u in UPPER)]
    assert not upward, f"core modules importing teach/course/bench: {upward}"


def test_no_import_cycles():
    state, stack, cycles = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(GRAPH):
        if node not in state:
            visit(node)
    # a package's __init__ importing its own submodules is its face, not a cycle
    real = [c for c in cycles if not any(a == b.rsplit(".", 1)[0] or b == a.rsplit(".", 1)[0]
                                         for a, b in zip(c, c[1:]))]
    assert not real, "import cycles: " + "; ".join(" -> ".join(c) for c in real)


def test_files_fit_in_three_screens():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if "kernels" not in p.parts and (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines outside flashlib/kernels/: {long}"


def test_the_graph_sees_known_arrows():
    """The test above is only as good as the graph: it must see arrows that exist."""
    assert "flashlib.inputs" in GRAPH["flashlib.ops"]
    assert "flashlib.course.grading" in GRAPH["flashlib.course.self_check"]
    assert "flashlib.kernels.fa2_fwd" in GRAPH["flashlib.kernels.block_sparse"]
    assert "flashlib.inputs" in GRAPH["flashlib.kernels.fa1"]          # imported inside a function
