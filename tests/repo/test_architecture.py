"""The layers of fl/ import one way (README, "Architecture"): a test, so a cycle cannot come back.

Every `import` and `from ... import` of every module counts, wherever it stands (module level, inside a
function, under TYPE_CHECKING). Within a package anything goes; across packages only the edges below.
"""
import ast
from pathlib import Path

import pytest

FL = Path(__file__).resolve().parents[2] / "fl"

# package -> the packages it may import. core is the engine and imports nothing of fl; methods, datasets,
# models and evaluators plug into it through its registry.
ALLOWED = {
    "core": set(),
    "config": {"core"},
    "data": {"core", "config"},
    "models": {"core", "config"},
    "metrics": {"core", "config"},
    "methods": {"core", "config", "metrics"},
    "report": set(),
    # fl.sweep and fl.reproduce start runs: they take run's thread policy for them (fl/run/cpu_threads.py)
    "sweep": {"core", "config", "report", "run"},
    "reproduce": {"config", "sweep", "report", "run"},  # fl.reproduce: the papers' tables through fl.sweep, fl.report
    "run": {"core", "config", "data", "report"},
    "train": {"run"},  # fl/train.py and fl/__main__.py: the entry point
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
