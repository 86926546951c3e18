"""The package's layout holds: imports run one way, no cycles, files of one screen or three.

The core (``flashlib/*.py`` and ``flashlib/kernels/``) imports nothing from the subpackages above
it (``teach``, ``course``, ``bench``); no module imports another that imports it back, however
indirectly (imports inside functions count: they are arrows too); no file outside
``flashlib/kernels/`` is over 450 lines. No private name is imported across flashlib's modules,
no module global is assigned from outside its module, every name read from a flashlib module
(by the package, tests, benchmarks, probes and tools) exists there, and flashlib has no backslash
line continuations.
"""
import ast
import importlib
import io
import tokenize
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


# ---------------------------------------------------------------------------------------------
# names, switches and lines a reader (and a code tool following calls) can trust

ROOT = PACKAGE.parent
SCANNED = [*sorted(PACKAGE.rglob("*.py")), *sorted((ROOT / "tests").glob("*.py")),
           *sorted((ROOT / "benchmarks").glob("*.py"))]


def _package_of(path: Path):
    """The package a relative import in ``path`` starts from (None outside flashlib)."""
    if PACKAGE not in path.parents:
        return None
    name = _module_name(path)
    return name if path.name == "__init__.py" else name.rsplit(".", 1)[0]


def _from_module(node: ast.ImportFrom, package) -> str:
    if not node.level:
        return node.module or ""
    if package is None:
        return ""
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _module_aliases(path: Path, tree) -> dict:
    """Local names bound to flashlib modules in ``path`` (``from flashlib.kernels import launch``,
    ``from . import runtime``, ``import flashlib.ops as ops``, ``import flashlib``)."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "flashlib":
                    aliases[a.asname or "flashlib"] = a.name if a.asname else "flashlib"
        elif isinstance(node, ast.ImportFrom):
            module = _from_module(node, _package_of(path))
            for a in node.names:
                if module.split(".")[0] == "flashlib" and f"{module}.{a.name}" in MODULES:
                    aliases[a.asname or a.name] = f"{module}.{a.name}"
    return aliases


def _dotted(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return inner and f"{inner}.{node.attr}"
    return None


def _as_module(node, aliases):
    """The flashlib module ``node`` (a name or a dotted chain of them) stands for, else None."""
    name = _dotted(node)
    if not name:
        return None
    head, *rest = name.split(".")
    module = ".".join([aliases[head], *rest]) if head in aliases else None
    return module if module in MODULES else None


def _private_imports(path: Path, tree) -> list:
    """``from <another flashlib module> import _name`` lines of ``path``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = _from_module(node, _package_of(path))
            if module.split(".")[0] == "flashlib" and module != _module_name(path):
                found += [f"{path.relative_to(ROOT)}:{node.lineno} {a.name} from {module}"
                          for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_private_name_is_imported_across_modules():
    # `from .fa3_fwd import _descriptor` ties a module to another's internals: a name used
    # elsewhere is public (no underscore, a docstring)
    found = [line for path in sorted(PACKAGE.rglob("*.py"))
             for line in _private_imports(path, ast.parse(path.read_text()))]
    assert not found, "private names imported across modules:\n" + "\n".join(found)


def _outside_assignments(path: Path, tree) -> list:
    """``module.NAME = ...`` and ``setattr(module, ...)`` in ``path`` for flashlib modules."""
    aliases, found = _module_aliases(path, tree), []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            if node.args and _as_module(node.args[0], aliases):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} setattr({_dotted(node.args[0])}, ...)")
        flat = [t for target in targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
        found += [f"{path.relative_to(ROOT)}:{node.lineno} {_dotted(t)} = ..." for t in flat
                  if isinstance(t, ast.Attribute) and _as_module(t.value, aliases)]
    return found


def test_no_module_global_is_assigned_from_outside_its_module():
    # tuning switches are options passed in (runtime.KernelOptions), not globals others flip:
    # `fa3_fwd.FOLD_SCALE = False` or `setattr(launch, "ENABLED", ...)` in flashlib, the tests or
    # the benchmarks. (A test's monkeypatch, undone after it, may still stand in for a fact.)
    found = [line for path in SCANNED for line in _outside_assignments(path, ast.parse(path.read_text()))]
    assert not found, "module globals assigned from outside their module:\n" + "\n".join(found)


def _defined_at_top(module: str) -> set:
    """Names a flashlib module's source defines outside functions and classes, inside ``if`` and
    ``try`` blocks too (the Gluon kernels exist only where Gluon's Hopper API does)."""
    found, blocks = set(), [ast.parse(MODULES[module].read_text()).body]
    while blocks:
        for node in blocks.pop():
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                found.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    found |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
            elif isinstance(node, (ast.If, ast.Try)):
                blocks += [node.body, node.orelse, *(getattr(h, "body", []) for h in getattr(node, "handlers", []))]
    return found


def _missing_attributes(path: Path, tree) -> list:
    """``module.name`` and ``from module import name`` in ``path`` where the flashlib module has no
    ``name``, neither once imported nor in its source."""
    aliases, found = _module_aliases(path, tree), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (module := _as_module(node.value, aliases)):
            pairs = [(module, node.attr, node.lineno)]
        elif isinstance(node, ast.ImportFrom):
            module = _from_module(node, _package_of(path))
            pairs = [(module, a.name, node.lineno) for a in node.names if a.name != "*"
                     ] if module in MODULES else []
        else:
            continue
        for module, name, line in pairs:
            if (f"{module}.{name}" not in MODULES and not hasattr(importlib.import_module(module), name)
                    and name not in _defined_at_top(module)):
                found.append(f"{path.relative_to(ROOT)}:{line} {module}.{name}")
    return found


def test_every_name_read_from_a_flashlib_module_exists():
    # a rename that misses a caller fails here on a CPU, not later on a GPU machine (the decode
    # suite once called harness._time after it became time_ms); the GPU-only tests, benchmarks,
    # probes and tools are read, not run
    everywhere = [*SCANNED, *sorted((ROOT / "benchmarks" / "probes").glob("*.py")),
                  *sorted((ROOT / "tools").glob("*.py"))]
    found = [line for path in everywhere for line in _missing_attributes(path, ast.parse(path.read_text()))]
    assert not found, "names flashlib's modules do not have:\n" + "\n".join(found)


def _backslash_continuations(path: Path) -> list:
    text = path.read_text()
    in_string = set()   # lines that end inside a string (a docstring's backslash is text)
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.STRING:
            in_string.update(range(token.start[0], token.end[0]))
    return [n for n, line in enumerate(text.splitlines(), 1)
            if line.rstrip().endswith("\\") and n not in in_string and not line.lstrip().startswith("#")]


def test_no_backslash_continuations_in_flashlib():
    # a statement over several lines goes in brackets: tools that follow calls stop at a backslash
    found = {str(p.relative_to(ROOT)): lines for p in sorted(PACKAGE.rglob("*.py"))
             if (lines := _backslash_continuations(p))}
    assert not found, f"backslash continuations (file: lines): {found}"


def test_the_scans_see_what_they_look_for(tmp_path):
    """The scans above must be able to fail."""
    here = PACKAGE / "kernels" / "fa3_bwd.py"
    tree = ast.parse("from .fa3_fwd import _descriptor, tma_ok\nfrom .fa3_bwd import _own\n"
                     "from flashlib.kernels import launch\nimport flashlib\nlaunch.SUPPORTED = False\n"
                     "flashlib.runtime.OPTIONS, x = None, 1\nsetattr(launch, 'SUPPORTED', 1)\n"
                     "launch.SUPPORTED.x = 1\nctx.scale = 2\n")
    assert [line.split()[1:] for line in _private_imports(here, tree)] == [["_descriptor", "from",
                                                                            "flashlib.kernels.fa3_fwd"]]
    assert [line.split(" ", 1)[1] for line in _outside_assignments(here, tree)] == [
        "launch.SUPPORTED = ...", "flashlib.runtime.OPTIONS = ...", "setattr(launch, ...)"]
    renamed = ast.parse("from flashlib.bench import harness as bench\nbench._time(f)\nbench.time_ms(f)\n"
                        "from flashlib.kernels.fa3_bwd import _fa3_bwd_kernel, _no_such_kernel\n")
    assert sorted(line.split(" ", 1)[1] for line in _missing_attributes(here, renamed)) == [
        "flashlib.bench.harness._time", "flashlib.kernels.fa3_bwd._no_such_kernel"]
    continued = tmp_path / "continued.py"
    continued.write_text('x = 1 + \\\n    2\n"""a docstring\\\nwith a backslash"""\n# a comment \\\n')
    assert _backslash_continuations(continued) == [1]
