"""The layout is the architecture: one wing per side, and imports only run down the floors

    util  <-  models  <-  codec  <-  wire  <-  cloud | phone  <-  emulation  <-  bench  <-  cli

(a module may import its own wing and any lower floor; cloud and phone never import each other).
The codec sits just above the models for one reason: its decoders return the models' one layer-K/V
type, `sakura.models.kv.LayerKV`; models import nothing from the codec.
Checked on the source, imports inside functions included. The package's own `sakura/__init__.py`
is the public API's facade and may name any wing (lazily). Also: no import loop between modules.

Inside the codec the same rule holds one level down: its shared base (the modules at its top level:
`base` with `LadderState`, `bitstream`, `rans`, `kernels`, ...) <- the `progressive` and
`baselines` families <- the `nested` family (`layered:quantiser="ecsq"` is the progressive ladder),
and no cycle at all between its modules, counting imports inside functions and the ones only a type
checker follows (`if TYPE_CHECKING:`). The codec's `__init__` is its facade (registers every family)."""

import ast
import functools
import gc
from pathlib import Path

import pytest

import sakura

SRC = Path(sakura.__file__).resolve().parent
FLOOR = {"util": 0, "models": 1, "assets": 1, "codec": 1.5, "wire": 2, "cloud": 3, "phone": 3, "emulation": 4,
         "bench": 5, "cli": 6, "__main__": 7}
CODEC_FAMILY_FLOOR = {"progressive": 1, "baselines": 1, "nested": 2}  # any other module of the codec: its shared base (0)


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.lru_cache(maxsize=None)
def _parse_file(path: Path) -> ast.Module:
    return _parse(path.read_text())


def _parse(text: str) -> ast.Module:
    """`ast.parse` with the collector off: an earlier test's abandoned coroutines finalised by a
    collection that fired inside ast.parse tripped CPython 3.11's "AST constructor recursion depth
    mismatch" (SystemError, seen after tests/sakura/phone/test_live.py in one process). A
    `gc.collect()` before every parse did the same but cost ~0.3 s each on a full test process's
    heap: minutes over the ~300 files the checks below parse."""
    gc.disable()
    try:
        return ast.parse(text)
    finally:
        gc.enable()


def _imports(path: Path, *, top_level_only: bool = False, module: str | None = None, text: str | None = None):
    """Absolute module names `path` imports (relative imports resolved)."""
    tree = _parse_file(path) if text is None else _parse(text)
    module = module or _module(path)
    pkg = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    nodes = tree.body if top_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(pkg[: len(pkg) - node.level + 1]) if node.level else ""
            mod = ".".join(x for x in (base, node.module or "") if x)
            yield mod
            yield from (f"{mod}.{a.name}" for a in node.names)


def _wing(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "sakura" and len(parts) > 1 else None


def _violations(path: Path, *, module: str | None = None, text: str | None = None) -> list[str]:
    me = _wing(module or _module(path))
    bad = []
    for name in sorted(set(_imports(path, module=module, text=text))):
        other = _wing(name)
        if other is None or other == me or other not in FLOOR:
            continue
        if FLOOR[other] >= FLOOR[me]:
            bad.append(f"{module or path.relative_to(SRC)} imports {name}")
    return bad


@pytest.mark.parametrize("wing", sorted(w for w in FLOOR if (SRC / w).is_dir() or (SRC / f"{w}.py").is_file()))
def test_imports_only_run_down_the_floors(wing):
    files = sorted((SRC / wing).rglob("*.py")) if (SRC / wing).is_dir() else [SRC / f"{wing}.py"]
    bad = [v for p in files for v in _violations(p)]
    assert bad == [], bad


def test_every_wing_has_a_floor():
    wings = {p.name for p in SRC.iterdir() if (p.is_dir() and (p / "__init__.py").exists()) or
             (p.suffix == ".py" and p.name != "__init__.py")}
    wings = {w.removesuffix(".py") for w in wings}
    assert wings - set(FLOOR) == set(), "a new top-level package needs a floor in FLOOR"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each an import loop)."""
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
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
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_loop_between_modules():
    """Module-level imports form no cycle (a loop makes the import order matter and hides in
    whichever module happens to be imported first)."""
    graph = {}
    for p in SRC.rglob("*.py"):
        m = _module(p)
        graph[m] = {n for n in _imports(p, top_level_only=True) if n.startswith("sakura.")}
    # plain modules only: a package's __init__ re-exports its own modules, and an edge into one
    # is resolved to the module the name comes from when that module exists
    mods = {m for m in graph if not (SRC / Path(*m.split(".")[1:]) / "__init__.py").exists()}
    graph = {m: {n if n in mods else n.rsplit(".", 1)[0] for n in graph[m]} & mods - {m} for m in mods}
    cycles = _cycles(graph)
    assert cycles == [], cycles


def test_the_checker_sees_a_function_level_import_up_a_floor():
    text = "def f():\n    from sakura.bench.demo import run_demo\n"
    assert _violations(SRC / "phone" / "probe.py", module="sakura.phone.probe", text=text) == [
        "sakura.phone.probe imports sakura.bench.demo", "sakura.phone.probe imports sakura.bench.demo.run_demo"]


def test_the_checker_sees_cloud_and_phone_as_siblings():
    text = "from sakura.cloud.builder import build_store\n"
    assert _violations(SRC / "phone" / "probe.py", module="sakura.phone.probe", text=text) != []


def _resolve(name: str) -> str:
    """The module a dotted import name refers to: itself where it is a module or package, else the
    module it is a name in (`sakura.codec.base.ShardKV` -> `sakura.codec.base`)."""
    path = SRC.parent / Path(*name.split("."))
    if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
        return name
    return name.rsplit(".", 1)[0]


def _codec_edges(path: Path, *, module: str | None = None, text: str | None = None) -> set[str]:
    """The codec modules `path` imports: every import (inside functions and `if TYPE_CHECKING:` too),
    each resolved to the module it loads (`from .. import bitstream` -> `sakura.codec.bitstream`,
    not the package)."""
    tree = _parse_file(path) if text is None else _parse(text)
    module = module or _module(path)
    pkg = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {_resolve(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(pkg[: len(pkg) - node.level + 1]) if node.level else ""
            mod = ".".join(x for x in (base, node.module or "") if x)
            out |= {_resolve(f"{mod}.{a.name}") for a in node.names}
    return {m for m in out if m == "sakura.codec" or m.startswith("sakura.codec.")}


def _codec_floor(module: str) -> tuple[float, str]:
    """(floor, family) of a codec module; the facade (`sakura.codec` itself) is above them all."""
    parts = module.split(".")
    if len(parts) == 2:
        return float("inf"), "(facade)"
    family = parts[2] if parts[2] in CODEC_FAMILY_FLOOR else ""
    return CODEC_FAMILY_FLOOR.get(family, 0), family


def _codec_violations(path: Path, *, module: str | None = None, text: str | None = None) -> list[str]:
    me = module or _module(path)
    floor, family = _codec_floor(me)
    bad = []
    for other in sorted(_codec_edges(path, module=me, text=text) - {me}):
        f, fam = _codec_floor(other)
        if fam != family and f >= floor:
            bad.append(f"{me} imports {other}")
    return bad


def _codec_modules() -> dict[str, Path]:
    return {_module(p): p for p in sorted((SRC / "codec").rglob("*.py"))}


def test_the_codec_families_import_only_down():
    bad = [v for m, p in _codec_modules().items() for v in _codec_violations(p, module=m)]
    assert bad == [], bad


def test_no_import_cycle_inside_the_codec_not_even_for_type_checkers():
    mods = _codec_modules()
    graph = {m: _codec_edges(p, module=m) & set(mods) - {m} for m, p in mods.items()}
    assert _cycles(graph) == []


def test_the_codec_checker_sees_a_type_checking_import_and_a_sibling_family():
    text = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..nested.ladder import NestedAnalysis\n"
    assert _codec_violations(SRC / "codec" / "progressive" / "probe.py", module="sakura.codec.progressive.probe",
                             text=text) == ["sakura.codec.progressive.probe imports sakura.codec.nested.ladder"]
    text = "def f():\n    from ..progressive import ladder\n"
    assert _codec_violations(SRC / "codec" / "baselines" / "probe.py", module="sakura.codec.baselines.probe",
                             text=text) == ["sakura.codec.baselines.probe imports sakura.codec.progressive.ladder"]
    text = "from . import get_codec\n"   # the facade, from inside the codec
    assert _codec_violations(SRC / "codec" / "base2.py", module="sakura.codec.base2", text=text) == [
        "sakura.codec.base2 imports sakura.codec"]
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
