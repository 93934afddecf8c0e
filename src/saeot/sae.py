"""Sparse autoencoders: a TopK SAE trainer, SAELens on-disk format read/write, and a quality report.

SAELens format (what ``SAE.save_model`` of SAELens 6 writes; older releases differ only in cfg keys)::

    <folder>/cfg.json                 {"architecture": "topk"|"standard"|"jumprelu", "d_in", "d_sae",
                                       "apply_b_dec_to_input", "normalize_activations", "k" (topk),
                                       "rescale_acts_by_decoder_norm" (topk), "dtype", "device",
                                       "metadata": {"hook_name", "model_name", ...}}
                                      (before SAELens 6: hook_name / model_name at the top level,
                                       "hook_point" in the oldest)
    <folder>/sae_weights.safetensors  W_enc (d_in, d_sae), b_enc (d_sae,), W_dec (d_sae, d_in),
                                      b_dec (d_in,), threshold (d_sae,) for jumprelu

GemmaScope's original release: ``layer_<L>/width_<W>/average_l0_<n>/params.npz`` (same tensor
names, JumpReLU, no cfg.json); SAELens reads those with ``apply_b_dec_to_input = False`` and
``hook_name = blocks.<L>.hook_resid_post``, and so do we.

Encoding, exactly as SAELens does it (``process_sae_in`` then the architecture's ``encode``)::

    x'  = normalise(x)                      # normalize_activations, see _normalise_in
    pre = (x' - b_dec * apply_b_dec_to_input) @ W_enc + b_enc
    topk:     keep the k largest of pre, then relu   (pre * ||W_dec_j|| first if
              rescale_acts_by_decoder_norm)
    standard: relu(pre)
    jumprelu: relu(pre) * (pre > threshold)

Decoding: ``a @ W_dec + b_dec`` then the inverse normalisation.

Layer convention (see :mod:`saeot.collect`): residual layer 0 = embeddings, layer L >= 1 = the
output of transformer block L-1.  So SAELens ``blocks.L.hook_resid_post`` is layer L+1 and
``blocks.L.hook_resid_pre`` is layer L (:func:`hook_layer`).
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ARCHITECTURES = ("topk", "standard", "jumprelu")
NORMALISATIONS = ("none", "expected_average_only_in", "constant_norm_rescale", "layer_norm")
# the SAELens on-disk format version our writer follows (cfg layout of SAE.save_model, SAELens 6)
SAELENS_FORMAT_VERSION = "6.0.0"


def hook_layer(hook_name: str) -> int:
    """Residual layer index (saeot convention) of a SAELens / TransformerLens ``hook_name``.

    ``blocks.L.hook_resid_post`` -> L + 1 (output of block L); ``blocks.L.hook_resid_pre`` -> L
    (its input); ``hook_embed`` -> 0; saeot's own older ``resid_layer_L`` -> L.  Hooks that are
    not the residual stream between blocks (``hook_resid_mid``, ``hook_mlp_out``, ``attn.hook_z``)
    raise ValueError: saeot collects only the residual stream between blocks.

    Examples
    --------
    >>> hook_layer("blocks.12.hook_resid_post"), hook_layer("blocks.0.hook_resid_pre")
    (13, 0)
    """
    m = re.fullmatch(r"blocks\.(\d+)\.hook_resid_(pre|post)", hook_name)
    if m:
        return int(m.group(1)) + (1 if m.group(2) == "post" else 0)
    if hook_name == "hook_embed":
        return 0
    m = re.fullmatch(r"resid_layer_(\d+)", hook_name)
    if m:
        return int(m.group(1))
    raise ValueError(f"hook {hook_name!r} is not a residual-stream hook saeot can collect "
                     "(expected blocks.L.hook_resid_post / hook_resid_pre or hook_embed)")


def layer_hook_name(layer: int) -> str:
    """The SAELens ``hook_name`` of residual layer ``layer`` (inverse of :func:`hook_layer`)."""
    if layer < 0:
        raise ValueError(f"layer must be >= 0, got {layer}")
    return "blocks.0.hook_resid_pre" if layer == 0 else f"blocks.{layer - 1}.hook_resid_post"


@dataclass
class SAE:
    """SAE weights as numpy arrays (fp32) plus its config.

    Attributes
    ----------
    W_enc : (d_in, d_sae);  b_enc : (d_sae,);  W_dec : (d_sae, d_in);  b_dec : (d_in,)
    architecture : {"topk", "standard", "jumprelu"}
    k : int (topk only);  threshold : (d_sae,) (jumprelu only)
    cfg : dict   the SAELens config (flattened: metadata keys at the top level), written back on save
    apply_b_dec_to_input : bool   subtract b_dec before the encoder (SAELens default True;
                                  GemmaScope False)
    normalize_activations : str   one of NORMALISATIONS
    norm_scaling_factor : float or None   input scale for ``expected_average_only_in``
    rescale_acts_by_decoder_norm : bool   topk only (SAELens TopKSAE option)
    """

    W_enc: np.ndarray
    b_enc: np.ndarray
    W_dec: np.ndarray
    b_dec: np.ndarray
    architecture: str = "topk"
    k: int | None = 32
    threshold: np.ndarray | None = None
    cfg: dict = field(default_factory=dict)
    apply_b_dec_to_input: bool = True
    normalize_activations: str = "none"
    norm_scaling_factor: float | None = None
    rescale_acts_by_decoder_norm: bool = False

    def __post_init__(self):
        if self.normalize_activations not in NORMALISATIONS:
            raise ValueError(f"unsupported normalize_activations {self.normalize_activations!r}; "
                             f"expected one of {NORMALISATIONS}")
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"unsupported SAE architecture {self.architecture!r}; expected one of {ARCHITECTURES}")
        if self.architecture == "jumprelu" and self.threshold is None:
            raise ValueError("jumprelu SAE without threshold")

    # Copied from saeot.distributions.FeatureDistributions (n_features, k): two shape properties of
    # the same form over another array; a shared helper would be longer than the four lines.
    @property
    def d_in(self) -> int:
        return self.W_enc.shape[0]

    @property
    def d_sae(self) -> int:
        return self.W_enc.shape[1]

    @property
    def hook_name(self) -> str | None:
        return self.cfg.get("hook_name")

    @property
    def layer(self) -> int | None:
        """Residual layer (saeot convention) from ``hook_name``; None if the config has none."""
        return None if self.hook_name is None else hook_layer(self.hook_name)

    def _normalise_in(self, x):
        """torch (b, d_in) -> (normalised x, undo) as SAELens' run-time normalisation."""
        import torch

        mode = self.normalize_activations
        if mode == "constant_norm_rescale":
            c = (self.d_in ** 0.5) / x.norm(dim=-1, keepdim=True)
            return x * c, lambda y: y / c
        if mode == "layer_norm":
            mu = x.mean(dim=-1, keepdim=True)
            xc = x - mu
            std = xc.std(dim=-1, keepdim=True)
            return xc / (std + 1e-5), lambda y: y * std + mu
        if mode == "expected_average_only_in" and self.norm_scaling_factor is not None:
            s = float(self.norm_scaling_factor)
            return x * s, lambda y: y / s
        return x, (lambda y: y)

    def pre_activations(self, x, features=None):
        """torch (b, d_in) float32 -> (b, d_sae) encoder pre-activations (before the nonlinearity);
        only the columns ``features`` (an index array) if given."""
        import torch

        cols = slice(None) if features is None else np.atleast_1d(features)
        x, _ = self._normalise_in(x)
        We = torch.from_numpy(np.ascontiguousarray(self.W_enc[:, cols], np.float32))
        be = torch.from_numpy(np.ascontiguousarray(self.b_enc[cols], np.float32))
        if self.apply_b_dec_to_input:
            x = x - torch.from_numpy(self.b_dec.astype(np.float32))
        pre = x @ We + be
        if self.architecture == "topk" and self.rescale_acts_by_decoder_norm:
            pre = pre * torch.from_numpy(np.linalg.norm(self.W_dec[cols], axis=1).astype(np.float32))
        return pre

    def encode_torch(self, x):
        """torch (..., d_in) -> (..., d_sae) dense activations (differentiable in x)."""
        shape = x.shape
        pre = self.pre_activations(x.reshape(-1, shape[-1]))
        import torch

        th = None if self.threshold is None else torch.from_numpy(self.threshold.astype(np.float32))
        return _activate(pre, self.architecture, self.k, th).reshape(*shape[:-1], self.d_sae)

    def encode(self, x, batch_size: int = 4096):
        """(n, d_in) -> (n, d_sae) scipy.sparse.csr_matrix of activations (float32)."""
        import scipy.sparse as sp
        import torch

        x = np.asarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.d_in:
            raise ValueError(f"x must be (n, {self.d_in}), got {x.shape}")
        blocks = []
        with torch.no_grad():
            for s in range(0, len(x), batch_size):
                a = self.encode_torch(torch.from_numpy(x[s:s + batch_size]))  # (b, d_sae)
                blocks.append(sp.csr_matrix(a.numpy()))
        return sp.vstack(blocks, format="csr") if blocks else sp.csr_matrix((0, self.d_sae), dtype=np.float32)

    def decode(self, acts, x=None) -> np.ndarray:
        """(n, d_sae) dense or sparse -> (n, d_in) reconstructions.

        ``x`` (the inputs) is needed only for the per-token normalisations (``constant_norm_rescale``,
        ``layer_norm``), whose inverse depends on each input's norm.
        """
        import torch

        a = acts
        if self.architecture == "topk" and self.rescale_acts_by_decoder_norm:
            a = a @ np.diag(1.0 / np.linalg.norm(self.W_dec, axis=1)) if not hasattr(a, "multiply") \
                else a.multiply(1.0 / np.linalg.norm(self.W_dec, axis=1)[None, :])
        y = np.asarray(a @ self.W_dec) + self.b_dec
        if self.normalize_activations == "none" or (
                self.normalize_activations == "expected_average_only_in" and self.norm_scaling_factor is None):
            return y
        if self.normalize_activations in ("constant_norm_rescale", "layer_norm") and x is None:
            raise ValueError(f"decode with normalize_activations={self.normalize_activations!r} needs the inputs x")
        xt = torch.from_numpy(np.asarray(x if x is not None else y, dtype=np.float32))
        _, undo = self._normalise_in(xt)
        return undo(torch.from_numpy(np.asarray(y, dtype=np.float32))).numpy()


def _activate(pre, architecture: str, k: int | None, threshold=None):
    import torch

    if architecture == "topk":
        v, i = torch.topk(pre, k, dim=-1)
        return torch.zeros_like(pre).scatter_(-1, i, torch.relu(v))
    if architecture == "standard":
        return torch.relu(pre)
    if architecture == "jumprelu":  # SAELens: relu first, then the jump mask
        return torch.relu(pre) * (pre > threshold)
    raise ValueError(f"unknown SAE architecture {architecture!r}; expected one of {ARCHITECTURES}")


def sae_metadata(model_name: str, layer: int, **extra) -> dict:
    """SAELens metadata for an SAE on residual layer ``layer``: hook_name, hook_layer (the
    TransformerLens block index, as SAELens records it) and ``saeot_layer`` (our index)."""
    hook = layer_hook_name(layer)
    return {"model_name": model_name, "hook_name": hook, "hook_layer": int(hook.split(".")[1]),
            "saeot_layer": int(layer), **extra}


def train_topk_sae(X: np.ndarray, d_sae: int, k: int = 32, *, steps: int = 2000, batch_size: int = 1024,
                   lr: float = 1e-3, seed: int = 0, progress: bool = True, cfg: dict | None = None,
                   aux_k: int | None = None, aux_coef: float = 1 / 32, dead_after_tokens: int | None = None,
                   log: list | None = None, checkpoint: Path | None = None, checkpoint_every: int = 200,
                   stop_after: int | None = None) -> SAE | None:
    """Train a TopK SAE (Gao et al., 2024) on activations ``X`` with Adam on the MSE plus AuxK.

    Inputs are scaled so that the mean squared norm is ``d_in`` (SAELens'
    ``normalize_activations="expected_average_only_in"``); the scale is folded back into the
    weights, so the returned SAE works on raw activations.  Decoder rows are kept at unit norm.

    AuxK (Gao et al., 2024, sec. A.2): a feature that has not fired for ``dead_after_tokens``
    training tokens is "dead"; the ``aux_k`` largest pre-activations among dead features must
    reconstruct the residual ``x - x_hat``; their normalised MSE times ``aux_coef`` joins the loss.
    This pulls dead features back towards the data (``aux_k = 0`` turns it off).

    Parameters
    ----------
    X : (n, d_in) float
    d_sae : int     number of features
    k : int         active features per token
    steps : int     optimiser steps (each a random batch of ``batch_size`` rows)
    aux_k : int     default min(d_sae // 2, 4 k); 0 = no AuxK
    dead_after_tokens : int   default min(n / 4, 2 d_sae) tokens without firing
    log : list, optional      appended with {"step", "mse", "aux", "dead_frac"} every 100 steps
    checkpoint : Path, optional
        Resumable training: the full state (weights, Adam moments, RNG, dead counters, step) is
        written there atomically every ``checkpoint_every`` steps and loaded on start, so an
        interrupted run continues where it stopped and, with the same ``seed`` and data, ends
        with the same SAE as an uninterrupted one (tested).
    stop_after : int, optional
        With ``checkpoint``: run at most this many steps in this call, save, and return None if
        training is not finished (a time-boxed slice of a longer run).

    Returns
    -------
    SAE
        ``architecture="topk"``, ``apply_b_dec_to_input=True``.
    """
    import torch
    from tqdm.auto import tqdm

    X = np.asarray(X, dtype=np.float32)
    n, d = X.shape
    if k > d_sae:
        raise ValueError(f"k={k} > d_sae={d_sae}")
    aux_k = min(d_sae // 2, 4 * k) if aux_k is None else int(aux_k)
    dead_after = min(n // 4, 2 * d_sae) if dead_after_tokens is None else int(dead_after_tokens)
    scale = float(np.sqrt((X.astype(np.float64) ** 2).sum(1).mean() / d)) or 1.0
    Xt = torch.from_numpy(X / scale)
    g = torch.Generator().manual_seed(seed)
    W_dec = torch.randn(d_sae, d, generator=g)
    W_dec /= W_dec.norm(dim=1, keepdim=True)
    W_dec.requires_grad_(True)
    W_enc = W_dec.detach().T.clone().requires_grad_(True)  # (d, d_sae), tied init
    b_enc = torch.zeros(d_sae, requires_grad=True)
    b_dec = Xt.mean(0).clone().requires_grad_(True)
    opt = torch.optim.Adam([W_enc, b_enc, W_dec, b_dec], lr=lr)
    since_fired = torch.zeros(d_sae)  # tokens since each feature last fired
    bs = min(batch_size, n)
    start = 0
    ck_meta = {"n": n, "d": d, "d_sae": d_sae, "k": k, "steps": steps, "batch_size": bs, "lr": lr, "seed": seed,
               "aux_k": aux_k, "dead_after": dead_after}
    if checkpoint is not None and Path(checkpoint).exists():
        st = torch.load(checkpoint, weights_only=False)
        if st["meta"] != ck_meta:
            raise ValueError(f"checkpoint {checkpoint} is from another run ({st['meta']}); delete it or change the path")
        with torch.no_grad():
            for t, v in zip((W_enc, b_enc, W_dec, b_dec), st["params"]):
                t.copy_(v)
        opt.load_state_dict(st["opt"])
        g.set_state(st["rng"])
        since_fired = st["since_fired"]
        start = st["step"]
        if log is not None:
            log.extend(st.get("log", []))

    def save_checkpoint(step_done: int) -> None:
        from saeot.fsutil import atomic_write

        state = {"meta": ck_meta, "params": [t.detach().clone() for t in (W_enc, b_enc, W_dec, b_dec)],
                 "opt": opt.state_dict(), "rng": g.get_state(), "since_fired": since_fired, "step": step_done,
                 "log": list(log or [])}
        atomic_write(checkpoint, lambda f: torch.save(state, f))

    end = steps if stop_after is None else min(steps, start + int(stop_after))
    for step in tqdm(range(start, end), initial=start, total=steps, disable=not progress,
                     desc=f"train TopK SAE d_sae={d_sae}", mininterval=2):
        idx = torch.randint(0, n, (bs,), generator=g)
        x = Xt[idx]  # (b, d)
        pre = (x - b_dec) @ W_enc + b_enc  # (b, d_sae)
        a = _activate(pre, "topk", k)
        x_hat = a @ W_dec + b_dec
        err = x - x_hat
        mse = (err ** 2).sum(1).mean()
        loss = mse
        with torch.no_grad():
            fired = (a > 0).any(0)
            since_fired = torch.where(fired, torch.zeros_like(since_fired), since_fired + bs)
            dead = since_fired >= dead_after
        aux = torch.zeros(())
        n_dead = int(dead.sum())
        if aux_k > 0 and n_dead > 0:
            kk = min(aux_k, n_dead)
            pre_dead = pre.masked_fill(~dead, -torch.inf)
            v, i = torch.topk(pre_dead, kk, dim=-1)
            a_aux = torch.zeros_like(pre).scatter_(-1, i, torch.relu(v))
            e_hat = a_aux @ W_dec
            tgt = err.detach()
            aux = ((tgt - e_hat) ** 2).sum(1).mean() / ((tgt - tgt.mean(0)) ** 2).sum(1).mean().clamp_min(1e-12)
            loss = loss + aux_coef * aux
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            W_dec /= W_dec.norm(dim=1, keepdim=True).clamp_min(1e-8)
        for pg in opt.param_groups:  # linear decay over the last 20% of steps
            pg["lr"] = lr * min(1.0, (steps - step) / max(1, 0.2 * steps))
        if log is not None and (step % 100 == 0 or step == steps - 1):
            log.append({"step": step, "mse": float(mse), "aux": float(aux), "dead_frac": n_dead / d_sae})
        if checkpoint is not None and ((step + 1) % checkpoint_every == 0 or step == end - 1):
            save_checkpoint(step + 1)
    if end < steps:
        if checkpoint is None:
            raise ValueError("stop_after needs a checkpoint to resume from")
        return None
    # fold the input scale back: pre = (x/s - b_dec) W_enc + b_enc = (x - s b_dec)(W_enc/s) + b_enc
    we = W_enc.detach().numpy() / scale
    wd = W_dec.detach().numpy() * scale
    bd = b_dec.detach().numpy() * scale
    info = {"d_in": d, "d_sae": d_sae, "k": k, "architecture": "topk", "train_steps": steps,
            "train_tokens_seen": steps * bs, "normalization_scale": scale, "aux_k": aux_k, "aux_coef": aux_coef,
            "dead_after_tokens": dead_after}
    info.update(cfg or {})
    return SAE(we.astype(np.float32), b_enc.detach().numpy().astype(np.float32), wd.astype(np.float32),
               bd.astype(np.float32), "topk", k, None, info)


# cfg keys that live under "metadata" in SAELens 6 configs (LLM_METADATA_KEYS there, plus ours)
METADATA_KEYS = ("model_name", "hook_name", "hook_head_index", "hook_layer", "prepend_bos", "dataset_path",
                 "context_size", "model_class_name", "model_from_pretrained_kwargs", "seqpos_slice",
                 "exclude_special_tokens", "neuronpedia_id", "sae_lens_training_version", "sae_lens_version",
                 "train_steps", "train_tokens_seen", "normalization_scale", "aux_k", "aux_coef", "saeot_layer",
                 "dead_after_tokens")


def save_sae(sae: SAE, folder: Path) -> Path:
    """Write ``sae`` in the SAELens 6 on-disk format (atomically: temp folder, then rename).

    ``SAE.load_from_disk`` of SAELens reads the result (same cfg keys as its ``save_model``;
    the weights file holds exactly the parameters its architecture class declares).
    """
    from safetensors.numpy import save_file

    from saeot.fsutil import atomic_folder

    folder = Path(folder)
    with atomic_folder(folder) as tmp:
        tensors = {"W_enc": sae.W_enc, "b_enc": sae.b_enc, "W_dec": sae.W_dec, "b_dec": sae.b_dec}
        if sae.architecture == "jumprelu":
            tensors["threshold"] = sae.threshold
        meta = {k: v for k, v in sae.cfg.items() if k in METADATA_KEYS}
        meta.setdefault("sae_lens_version", SAELENS_FORMAT_VERSION)
        meta.setdefault("sae_lens_training_version", None)
        meta["saeot_format"] = 1
        normalise = sae.normalize_activations
        if normalise == "expected_average_only_in" and sae.norm_scaling_factor is not None:
            normalise = "none"  # folded below, as SAELens' fold_activation_norm_scaling_factor does
        cfg = {"architecture": sae.architecture, "d_in": sae.d_in, "d_sae": sae.d_sae, "dtype": "float32",
               "device": "cpu", "apply_b_dec_to_input": bool(sae.apply_b_dec_to_input),
               "normalize_activations": normalise, "reshape_activations": "none", "metadata": meta}
        if sae.architecture == "topk":
            cfg["k"] = int(sae.k)
            cfg["rescale_acts_by_decoder_norm"] = bool(sae.rescale_acts_by_decoder_norm)
        if normalise != sae.normalize_activations:  # x*s in: W_enc*s, and outputs / s
            sc = float(sae.norm_scaling_factor)
            tensors.update({"W_enc": sae.W_enc * sc, "W_dec": sae.W_dec / sc, "b_dec": sae.b_dec / sc})
        save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()},
                  str(tmp / "sae_weights.safetensors"))
        (tmp / "cfg.json").write_text(json.dumps(cfg, indent=1))
    return folder


def _flatten_cfg(cfg: dict) -> dict:
    """SAELens 6 keeps hook_name etc. under "metadata"; older versions at the top level."""
    flat = dict(cfg)
    flat.update({k: v for k, v in (cfg.get("metadata") or {}).items() if k not in flat})
    if "hook_point" in flat and "hook_name" not in flat:  # SAELens < 1
        flat["hook_name"] = flat["hook_point"]
    return flat


def load_sae(folder: Path, *, norm_scaling_factor: float | None = None) -> SAE:
    """Read an SAE in the SAELens on-disk format, or a GemmaScope ``params.npz`` folder.

    Encoding follows the config (module docstring): ``apply_b_dec_to_input`` (default True, as
    SAELens' own default for configs that do not say), ``normalize_activations``, JumpReLU
    thresholds, TopK k (``k`` or ``activation_fn_kwargs.k``) and ``rescale_acts_by_decoder_norm``.
    Configs without ``architecture`` are ``standard``.

    GemmaScope ``params.npz`` without cfg.json: JumpReLU, ``apply_b_dec_to_input = False``,
    ``hook_name = blocks.L.hook_resid_post`` with L from a ``layer_L`` folder on the path.

    ``norm_scaling_factor``: the input scale of an ``expected_average_only_in`` SAE (SAELens keeps
    it in its release directory, not in cfg.json); without it such an SAE is read as SAELens'
    ``load_from_disk`` reads it (no scaling) and a warning says so.
    """
    folder = Path(folder)
    cfg_path = folder / "cfg.json"
    raw = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    cfg = _flatten_cfg(raw)
    if (folder / "sae_weights.safetensors").exists():
        from safetensors.numpy import load_file

        w = load_file(str(folder / "sae_weights.safetensors"))
    elif (folder / "params.npz").exists():
        w = dict(np.load(folder / "params.npz"))
        if not raw:  # GemmaScope's original release: what SAELens' gemma-scope loader assumes
            cfg.update({"architecture": "jumprelu", "apply_b_dec_to_input": False, "normalize_activations": "none"})
            m = re.search(r"layer_(\d+)", str(folder.resolve()))
            if m:
                cfg["hook_name"] = f"blocks.{int(m.group(1))}.hook_resid_post"
            cfg["d_in"], cfg["d_sae"] = w["W_enc"].shape
    else:
        raise FileNotFoundError(f"{folder}: no sae_weights.safetensors or params.npz")
    arch = cfg.get("architecture", "standard")
    if arch not in ARCHITECTURES:
        raise ValueError(f"{folder}: unsupported SAE architecture {arch!r}; expected one of {ARCHITECTURES}")
    k = cfg.get("k") or (cfg.get("activation_fn_kwargs") or {}).get("k")
    if arch == "topk" and not k:
        raise ValueError(f"{folder}: topk SAE without k in cfg.json")
    norm = cfg.get("normalize_activations", "none")
    if isinstance(norm, bool) or norm is None:  # SAELens < 3 stored a bool
        norm = "expected_average_only_in" if norm else "none"
    if norm not in NORMALISATIONS:
        raise ValueError(f"{folder}: unsupported normalize_activations {norm!r}; expected one of {NORMALISATIONS}")
    scale = norm_scaling_factor if norm_scaling_factor is not None else cfg.get("norm_scaling_factor")
    if norm == "expected_average_only_in" and scale is None:
        warnings.warn(f"{folder}: normalize_activations='expected_average_only_in' without a norm_scaling_factor; "
                      "encoding raw activations (as SAELens load_from_disk does)", UserWarning, stacklevel=2)
    if "scaling_factor" in w and not np.allclose(w["scaling_factor"], 1.0):
        raise ValueError(f"{folder}: finetuning scaling_factor != 1 is not supported")
    th = w.get("threshold")
    if th is None and "log_threshold" in w:  # SAELens JumpReLU training checkpoints
        th = np.exp(w["log_threshold"])
    sae = SAE(w["W_enc"].astype(np.float32), w["b_enc"].astype(np.float32), w["W_dec"].astype(np.float32),
              w["b_dec"].astype(np.float32), arch, int(k) if k else None,
              None if th is None else np.asarray(th, dtype=np.float32), cfg,
              apply_b_dec_to_input=bool(cfg.get("apply_b_dec_to_input", True)), normalize_activations=norm,
              norm_scaling_factor=None if scale is None else float(scale),
              rescale_acts_by_decoder_norm=bool(cfg.get("rescale_acts_by_decoder_norm", False)))
    if sae.W_dec.shape != (sae.d_sae, sae.d_in):
        raise ValueError(f"{folder}: W_dec shape {sae.W_dec.shape} != (d_sae, d_in) = {(sae.d_sae, sae.d_in)}")
    if cfg.get("d_in") not in (None, sae.d_in) or cfg.get("d_sae") not in (None, sae.d_sae):
        raise ValueError(f"{folder}: cfg d_in/d_sae {cfg.get('d_in')}/{cfg.get('d_sae')} do not match the weights "
                         f"{sae.d_in}/{sae.d_sae}")
    return sae


def sae_report(sae: SAE, X: np.ndarray, acts=None) -> dict:
    """Fraction of variance unexplained, mean L0 and dead features on ``X`` (n, d_in).

    Returns
    -------
    dict
        ``fvu`` = sum ||x - x_hat||^2 / sum ||x - mean(x)||^2; ``l0`` = mean active features per
        token; ``dead_frac`` = fraction of features never active on X; ``n_tokens``.
    """
    X = np.asarray(X, dtype=np.float64)
    acts = sae.encode(X) if acts is None else acts
    Xh = sae.decode(acts, X).astype(np.float64)
    fvu = float(((X - Xh) ** 2).sum() / ((X - X.mean(0)) ** 2).sum())
    l0 = float(acts.getnnz(axis=1).mean())
    fired = np.asarray(acts.getnnz(axis=0)).ravel() > 0
    return {"fvu": fvu, "l0": l0, "dead_frac": float(1 - fired.mean()), "n_tokens": int(len(X))}
