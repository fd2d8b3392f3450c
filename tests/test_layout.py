"""The layout the README promises, checked on the source: imports name the package, project imports
sit at the top of a module (none hidden in a function to dodge a cycle), and no module or top-level
folder imports itself back through another."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"models": "hyflash.models", "export": "hyflash.export", "runtime_py": "hyflash.runtime_py",
           "train": "hyflash.train", "hyflash": "hyflash"}
# imported inside a function on purpose, never to dodge a cycle: the eager backend pulls in torch and the
# models only when asked for; the CLI imports a command's modules when that command runs (a fast --help,
# and `hyflash memory` without ExecuTorch)
LAZY = {("hyflash.runtime_py.backends", "hyflash.runtime_py.eager")}
LAZY_IMPORTERS = {"hyflash.cli"}


def modules() -> dict[str, ast.Module]:
    out = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            out[name] = ast.parse(path.read_text(), str(path))
    return out


def project_imports(node: ast.AST) -> list[str]:
    """The hyflash modules an Import/ImportFrom node names (`from hyflash.x import y` may name module x.y)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "hyflash"]
    if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "hyflash":
        return [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return []


def test_imports_name_the_package():
    relative = [f"{name}: from {'.' * n.level}{n.module or ''}" for name, tree in modules().items()
                for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]
    assert not relative, relative


def test_project_imports_are_at_module_top():
    mods = modules()
    hidden = []
    for name, tree in mods.items():
        top = set(tree.body)
        for n in ast.walk(tree):
            if n in top or not isinstance(n, (ast.Import, ast.ImportFrom)):
                continue
            hidden += [f"{name} -> {m}" for m in project_imports(n) if m in mods and (name, m) not in LAZY
                       and name not in LAZY_IMPORTERS]
    assert not hidden, hidden


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: {m for n in tree.body for m in project_imports(n) if m in mods and m != name}
            for name, tree in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path + [node, nxt]
            if nxt not in state:
                found = visit(nxt, path + [node])
                if found:
                    return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


def test_no_module_import_cycles():
    assert find_cycle(import_graph()) is None, find_cycle(import_graph())


def test_no_folder_import_cycles():
    """Folders depend one way: models <- train <- runtime_py <- export <- the CLI (hyflash/).
    hyflash/__init__.py (only the version) is a leaf of its own."""
    def folder(module: str) -> str:
        return "hyflash.__init__" if module == "hyflash" else ".".join(module.split(".")[:2])

    graph: dict[str, set[str]] = {}
    for mod, deps in import_graph().items():
        graph.setdefault(folder(mod), set()).update(folder(d) for d in deps if folder(d) != folder(mod))
    assert find_cycle(graph) is None, find_cycle(graph)
    assert "hyflash.runtime_py" not in graph["hyflash.models"] and "hyflash.export" not in graph["hyflash.runtime_py"]


def test_no_positional_graph_feeds():
    """Graphs are fed and read by name: no list of inputs passed to a session or method by position
    outside the one place that turns names into a method's argument list (backends.py)."""
    offenders = []
    for name, tree in modules().items():
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("run", "execute"):
                if n.args and isinstance(n.args[0], (ast.List, ast.ListComp)) and name != "hyflash.runtime_py.backends":
                    offenders.append(name)
    assert not offenders, offenders
