"""On-disk store: atomic, content-addressed writes (StoreWriter) and validated reads (Store).

Crash safety: every file is written to ``STORE/.tmp/``, fsynced, chmod 0644 (so an unprivileged
nginx worker can read it), then renamed into place and the directory fsynced. Objects go first,
the manifest last, so a crash leaves at worst unreferenced objects (``verify`` lists them as
orphans), never a manifest pointing at a missing or partial object.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from sakura.util import fsutil
from sakura.wire.store.api import StoreIntegrityError, StoreNotFound
from sakura.wire.store.layout import (
    INDEX_PATH,
    LOCK_FILE,
    MANIFEST_DIR,
    NAME_RE,
    OBJECT_DIR,
    SHA256_RE,
    STORE_MARKER,
    TMP_DIR,
    WRITERS_LOCK,
    check_name,
    manifest_relpath,
)
from sakura.wire.store.manifest import (
    MAX_MANIFEST_BYTES,
    SCHEMA_VERSION,
    Manifest,
    ManifestError,
    ObjectRef,
    Prefix,
    Rendition,
    Shard,
    Table,
    TemplateRef,
    parse_json,
)

log = logging.getLogger(__name__)

_HASH_CHUNK = 1 << 20  # bytes read per step when hashing files (bounded memory)


class StoreError(RuntimeError):
    """The store on disk is unusable or inconsistent; the message names the file."""


class NotAStore(StoreError, FileNotFoundError):
    """The path given as a store is not one: missing, a regular file, or a folder without the
    store's marker (`STORE_MARKER`). The message is one line naming the path. A `FileNotFoundError`
    too, as `open_store` raised for a missing folder before the marker existed (callers' handlers
    keep working)."""


class ObjectMissing(StoreError, StoreNotFound):
    """An object (or manifest) the caller asked for is not in the store."""


class ObjectDamaged(StoreError, StoreIntegrityError):
    """An object on disk does not match its reference (size or sha256)."""


# ------------------------------------------------------------------------------- low-level I/O
_NOFOLLOW = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def open_in_store(root: str | os.PathLike[str], relpath: str) -> int:
    """Open ``root/relpath`` read-only without following a symlink at any step below ``root``
    (each directory is opened with O_NOFOLLOW relative to the one above, openat-style), so no
    symlink in the store (``objects/xx`` or a file) can lead out of it. The one rule ``serve``
    and ``Store`` (reads, ``verify``) share. Returns an fd; raises FileNotFoundError if missing,
    ``OSError`` (ELOOP / ENOTDIR) for a symlink or a non-directory on the way."""
    parts = relpath.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise FileNotFoundError(f"{relpath}: not a store path")
    dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        for part in parts[:-1]:
            nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=dfd)
            os.close(dfd)
            dfd = nfd
        # O_NONBLOCK: opening a FIFO for reading blocks until a writer appears (one planted in
        # objects/ froze the whole event loop); with it the open returns at once and fstat refuses
        # anything but a regular file (a device, a socket, a FIFO). For a regular file the flag
        # changes nothing, and it is cleared anyway.
        fd = os.open(parts[-1], os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
    finally:
        os.close(dfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", relpath)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_store_file(root: str | os.PathLike[str], relpath: str, limit: int) -> bytes:
    """At most ``limit`` bytes of the regular file ``root/relpath`` (`open_in_store`'s rules: no
    symlink, no FIFO or device), e.g. ``index.json``; raises OSError like `open_in_store`."""
    with os.fdopen(open_in_store(root, relpath), "rb") as f:
        return f.read(limit)


def store_irregular_files(root: Path) -> list[str]:
    """Relative paths of everything under the served parts of the store (objects/, manifests/,
    index.json) that is neither a directory, a regular file nor a symlink (``store_symlinks``):
    FIFOs, sockets, devices. ``serve`` refuses them (404), so ``verify`` reports them."""
    out = []
    idx = root / INDEX_PATH
    if idx.exists() and not idx.is_symlink() and not idx.is_file():
        out.append(INDEX_PATH)
    for top in (OBJECT_DIR, MANIFEST_DIR):
        d = root / top
        if d.is_symlink() or not d.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(d):
            for n in filenames:  # os.walk lists FIFOs, sockets and devices among the files
                p = Path(dirpath) / n
                if not p.is_symlink() and not stat.S_ISREG(p.lstat().st_mode):
                    out.append(str(p.relative_to(root)))
    return sorted(out)


def store_symlinks(root: Path) -> list[str]:
    """Relative paths of every symlink under the served parts of the store (objects/, manifests/,
    index.json): ``serve`` refuses them, so ``verify`` reports them."""
    out = []
    if (root / INDEX_PATH).is_symlink():
        out.append(INDEX_PATH)
    for top in (OBJECT_DIR, MANIFEST_DIR):
        d = root / top
        if d.is_symlink():
            out.append(top)
            continue
        for dirpath, dirnames, filenames in os.walk(d):  # followlinks=False: a symlinked dir is listed, not entered
            for n in dirnames + filenames:
                p = Path(dirpath) / n
                if p.is_symlink():
                    out.append(str(p.relative_to(root)))
    return sorted(out)


def sha256_file(path: Path) -> str:
    """sha256 hex digest of a file, read in 1 MiB steps."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def atomic_write(root: Path, relpath: str, data: bytes | bytearray | memoryview) -> Path:
    """Write ``data`` to ``root/relpath`` atomically and durably (``sakura.util.fsutil.atomic_write``:
    temp file in ``root/.tmp`` + fsync + chmod 0644 + rename + directory fsync).

    Readers (and HTTP servers) see either the old file or the complete new one, never a prefix.
    """
    return fsutil.atomic_write(root / relpath, data, tmp_dir=root / TMP_DIR, mode=0o644)


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Exclusive advisory lock on ``root/.lock``: serialises index updates between writers."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / LOCK_FILE, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def put_object(root: Path, data: bytes | bytearray | memoryview) -> ObjectRef:
    """Store ``data`` as an immutable object named by its sha256; idempotent.

    If a file of that name already exists it is re-hashed: a correct copy is kept (no write; its
    mtime is refreshed, so ``gc`` sees it as young), a damaged one is replaced. Returns the
    object's reference.
    """
    mv = memoryview(data)
    ref = ObjectRef(sha256=hashlib.sha256(mv).hexdigest(), bytes=mv.nbytes)
    dest = root / ref.path
    if dest.exists():
        if dest.stat().st_size == ref.bytes and sha256_file(dest) == ref.sha256:
            try:
                # refresh its age: gc deletes orphans older than its grace period, and an object a
                # crashed build left two hours ago is, until this build commits, such an orphan
                os.utime(dest)
                return ref
            except FileNotFoundError:  # gc took it meanwhile: write it again
                pass
        else:
            log.warning("object %s on disk is damaged; rewriting it", ref.sha256)
    atomic_write(root, ref.path, mv)
    return ref


# ------------------------------------------------------------------------------- store marker
#: The on-disk format this code writes (`STORE_MARKER`'s ``format_version``) and the newest it reads.
STORE_FORMAT_VERSION = 1
#: What `store_format` answers for a store built before the marker existed (recognised, not
#: rewritten by read-only commands; the next build or `gc` writes the marker: migrated).
LEGACY_FORMAT_VERSION = 0
_MARKER_SCHEMA = "sakura.store"


def store_format(root: str | os.PathLike[str]) -> int:
    """The format version of the store at ``root``, or `NotAStore` (one line) if it is none.

    A store is a folder holding `STORE_MARKER` (``{"schema": "sakura.store", "format_version": 1}``),
    written by the first build. ``index.json`` alone does not make one: a mistyped path (``/``, a
    home folder) must fail an integrity check, not pass it with "0 objects". A store built before
    the marker existed (``index.json`` of schema ``sakura.index`` beside ``manifests/`` and
    ``objects/``) is recognised as `LEGACY_FORMAT_VERSION`."""
    root = Path(root)
    if not root.exists():
        raise NotAStore(f"store {root} does not exist")
    if not root.is_dir():
        raise NotAStore(f"{root} is a file, not a store folder")
    try:
        data = read_store_file(root, STORE_MARKER, 4096)
    except FileNotFoundError:
        if _is_legacy_store(root):
            return LEGACY_FORMAT_VERSION
        raise NotAStore(f"{root} is not a sakura store (no {STORE_MARKER}; `sakura build {root}` makes one)") from None
    except OSError as e:
        raise NotAStore(f"{root / STORE_MARKER}: not a regular file in the store ({e.strerror or e})") from None
    try:
        d = parse_json(data, STORE_MARKER)
        version = d["format_version"] if d.get("schema") == _MARKER_SCHEMA else None
    except (ValueError, AttributeError):
        version = None
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise NotAStore(f"{root / STORE_MARKER}: not a sakura store marker")
    if version > STORE_FORMAT_VERSION:
        raise NotAStore(f"{root}: store format {version} is newer than this sakura reads "
                        f"({STORE_FORMAT_VERSION}); upgrade sakura")
    return version


def _is_legacy_store(root: Path) -> bool:
    if not ((root / MANIFEST_DIR).is_dir() and (root / OBJECT_DIR).is_dir()):
        return False
    try:
        idx = parse_json(read_store_file(root, INDEX_PATH, 1 << 30), INDEX_PATH)
    except (OSError, ValueError):
        return False
    return isinstance(idx, dict) and idx.get("schema") == "sakura.index" and isinstance(idx.get("manifests"), list)


def write_store_marker(root: Path) -> bool:
    """Make ``root`` a store (new, empty or legacy): write `STORE_MARKER` unless it is there. True
    if it was written. A folder holding a marker of another format is refused (`NotAStore`)."""
    if (root / STORE_MARKER).exists() or (root / STORE_MARKER).is_symlink():
        store_format(root)  # a newer format, or a damaged marker: refused before anything is written
        return False
    data = json.dumps({"schema": _MARKER_SCHEMA, "format_version": STORE_FORMAT_VERSION}, sort_keys=True) + "\n"
    atomic_write(root, STORE_MARKER, data.encode())
    return True


# -------------------------------------------------------------------------- stale temporaries
def stale_temp_files(root: Path) -> list[str] | None:
    """``.tmp/...`` files no live writer owns (left by a killed build), relative to ``root``;
    None when a writer is running (its temp files are in use, so none can be called stale)."""
    tdir = root / TMP_DIR
    if not tdir.is_dir():
        return []
    fd = _writers_lock_fd(root, create=False)
    if fd is None:  # no writer ever held it here (or the folder is read-only): nothing can be live
        return _temp_names(root)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        return _temp_names(root)
    finally:
        os.close(fd)


def _temp_names(root: Path) -> list[str]:
    """``.tmp/...`` entries but the writers' lock itself, sorted."""
    lock = Path(WRITERS_LOCK).name
    return sorted(f"{TMP_DIR}/{p.name}" for p in (root / TMP_DIR).iterdir() if p.name != lock)


def _writers_lock_fd(root: Path, *, create: bool) -> int | None:
    try:
        if create:
            (root / TMP_DIR).mkdir(exist_ok=True)
        return os.open(root / WRITERS_LOCK, (os.O_RDWR | os.O_CREAT if create else os.O_RDONLY)
                       | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError:
        return None


def _remove_temps(root: Path, names: Iterable[str]) -> list[str]:
    removed = []
    for rel in names:
        p = root / rel
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
            removed.append(rel)
        except FileNotFoundError:
            pass
    return removed


def begin_writing(root: Path) -> int:
    """A writer's start: make ``root`` a store (`write_store_marker`), remove the temp files of
    writers that died (only when no other writer is alive: then every ``.tmp/`` file is stale) and
    hold `WRITERS_LOCK` shared until `end_writing` (or this process's death: the kernel drops the
    lock). Returns the lock's fd."""
    root.mkdir(parents=True, exist_ok=True)
    if (root / STORE_MARKER).exists():
        store_format(root)  # a newer format or a damaged marker: refused before anything is written
    fd = _writers_lock_fd(root, create=True)
    if fd is None:
        raise StoreError(f"cannot open {root / WRITERS_LOCK} for writing")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # another writer is alive: its temp files are in use; the next one to start alone cleans
        else:
            removed = _remove_temps(root, _temp_names(root))
            if removed:
                log.info("removed %d temp file(s) left by an interrupted build: %s", len(removed),
                         ", ".join(removed[:3]))
        # from exclusive (or nothing) to shared: other writers may start, and none cleans .tmp/
        # while this one holds it (the marker's own temp file included)
        fcntl.flock(fd, fcntl.LOCK_SH)
        write_store_marker(root)
    except BaseException:
        os.close(fd)
        raise
    return fd


def end_writing(fd: int | None) -> None:
    """Release `begin_writing`'s hold."""
    if fd is not None:
        os.close(fd)


# ------------------------------------------------------------------------------------- writer
@dataclass(frozen=True)
class RenditionInput:
    """What ``sakura build`` hands over for one rendition: already-encoded bytes plus metadata.

    Attributes:
        name: ladder rung, unique within the shard.
        codec: codec name; params: codec parameters (plain JSON).
        data: the encoded bytes.
        distortion: measured distortion, metric -> value (>= 0); ``{}`` for lossless.
        tables: names of shared tables (added with ``StoreWriter.add_table``) needed to decode.
        prefix_bytes: for a layered codec's rung: the rendition is ``data[:prefix_bytes]`` where
            ``data`` is the shard's whole layered object (pass the same ``data`` for every rung;
            it is stored once).
    """

    name: str
    codec: str
    data: bytes | bytearray | memoryview
    params: Mapping[str, Any] = field(default_factory=dict)
    distortion: Mapping[str, float] = field(default_factory=dict)
    tables: Sequence[str] = ()
    prefix_bytes: int | None = None


class StoreWriter:
    """Writes one template's objects and, on ``commit()``, its manifest. The build calls it::

        codec = codec_from_spec("progressive")                 # sakura.codec; 3 rungs per shard
        tables = codec.fit_tables(shards)                       # shards: one ShardKV per layer
        with StoreWriter(store_dir, model_fingerprint=fp, template_id="look-00") as w:
            w.set_template_ref(png_bytes, media_type="image/png")   # sakura.wire.store.template_ref
            w.add_table("progressive", codec="progressive", data=tables.to_bytes(ShardId(fp, tfp, -1)),
                        params=codec.params)
            for i, shard in enumerate(shards):
                data = codec.encode(shard, ShardId(fp, tfp, i), tables)   # one object, rungs = prefixes
                w.add_shard(layer=i, tokens=(0, n_tokens), fp16_bytes=shard.fp16_bytes, renditions=[
                    RenditionInput(f"progressive#{r}", "progressive", data, tables=["progressive"],
                                   prefix_bytes=end, distortion={"image_mse": mse[i][r],
                                                                 "image_psnr_db": psnr_db(mse[i][r])})
                    for r, end in enumerate(codec.level_ends(data))])
            w.set_kv_layout({"layers": len(shards), "tokens": n_tokens, "heads": h, "head_dim": d})
        # leaving the block without an exception commits (manifest written last, atomically);
        # sakura.cloud.builder.pipeline.build_store is the real caller

    Objects are written as they are added (bounded memory: the writer keeps only references).
    Rebuilding with the same inputs rewrites nothing (same object names, byte-identical manifest).
    """

    def __init__(self, root: str | os.PathLike[str], *, model_fingerprint: str, template_id: str) -> None:
        self.root = Path(root)
        self.model_fingerprint = check_name(model_fingerprint, "model fingerprint")
        self.template_id = check_name(template_id, "template id")
        self._writing: int | None = begin_writing(self.root)  # marker, stale temps, held until commit
        self._template_ref: TemplateRef | None = None
        self._tables: list[Table] = []
        self._shards: list[Shard] = []
        self._kv_layout: dict[str, Any] = {}
        self._committed: Path | None = None

    def put_object(self, data: bytes | bytearray | memoryview) -> ObjectRef:
        """Store raw bytes as a content-addressed object (no manifest entry)."""
        return put_object(self.root, data)

    def set_template_ref(self, data: bytes | bytearray | memoryview, *, media_type: str) -> ObjectRef:
        """The small reference (e.g. template latent / image) from which the phone computes KV locally."""
        ref = self.put_object(data)
        self._template_ref = TemplateRef(object=ref, media_type=media_type)
        return ref

    def add_table(self, name: str, *, codec: str, data: bytes | bytearray | memoryview,
                  params: Mapping[str, Any] | None = None) -> ObjectRef:
        """A shared codec table; renditions refer to it by ``name``."""
        if any(t.name == name for t in self._tables):
            raise ValueError(f"table {name!r} was already added")
        ref = self.put_object(data)
        self._tables.append(Table(name=name, codec=codec, object=ref, params=dict(params or {})))
        return ref

    def add_shard(self, *, layer: int, tokens: tuple[int, int], fp16_bytes: int,
                  renditions: Iterable[RenditionInput], quality_floor: Mapping[str, Any] | None = None) -> Shard:
        """Append the next shard in consumption order; writes each rendition's bytes as an object.

        Args:
            layer: transformer layer index.
            tokens: ``(start, stop)`` template-token range, stop exclusive.
            fp16_bytes: bytes of this shard's K+V as one uncompressed fp16 copy.
            renditions: the ladder for this shard (at least one).
            quality_floor: optional ``{"reference": codec spec, "image_mse": x}`` (``Shard.quality_floor``).
        """
        renditions = list(renditions)
        known = {t.name for t in self._tables}
        for j, r in enumerate(renditions):
            missing = [t for t in r.tables if t not in known]
            if missing:  # checked before any write, so a rejected shard leaves no trace in the manifest
                raise ManifestError(f"manifest field shards[{len(self._shards)}].renditions[{j}].tables: "
                                    f"refers to unknown tables {missing} (add_table() them first)")
            if r.prefix_bytes is not None and not 1 <= r.prefix_bytes <= memoryview(r.data).nbytes:
                raise ManifestError(f"manifest field shards[{len(self._shards)}].renditions[{j}].prefix: "
                                    f"prefix_bytes={r.prefix_bytes} outside [1, {memoryview(r.data).nbytes}]")
        rends = []
        for r in renditions:
            ref = self.put_object(r.data)
            prefix = None
            if r.prefix_bytes is not None:
                prefix = Prefix(bytes=r.prefix_bytes,
                                sha256=hashlib.sha256(memoryview(r.data)[: r.prefix_bytes]).hexdigest())
            rends.append(Rendition(name=r.name, codec=r.codec, object=ref, params=dict(r.params),
                                   distortion={k: float(v) for k, v in r.distortion.items()},
                                   tables=tuple(r.tables), prefix=prefix))
        shard = Shard(index=len(self._shards), layer=int(layer), tokens=(int(tokens[0]), int(tokens[1])),
                      fp16_bytes=int(fp16_bytes), renditions=tuple(rends),
                      quality_floor=dict(quality_floor) if quality_floor is not None else None)
        # Round-trip through the reader's validation now, so a bad shard fails here, named.
        Shard.from_json(shard.to_json(), f"shards[{shard.index}]")
        self._shards.append(shard)
        return shard

    def set_kv_layout(self, layout: Mapping[str, Any]) -> None:
        """Free-form plain-JSON description of the KV (layers, tokens, heads, head_dim, dtype...)."""
        self._kv_layout = dict(layout)

    def manifest(self) -> Manifest:
        """The manifest as it would be committed now (validated)."""
        if self._template_ref is None:
            raise ValueError("set_template_ref() was not called: every manifest needs the template reference")
        m = Manifest(model_fingerprint=self.model_fingerprint, template_id=self.template_id,
                     template_ref=self._template_ref, shards=tuple(self._shards), tables=tuple(self._tables),
                     kv_layout=self._kv_layout, schema_version=SCHEMA_VERSION)
        Manifest.from_bytes(m.to_bytes())  # the exact bytes we write must pass the reader
        return m

    @property
    def committed_path(self) -> Path | None:
        """The manifest file once ``commit()`` ran (leaving the ``with`` block commits), else None."""
        return self._committed

    def commit(self) -> Path:
        """Write the manifest (atomically, after all objects) and update ``index.json``; returns the
        manifest's path (also ``committed_path`` afterwards)."""
        m = self.manifest()
        data = m.to_bytes()
        rel = manifest_relpath(self.model_fingerprint, self.template_id)
        dest = self.root / rel
        with _locked(self.root):
            # gc runs under this lock: every object present now stays (it is referenced once the
            # manifest lands). One gc took while this build ran means a failed build, never a
            # manifest pointing at nothing.
            gone = [o.sha256 for o in m.objects() if not (self.root / o.path).is_file()]
            if gone:
                raise StoreError(f"{rel}: not committed: {len(gone)} of its objects vanished while it was built "
                                 f"(e.g. object {gone[0]}; a concurrent `store gc`?); build it again")
            old = _read_or_none(self.root, rel)
            if old != data:  # idempotent: no rewrite
                atomic_write(self.root, rel, data)
            try:
                _write_index(self.root, changed=(self.model_fingerprint, self.template_id))
            except BaseException:
                # the index could not be written (a full disk): put the manifest back as it was, so
                # the store never holds a manifest its index.json does not list
                _restore(self.root, rel, old)
                raise
        self._committed = dest
        self.close()
        return dest

    def close(self) -> None:
        """Stop writing (leaving the ``with`` block does it): another writer may now clean ``.tmp/``."""
        end_writing(self._writing)
        self._writing = None

    def __enter__(self) -> "StoreWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None and self._committed is None:
                self.commit()
        finally:
            self.close()

    def __del__(self) -> None:
        if getattr(self, "_writing", None) is not None:
            self.close()


#: index.json's own version (unchanged when the manifest encoding moved to version 2)
INDEX_SCHEMA_VERSION = 1


def _read_or_none(root: Path, relpath: str) -> bytes | None:
    """The bytes of store file ``relpath`` (regular files only, bounded), or None if absent or unreadable."""
    try:
        return read_store_file(root, relpath, 1 << 30)
    except OSError:
        return None


def _restore(root: Path, relpath: str, old: bytes | None) -> None:
    """Undo a manifest write: the old bytes back (atomically), or no file; best effort (the disk
    may still be full: the removal then at least leaves no unlisted manifest)."""
    try:
        if old is None:
            (root / relpath).unlink(missing_ok=True)
        else:
            atomic_write(root, relpath, old)
    except OSError:
        (root / relpath).unlink(missing_ok=True)


def _write_index(root: Path, changed: tuple[str, str] | None = None) -> None:
    """Rewrite ``index.json`` (catalogue of manifests) if it changed. Caller holds the lock.

    Incremental when ``changed`` names the manifest just committed: the other entries are reused
    from the current ``index.json`` (every writer updates its own entry under this lock), so a
    commit hashes one manifest instead of the whole library (a 20,000-manifest library of 40 KB
    Klein manifests would otherwise re-hash 0.8 GB per commit, serialised under the lock). The
    listing itself is always the manifests on disk: a manifest the index lacks, or whose size
    differs from its entry, is hashed; an entry whose file is gone is dropped; an unreadable
    index is rebuilt from scratch.
    """
    known: dict[tuple[str, str], tuple[str, int]] = {}
    current = _read_or_none(root, INDEX_PATH)
    if changed is not None and current is not None:
        try:
            for e in parse_json(current, str(INDEX_PATH))["manifests"]:
                known[(e["model_fingerprint"], e["template_id"])] = (str(e["manifest"]["sha256"]),
                                                                     int(e["manifest"]["bytes"]))
        except (ValueError, KeyError, TypeError):
            known = {}
    entries = []
    for fp, tid, path in _scan_manifests(root):
        size = path.stat().st_size
        old = known.get((fp, tid)) if (fp, tid) != changed else None
        digest = old[0] if old is not None and old[1] == size else sha256_file(path)
        entries.append({"model_fingerprint": fp, "template_id": tid, "manifest": {"sha256": digest, "bytes": size}})
    # One entry per line, each with C-speed json.dumps (an indented dump of 20,000 entries is
    # pure-Python and slow); sorted keys, so equal catalogues are equal bytes.
    body = ",\n".join(json.dumps(e, sort_keys=True) for e in entries)
    data = (f'{{"manifests": [\n{body}\n], "schema": "sakura.index", "schema_version": {INDEX_SCHEMA_VERSION}}}\n').encode()
    if current != data:
        atomic_write(root, INDEX_PATH, data)


def _scan_manifests(root: Path) -> list[tuple[str, str, Path]]:
    """``(model_fingerprint, template_id, path)`` of every manifest file, sorted by name
    (``os.scandir``: one directory read, no per-file stat, for libraries of thousands)."""
    out = []
    mdir = root / MANIFEST_DIR
    if not mdir.is_dir():
        return out
    for fp in sorted(e.name for e in os.scandir(mdir) if e.is_dir() and NAME_RE.fullmatch(e.name)):
        files = sorted((e.name, e.path) for e in os.scandir(mdir / fp)
                       if e.name.endswith(".json") and e.is_file())  # a stray directory named *.json is not a manifest
        for name, path in files:
            tid = name[: -len(".json")]
            if NAME_RE.fullmatch(tid):
                out.append((fp, tid, Path(path)))
    return out


# ------------------------------------------------------------------------------------- reader
@dataclass(frozen=True)
class TemplateStats:
    """Storage accounting for one template (bytes)."""

    model_fingerprint: str
    template_id: str
    shards: int
    renditions: int
    ladder_bytes: int      # all renditions of all shards
    table_bytes: int       # shared tables referenced by this template
    template_ref_bytes: int
    total_bytes: int       # unique objects referenced (ladder + tables + ref, deduplicated)
    fp16_bytes: int        # one uncompressed fp16 copy of the template KV
    manifest_bytes: int

    @property
    def ratio_vs_fp16(self) -> float:
        """Objects (``total_bytes``: ladder + tables + template ref) over one uncompressed fp16 copy."""
        return self.total_bytes / self.fp16_bytes if self.fp16_bytes else float("nan")

    @property
    def whole_bytes(self) -> int:
        """Everything the template costs on disk: its unique objects plus its manifest file."""
        return self.total_bytes + self.manifest_bytes

    @property
    def whole_ratio_vs_fp16(self) -> float:
        """``whole_bytes`` over one uncompressed fp16 copy of the template KV."""
        return self.whole_bytes / self.fp16_bytes if self.fp16_bytes else float("nan")


@dataclass(frozen=True)
class StoreStats:
    templates: list[TemplateStats]
    object_count: int
    object_bytes: int      # on disk, each object once (dedup across templates)
    orphan_count: int      # objects no manifest refers to (e.g. left by a crashed build)
    orphan_bytes: int


@dataclass
class VerifyReport:
    """Result of ``Store.verify``: ``ok`` iff ``problems`` is empty (orphans are not problems)."""

    checked_objects: int = 0
    checked_manifests: int = 0
    problems: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    #: ``.tmp/`` files no live writer owns (an interrupted build's; the next build removes them);
    #: None when a build is writing now (its temp files are in use)
    stale_temps: list[str] | None = field(default_factory=list)
    format_version: int = STORE_FORMAT_VERSION

    @property
    def ok(self) -> bool:
        return not self.problems


class Store:
    """Read side of a store directory: validated manifests, objects, accounting, verification.

    Implements ``sakura.wire.store.api.TemplateStore`` (``manifest_keys``, ``get_manifest``,
    ``get_object``, ``get_rendition``): the same calls the phone's ``TemplateClient`` answers
    over HTTP."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        #: `store_format`: raises `NotAStore` for a missing path, a file, or a folder without the marker
        self.format_version = store_format(self.root)

    def manifest_keys(self) -> list[tuple[str, str]]:
        """``(model_fingerprint, template_id)`` of every manifest on disk, sorted."""
        return [(fp, tid) for fp, tid, _ in _scan_manifests(self.root)]

    def manifest_path(self, model_fingerprint: str, template_id: str) -> Path:
        return self.root / manifest_relpath(model_fingerprint, template_id)

    def get_manifest(self, model_fingerprint: str, template_id: str) -> Manifest:
        """Read and validate one manifest; ``ObjectMissing`` (a ``KeyError``) if absent,
        ``ManifestError`` if malformed."""
        p = self.manifest_path(model_fingerprint, template_id)
        if not p.is_file():
            raise ObjectMissing(f"no manifest for model {model_fingerprint!r}, template {template_id!r} in {self.root}")
        try:
            with os.fdopen(open_in_store(self.root, manifest_relpath(model_fingerprint, template_id)), "rb") as f:
                data = f.read(MAX_MANIFEST_BYTES + 1)
        except OSError as e:  # a symlink on the way (ELOOP/ENOTDIR): serve refuses it too
            raise ManifestError(f"{p}: not a regular file inside the store ({e.strerror or e})") from None
        m = Manifest.from_bytes(data, source=str(p))
        if (m.model_fingerprint, m.template_id) != (model_fingerprint, template_id):
            raise ManifestError(f"{p}: names model {m.model_fingerprint!r} / template {m.template_id!r}, "
                                f"but is stored as {model_fingerprint!r} / {template_id!r}")
        return m

    def object_path(self, ref: ObjectRef | str) -> Path:
        sha = ref.sha256 if isinstance(ref, ObjectRef) else ref
        return self.root / ObjectRef(sha, 0).path

    def get_object(self, ref: ObjectRef, *, verify: bool = True) -> bytes:
        """Whole object bytes; with ``verify`` checks size and sha256 against ``ref``
        (``ObjectDamaged`` on a mismatch, ``ObjectMissing`` if there is no such file)."""
        return self._read(ref, ref.bytes, ref.sha256, b"", verify=verify)

    def get_rendition(self, rendition: Rendition, *, have: bytes = b"") -> bytes:
        """A rendition's bytes, verified against its own sha256: for a layered rung the object's
        first ``rendition.nbytes`` bytes (only ``[len(have), nbytes)`` is read; ``have`` must be a
        lower rung of the same object, checked by the same digest)."""
        if not isinstance(rendition, Rendition):
            raise TypeError(f"get_rendition takes a Rendition from a manifest, got {type(rendition).__name__}")
        if len(have) > rendition.nbytes:
            raise ValueError(f"have ({len(have)} bytes) is longer than rendition {rendition.name!r} ({rendition.nbytes})")
        return self._read(rendition.object, rendition.nbytes, rendition.sha256, bytes(have))

    def _read(self, ref: ObjectRef, stop: int, digest: str, have: bytes, *, verify: bool = True) -> bytes:
        """Bytes ``[0, stop)`` of object ``ref`` (``have`` already held), sha256 must be ``digest``."""
        p = self.object_path(ref)
        try:
            with os.fdopen(open_in_store(self.root, ref.path), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(len(have))
                data = have + f.read(stop - len(have))
        except FileNotFoundError:
            raise ObjectMissing(f"object {ref.sha256} is missing from {self.root}") from None
        except OSError as e:  # a symlink (ELOOP) or a non-directory on the way: what serve refuses
            raise ObjectDamaged(f"object {ref.sha256}: {p} is not a regular file inside the store "
                                f"({e.strerror or e})") from None
        if verify:
            if size != ref.bytes:
                raise ObjectDamaged(f"object {ref.sha256}: {size} bytes on disk, manifest says {ref.bytes}")
            if hashlib.sha256(data).hexdigest() != digest:
                what = "" if stop == ref.bytes else f" bytes [0, {stop})"
                raise ObjectDamaged(f"object {ref.sha256}{what}: checksum mismatch (file {p} is damaged, "
                                    f"or a wrong `have`)")
        return data

    def _object_files(self) -> list[Path]:
        # Regular files only, never through a symlink (what serve can send): a symlinked object
        # or objects/xx directory is not an object (verify reports it via store_symlinks).
        odir = self.root / OBJECT_DIR
        if odir.is_symlink() or not odir.is_dir():
            return []
        out = []
        for d in os.scandir(odir):
            if d.is_dir(follow_symlinks=False):
                out += [Path(e.path) for e in os.scandir(d.path) if e.is_file(follow_symlinks=False)]
        return sorted(out)

    def stats(self) -> StoreStats:
        """Storage accounting per template and for the whole store. Skips unreadable manifests
        (``verify`` reports them)."""
        templates = []
        referenced: set[str] = set()
        for fp, tid, path in _scan_manifests(self.root):
            try:
                m = self.get_manifest(fp, tid)
            except (ManifestError, KeyError) as e:
                log.warning("stats: skipping %s: %s", path, e)
                continue
            objs = m.objects()
            referenced.update(o.sha256 for o in objs)
            # each object once: a layered shard's rungs are prefixes of one object
            ladder = sum({r.object.sha256: r.object.bytes for s in m.shards for r in s.renditions}.values())
            tables = sum({t.object.sha256: t.object.bytes for t in m.tables}.values())
            templates.append(TemplateStats(
                model_fingerprint=fp, template_id=tid, shards=len(m.shards),
                renditions=sum(len(s.renditions) for s in m.shards), ladder_bytes=ladder,
                table_bytes=tables, template_ref_bytes=m.template_ref.object.bytes,
                total_bytes=sum(o.bytes for o in objs), fp16_bytes=m.fp16_bytes,
                manifest_bytes=path.stat().st_size))
        files = self._object_files()
        sizes = {p.name: p.stat().st_size for p in files}
        orphans = [n for n in sizes if n not in referenced]
        return StoreStats(templates=templates, object_count=len(files), object_bytes=sum(sizes.values()),
                          orphan_count=len(orphans), orphan_bytes=sum(sizes[n] for n in orphans))

    def verify_manifest(self, model_fingerprint: str, template_id: str) -> list[str]:
        """Problems with one template (``[]`` if it is complete and intact): its manifest validates
        and every object it references exists with the right size, sha256 and rung-prefix sha256.
        Re-hashes only this template's objects (what a resumed build checks before skipping it)."""
        rel = manifest_relpath(model_fingerprint, template_id)
        try:
            m = self.get_manifest(model_fingerprint, template_id)
        except (ManifestError, KeyError) as e:
            return [f"{rel}: {e}"]
        problems: list[str] = []
        good: dict[str, bool] = {}
        for o in m.objects():
            try:
                fd = open_in_store(self.root, o.path)
            except FileNotFoundError:
                problems.append(f"{rel}: object {o.sha256} is missing")
                continue
            except OSError:
                problems.append(f"{rel}: object {o.sha256} is not a regular file in the store (a symlink?)")
                continue
            with os.fdopen(fd, "rb") as f:
                h = hashlib.sha256()
                while chunk := f.read(_HASH_CHUNK):
                    h.update(chunk)
                size = os.fstat(f.fileno()).st_size
            if size != o.bytes or h.hexdigest() != o.sha256:
                problems.append(f"{rel}: object {o.sha256} is damaged")
            else:
                good[o.sha256] = True
        problems += self._prefix_problems(m, rel, good)
        return problems

    def _prefix_problems(self, m: Manifest, rel: str, good: Mapping[str, object]) -> list[str]:
        out = []
        for s in m.shards:
            for r in s.renditions:
                if r.prefix is None or r.object.sha256 not in good:
                    continue
                with open(self.object_path(r.object), "rb") as f:
                    head = f.read(r.prefix.bytes)
                if hashlib.sha256(head).hexdigest() != r.prefix.sha256:
                    out.append(f"{rel}: shard {s.index} rendition {r.name!r}: prefix of "
                               f"{r.prefix.bytes} bytes does not match its sha256")
        return out

    def verify(self) -> VerifyReport:
        """Re-hash every object, validate every manifest and check every reference resolves to an
        object of the right size and checksum. Problems are listed with the file they concern."""
        rep = VerifyReport(format_version=self.format_version, stale_temps=stale_temp_files(self.root))
        rep.problems += [f"{rel}: is a symlink (serve refuses symlinks; the store must hold regular files)"
                         for rel in store_symlinks(self.root)]
        rep.problems += [f"{rel}: is not a regular file (a FIFO, socket or device; serve refuses it)"
                         for rel in store_irregular_files(self.root)]
        good: dict[str, int] = {}
        for p in self._object_files():
            rep.checked_objects += 1
            if SHA256_RE.fullmatch(p.name) is None or p.parent.name != p.name[:2]:
                rep.problems.append(f"{p.relative_to(self.root)}: not a valid object name")
                continue
            digest = sha256_file(p)
            if digest != p.name:
                rep.problems.append(f"{p.relative_to(self.root)}: checksum mismatch (content hashes to {digest})")
                continue
            good[p.name] = p.stat().st_size
        referenced: set[str] = set()
        for fp, tid, path in _scan_manifests(self.root):
            rep.checked_manifests += 1
            rel = path.relative_to(self.root)
            try:
                m = self.get_manifest(fp, tid)
            except (ManifestError, KeyError) as e:
                rep.problems.append(f"{rel}: {e}")
                continue
            for o in m.objects():
                referenced.add(o.sha256)
                if o.sha256 not in good:
                    state = "damaged" if self.object_path(o).exists() else "missing"
                    rep.problems.append(f"{rel}: object {o.sha256} is {state}")
                elif good[o.sha256] != o.bytes:
                    rep.problems.append(f"{rel}: object {o.sha256} has {good[o.sha256]} bytes, manifest says {o.bytes}")
            rep.problems += self._prefix_problems(m, str(rel), good)
        idx = self.root / INDEX_PATH
        if idx.exists() and idx.is_file():
            try:
                entries = parse_json(read_store_file(self.root, INDEX_PATH, 1 << 30), str(INDEX_PATH))["manifests"]
                listed = {(e["model_fingerprint"], e["template_id"]) for e in entries}
            except (ValueError, KeyError, TypeError, OSError) as e:  # ManifestError is a ValueError
                rep.problems.append(f"{INDEX_PATH}: unreadable ({e})")
            else:
                if listed != set(self.manifest_keys()):
                    rep.problems.append(f"{INDEX_PATH}: does not list exactly the manifests on disk")
        rep.orphans = sorted(set(good) - referenced)
        return rep

    def gc(self, *, min_age_s: float = 3600.0, dry_run: bool = False) -> list[str]:
        """Delete objects no manifest refers to (e.g. left by an interrupted build) and stale temp
        files, if older than ``min_age_s`` seconds: a build in progress writes its objects before
        its manifest, so young orphans may be about to be referenced. Returns the deleted names.
        Temp files no live writer owns (`stale_temp_files`) go whatever their age. Runs under the
        writer lock; refuses if any manifest is unreadable (its objects would look like orphans). A
        store built before the marker gets it (migrated) unless ``dry_run``."""
        now = time.time()
        removed: list[str] = []
        if not dry_run:
            write_store_marker(self.root)
        stale = stale_temp_files(self.root) or []
        removed += stale if dry_run else _remove_temps(self.root, stale)
        with _locked(self.root):
            referenced: set[str] = set()
            for fp, tid, path in _scan_manifests(self.root):
                try:
                    m = self.get_manifest(fp, tid)
                except (ManifestError, KeyError) as e:
                    raise StoreError(f"gc refused: {path} is unreadable ({e}); fix or remove it first") from None
                referenced.update(o.sha256 for o in m.objects())
            for p in self._object_files():
                if p.name not in referenced and now - p.stat().st_mtime >= min_age_s:
                    removed.append(p.name)
                    if not dry_run:
                        p.unlink()
            tmp = self.root / TMP_DIR
            if tmp.is_dir():
                for p in tmp.iterdir():
                    if p.name == Path(WRITERS_LOCK).name:
                        continue
                    if f"{TMP_DIR}/{p.name}" not in removed and now - p.stat().st_mtime >= min_age_s:
                        removed.append(f"{TMP_DIR}/{p.name}")
                        if not dry_run:
                            p.unlink()
        return removed

