"""The layout the README promises, checked on the source: imports name the package, project imports
sit at the top of a module (none hidden in a function to dodge a cycle), and no module or top-level
folder imports itself back through another."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"models": "hyflash.models", "export": "hyflash.export", "runtime_py": "hyflash.runtime_py",
           "train": "hyflash.train", "hyflash": "hyflash"}
# imported inside a function on purpose, never to dodge a cycle: the eager backend pulls in torch and the
# models only when asked for; the CLI imports a command's modules when that command runs (a fast --help,
# and `hyflash memory` without ExecuTorch)
LAZY = {("hyflash.runtime_py.backends", "hyflash.runtime_py.eager")}
LAZY_IMPORTERS = ("hyflash.cli.",)


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
                       and not name.startswith(LAZY_IMPORTERS)]
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


# The layers, each importing only those before it: the models (and what every layer shares), the runtime,
# the exporter (which validates with the runtime's loop), training, then the app (the CLI, demo, inspect).
# hyflash/__init__.py holds only the version and may be imported by any layer.
LAYERS = ("hyflash.models", "hyflash.runtime_py", "hyflash.export", "hyflash.train", "app")


def layer(module: str) -> str:
    top = ".".join(module.split(".")[:2])
    return top if top in LAYERS else "app"


def test_layers_import_only_the_layers_before_them():
    """models <- runtime_py <- export <- train <- the app (hyflash/): export and the runtime never import
    training code; nothing imports the app."""
    wrong = []
    for mod, deps in import_graph().items():
        for dep in deps:
            if dep == "hyflash":
                continue
            if LAYERS.index(layer(dep)) > LAYERS.index(layer(mod)):
                wrong.append(f"{mod} -> {dep}")
    assert not wrong, wrong


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


MAX_FUNCTION_LINES = 60  # a function longer than this is probably two (the style guide's rule of thumb)
MAX_MODULE_LINES = 500


def test_functions_and_modules_stay_small():
    big = []
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            source = path.read_text()
            if source.count("\n") > MAX_MODULE_LINES:
                big.append(f"{path.relative_to(ROOT)}: {source.count(chr(10))} lines")
            for n in ast.walk(ast.parse(source)):
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = n.end_lineno - n.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        big.append(f"{path.relative_to(ROOT)}:{n.lineno} {n.name}: {lines} lines")
    assert not big, big


# paths made by commands, not committed: cited in docs as where a command writes
MADE = ("data/corpus", "data/chat/smollm2-regen", "docs/results/")
CITED = re.compile(r"(?<![\w./-])((?:models|export|runtime_py|train|tests|scripts|research|docs|data|runtime_cpp|"
                   r"hyflash|\.ci)/[\w./*{},-]*\w)")


def test_every_repository_path_cited_exists():
    """Paths named in the README, the docs, the research index and the product's code and build files."""
    sources = [ROOT / "README.md", ROOT / "Makefile", ROOT / "pyproject.toml", ROOT / "research" / "README.md",
               *(ROOT / "docs").glob("*.md"), *(ROOT / "runtime_cpp").rglob("*.[ch]*"),
               *(p for f in (*FOLDERS, "scripts", "tests") for p in (ROOT / f).rglob("*.py"))]
    missing = []
    for source in sources:
        for path in CITED.findall(source.read_text(errors="replace")):
            if "*" in path or "{" in path or path.startswith(MADE) or (ROOT / path).exists():
                continue
            if source.is_relative_to(ROOT / "research") and (ROOT / "research" / path).exists():
                continue  # the research index names its own folders relative to itself
            missing.append(f"{source.relative_to(ROOT)}: {path}")
    assert not missing, missing
