#!/usr/bin/env python3
"""Counts what issue 43 asked to bring down, from the source tree (ast, no imports of the code):

- imports inside functions: all (and per package), project-internal, and from the function's own
  wing (where laziness buys nothing: the wing is loaded already); those without a ``# lazy: <reason>``
  comment on the statement's line (the agreed marker, docs/harness.md);
- ``log=print`` / ``echo=print`` parameters;
- hand-written markdown table separators (a string literal holding ``|---|`` or ``|---:|``);
- the longest functions; the generated IDCT kernels (``codec/progressive/_lee.py``, straight-line
  code written by a generator on purpose) are listed but exempt from the 150-line count.

    python scripts/code_census.py                 # the figures, for docs/harness.md
    python scripts/code_census.py --list same-wing   # every same-wing function-level import
    python scripts/code_census.py --list unexplained # function-level imports without a reason
    python scripts/code_census.py --json
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sakura", "saeot")
SEPARATOR = re.compile(r"\|\s*:?-{3,}:?\s*\|")
LAZY = re.compile(r"#\s*lazy:\s*\S")
#: generated straight-line code, exempt from the function-length target
EXEMPT_LONG = ("src/sakura/codec/progressive/_lee.py",)
#: issue 43's targets
TARGET_FUNCTION_LEVEL, TARGET_SAME_WING, TARGET_LONG = 300, 0, 0


def wing(module: str) -> str:
    """``sakura.wire.store.store`` -> ``sakura.wire``; ``saeot.x`` -> ``saeot``."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "sakura" and len(parts) > 1 else parts[0]


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT / "src").with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(node: ast.AST, module: str, is_pkg: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:  # relative: resolve against the importing module
        base = module.split(".") if is_pkg else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        return [".".join(base + ([node.module] if node.module else []))]
    return [node.module or ""]


def census(src: Path = ROOT / "src") -> dict:
    fn_imports, long_fns, log_params, separators = [], [], [], []
    for path in sorted(p for pkg in PACKAGES for p in (src / pkg).rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text)
        mod = module_name(path)
        rel = str(path.relative_to(ROOT))
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            long_fns.append((fn.end_lineno - fn.lineno + 1, f"{rel}:{fn.lineno} {fn.name}"))
            args = fn.args.args + fn.args.kwonlyargs
            defaults = [None] * (len(fn.args.args) - len(fn.args.defaults)) + fn.args.defaults + fn.args.kw_defaults
            for a, d in zip(args, defaults):
                if a.arg in ("log", "echo") and isinstance(d, ast.Name) and d.id == "print":
                    log_params.append(f"{rel}:{fn.lineno} {fn.name}({a.arg}=print)")
            for node in ast.walk(fn):
                if not isinstance(node, (ast.Import, ast.ImportFrom)) or _owner(fn, node) is not fn:
                    continue
                for target in _imported(node, mod, path.name == "__init__.py"):
                    internal = target.split(".")[0] in PACKAGES
                    stmt = lines[node.lineno - 1: node.end_lineno]
                    fn_imports.append({"where": f"{rel}:{node.lineno}", "function": fn.name, "imports": target,
                                       "package": mod.split(".")[0], "internal": internal,
                                       "same_wing": internal and wing(target) == wing(mod),
                                       "reason": any(LAZY.search(line) for line in stmt)})
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and SEPARATOR.search(node.value) \
                    and id(node) not in docstrings:  # a docstring showing a table is not a table written
                separators.append(f"{rel}:{node.lineno}")
    long_fns.sort(reverse=True)
    long_counted = [(n, w) for n, w in long_fns if not w.startswith(EXEMPT_LONG)]
    return {"function_level_imports": len(fn_imports),
            **{f"function_level_imports_{pkg}": sum(i["package"] == pkg for i in fn_imports) for pkg in PACKAGES},
            "function_level_internal": sum(i["internal"] for i in fn_imports),
            "function_level_same_wing": sum(i["same_wing"] for i in fn_imports),
            "function_level_without_lazy_reason": sum(not i["reason"] for i in fn_imports),
            "log_print_parameters": len(log_params),
            **{f"log_print_parameters_{pkg}": sum(w.startswith(f"src/{pkg}/") for w in log_params) for pkg in PACKAGES},
            "hand_written_separators": len(separators),
            **{f"hand_written_separators_{pkg}": sum(w.startswith(f"src/{pkg}/") for w in separators) for pkg in PACKAGES},
            "longest_functions": [{"lines": n, "where": w, "exempt": w.startswith(EXEMPT_LONG)} for n, w in long_fns[:10]],
            "functions_over_150_lines": sum(n > 150 for n, _ in long_counted),
            "functions_over_150_lines_exempt": sum(n > 150 for n, _ in long_fns) - sum(n > 150 for n, _ in long_counted),
            "_imports": fn_imports, "_log_params": log_params, "_separators": separators}


def _owner(fn: ast.AST, node: ast.AST) -> ast.AST:
    """The innermost function of ``fn`` (itself included) that holds ``node``: an import inside a
    nested function is counted once, for the nested one."""
    for child in ast.walk(fn):
        if child is not fn and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                any(n is node for n in ast.walk(child)):
            return child
    return fn


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--list", choices=("same-wing", "unexplained", "all", "log-print", "separators"))
    a = ap.parse_args(argv)
    c = census()
    if a.list:
        items = {"same-wing": [f"{i['where']} {i['function']}: {i['imports']}" for i in c["_imports"] if i["same_wing"]],
                 "unexplained": [f"{i['where']} {i['function']}: {i['imports']}" for i in c["_imports"] if not i["reason"]],
                 "all": [f"{i['where']} {i['function']}: {i['imports']}" for i in c["_imports"]],
                 "log-print": c["_log_params"], "separators": c["_separators"]}[a.list]
        print("\n".join(items))
        return 0
    public = {k: v for k, v in c.items() if not k.startswith("_")}
    if a.json:
        print(json.dumps(public, indent=1))
        return 0
    for k, v in public.items():
        if k != "longest_functions":
            print(f"{k:36s} {v}")
    print(f"targets (issue 43): function-level imports <= {TARGET_FUNCTION_LEVEL} "
          f"({'met' if public['function_level_imports'] <= TARGET_FUNCTION_LEVEL else 'NOT met'}), "
          f"same-wing {TARGET_SAME_WING} ({'met' if public['function_level_same_wing'] <= TARGET_SAME_WING else 'NOT met'}), "
          f"functions over 150 lines {TARGET_LONG} ({'met' if public['functions_over_150_lines'] <= TARGET_LONG else 'NOT met'})")
    print("longest functions (exempt: the generated straight-line IDCT kernels in codec/progressive/_lee.py):")
    for f in public["longest_functions"]:
        print(f"  {f['lines']:4d}  {f['where']}{'  (exempt: generated)' if f['exempt'] else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
