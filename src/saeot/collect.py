"""Residual-stream activation collector with a resumable safetensors cache.

Layer convention: layer 0 = the embedding module's output (incl. any embedding scaling); layer
i >= 1 = the output of transformer block i-1; the last layer is the last block's output, *before*
the final norm.  Hooks capture these directly (``output_hidden_states`` would apply the final
norm to the last entry on some architectures).

Cache layout (``out_dir``)::

    manifest.json            model, layers, ctx_len, chunk fingerprint, n_shards
    shard_00000.safetensors  tokens (n,) int64, chunk (n,) int64, pos (n,) int64,
                             layer_<l> (n, d) float32 for each collected layer

A shard holds one batch of chunks; each is written atomically and durably (:mod:`saeot.fsutil`), so an
interrupted run resumes from the first missing shard.  The BOS token the model is fed (when the
tokenizer has one) is never stored: only corpus tokens are.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from saeot.corpus import chunks_fingerprint
from saeot.errors import ActivationFileError
from saeot.fsutil import atomic_write


class _StopForward(Exception):
    """Raised by the deepest collection hook to end a forward pass whose later layers are not needed."""


def _atomic_write_json(path: Path, obj) -> None:
    atomic_write(path, json.dumps(obj, indent=1).encode("utf-8"))


def collect_activations(lm, chunks: list[list[int]], out_dir: Path, layers: list[int] | None = None,
                        batch_size: int = 8, progress: bool = True, source: str | None = None) -> Path:
    """Run ``lm`` over ``chunks`` and cache residual-stream activations at ``layers``.

    Parameters
    ----------
    lm : saeot.models.LoadedModel
    chunks : list of list of int
        Token chunks (all the same length; see :func:`saeot.corpus.chunk_corpus`).
    out_dir : Path
    layers : list of int, optional
        Residual layers 0..lm.n_layers-1; default all.
    batch_size : int
        Chunks per forward pass (= per shard).
    source : str, optional
        Where the text came from (a user's file), recorded in the manifest; None = the bundled corpus.

    Returns
    -------
    Path
        ``out_dir``.
    """
    import torch  # lazy: torch (seconds) keeps --help fast
    from safetensors.torch import save as safetensors_bytes  # lazy: safetensors backends, on read
    from tqdm.auto import tqdm  # lazy: tqdm.auto (0.3 s) keeps --help fast

    layers = list(range(lm.n_layers)) if layers is None else sorted(set(int(l) for l in layers))
    bad = [l for l in layers if not 0 <= l < lm.n_layers]
    if bad:
        raise ValueError(f"layers {bad} out of range 0..{lm.n_layers - 1} for {lm.name}")
    if not chunks or len({len(c) for c in chunks}) != 1:
        raise ValueError("chunks must be a non-empty list of equal-length token lists")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    n_shards = (len(chunks) + batch_size - 1) // batch_size
    manifest = {"model": lm.name, "layers": layers, "ctx_len": len(chunks[0]), "n_chunks": len(chunks),
                "batch_size": batch_size, "n_shards": n_shards, "fingerprint": chunks_fingerprint(chunks),
                "d_model": lm.d_model, "format": "saeot-activations/1"}
    if source is not None:
        manifest["text"] = str(source)
    mpath = out_dir / "manifest.json"
    if mpath.exists():
        old = json.loads(mpath.read_text())
        if old != manifest:
            raise ValueError(f"{out_dir} holds a different collection ({old.get('model')}, "
                             f"layers {old.get('layers')}); use another folder")
    else:
        _atomic_write_json(mpath, manifest)
    bos = getattr(lm.tokenizer, "bos_token_id", None) if lm.causal else getattr(lm.tokenizer, "cls_token_id", None)
    captured: dict[int, torch.Tensor] = {}
    last = max(layers)

    def hook_for(layer):
        def hook(_mod, _inp, out):
            captured[layer] = (out[0] if isinstance(out, tuple) else out).detach()
            if layer == last:
                # Nothing after the deepest collected layer is stored, so stop the forward here. For a
                # causal LM the unembedding is most of the cost: Gemma-3-270M's head (640 x 262,144)
                # is ~1.7x the MACs of its 18 blocks together.
                raise _StopForward
        return hook

    handles = []
    if 0 in layers:
        handles.append(lm.embed.register_forward_hook(hook_for(0)))
    for i, blk in enumerate(lm.blocks):
        if i + 1 in layers:
            handles.append(blk.register_forward_hook(hook_for(i + 1)))
    try:
        todo = [s for s in range(n_shards) if not (out_dir / f"shard_{s:05d}.safetensors").exists()]
        for s in tqdm(todo, disable=not progress, desc=f"collect {lm.name}", unit="shard"):
            batch = chunks[s * batch_size:(s + 1) * batch_size]
            ids = torch.tensor(batch, dtype=torch.long, device=lm.device)  # (B, T)
            skip = 0
            if bos is not None:
                ids = torch.cat([torch.full((len(batch), 1), bos, dtype=torch.long, device=lm.device), ids], 1)
                skip = 1
            captured.clear()
            with torch.no_grad():
                try:
                    lm.model(input_ids=ids, attention_mask=torch.ones_like(ids))
                except _StopForward:
                    pass
            B, T = len(batch), len(batch[0])
            tensors = {
                "tokens": torch.tensor(batch, dtype=torch.long).reshape(-1),  # (B*T,)
                "chunk": torch.arange(s * batch_size, s * batch_size + B).repeat_interleave(T),
                "pos": torch.arange(T).repeat(B),
            }
            for l in layers:
                h = captured[l][:, skip:, :]  # (B, T, d) corpus tokens only
                tensors[f"layer_{l}"] = h.reshape(B * T, -1).float().cpu().contiguous()
            atomic_write(out_dir / f"shard_{s:05d}.safetensors", safetensors_bytes(tensors))
    finally:
        for h in handles:
            h.remove()
    return out_dir


def chunk_token_set(cache_dir: Path, mask: np.ndarray | None = None) -> set[bytes]:
    """The token content of a cache's chunks (one ``bytes`` key per chunk), optionally only the
    chunks of the tokens selected by ``mask`` (n_tokens,) bool."""
    tokens, chunk = load_activations(cache_dir, "tokens"), load_activations(cache_dir, "chunk")
    if mask is not None:
        tokens, chunk = tokens[mask], chunk[mask]
    # chunks are stored contiguously, one row per token in position order
    cuts = np.flatnonzero(np.diff(chunk)) + 1
    return {t.astype(np.int64).tobytes() for t in np.split(tokens, cuts)}


def excluding_chunks(chunks: list[list[int]], cache_dir: Path) -> list[list[int]]:
    """``chunks`` without those whose tokens already lie in the cache at ``cache_dir``, so a
    training-only collection never repeats (say) the evaluation's held-out chunks."""
    seen = chunk_token_set(cache_dir)
    return [c for c in chunks if np.asarray(c, dtype=np.int64).tobytes() not in seen]


def load_manifest(cache_dir: Path) -> dict:
    p = Path(cache_dir) / "manifest.json"
    if not p.exists():
        raise FileNotFoundError(f"no activation cache at {cache_dir} (run `saeot collect`)")
    try:
        man = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ActivationFileError(f"{p}: invalid JSON ({e})") from None
    need = {"layers": list, "n_shards": int, "d_model": int}
    if not isinstance(man, dict) or any(not isinstance(man.get(k), t) for k, t in need.items()):
        raise ActivationFileError(f"{p}: not a saeot activation manifest (needs {', '.join(need)})")
    return man


def load_activations(cache_dir: Path, key: str | int) -> np.ndarray:
    """Concatenate one tensor over all shards: ``key`` = a layer number or tokens/chunk/pos.

    Every shard's tensor is checked from its header before it is read (present, 1-D or
    (rows, d_model), floating for layers) and layer tensors must be finite; a bad shard is one
    :class:`saeot.errors.ActivationFileError` line naming it.

    Returns
    -------
    (n_tokens, d) float32 for a layer, (n_tokens,) int64 otherwise.
    """
    from safetensors import safe_open  # lazy: safetensors backends, on read

    man = load_manifest(cache_dir)
    name = f"layer_{key}" if isinstance(key, int) or str(key).isdigit() else str(key)
    is_layer = name.startswith("layer_")
    if is_layer and int(name[6:]) not in man["layers"]:
        raise ValueError(f"layer {name[6:]} not collected in {cache_dir} (have {man['layers']})")
    parts = []
    for s in range(man["n_shards"]):
        p = Path(cache_dir) / f"shard_{s:05d}.safetensors"
        if not p.exists():
            raise FileNotFoundError(f"{p} missing: collection incomplete, re-run `saeot collect` to resume")
        try:
            with safe_open(str(p), framework="np") as f:
                if name not in f.keys():
                    raise ActivationFileError(f"{p}: no tensor {name!r}")
                shape = tuple(f.get_slice(name).get_shape())
                want = 2 if is_layer else 1
                if len(shape) != want or (is_layer and shape[1] != man["d_model"]):
                    raise ActivationFileError(f"{p}: {name} has shape {list(shape)}, expected "
                                              + (f"(rows, {man['d_model']})" if is_layer else "(rows,)"))
                x = f.get_tensor(name)
        except ActivationFileError:
            raise
        except Exception as e:  # noqa: BLE001 - a corrupt external file is one line, whatever the parser says
            raise ActivationFileError(f"{p}: unreadable ({type(e).__name__}: {e})") from None
        if is_layer:
            if x.dtype.kind != "f":
                raise ActivationFileError(f"{p}: {name} has dtype {x.dtype}, expected floating point")
            bad = int(x.size - np.isfinite(x).sum())
            if bad:
                raise ActivationFileError(f"{p}: {name} has {bad} NaN/inf values")
        if parts and len(x) != len(parts[0]) and s < man["n_shards"] - 1:
            raise ActivationFileError(f"{p}: {name} has {len(x)} rows, other shards {len(parts[0])}")
        parts.append(x)
    return np.concatenate(parts, 0)


# Largest activation array load_array reads (float32 bytes): a user's file claiming more is refused
# from its header, before any allocation.
MAX_ARRAY_BYTES = int(os.environ.get("SAEOT_MAX_ARRAY_BYTES", 16 << 30))


def load_array(path: Path, *, d: int | None = None, rows: int | None = None, what: str = "activations",
               integer: bool = False, max_bytes: int | None = None) -> np.ndarray:
    """A user's activation (or token id) array from ``.npy``, ``.npz`` or ``.safetensors``.

    ``.npz`` / ``.safetensors`` must hold one array (or one named ``activations`` / ``tokens``).
    Shape, dtype and size are checked from the header before reading; activations must be
    (rows, d) floating and finite, token ids (rows,) integers.  Each failure is one
    :class:`saeot.errors.ActivationFileError` line naming the file.

    Returns
    -------
    (rows, d) float32, or (rows,) int64 with ``integer``.
    """
    path = Path(path)
    if not path.is_file():
        raise ActivationFileError(f"{path}: no such file ({what})")
    want = "tokens" if integer else "activations"
    try:
        if path.suffix == ".npy":
            x = np.load(path, mmap_mode="r", allow_pickle=False)  # header only; pages read on use
        elif path.suffix == ".npz":
            z = np.load(path, allow_pickle=False)
            names = list(z.files)
            key = want if want in names else names[0] if len(names) == 1 else None
            if key is None:
                raise ActivationFileError(f"{path}: holds {names}; expected one array or one named {want!r}")
            x = z[key]
        elif path.suffix == ".safetensors":
            from safetensors import safe_open  # lazy: safetensors backends, on read

            with safe_open(str(path), framework="np") as f:
                names = list(f.keys())
                key = want if want in names else names[0] if len(names) == 1 else None
                if key is None:
                    raise ActivationFileError(f"{path}: holds {names}; expected one tensor or one named {want!r}")
                shape = tuple(f.get_slice(key).get_shape())
                if 4 * int(np.prod(shape, dtype=np.int64)) > (MAX_ARRAY_BYTES if max_bytes is None else max_bytes):
                    raise ActivationFileError(f"{path}: {key} {list(shape)} is over the size limit "
                                              "(SAEOT_MAX_ARRAY_BYTES); refused before loading")
                x = f.get_tensor(key)
        else:
            raise ActivationFileError(f"{path}: expected a .npy, .npz or .safetensors file ({what})")
    except ActivationFileError:
        raise
    except Exception as e:  # noqa: BLE001 - a corrupt external file is one line, whatever the parser says
        raise ActivationFileError(f"{path}: unreadable ({type(e).__name__}: {e})") from None
    shape = tuple(x.shape)
    if 4 * int(np.prod(shape, dtype=np.int64)) > (MAX_ARRAY_BYTES if max_bytes is None else max_bytes):
        raise ActivationFileError(f"{path}: {list(shape)} is over the size limit (SAEOT_MAX_ARRAY_BYTES); "
                                  "refused before loading")
    if integer:
        if len(shape) != 1 or x.dtype.kind not in "iu":
            raise ActivationFileError(f"{path}: {what} must be a 1-D integer array, got {x.dtype}{list(shape)}")
    else:
        if len(shape) != 2 or x.dtype.kind != "f":
            raise ActivationFileError(f"{path}: {what} must be a 2-D float array (rows, d), got {x.dtype}{list(shape)}")
        if d is not None and shape[1] != d:
            raise ActivationFileError(f"{path}: {what} have d = {shape[1]}, the SAE expects d_in = {d}")
    if rows is not None and shape[0] != rows:
        raise ActivationFileError(f"{path}: {what} have {shape[0]} rows, expected {rows} (one per token, "
                                  "the same tokens for both layers)")
    if shape[0] == 0:
        raise ActivationFileError(f"{path}: {what} are empty")
    out = np.array(x, dtype=np.int64 if integer else np.float32)  # a copy: never a read-only memmap
    if not integer:
        bad = int(out.size - np.isfinite(out).sum())
        if bad:
            raise ActivationFileError(f"{path}: {what} have {bad} NaN/inf values")
    return out
