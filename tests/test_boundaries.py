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
    """Every module of the package, its subpackages' included (lab.host.run.bench)."""
    path = REPO.joinpath(*package.split("."))
    return [m.name for m in pkgutil.walk_packages([str(path)], package + ".")
            if not m.name.rsplit(".", 1)[-1].startswith("__")]


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


PACKAGES = ("lab.common", "lab.models", "lab.worker", "lab.host", "lab.report", "lab.benchmarks", "envcheck")


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
    # the kit's benchmarks of itself sit above the product: nothing imports them
    assert not any("lab.benchmarks" in deps for deps in graph.values()), graph


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


# lab.host's parts, from the one that talks to the user down to the shared vocabulary: a
# part imports only the parts below it (request and watch are side by side and import
# neither each other). tasks.py composes them all from above; lab.common is under all. The
# launchers import nothing of the kit: the places run them as commands.
LAYERS = ("cli", "suites", "run", "request|watch", "places", "images", "settings", "errors", "launchers")
RANK = {part: i for i, group in enumerate(LAYERS) for part in group.split("|")}


def kit_imports(path: Path):
    """(line, the kit module named, inside a function?) for each import of the kit in a
    file (`from lab.host import places` names lab.host.places); `if TYPE_CHECKING:` blocks
    left out (they never run)."""
    tree = ast.parse(path.read_text(), str(path))
    skip = {id(x) for node in ast.walk(tree) if isinstance(node, ast.If)
            and getattr(node.test, "id", "") == "TYPE_CHECKING" for x in ast.walk(node)}
    inner = {id(x) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for x in ast.walk(f) if x is not f}
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [f"{node.module}.{a.name}" if node.module in ("lab", "lab.host", "lab.report")
                     else node.module for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in ("lab", "envcheck", "tasks"):
                yield node.lineno, name, id(node) in inner


def host_part(module: str) -> str | None:
    """lab.host.run.bench -> run; lab.host.settings -> settings; anything else None."""
    bits = module.split(".")
    return bits[2] if bits[:2] == ["lab", "host"] and len(bits) > 2 else None


def upward_imports(root: Path = REPO) -> list[str]:
    found = []
    for path in sorted(root.joinpath("lab", "host").rglob("*.py")):
        me = host_part(".".join(path.relative_to(root).with_suffix("").parts))
        for line, name, _ in kit_imports(path):
            other = host_part(name)
            if me in RANK and other in RANK and other != me and RANK[other] <= RANK[me]:
                found.append(f"{path.relative_to(root)}:{line} ({me}) imports {name} ({other})")
    return found


def test_lab_host_parts_are_exactly_the_layers():
    folder = REPO / "lab" / "host"
    parts = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"} | \
        {d.name for d in folder.iterdir() if (d / "__init__.py").is_file()}
    assert parts == set(RANK), parts ^ set(RANK)


def test_lab_host_imports_go_one_way_down_its_layers():
    assert upward_imports() == []


def test_the_layer_check_finds_an_import_upward(tmp_path):
    """The check itself works: a place that imports the request (above it) is found, a
    run that imports the places (below it) is not."""
    for part, text in {"places": "from lab.host.request import checks\n",
                       "run": "from lab.host.places import launch\n"}.items():
        tmp_path.joinpath("lab", "host", part).mkdir(parents=True)
        tmp_path.joinpath("lab", "host", part, "m.py").write_text(text)
    assert upward_imports(tmp_path) == [
        "lab/host/places/m.py:1 (places) imports lab.host.request (request)"]


# Imports of the kit's own modules are at the top of each file in lab.host and lab.report:
# a function-local one hides a cycle or an upward call. The exceptions, each with its
# reason (module, imported module). Optional heavy libraries that are not the kit's
# (docker, kubernetes, matplotlib, pynvml, tqdm, yaml) may stay lazy: a host without them
# still lists its tasks and answers --help.
LOCAL_KIT_IMPORTS: dict[tuple[str, str], str] = {}


def local_kit_imports(root: Path = REPO) -> list[tuple[str, str]]:
    found = []
    for package in ("host", "report"):
        for path in sorted(root.joinpath("lab", package).rglob("*.py")):
            module = ".".join(path.relative_to(root).with_suffix("").parts)
            found += [(module, name) for _, name, inner in kit_imports(path) if inner]
    return found


def test_no_function_local_import_of_the_kit_in_host_and_report():
    assert [i for i in local_kit_imports() if i not in LOCAL_KIT_IMPORTS] == []
    # every exception still exists (a stale entry would let the next one through unseen)
    assert set(LOCAL_KIT_IMPORTS) <= set(local_kit_imports())


def test_the_local_import_check_finds_one(tmp_path):
    """The check itself works: an import inside a function is found, one at the top and
    one under `if TYPE_CHECKING:` are not."""
    tmp_path.joinpath("lab", "report").mkdir(parents=True)
    tmp_path.joinpath("lab", "host").mkdir(parents=True)
    tmp_path.joinpath("lab", "host", "a.py").write_text(
        "from typing import TYPE_CHECKING\nfrom lab.common import kit\nif TYPE_CHECKING:\n"
        "    from lab.host import b\n\ndef f():\n    from lab.host.places import launch\n")
    assert local_kit_imports(tmp_path) == [("lab.host.a", "lab.host.places")]
