"""Sparse autoencoders: a TopK SAE trainer, SAELens on-disk format read/write, and a quality report.

SAELens format (what ``SAE.save_model`` writes and GemmaScope / gpt2-small-res-jb releases use)::

    <folder>/cfg.json                 {"architecture": "topk"|"standard"|"jumprelu", "d_in", "d_sae",
                                       "k" (topk), "hook_name", "model_name", ...}
    <folder>/sae_weights.safetensors  W_enc (d_in, d_sae), b_enc (d_sae,), W_dec (d_sae, d_in),
                                      b_dec (d_in,), threshold (d_sae,) for jumprelu

Encoding: ``pre = (x - b_dec) @ W_enc + b_enc``; topk keeps the k largest of relu(pre) (SAELens
TopK); standard = relu(pre); jumprelu = pre * (pre > threshold).  Decoding: ``a @ W_dec + b_dec``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ARCHITECTURES = ("topk", "standard", "jumprelu")


@dataclass
class SAE:
    """SAE weights as numpy arrays (fp32) plus its config.

    Attributes
    ----------
    W_enc : (d_in, d_sae);  b_enc : (d_sae,);  W_dec : (d_sae, d_in);  b_dec : (d_in,)
    architecture : {"topk", "standard", "jumprelu"}
    k : int (topk only);  threshold : (d_sae,) (jumprelu only)
    cfg : dict   extra SAELens config fields (hook_name, model_name, ...), written back on save
    """

    W_enc: np.ndarray
    b_enc: np.ndarray
    W_dec: np.ndarray
    b_dec: np.ndarray
    architecture: str = "topk"
    k: int | None = 32
    threshold: np.ndarray | None = None
    cfg: dict = field(default_factory=dict)

    @property
    def d_in(self) -> int:
        return self.W_enc.shape[0]

    @property
    def d_sae(self) -> int:
        return self.W_enc.shape[1]

    def encode(self, x, batch_size: int = 4096):
        """(n, d_in) -> (n, d_sae) scipy.sparse.csr_matrix of activations (float32)."""
        import scipy.sparse as sp
        import torch

        x = np.asarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.d_in:
            raise ValueError(f"x must be (n, {self.d_in}), got {x.shape}")
        We = torch.from_numpy(np.ascontiguousarray(self.W_enc, np.float32))
        be = torch.from_numpy(self.b_enc.astype(np.float32))
        bd = torch.from_numpy(self.b_dec.astype(np.float32))
        th = None if self.threshold is None else torch.from_numpy(self.threshold.astype(np.float32))
        blocks = []
        for s in range(0, len(x), batch_size):
            pre = (torch.from_numpy(x[s:s + batch_size]) - bd) @ We + be  # (b, d_sae)
            a = _activate(pre, self.architecture, self.k, th)
            blocks.append(sp.csr_matrix(a.numpy()))
        return sp.vstack(blocks, format="csr") if blocks else sp.csr_matrix((0, self.d_sae), dtype=np.float32)

    def decode(self, acts) -> np.ndarray:
        """(n, d_sae) dense or sparse -> (n, d_in) reconstructions."""
        return np.asarray(acts @ self.W_dec) + self.b_dec


def _activate(pre, architecture: str, k: int | None, threshold=None):
    import torch

    if architecture == "topk":
        v, i = torch.topk(pre, k, dim=-1)
        return torch.zeros_like(pre).scatter_(-1, i, torch.relu(v))
    if architecture == "standard":
        return torch.relu(pre)
    if architecture == "jumprelu":
        return pre * (pre > threshold)
    raise ValueError(f"unknown SAE architecture {architecture!r}; expected one of {ARCHITECTURES}")


def train_topk_sae(X: np.ndarray, d_sae: int, k: int = 32, *, steps: int = 2000, batch_size: int = 1024,
                   lr: float = 1e-3, seed: int = 0, progress: bool = True, cfg: dict | None = None) -> SAE:
    """Train a TopK SAE (Gao et al., 2024) on activations ``X`` with Adam on the MSE.

    Inputs are scaled so that the mean squared norm is ``d_in`` (SAELens'
    ``normalize_activations="expected_average_only_in"``); the scale is folded back into the
    weights, so the returned SAE works on raw activations.  Decoder rows are kept at unit norm.

    Parameters
    ----------
    X : (n, d_in) float
    d_sae : int     number of features
    k : int         active features per token
    steps : int     optimiser steps (each a random batch of ``batch_size`` rows)

    Returns
    -------
    SAE
        ``architecture="topk"``.
    """
    import torch
    from tqdm.auto import tqdm

    X = np.asarray(X, dtype=np.float32)
    n, d = X.shape
    if k > d_sae:
        raise ValueError(f"k={k} > d_sae={d_sae}")
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
    for step in tqdm(range(steps), disable=not progress, desc=f"train TopK SAE d_sae={d_sae}", mininterval=2):
        idx = torch.randint(0, n, (min(batch_size, n),), generator=g)
        x = Xt[idx]  # (b, d)
        a = _activate((x - b_dec) @ W_enc + b_enc, "topk", k)  # (b, d_sae)
        loss = ((a @ W_dec + b_dec - x) ** 2).sum(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            W_dec /= W_dec.norm(dim=1, keepdim=True).clamp_min(1e-8)
        for pg in opt.param_groups:  # linear decay over the last 20% of steps
            pg["lr"] = lr * min(1.0, (steps - step) / max(1, 0.2 * steps))
    # fold the input scale back: pre = (x/s - b_dec) W_enc + b_enc = (x - s b_dec)(W_enc/s) + b_enc
    we = W_enc.detach().numpy() / scale
    wd = W_dec.detach().numpy() * scale
    bd = b_dec.detach().numpy() * scale
    info = {"d_in": d, "d_sae": d_sae, "k": k, "architecture": "topk", "train_steps": steps,
            "train_tokens_seen": steps * min(batch_size, n), "normalization_scale": scale}
    info.update(cfg or {})
    return SAE(we.astype(np.float32), b_enc.detach().numpy().astype(np.float32), wd.astype(np.float32),
               bd.astype(np.float32), "topk", k, None, info)


def save_sae(sae: SAE, folder: Path) -> Path:
    """Write ``sae`` in the SAELens on-disk format (atomically: temp folder, then rename)."""
    from safetensors.numpy import save_file

    from saeot.fsutil import atomic_folder

    folder = Path(folder)
    with atomic_folder(folder) as tmp:
        tensors = {"W_enc": sae.W_enc, "b_enc": sae.b_enc, "W_dec": sae.W_dec, "b_dec": sae.b_dec}
        if sae.threshold is not None:
            tensors["threshold"] = sae.threshold
        save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()},
                  str(tmp / "sae_weights.safetensors"))
        cfg = dict(sae.cfg)
        cfg.update({"architecture": sae.architecture, "d_in": sae.d_in, "d_sae": sae.d_sae,
                    "dtype": "float32", "device": "cpu"})
        if sae.architecture == "topk":
            cfg["k"] = sae.k
        (tmp / "cfg.json").write_text(json.dumps(cfg, indent=1))
    return folder


def load_sae(folder: Path) -> SAE:
    """Read an SAE in the SAELens on-disk format (ours, GemmaScope-converted, gpt2-small-res-jb).

    Older SAELens configs without ``architecture`` are ``standard``; a ``topk`` may keep k under
    ``k`` or ``activation_fn_kwargs.k``.  Parameter files named ``params.npz`` (GemmaScope's
    original release) are read too.
    """
    folder = Path(folder)
    cfg_path = folder / "cfg.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    if (folder / "sae_weights.safetensors").exists():
        from safetensors.numpy import load_file

        w = load_file(str(folder / "sae_weights.safetensors"))
    elif (folder / "params.npz").exists():
        w = dict(np.load(folder / "params.npz"))
        cfg.setdefault("architecture", "jumprelu")
    else:
        raise FileNotFoundError(f"{folder}: no sae_weights.safetensors or params.npz")
    arch = cfg.get("architecture", "standard")
    if arch not in ARCHITECTURES:
        raise ValueError(f"{folder}: unsupported SAE architecture {arch!r}; expected one of {ARCHITECTURES}")
    k = cfg.get("k") or (cfg.get("activation_fn_kwargs") or {}).get("k")
    if arch == "topk" and not k:
        raise ValueError(f"{folder}: topk SAE without k in cfg.json")
    sae = SAE(w["W_enc"].astype(np.float32), w["b_enc"].astype(np.float32), w["W_dec"].astype(np.float32),
              w["b_dec"].astype(np.float32), arch, int(k) if k else None,
              None if w.get("threshold") is None else np.asarray(w["threshold"], dtype=np.float32), cfg)
    if sae.W_dec.shape != (sae.d_sae, sae.d_in):
        raise ValueError(f"{folder}: W_dec shape {sae.W_dec.shape} != (d_sae, d_in) = {(sae.d_sae, sae.d_in)}")
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
    Xh = sae.decode(acts).astype(np.float64)
    fvu = float(((X - Xh) ** 2).sum() / ((X - X.mean(0)) ** 2).sum())
    l0 = float(acts.getnnz(axis=1).mean())
    fired = np.asarray(acts.getnnz(axis=0)).ravel() > 0
    return {"fvu": fvu, "l0": l0, "dead_frac": float(1 - fired.mean()), "n_tokens": int(len(X))}
