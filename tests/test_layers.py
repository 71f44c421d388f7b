"""The house stays standing: the import contracts of .importlinter hold
(layers point down; wire formats, the planner and values start no process
and open no database; SQL only under refstore/), no import cycle exists
among aspen_cgi's modules, counting the imports made inside functions,
ruff finds nothing (pyproject.toml's rules), mypy --strict finds nothing
in model/, protocol/ and planner/, and mypy (its default mode) nothing in the
whole package."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "aspen_cgi"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    if not level:
        return name or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def import_graph() -> dict[str, set[str]]:
    """module -> the aspen_cgi modules it imports anywhere in its text (functions
    and `if TYPE_CHECKING:` blocks included: a reader follows those too)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}

    def target(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    for mod, path in mods.items():
        is_package = path.name == "__init__.py"

        def visit(node: ast.AST) -> None:
            for child in ast.iter_child_nodes(node):
                names: list[str] = []
                if isinstance(child, ast.Import):
                    names = [a.name for a in child.names]
                elif isinstance(child, ast.ImportFrom):
                    base = _resolve(mod, is_package, child.level, child.module)
                    names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in child.names]
                for n in names:
                    t = target(n) if n.startswith("aspen_cgi") else None
                    if t and t != mod:
                        graph[mod].add(t)
                visit(child)
        visit(ast.parse(path.read_text()))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
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

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_no_import_cycle_counting_imports_inside_functions():
    graph = import_graph()
    assert len(graph) > 80 and sum(len(v) for v in graph.values()) > 300     # the walk saw the package
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle_through_a_function_local_import():
    graph = import_graph()
    graph["aspen_cgi.model.objectid"] = graph["aspen_cgi.model.objectid"] | {"aspen_cgi.http.backend"}
    found = cycles(graph)
    assert found and "aspen_cgi.model.objectid" in found[0] and "aspen_cgi.http.backend" in found[0]


def test_import_contracts_hold():
    lint = shutil.which("lint-imports", path=os.path.dirname(sys.executable)) or shutil.which("lint-imports")
    assert lint, "import-linter is a test dependency (setup.cfg [test])"
    res = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Contracts: 3 kept, 0 broken." in res.stdout


BELOW_THE_SERVICES = ("refstore", "packs", "cache", "planner")   # storage, packs, the cache, the planner


def environ_reached(source: str) -> list[str]:
    """Where SOURCE's functions take a request's environment (a parameter named
    env or environ) or read the process's (os.environ, os.getenv)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
                if a is not None and a.arg in ("env", "environ"):
                    out.append(f"line {node.lineno}: {getattr(node, 'name', 'lambda')}({a.arg})")
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and \
                isinstance(node.value, ast.Name) and node.value.id == "os":
            out.append(f"line {node.lineno}: os.{node.attr}")
    return out


def test_the_environment_stops_at_the_service_layer():
    """Storage, packs, the cache and the planner receive typed values
    (runtime/repository.Repository: the repository, its settings, its git
    children's environment), never a request's environment nor the process's."""
    found = {f"{p.relative_to(ROOT)} {where}"
             for d in BELOW_THE_SERVICES for p in sorted((PACKAGE / d).rglob("*.py"))
             for where in environ_reached(p.read_text())}
    assert len(list((PACKAGE / "refstore").glob("*.py"))) > 10
    assert found == set()


def test_the_environment_check_finds_a_parameter_and_a_read():
    assert environ_reached("def f(gitdir, env):\n    return gitdir\n") == ["line 1: f(env)"]
    assert environ_reached("import os\nx = os.environ.get('GIT_DIR')\n") == ["line 2: os.environ"]
    assert environ_reached("def f(repo):\n    return repo.git_env\n") == []


def test_no_undefined_name_in_the_package():
    """A name used and never bound (a rename half done) fails here, not in the one request that reaches it."""
    res = subprocess.run([sys.executable, "-m", "pyflakes", "aspen_cgi"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert "No module named pyflakes" not in res.stderr, "pyflakes is a test dependency (setup.cfg [test])"
    undefined = [line for line in res.stdout.splitlines() if "undefined name" in line]
    assert undefined == []


def test_ruff_finds_nothing():
    """ruff, with pyproject.toml's rules (pycodestyle's errors, pyflakes, isort's
    import order), over the package, the tests and the bench."""
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", "aspen_cgi", "tests",
                          "bench"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "No module named ruff" not in res.stderr, "ruff is a test dependency (setup.cfg [test])"
    assert res.returncode == 0, res.stdout + res.stderr


STRICT = ("aspen_cgi/model", "aspen_cgi/protocol", "aspen_cgi/planner")


def test_mypy_strict_finds_nothing_in_the_values_the_wire_formats_and_the_planner():
    """mypy --strict over the three rooms every other one builds on; what they
    import from elsewhere is followed silently (checked there later)."""
    res = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                          "--ignore-missing-imports", "--no-incremental", *STRICT], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert "No module named mypy" not in res.stderr, "mypy is a test dependency (setup.cfg [test])"
    assert res.returncode == 0, res.stdout + res.stderr


def test_mypy_finds_nothing_in_the_whole_package():
    """mypy in its default mode (unannotated bodies unchecked) over every module
    of aspen_cgi: what crosses a module's door is typed, and the types agree."""
    res = subprocess.run([sys.executable, "-m", "mypy", "--ignore-missing-imports", "--no-incremental", "aspen_cgi"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert "No module named mypy" not in res.stderr, "mypy is a test dependency (setup.cfg [test])"
    assert res.returncode == 0, "mypy aspen_cgi found errors:\n" + res.stdout + res.stderr
