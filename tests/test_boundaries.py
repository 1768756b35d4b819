"""The packages say where code runs, and imports keep to it: a rank never imports the
host's packages (Docker, invoke, tabulate) or lab.host; the host, the report, the
shared code and envcheck never import torch at import time; lab.common imports no
other part of the kit but the model registry (lab.models, whose specs are facts);
envcheck imports only lab.common; no two packages import each other, even inside a
function (read from the source). Modules are found by walking the packages, so a new
module is checked without being listed here."""
import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def modules(package: str) -> list[str]:
    path = REPO.joinpath(*package.split("."))
    return [f"{package}.{m.name}" for m in pkgutil.iter_modules([str(path)])
            if not m.name.startswith("__")]


def imported_after(mods: list[str]) -> set:
    code = f"import sys, {', '.join(mods)}; print(' '.join(sorted(sys.modules)))"
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                        cwd=REPO)
    assert cp.returncode == 0, cp.stderr
    return set(cp.stdout.split())


def kit_parts(mods: set) -> set:
    """lab.host.run.bench -> lab.host; envcheck.probes -> envcheck."""
    return {".".join(m.split(".")[:2]) if m.startswith("lab.") else "envcheck" for m in mods
            if m.startswith(("lab.", "envcheck"))}


def test_the_packages_are_regular_packages():
    for pkg in ("lab", "lab.common", "lab.models", "lab.worker", "lab.host", "lab.report", "envcheck"):
        assert REPO.joinpath(*pkg.split("."), "__init__.py").is_file(), pkg
    assert len(modules("lab.host")) >= 8 and "lab.worker.train" in modules("lab.worker")


def test_worker_side_does_not_import_the_hosts_packages():
    mods = imported_after(modules("lab.worker"))
    assert "torch" in mods  # the check itself works: the worker does use torch
    assert not {"docker", "invoke", "tabulate"} & mods
    assert not any(m.startswith("lab.host") for m in mods)


@pytest.mark.parametrize("package", ["lab.host", "lab.report", "lab.common", "envcheck"])
def test_host_report_and_shared_code_do_not_import_training_packages(package):
    extra = ["tasks"] if package == "lab.host" else []
    mods = imported_after(modules(package) + extra)
    assert not {"torch", "numpy", "horovod"} & mods


def test_shared_code_imports_no_other_part_of_the_kit():
    assert kit_parts(imported_after(modules("lab.common"))) <= {"lab.common", "lab.models"}


def test_model_specs_are_facts_read_without_torch():
    mods = imported_after(["lab.models"])
    assert kit_parts(mods) <= {"lab.models"} and not {"torch", "numpy"} & mods


PACKAGES = ("lab.common", "lab.models", "lab.worker", "lab.host", "lab.report", "envcheck")


def package_of(module: str) -> str | None:
    return next((p for p in PACKAGES if module == p or module.startswith(p + ".")), None)


def package_imports(root: Path = REPO) -> dict[str, set[str]]:
    """package -> the packages its source imports, at import time or inside a function."""
    graph = {p: set() for p in PACKAGES}
    for p in PACKAGES:
        for path in root.joinpath(*p.split(".")).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
                if isinstance(node, ast.ImportFrom) and node.module in ("lab", "lab.common"):
                    names = [f"{node.module}.{a.name}" for a in node.names]   # from lab import models
                for name in names:
                    q = package_of(name)
                    if q and q != p:
                        graph[p].add(q)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, path = [], []

    def visit(node):
        if node in path:
            found.append(path[path.index(node):] + [node])
            return
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            visit(nxt)
        path.pop()
    for start in graph:
        visit(start)
    return found


def test_no_package_cycle():
    graph = package_imports()
    assert cycles(graph) == [], graph
    # what a rank runs never reaches host code, even through envcheck
    reach, todo = set(), ["lab.worker"]
    while todo:
        for q in graph[todo.pop()] - reach:
            reach.add(q)
            todo.append(q)
    assert "lab.host" not in reach and "lab.report" not in reach, reach


def test_the_cycle_check_finds_a_cycle(tmp_path):
    """The check itself works: a lazy import back from envcheck to lab.host is a cycle."""
    for p in PACKAGES:
        tmp_path.joinpath(*p.split(".")).mkdir(parents=True, exist_ok=True)
    tmp_path.joinpath("lab", "host", "a.py").write_text("import envcheck.x\n")
    tmp_path.joinpath("envcheck", "x.py").write_text("def f():\n    from lab.host import a\n")
    assert cycles(package_imports(tmp_path)) == [["lab.host", "envcheck", "lab.host"],
                                                 ["envcheck", "lab.host", "envcheck"]]


def test_envcheck_uses_only_the_shared_code():
    parts = kit_parts(imported_after(modules("envcheck")))
    assert parts <= {"lab.common", "envcheck"}, parts


def module_imports(package: str, root: Path = REPO) -> dict[str, set[str]]:
    """module -> the modules of the same package its source imports (anywhere in it, a
    function's body included; `if TYPE_CHECKING:` blocks left out: they never run). A
    subpackage (lab.host.places) is one node of its parent, its files' imports its own;
    a name that is no module of the package (`from lab.host.places import choose_runner`)
    is its `__init__`."""
    folder = root.joinpath(*package.split("."))
    files = {p.stem: [p] for p in folder.glob("*.py")}
    files.update({d.name: sorted(d.rglob("*.py")) for d in folder.iterdir()
                  if d.is_dir() and (d / "__init__.py").is_file()})
    names = set(files)
    graph = {n: set() for n in names}
    for n, paths in files.items():
        for path in paths:
            tree = ast.parse(path.read_text())
            skip = {id(x) for node in ast.walk(tree) if isinstance(node, ast.If)
                    and getattr(node.test, "id", "") == "TYPE_CHECKING" for x in ast.walk(node)}
            for node in ast.walk(tree):
                if id(node) in skip or not isinstance(node, ast.ImportFrom) or node.level:
                    continue
                if node.module == package:
                    graph[n] |= {a.name if a.name in names else "__init__" for a in node.names}
                elif (node.module or "").startswith(package + "."):
                    graph[n] |= {node.module.split(".")[len(package.split("."))]} & names
    return {n: {d for d in deps if d != n} for n, deps in graph.items()}


def subpackages(package: str) -> list[str]:
    folder = REPO.joinpath(*package.split("."))
    return [f"{package}.{d.relative_to(folder).as_posix().replace('/', '.')}"
            for d in sorted(folder.rglob("*")) if d.is_dir() and (d / "__init__.py").is_file()]


@pytest.mark.parametrize("package", ["lab.host", "lab.worker", "lab.common", "lab.report", "envcheck",
                                     *subpackages("lab.host")])
def test_no_circle_inside_a_package(package):
    graph = module_imports(package)
    assert cycles(graph) == [], {m: sorted(d) for m, d in graph.items() if d}



def test_the_circle_check_sees_subpackages(tmp_path):
    """The check itself works: a place importing bench, which imports the places, is a circle."""
    host = tmp_path / "lab" / "host"
    (host / "places").mkdir(parents=True)
    (host / "__init__.py").write_text("")
    (host / "places" / "__init__.py").write_text("from lab.host.places.local import Local\n")
    (host / "places" / "local.py").write_text("def f():\n    from lab.host import bench\n")
    (host / "bench.py").write_text("from lab.host.places import choose_runner\n")
    assert cycles(module_imports("lab.host", tmp_path)) != []
    assert module_imports("lab.host.places", tmp_path)["__init__"] == {"local"}
