"""The copy of flashlib a graded student's process sees: the exercise's answers removed from the files.

``flashlib_copy(dest, answers)`` copies the flashlib package (source files only: no
``__pycache__``, no bytecode, which would still hold the answers) and rewrites, in the copy,
each function named by ``answers`` (a grader's FLASHLIB_ANSWERS, dotted names; a
``@triton.jit`` function or a class's method too): its signature and docstring stay, its body
becomes a ``raise RuntimeError`` saying the answer is removed. A name may reach a function through
a module that imports it (``flashlib.kernels.decode.attend_key_blocks``): the function goes where
it is defined. Re-executing the copy's source, reading it, or reloading a module therefore finds
nothing to borrow. ``answer_names(grader_text)`` reads a grader's FLASHLIB_ANSWERS without running
it; ``resolve`` finds what a name names.

Limits: only the named functions go (a grader that names too few leaves the rest); the copy is
made once per exercise per grading run and must be readable by the sandbox's user (mode 0755).
"""
import ast
import importlib
import inspect
import os
import shutil
import types
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]          # flashlib/


def answer_names(grader_text: str) -> tuple:
    """A grader's FLASHLIB_ANSWERS (a literal tuple of dotted names), read from its source."""
    for node in ast.parse(grader_text).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and
                                                t.id == "FLASHLIB_ANSWERS" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    return ()


def resolve(dotted):
    """The object a dotted name names: a module's attribute, or a class's
    ("flashlib.decode.PagedKVCache.append"); None if there is none."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):              # the longest prefix that is a module
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr, None)
        return obj
    return None


def _definition(dotted):
    """(file, name, first line of the def) where a dotted flashlib function is defined, or None."""
    obj = resolve(dotted)
    while obj is not None and not isinstance(obj, types.FunctionType) and hasattr(obj, "fn"):
        obj = obj.fn                                   # a @triton.jit function
    obj = inspect.unwrap(obj) if isinstance(obj, types.FunctionType) else None
    if obj is None:
        return None
    return Path(obj.__code__.co_filename).resolve(), obj.__name__, obj.__code__.co_firstlineno


def _removed(text, name, firstlineno, dotted):
    """``text`` with the body of the function ``name`` defined at ``firstlineno`` (its first
    decorator's line, if any) replaced."""
    tree = ast.parse(text)
    lines = text.splitlines(True)
    found = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
             and n.name == name and min([n.lineno] + [d.lineno for d in n.decorator_list])
             == firstlineno]
    if len(found) != 1:
        raise LookupError(f"cannot find the definition of {dotted}")
    for node in sorted(found, key=lambda n: n.lineno, reverse=True):
        body = node.body
        keep = 1 if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                     and isinstance(body[0].value.value, str)) else 0
        first = body[keep] if keep < len(body) else None
        start = (first.lineno if first is not None else body[-1].end_lineno + 1) - 1
        indent = " " * (body[0].col_offset)
        message = (f"{dotted} is flashlib's own answer to an exercise: it is removed from the copy "
                   "of flashlib that graded files see; write it yourself")
        lines[start:node.end_lineno] = [f"{indent}raise RuntimeError({message!r})\n"]
    return "".join(lines)


def flashlib_copy(dest, answers) -> Path:
    """A copy of the flashlib package at ``dest``/flashlib with ``answers`` removed; returns it."""
    target = Path(dest) / "flashlib"
    shutil.copytree(PACKAGE, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
    todo = {}
    for dotted in answers:
        if dotted.split(".")[0] != "flashlib":
            continue
        found = _definition(dotted)
        if found is None or not found[0].is_relative_to(PACKAGE):
            raise LookupError(f"cannot find {dotted}, a grader's FLASHLIB_ANSWERS entry")
        todo.setdefault(found[0], {})[found[2]] = (found[1], dotted)
    for source, functions in todo.items():
        file = target / source.relative_to(PACKAGE)
        text = file.read_text(encoding="utf-8")
        for line in sorted(functions, reverse=True):          # later ones first: lines stay put
            text = _removed(text, functions[line][0], line, functions[line][1])
        file.write_text(text, encoding="utf-8")
    for folder, dirs, names in os.walk(dest):
        os.chmod(folder, 0o755)
        for name in names:
            os.chmod(os.path.join(folder, name), 0o644)
    return target
