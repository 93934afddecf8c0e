"""Package boundaries: phone-side code (runtime, client), the store's read side, the models and
the codec never import the cloud build pipeline, the demo or the benchmarks (checked on the
source, including imports inside functions)."""

import ast
import gc
from pathlib import Path

import pytest

import sakura

SRC = Path(sakura.__file__).resolve().parent
PHONE_SIDE = ("runtime", "client", "store", "models", "codec", "server", "link")
CLOUD_OR_DEMO = ("sakura.build", "sakura.demo", "sakura.bench", "sakura.training")


def _imports(path: Path):
    # Garbage first: an earlier test's abandoned coroutines finalised by a collection that fires
    # inside ast.parse tripped CPython 3.11's "AST constructor recursion depth mismatch"
    # (SystemError, seen after tests/sakura/runtime/test_live.py in one process).
    gc.collect()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)


@pytest.mark.parametrize("package", PHONE_SIDE)
def test_phone_side_imports_no_cloud_or_demo_code(package):
    bad = [f"{p.relative_to(SRC)}: {name}" for p in sorted((SRC / package).rglob("*.py")) for name in _imports(p)
           if name.startswith(CLOUD_OR_DEMO) or name in ("sakura.demo", "sakura.build")]
    assert bad == [], bad


def test_the_checker_sees_a_function_level_import(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("def f():\n    from sakura.build.pipeline import build_store\n")
    assert "sakura.build.pipeline" in set(_imports(f))
