"""The package's imports go one way: no circle, nothing imported from a floor above.

Floors, low to high: the ground floor (modules directly in `embcache/`: errors, arg_types,
partition, sparse_types, ...), then `data`, `kernels` (our embedding kernels in Triton, which
the cache and `nn` call), `cache`, `nn`, `distributed`, `train` (the run
skeleton), the rooms (`dlrm`, `cf`, `face`: one a capability, side by side), `bench`. A module
may import its own floor and those below; a room imports no other room. Beside the floors: the `embcache`
command (`cli.py`, `__main__.py`) imports anything and is imported by no floor; the package
root (`__init__.py`, whose lazy names are nn's modules) and `serve.py` (the scorer of
exports) import anything, and a floor that imports one of them stands as high as what that
one imports. `cpu_kernels/` stands alone: it imports nothing from embcache.

Read from the source (`ast`), nothing imported: every `import` and `from ... import`,
those inside functions too (a lazy import is still a dependency), relative ones resolved,
and the modules a command registry (`COMMANDS`) names. The packages' lazy names
(`importlib.import_module` in an `__init__`) are their own modules, so they are not read.
An import of `embcache.x` is an edge to the module `embcache/x.py`, or to the package
`embcache/x/__init__.py`; `from embcache.x import y` is an edge to `embcache.x.y` where
that is a module, else to `embcache.x`.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("embcache", "cpu_kernels")
ROOMS = ("dlrm", "cf", "face")  # one floor, side by side: a capability each
FLOORS = ("data", "kernels", "cache", "nn", "distributed", "train", ROOMS, "bench")  # low to high, above the ground floor
ENTRY_POINTS = ("embcache.__main__", "embcache.cli")  # the command: imports every other command by name
ABOVE_FLOORS = ("embcache", "embcache.serve")  # the package root's lazy names; the scorer servers import


# ------------------------------------------------------------------------ the import graph
def module_files(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under `packages` (a package is its __init__)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_names(name: str, path: Path) -> list[tuple[str, str | None]]:
    """Every import of module `name` (at `path`), wherever the statement stands, as (the
    module it names, the package to fall back to when that is no module): `import a.b` is
    (`a.b`, None); `from a import b` is (`a.b`, `a`), since `b` may be a module or a name.
    A command registry (`COMMANDS = {name: (module, help)}`, imported on use by
    `embcache.cli.dispatch`) imports each module it names."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, one level up per extra dot
                here = name.split(".") if is_package else name.split(".")[:-1]
                base = ".".join(here[:len(here) - (node.level - 1)] + ([base] if base else []))
            names.extend((f"{base}.{alias.name}", base) if alias.name != "*" else (base, None)
                         for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and "COMMANDS" in [
                getattr(t, "id", None) for t in getattr(node, "targets", [getattr(node, "target", None)])]:
            names.extend((c.value, None) for c in ast.walk(node.value)
                         if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return names


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (outside ones, torch and the like, left out)."""
    graph = {}
    for name, path in modules.items():
        edges = set()
        for target, fallback in imported_names(name, path):
            if target in modules:
                edges.add(target)
            elif fallback in modules:
                edges.add(fallback)
        edges.discard(name)
        graph[name] = edges
    return graph


# ------------------------------------------------------------------------ the checks
def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: each strongly connected group of more than one module, as one
    circle through it (`a -> b -> a`), in a stable order."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):  # Tarjan's algorithm (recursive: a few hundred modules are far from the limit)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(_circle(graph, group) for group in groups)


def _circle(graph, group: set[str]) -> list[str]:
    """One circle inside a strongly connected `group`: from its first module, a shortest way back."""
    start = min(group)
    paths, seen = {start: [start]}, {start}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    return paths[v] + [start]
                if w not in seen:
                    seen.add(w)
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{sorted(group)} is not strongly connected")


_PACKAGE_FLOORS = {f"embcache.{f}": i + 1 for i, group in enumerate(FLOORS)
                   for f in (group if isinstance(group, tuple) else (group,))}


def floor(module: str) -> int | None:
    """0 for the ground floor, 1.. for FLOORS; None for the modules beside the floors,
    cpu_kernels and a sub-package of embcache that is on no floor (`floorless`)."""
    parts = module.split(".")
    if parts[0] != "embcache" or module in ENTRY_POINTS + ABOVE_FLOORS:
        return None
    package = ".".join(parts[:2])
    if package in _PACKAGE_FLOORS:
        return _PACKAGE_FLOORS[package]
    return 0 if len(parts) == 2 else None


def reach(module: str, graph: dict[str, set[str]], seen=()) -> int:
    """The highest floor a module of ABOVE_FLOORS imports (through the others of them too)."""
    floors = [0]
    for dst in graph.get(module, ()):
        if dst in ABOVE_FLOORS and dst not in seen:
            floors.append(reach(dst, graph, (*seen, module)))
        elif floor(dst) is not None:
            floors.append(floor(dst))
    return max(floors)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """`importer -> imported (why)` for each import by a floor of a floor above it, of the
    command, or of a module beside the floors that imports a floor above it; and for each
    import of embcache by cpu_kernels."""
    bad = []
    for src, targets in sorted(graph.items()):
        for dst in sorted(targets):
            if src.split(".")[0] == "cpu_kernels":
                if dst.split(".")[0] == "embcache":
                    bad.append(f"{src} -> {dst} (cpu_kernels imports nothing from embcache)")
                continue
            here = floor(src)
            if here is None or dst.split(".")[0] != "embcache":
                continue
            if dst in ENTRY_POINTS:
                bad.append(f"{src} -> {dst} (the command, which no floor imports)")
            elif dst in ABOVE_FLOORS:
                if reach(dst, graph) > here:
                    bad.append(f"{src} -> {dst} (which imports {_name(reach(dst, graph))}, above {_name(here)})")
            elif floor(dst) is not None and floor(dst) > here:
                bad.append(f"{src} -> {dst} ({_name(floor(dst))} is above {_name(here)})")
            elif floor(dst) == here and _room(src) and _room(dst) and _room(src) != _room(dst):
                bad.append(f"{src} -> {dst} (the {_room(src)} room imports no other room)")
    return bad


def _name(level: int) -> str:
    group = FLOORS[level - 1] if level else "the ground floor"
    return f"the rooms' floor ({', '.join(group)})" if isinstance(group, tuple) else group


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "embcache" and parts[1] in ROOMS else None


def floorless(modules) -> list[str]:
    """Modules of embcache on no floor and not beside them (a new sub-package to place)."""
    return sorted(m for m in modules if m.split(".")[0] == "embcache" and m not in ENTRY_POINTS + ABOVE_FLOORS
                  and floor(m) is None)


# ------------------------------------------------------------------------ the package
@pytest.fixture(scope="module")
def package_graph():
    return import_graph(module_files(ROOT))


def test_the_package_has_no_import_circle(package_graph):
    found = cycles(package_graph)
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_no_floor_imports_from_a_floor_above(package_graph):
    found = upward_imports(package_graph)
    assert not found, "upward imports:\n" + "\n".join(found)


def test_every_module_has_a_floor(package_graph):
    found = floorless(package_graph)
    assert not found, f"modules on no floor (add their package to FLOORS): {found}"


def test_the_graph_sees_the_package(package_graph):
    """The checks above look at something: the known modules and a few known edges."""
    graph = package_graph
    assert {"embcache.nn.heads", "embcache.face.trainer", "embcache.data.loader", "cpu_kernels.heat"} <= set(graph)
    assert "embcache.nn.class_pool" in graph["embcache.nn.heads"]  # `from .class_pool import ...`
    assert {"embcache.errors", "embcache.dlrm.cli", "embcache.dlrm.cache_cli"} <= graph["embcache.cli"]
    assert graph["embcache.dlrm.cache_cli"] == {"embcache.dlrm.plan_cli"}  # its COMMANDS


# ------------------------------------------------------------------------ the checks can fail
# name -> (modules: dotted name -> source, the check, the line it must report)
SNIPPETS = {
    "circle": ({"embcache.nn.a": "from embcache.nn import b\n", "embcache.nn.b": "from . import a\n"},
               "circle", "embcache.nn.a -> embcache.nn.b -> embcache.nn.a"),
    "circle through a lazy import": (
        {"embcache.distributed.world": "def gather():\n    from .gather import rows\n",
         "embcache.distributed.gather": "from embcache.distributed.world import World\n"},
        "circle", "embcache.distributed.gather -> embcache.distributed.world -> embcache.distributed.gather"),
    "circle through a package": (
        {"embcache.cache": "from .row import RowCache\n", "embcache.cache.row": "import embcache.cache\n"},
        "circle", "embcache.cache -> embcache.cache.row -> embcache.cache"),
    "data imports nn": ({"embcache.data.loader": "from embcache.nn.types import KJT\n", "embcache.nn.types": ""},
                        "upward", "embcache.data.loader -> embcache.nn.types (nn is above data)"),
    "kernels import the cache": ({"embcache.kernels.pooled": "from embcache.cache.slots import Slots\n",
                                  "embcache.cache.slots": ""},
                                 "upward", "embcache.kernels.pooled -> embcache.cache.slots (cache is above kernels)"),
    "cache imports train, relatively": (
        {"embcache.cache.plan": "from ..train.config import Config\n", "embcache.train.config": ""},
        "upward", "embcache.cache.plan -> embcache.train.config (train is above cache)"),
    "data imports distributed in a function": (
        {"embcache.data.loader": "def f():\n    from embcache.distributed.world import slice_bounds\n",
         "embcache.distributed.world": ""},
        "upward", "embcache.data.loader -> embcache.distributed.world (distributed is above data)"),
    "nn imports distributed": ({"embcache.nn.heads": "import embcache.distributed.gathers as g\n",
                                "embcache.distributed.gathers": ""},
                               "upward", "embcache.nn.heads -> embcache.distributed.gathers"),
    "nn imports a room": ({"embcache.nn.heads": "from embcache.face.class_sharded import ShardedFullFC\n",
                           "embcache.face.class_sharded": ""},
                          "upward", "embcache.nn.heads -> embcache.face.class_sharded (the rooms' floor (dlrm, cf, "
                                    "face) is above nn)"),
    "a room imports another room": ({"embcache.face.trainer": "from embcache.cf.model import CFModel\n",
                                     "embcache.cf.model": ""},
                                    "upward", "embcache.face.trainer -> embcache.cf.model (the face room imports no "
                                              "other room)"),
    "the ground floor imports cache": ({"embcache.errors": "from embcache.cache import slots\n",
                                        "embcache.cache.slots": ""},
                                       "upward", "embcache.errors -> embcache.cache.slots (cache is above the ground"),
    "a floor imports the command": ({"embcache.face.trainer": "from embcache.cli import main\n", "embcache.cli": ""},
                                    "upward", "embcache.face.trainer -> embcache.cli (the command"),
    "data imports nn through the package root": (
        {"embcache": "def __getattr__(name):\n    from .nn.bag import Bag\n", "embcache.nn.bag": "",
         "embcache.data.loader": "from embcache import Bag\n"},
        "upward", "embcache.data.loader -> embcache (which imports nn, above data)"),
    "a command registry names a module above": (
        {"embcache.cache.cli": 'COMMANDS = {"plan": ("embcache.dlrm.plan_cli", "plan a cache")}\n',
         "embcache.dlrm.plan_cli": ""},
        "upward", "embcache.cache.cli -> embcache.dlrm.plan_cli (the rooms' floor (dlrm, cf, face) is above cache)"),
    "cpu_kernels imports embcache": ({"cpu_kernels.heat": "from embcache.errors import UserFacingError\n",
                                      "embcache.errors": ""},
                                     "upward", "cpu_kernels.heat -> embcache.errors"),
    "a sub-package on no floor": ({"embcache.extras.thing": "", "embcache.errors": ""},
                                  "floorless", "embcache.extras.thing"),
}
CHECKS = {"circle": lambda g: [" -> ".join(c) for c in cycles(g)], "upward": upward_imports, "floorless": floorless}


def write_modules(root: Path, modules: dict[str, str]) -> Path:
    """`modules` as files under `root` (a name that others extend is a package's __init__.py;
    every enclosing folder gets an empty one)."""
    for name, source in modules.items():
        parts = name.split(".")
        if any(other.startswith(name + ".") for other in modules):
            path = root.joinpath(*parts, "__init__.py")
        else:
            path = root.joinpath(*parts[:-1], parts[-1] + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
        for i in range(1, len(parts)):
            init = root.joinpath(*parts[:i], "__init__.py")
            if not init.exists():
                init.write_text("")
    return root


@pytest.mark.parametrize("case", list(SNIPPETS))
def test_the_checks_find_what_they_are_for(tmp_path, case):
    modules, check, expected = SNIPPETS[case]
    graph = import_graph(module_files(write_modules(tmp_path, modules)))
    found = CHECKS[check](graph)
    assert any(line.startswith(expected) for line in found), found
    others = {name: f(graph) for name, f in CHECKS.items() if name != check and f(graph)}
    assert not others, others  # each case breaks its own rule only


def test_downward_and_outside_imports_pass(tmp_path):
    modules = {"embcache.face.trainer": "import torch\nfrom embcache.nn.heads import FullFC\nfrom ..data import x\n",
               "embcache.nn.heads": "from embcache.errors import E\nfrom .class_pool import Pool\n",
               "embcache.nn.class_pool": "import embcache.cache.slots\n", "embcache.cache.slots": "",
               "embcache.data.x": "from embcache import sparse_types\n", "embcache.sparse_types": "",
               "embcache.errors": "", "embcache.cli": "import embcache.face.trainer\n",
               "embcache": "def __getattr__(name):\n    from .nn.heads import FullFC\n",
               "embcache.face.bench": "from embcache import FullFC\nfrom embcache.serve import load\n",
               "embcache.serve": "from embcache.data.x import y\n",
               "cpu_kernels.heat": "import numba\nfrom . import _kernels\n", "cpu_kernels._kernels": ""}
    graph = import_graph(module_files(write_modules(tmp_path, modules)))
    assert graph["embcache.face.trainer"] == {"embcache.nn.heads", "embcache.data.x"}
    assert graph["embcache.data.x"] == {"embcache.sparse_types"}
    assert graph["cpu_kernels.heat"] == {"cpu_kernels._kernels"}
    assert {name: f(graph) for name, f in CHECKS.items()} == {name: [] for name in CHECKS}


def private_kernel_imports(graph: dict[str, set[str]]) -> list[str]:
    """`importer -> imported` for each import by embcache of a private module of cpu_kernels
    (`cpu_kernels._x`): the cache shares HEAT's machine operations through the public
    `cpu_kernels.intrinsics`, not through HEAT's insides."""
    return [f"{src} -> {dst}" for src, targets in sorted(graph.items()) if src.split(".")[0] == "embcache"
            for dst in sorted(targets) if dst.startswith("cpu_kernels._")]


def test_embcache_imports_no_private_module_of_the_kernels(package_graph, tmp_path):
    assert private_kernel_imports(package_graph) == []
    assert "cpu_kernels.intrinsics" in package_graph["embcache.cache.bookkeeping.fused_admission"]
    caught = import_graph(module_files(write_modules(tmp_path, {
        "embcache.cache.x": "from cpu_kernels._kernels import k\n", "cpu_kernels._kernels": ""})))
    assert private_kernel_imports(caught) == ["embcache.cache.x -> cpu_kernels._kernels"]


# ------------------------------------------------------------------------ short files
MAX_MODULE_LINES = 550
MAX_FUNCTION_LINES = 60  # outside the numba kernels, whose loops are kept whole for the compiler


def too_long(files: dict[str, Path]) -> list[str]:
    """`module: N lines` past MAX_MODULE_LINES and `module.function: N lines` past
    MAX_FUNCTION_LINES (a function decorated with numba's `njit` is a kernel: exempt)."""
    out = []
    for name, path in sorted(files.items()):
        text = path.read_text()
        lines = text.count("\n") + (not text.endswith("\n"))
        if lines > MAX_MODULE_LINES:
            out.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                kernel = any("njit" in ast.unparse(d) for d in node.decorator_list)
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES and not kernel:
                    out.append(f"{name}.{node.name}: {n} lines")
    return out


def test_modules_and_functions_stay_short(tmp_path):
    assert too_long(module_files(ROOT)) == []
    body = "".join(f"    x = {i}\n" for i in range(61))
    caught = too_long(module_files(write_modules(tmp_path, {
        "embcache.cache.long": "def f():\n" + body, "embcache.cache.kernel": "@numba.njit\ndef k():\n" + body})))
    assert caught == ["embcache.cache.long.f: 62 lines"]
