"""The layers of fl/ import one way (README, "Architecture"): a test, so a cycle cannot come back.

Every `import` and `from ... import` of every module counts, wherever it stands (module level, inside a
function, under TYPE_CHECKING). Within a package anything goes; across packages only the edges below.
"""
import ast
from pathlib import Path

import pytest

FL = Path(__file__).resolve().parents[2] / "fl"

# package -> the packages it may import. core is the engine and imports nothing of fl; methods, datasets,
# models, evaluators and aggregators plug into it through its registry.
ALLOWED = {
    "core": set(),
    "config": {"core"},
    "data": {"core", "config"},
    "models": {"core", "config"},
    "metrics": {"core", "config"},
    "aggregators": {"core", "config"},
    "methods": {"core", "config", "metrics"},
    "report": set(),
    # fl.sweep and fl.reproduce start runs: they take run's thread policy for them (fl/run/cpu_threads.py)
    "sweep": {"core", "config", "report", "run"},
    "reproduce": {"config", "sweep", "report", "run"},  # fl.reproduce: the papers' tables through fl.sweep, fl.report
    "run": {"core", "config", "data", "report"},
    "train": {"run"},  # fl/train.py and fl/__main__.py: the entry point
    "testing": {"core", "config", "run"},  # fl.testing: a plug-in author's checks run fl.train's main in-process
}


def package_of(module: str) -> str:
    """fl.core.loop -> core; fl.train / fl.__main__ -> train."""
    parts = module.split(".")
    return "train" if parts[1] in ("train", "__main__") else parts[1]


def imports(path: Path) -> set[str]:
    """The fl modules `path` imports, at any depth of the file (the code base uses absolute imports only)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("fl.")}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            if node.module == "fl":  # from fl import methods
                found |= {f"fl.{a.name}" for a in node.names}
            elif (node.module or "").startswith("fl."):
                found.add(node.module)
    return found


def edges() -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for path in sorted(FL.rglob("*.py")):
        rel = path.relative_to(FL)
        if len(rel.parts) == 1 and rel.name == "__init__.py":
            continue
        src = package_of("fl." + ".".join(rel.with_suffix("").parts))
        for target in imports(path):
            dst = package_of(target)
            if dst != src:
                out.setdefault((src, dst), []).append(str(rel))
    return out


def test_every_package_is_known():
    packages = {p.name for p in FL.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert packages | {"train"} == set(ALLOWED)


@pytest.mark.parametrize("edge", sorted(edges()))
def test_imports_point_one_way(edge):
    src, dst = edge
    assert dst in ALLOWED[src], f"fl/{src} must not import fl/{dst}: {', '.join(edges()[edge])}"


def test_the_allowed_edges_have_no_cycle():
    def reaches(a: str, b: str, seen=()) -> bool:
        return any(n == b or (n not in seen and reaches(n, b, seen + (n,))) for n in ALLOWED[a])

    assert not [p for p in ALLOWED if reaches(p, p)]


def module_imports() -> dict[str, set[str]]:
    """fl module -> the fl modules it imports (a name imported from a package counts as its submodule when it is
    one: `from fl.reproduce import claims`)."""
    files = {".".join(p.relative_to(FL.parent).with_suffix("").parts).removesuffix(".__init__"): p
             for p in sorted(FL.rglob("*.py"))}
    out = {}
    for name, path in files.items():
        found = set(imports(path))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fl"):
                found |= {f"{node.module}.{a.name}" for a in node.names}
        out[name] = {m for m in found if m in files and m != name}
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_two_modules_import_each_other_even_through_others():
    """Within a package too (fl/reproduce/claims.py and spec.py did, through a function-level import)."""
    assert cycles(module_imports()) == []
