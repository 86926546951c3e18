"""Refusing borrowed answers: a learner's file that reaches for flashlib's own answer, or for
solutions/, is "not accepted: write it yourself (...)" instead of graded. Three looks:

- before it runs, on the parsed file (``borrowed``): flashlib beyond what the exercise's stub
  imports (``allowed_flashlib``), a string naming solutions/, or exec/eval/__import__/importlib/
  runpy/sys.modules;
- once loaded (``foreign``): a public function of the file that is flashlib's or comes from
  solutions/;
- while it runs (``tripwire``): flashlib's own answers to the exercise (the grader's
  FLASHLIB_ANSWERS) record any call made with the graded file on the stack, however it was reached.

Limits: these read names, files of definition and call stacks, so they stop a learner reusing the
answer, not one who pastes its text into the file. While a tripwire is set, the answers it names are
replaced in their modules (or classes) for the whole process. Untrusted work is graded by
``flashlib grade``, which also runs it in a confined process (``flashlib.course.sandbox``).
"""
import functools
import sys
import types
from pathlib import Path

_REFUSED_MODULES = {"importlib", "builtins", "ctypes", "gc", "runpy"}
_REFUSED_NAMES = {"__import__", "exec", "eval", "__builtins__"}


def flashlib_uses(tree) -> set:
    """Dotted names of flashlib a parsed file refers to: imports and attribute chains on them."""
    import ast

    bound, uses = {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "flashlib":
                    uses.add(alias.name)
                    name = alias.asname or alias.name.split(".")[0]
                    bound[name] = alias.name if alias.asname else "flashlib"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "flashlib":
            for alias in node.names:
                uses.add(f"{node.module}.{alias.name}")
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    chained = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts, base = [], node
            while isinstance(base, ast.Attribute):
                parts.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in bound:
                uses.add(".".join([bound[base.id], *reversed(parts)]))
                chained.add(id(base))
    for node in ast.walk(tree):   # the package itself passed around (getattr(flashlib, ...))
        if (isinstance(node, ast.Name) and bound.get(node.id) == "flashlib"
                and id(node) not in chained and isinstance(node.ctx, ast.Load)):
            uses.add("flashlib (as a value)")
    return uses


def _docstrings(tree):
    import ast

    nodes = [tree, *(n for n in ast.walk(tree)
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))]
    return {id(n.body[0].value) for n in nodes if n.body and isinstance(n.body[0], ast.Expr)}


def borrowed(tree, allowed) -> str | None:
    """Why a parsed file is not accepted (it reaches for the answer), or None. allowed: the
    dotted flashlib names the exercise's stub imports (its helpers); any other use of flashlib,
    a string naming solutions/, or exec/eval/__import__/importlib/runpy/sys.modules is refused."""
    import ast

    allowed = set(allowed)
    for use in sorted(flashlib_uses(tree), key=len, reverse=True):
        if use not in allowed and not any(use.startswith(a + ".") for a in allowed
                                          if a != "flashlib"):
            return f"uses {use}"
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found = {a.name.split(".")[0] for a in node.names} & _REFUSED_MODULES
        elif isinstance(node, ast.ImportFrom):
            found = {(node.module or "").split(".")[0]} & _REFUSED_MODULES
        else:
            found = set()
        if found:
            return f"imports {found.pop()}"
        if isinstance(node, ast.Name) and node.id in _REFUSED_NAMES:
            return f"uses {node.id}"
        if (isinstance(node, ast.Attribute) and node.attr == "modules"
                and isinstance(node.value, ast.Name) and node.value.id == "sys"):
            return "uses sys.modules"
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in docs and ("solutions/" in node.value or "solutions\\" in node.value
                                              or node.value == "solutions")):
            return "names solutions/"
    return None


def allowed_flashlib(grader, name, root) -> set:
    """What a learner's file may use of flashlib: the grader's FLASHLIB_ALLOWED (the stub's
    imports), else what the reference answer or the stub imports."""
    import ast

    declared = getattr(grader, "FLASHLIB_ALLOWED", None)
    if declared is not None:
        return set(declared)
    for folder in ("solutions", "exercises"):
        file = Path(root) / folder / f"{name}.py"
        if file.is_file():
            return flashlib_uses(ast.parse(file.read_text(encoding="utf-8")))
    return set()


def _origin(obj):
    """The source file a function (or a Triton kernel's function) was defined in, or None."""
    code = getattr(getattr(obj, "fn", obj), "__code__", None)
    return Path(code.co_filename).resolve() if code is not None else None


def foreign(module, allowed, root) -> str | None:
    """Why a loaded file is not accepted: one of its public functions is flashlib's (beyond the
    ``allowed`` helpers) or comes from solutions/; else None. Catches what hides from ``borrowed``."""
    package = Path(__file__).resolve().parents[1]   # flashlib/
    solutions = (Path(root) / "solutions").resolve()
    own = Path(module.__file__).resolve()
    for attr, obj in vars(module).items():
        where = None if attr.startswith("_") or isinstance(obj, types.ModuleType) else _origin(obj)
        if where is None or where == own:
            continue
        fn = getattr(obj, "fn", obj)
        dotted = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__name__', attr)}"
        if where.is_relative_to(solutions):
            return f"{attr} comes from solutions/{where.name}"
        if where.is_relative_to(package) and dotted not in allowed:
            return f"{attr} is flashlib's {dotted}"
    return None


NOT_ACCEPTED = "not accepted: write it yourself ({why})"


# A runtime tripwire for what ``borrowed`` and ``foreign`` cannot see (a name built from strings,
# pkgutil.resolve_name, getattr on a module found at run time): while a learner's function runs,
# flashlib's own answers to the exercise (the grader's FLASHLIB_ANSWERS, dotted names) are
# replaced by wrappers that record a call made with the graded file on the stack.
_ACTIVE = []       # (graded file, calls recorded) for each tripwire set


@functools.lru_cache(maxsize=4096)
def _resolved(filename) -> str:
    return str(Path(filename).resolve())


def _on_stack(file) -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if _resolved(frame.f_code.co_filename) == file:
            return True
        frame = frame.f_back
    return False


def _recording(original, dotted):
    def recorder(*args, **kwargs):
        for file, calls in list(_ACTIVE):
            if _on_stack(file):
                calls.append(dotted)
        return original(*args, **kwargs)

    recorder.__name__, recorder.__doc__ = original.__name__, original.__doc__
    recorder._flashlib_tripwire = True
    return recorder


def _owner(dotted, importlib):
    """(module or class, attribute) of a dotted name: the longest prefix that is a module, then
    attributes ("flashlib.decode.PagedKVCache.append": the class PagedKVCache, "append")."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:-1]:
            owner = getattr(owner, attr)
        return owner, parts[-1]
    raise ImportError(f"no module in {dotted}")


class tripwire:
    """``with tripwire(names, path) as calls:`` the functions ``names`` ("flashlib.teach.softmax.
    safe_softmax", ...) record in ``calls`` each call made from the file ``path`` (on the stack)."""

    def __init__(self, names, path):
        self.names, self.path, self.calls, self._undo = tuple(names or ()), path, [], []

    def __enter__(self):
        import importlib

        if not self.names or self.path is None:
            return self.calls
        for dotted in self.names:
            owner, attr = _owner(dotted, importlib)
            original = getattr(owner, attr)
            if not getattr(original, "_flashlib_tripwire", False):
                setattr(owner, attr, _recording(original, dotted))
                self._undo.append((owner, attr, original))
        self._entry = (str(Path(self.path).resolve()), self.calls)
        _ACTIVE.append(self._entry)
        return self.calls

    def __exit__(self, *exc):
        if self.names and self.path is not None:
            _ACTIVE.remove(self._entry)
        for owner, attr, original in reversed(self._undo):
            setattr(owner, attr, original)
        return False


def answers(check_fn) -> tuple:
    """flashlib's own answers to the exercise a check belongs to: its grader's FLASHLIB_ANSWERS."""
    return tuple(getattr(check_fn, "__globals__", {}).get("FLASHLIB_ANSWERS", ()))


def tripped(calls) -> str:
    """The verdict on a file whose code called flashlib's own answer (``calls``: a tripwire's)."""
    return NOT_ACCEPTED.format(why=f"calls {calls[0]}, flashlib's own answer")
