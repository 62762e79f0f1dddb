"""The layout rules of docs/architecture.md, checked on the source: imports run one way,
no import inside a function dodges a cycle, the generic layers know no environment, and no
function grows past 80 lines of its own or 6 positional parameters."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Layers, lowest first: a module may import its own layer's package and lower layers only.
LAYERS = (
    ("rlagent._checks", "rlagent._recurrence", "rlagent.advantages", "rlagent.returns",
     "rlagent.losses", "rlagent.types", "rlagent.parallel", "rlagent"),
    ("rlagent.envs", "rlagent.models"),
    ("rlagent.rollout",),
    ("rlagent.train",),
    ("rlagent.credit",),
    ("rlagent.prm",),
    ("rlagent.preference",),
    ("rlagent.pipeline", "rlagent.host", "rlagent.analysis", "rlagent.text"),
)  # fmt: skip
# Packages whose modules may not import each other though they share a layer.
SIBLINGS = {"rlagent.envs": "rlagent.models", "rlagent.models": "rlagent.envs"}
# Generic layers: they must work with any environment of rlagent.envs.base.
GENERIC = (
    "rlagent.rollout", "rlagent.train", "rlagent.credit", "rlagent.prm", "rlagent.preference",
    "rlagent.host",
)  # fmt: skip
# Optional or heavy outside packages that may be imported where they are used.
LAZY_OK = ("matplotlib", "rliable", "scipy", "tensorboardX", "textarena", "transformers", "torch")
MAX_LINES, MAX_POSITIONAL = 80, 6


def _modules():
    for path in sorted((ROOT / "rlagent").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, ast.parse(path.read_text(), str(path))


def _layer(module: str) -> int:
    best = None
    for index, layer in enumerate(LAYERS):
        for prefix in layer:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > len(best[1]):
                    best = (index, prefix)
    assert best is not None, f"{module} is in no layer of tests/test_layout.py"
    return best[0]


def _imports(tree):
    """(module imported, inside a function) for every rlagent import of a module."""
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    inner = {id(c) for f in functions for c in ast.walk(f) if c is not f}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
            yield node.module, names, id(node) in inner
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, [alias.name], id(node) in inner


def _package(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else name


MODULES = list(_modules())


@pytest.mark.parametrize("name,tree", MODULES, ids=[name for name, _ in MODULES])
def test_imports_run_one_way_and_at_the_top(name, tree):
    for module, names, deferred in _imports(tree):
        root = module.split(".")[0]
        if deferred:
            assert root in LAZY_OK, f"{name} imports {module} inside a function"
        if root != "rlagent":
            continue
        target = max(names, key=len) if module == "rlagent" else module
        assert _layer(target) <= _layer(name), f"{name} imports {target} (a higher layer)"
        assert SIBLINGS.get(_package(name)) != _package(target), f"{name} imports {target}"
        if name.startswith(GENERIC):
            assert not target.startswith("rlagent.envs.toolworld"), f"{name} imports {target}"


def _own_lines(node) -> int:
    def nested(n):
        for child in ast.iter_child_nodes(n):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                yield child
            else:
                yield from nested(child)

    total = node.end_lineno - node.lineno + 1
    return total - sum(c.end_lineno - c.lineno + 1 for c in nested(node))


def test_functions_are_short_and_take_few_positional_parameters():
    paths = sorted((ROOT / "rlagent").rglob("*.py")) + sorted((ROOT / "experiments").rglob("*.py"))
    problems = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"
            positional = [a.arg for a in node.args.posonlyargs + node.args.args]
            positional = [a for a in positional if a not in ("self", "cls")]
            if len(positional) > MAX_POSITIONAL:
                problems.append(f"{where}: {len(positional)} positional parameters")
            if _own_lines(node) > MAX_LINES:
                problems.append(f"{where}: {_own_lines(node)} lines")
    assert not problems, "\n".join(problems)
