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
import os
import re
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from saeot.errors import InputError, LayerMismatchError, SAEFormatError
from saeot.fsutil import atomic_folder, atomic_write

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
        import torch  # lazy: torch (seconds) keeps --help fast

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
        import torch  # lazy: torch (seconds) keeps --help fast

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
        import torch  # lazy: torch (seconds) keeps --help fast

        th = None if self.threshold is None else torch.from_numpy(self.threshold.astype(np.float32))
        return _activate(pre, self.architecture, self.k, th).reshape(*shape[:-1], self.d_sae)

    def encode(self, x, batch_size: int = 4096):
        """(n, d_in) -> (n, d_sae) scipy.sparse.csr_matrix of activations (float32)."""
        import scipy.sparse as sp  # lazy: scipy (0.3-3 s) keeps --help fast
        import torch  # lazy: torch (seconds) keeps --help fast

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
        import torch  # lazy: torch (seconds) keeps --help fast

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
    import torch  # lazy: torch (seconds) keeps --help fast

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


def _init_params(X: np.ndarray, d_sae: int, seed: int):
    """The training start both SAE kinds share: the RMS scale of `X` (n, d) float32, the scaled
    activations as a tensor, the generator seeded by `seed` (it draws the batches next), unit-norm random decoder rows (d_sae, d) from `seed`, the encoder tied
    to them (d, d_sae), a zero encoder bias and the data mean as decoder bias (leaf tensors)."""
    import torch  # lazy: torch (seconds) keeps --help fast

    d = X.shape[1]
    scale = float(np.sqrt((X.astype(np.float64) ** 2).sum(1).mean() / d)) or 1.0
    Xt = torch.from_numpy(X / scale)
    g = torch.Generator().manual_seed(seed)
    W_dec = torch.randn(d_sae, d, generator=g)
    W_dec /= W_dec.norm(dim=1, keepdim=True)
    W_dec.requires_grad_(True)
    W_enc = W_dec.detach().T.clone().requires_grad_(True)  # (d, d_sae), tied init
    b_enc = torch.zeros(d_sae, requires_grad=True)
    b_dec = Xt.mean(0).clone().requires_grad_(True)
    return scale, Xt, g, W_enc, b_enc, W_dec, b_dec


def _stopped_early(end: int, steps: int, checkpoint) -> bool:
    """A trainer that ran to `end` < `steps` (``stop_after``) has only its checkpoint to show."""
    if end < steps:
        if checkpoint is None:
            raise ValueError("stop_after needs a checkpoint to resume from")
        return True
    return False


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
    import torch  # lazy: torch (seconds) keeps --help fast
    from tqdm.auto import tqdm  # lazy: tqdm.auto (0.3 s) keeps --help fast

    X = np.asarray(X, dtype=np.float32)
    n, d = X.shape
    if k > d_sae:
        raise ValueError(f"k={k} > d_sae={d_sae}")
    aux_k = min(d_sae // 2, 4 * k) if aux_k is None else int(aux_k)
    dead_after = min(n // 4, 2 * d_sae) if dead_after_tokens is None else int(dead_after_tokens)
    scale, Xt, g, W_enc, b_enc, W_dec, b_dec = _init_params(X, d_sae, seed)
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
    if _stopped_early(end, steps, checkpoint):
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


def _jumprelu_functions(bandwidth: float):
    """JumpReLU and its L0 step with straight-through gradients for the threshold (Rajamanoharan
    et al., 2024, "Jumping Ahead", eqs. 11-12): the Heaviside step's derivative in theta is
    replaced by a rectangle kernel of width ``bandwidth`` around the threshold."""
    import torch  # lazy: torch (seconds) keeps --help fast

    def kernel(u):
        return ((u > -0.5) & (u < 0.5)).to(u.dtype)

    class JumpReLU(torch.autograd.Function):
        @staticmethod
        def forward(ctx, pre, theta):
            ctx.save_for_backward(pre, theta)
            return pre * (pre > theta)

        @staticmethod
        def backward(ctx, g):
            pre, theta = ctx.saved_tensors
            d_theta = -(theta / bandwidth) * kernel((pre - theta) / bandwidth) * g
            return g * (pre > theta), d_theta.sum(0)

    class Step(torch.autograd.Function):
        @staticmethod
        def forward(ctx, pre, theta):
            ctx.save_for_backward(pre, theta)
            return (pre > theta).to(pre.dtype)

        @staticmethod
        def backward(ctx, g):
            pre, theta = ctx.saved_tensors
            d_theta = -(1.0 / bandwidth) * kernel((pre - theta) / bandwidth) * g
            return torch.zeros_like(pre), d_theta.sum(0)

    return JumpReLU.apply, Step.apply


def train_jumprelu_sae(X: np.ndarray, d_sae: int, *, target_l0: float = 32, steps: int = 2000,
                       batch_size: int = 1024, lr: float = 1e-3, seed: int = 0, progress: bool = True,
                       cfg: dict | None = None, bandwidth: float = 0.05, theta_init: float = 0.1,
                       theta_lr_mult: float = 20.0,
                       checkpoint: Path | None = None, checkpoint_every: int = 200,
                       stop_after: int | None = None) -> SAE | None:
    """Train a JumpReLU SAE with one trainable threshold per feature (Rajamanoharan et al., 2024).

    ``f(x) = pre * H(pre - theta)`` with ``pre = (x - b_dec) W_enc + b_enc``; loss = MSE +
    lambda * L0, the L0 and the thresholds trained through straight-through estimators
    (:func:`_jumprelu_functions`).  Instead of a fixed sparsity coefficient, lambda follows a
    multiplicative controller towards ``target_l0`` active features per token (our choice: the
    JumpReLU SAEs are then as sparse as the TopK SAEs with k = target_l0 they are compared with).
    Decoder rows are kept at unit norm, so the per-feature thresholds are what differs between
    features' scales (what SAE-Match folds).  Inputs are scaled as in :func:`train_topk_sae`
    and the scale is folded back (the thresholds act on pre-activations, which the fold leaves
    unchanged).  ``checkpoint`` / ``stop_after``: as in :func:`train_topk_sae`.

    Returns
    -------
    SAE
        ``architecture="jumprelu"`` with ``threshold`` (d_sae,) > 0.
    """
    import torch  # lazy: torch (seconds) keeps --help fast
    from tqdm.auto import tqdm  # lazy: tqdm.auto (0.3 s) keeps --help fast

    X = np.asarray(X, dtype=np.float32)
    n, d = X.shape
    scale, Xt, g, W_enc, b_enc, W_dec, b_dec = _init_params(X, d_sae, seed)
    log_theta = torch.full((d_sae,), float(np.log(theta_init)), requires_grad=True)
    # the thresholds get a larger step (theta_lr_mult): with lr alone a log-threshold moves <= lr per
    # step, too little for 600-step runs to spread the thresholds over the features' scales
    opt = torch.optim.Adam([{"params": [W_enc, b_enc, W_dec, b_dec], "lr": lr},
                            {"params": [log_theta], "lr": lr * theta_lr_mult, "base_mult": theta_lr_mult}], lr=lr)
    log_lam = torch.tensor(float(np.log(0.1)))
    jump, step_fn = _jumprelu_functions(bandwidth)
    bs = min(batch_size, n)
    start = 0
    ck_meta = {"n": n, "d": d, "d_sae": d_sae, "target_l0": target_l0, "steps": steps, "batch_size": bs, "lr": lr,
               "seed": seed, "bandwidth": bandwidth, "theta_lr_mult": theta_lr_mult, "arch": "jumprelu"}
    if checkpoint is not None and Path(checkpoint).exists():
        st = torch.load(checkpoint, weights_only=False)
        if st["meta"] != ck_meta:
            raise ValueError(f"checkpoint {checkpoint} is from another run ({st['meta']}); delete it or change the path")
        with torch.no_grad():
            for t, v in zip((W_enc, b_enc, W_dec, b_dec, log_theta), st["params"]):
                t.copy_(v)
        opt.load_state_dict(st["opt"])
        g.set_state(st["rng"])
        log_lam, start = st["log_lam"], st["step"]

    def save_checkpoint(step_done: int) -> None:
        state = {"meta": ck_meta, "params": [t.detach().clone() for t in (W_enc, b_enc, W_dec, b_dec, log_theta)],
                 "opt": opt.state_dict(), "rng": g.get_state(), "log_lam": log_lam, "step": step_done}
        atomic_write(checkpoint, lambda f: torch.save(state, f))

    end = steps if stop_after is None else min(steps, start + int(stop_after))
    for step in tqdm(range(start, end), initial=start, total=steps, disable=not progress,
                     desc=f"train JumpReLU SAE d_sae={d_sae}", mininterval=2):
        x = Xt[torch.randint(0, n, (bs,), generator=g)]
        pre = (x - b_dec) @ W_enc + b_enc
        theta = log_theta.exp()
        a = jump(pre, theta)
        err = x - (a @ W_dec + b_dec)
        mse = (err ** 2).sum(1).mean()
        l0 = step_fn(pre, theta).sum(1).mean()
        loss = mse + log_lam.exp() * l0
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            W_dec /= W_dec.norm(dim=1, keepdim=True).clamp_min(1e-8)
            # sparsity controller: lambda up while L0 is above target, down below (log-space, bounded steps)
            log_lam = (log_lam + 0.05 * float(np.clip(float(l0) / target_l0 - 1.0, -1.0, 1.0))).clamp(-12.0, 6.0)
        for pg in opt.param_groups:  # linear decay over the last 20% of steps
            pg["lr"] = lr * pg.get("base_mult", 1.0) * min(1.0, (steps - step) / max(1, 0.2 * steps))
        if checkpoint is not None and ((step + 1) % checkpoint_every == 0 or step == end - 1):
            save_checkpoint(step + 1)
    if _stopped_early(end, steps, checkpoint):
        return None
    info = {"d_in": d, "d_sae": d_sae, "architecture": "jumprelu", "train_steps": steps, "train_tokens_seen": steps * bs,
            "normalization_scale": scale, "target_l0": target_l0, "sparsity_coefficient_final": float(log_lam.exp())}
    info.update(cfg or {})
    return SAE((W_enc.detach().numpy() / scale).astype(np.float32), b_enc.detach().numpy().astype(np.float32),
               (W_dec.detach().numpy() * scale).astype(np.float32), (b_dec.detach().numpy() * scale).astype(np.float32),
               "jumprelu", None, log_theta.detach().exp().numpy().astype(np.float32), info)


# cfg keys that live under "metadata" in SAELens 6 configs (LLM_METADATA_KEYS there, plus ours)
METADATA_KEYS = ("model_name", "hook_name", "hook_head_index", "hook_layer", "prepend_bos", "dataset_path",
                 "context_size", "model_class_name", "model_from_pretrained_kwargs", "seqpos_slice",
                 "exclude_special_tokens", "neuronpedia_id", "sae_lens_training_version", "sae_lens_version",
                 "train_steps", "train_tokens_seen", "normalization_scale", "aux_k", "aux_coef", "saeot_layer",
                 "dead_after_tokens", "target_l0", "sparsity_coefficient_final")


def save_sae(sae: SAE, folder: Path) -> Path:
    """Write ``sae`` in the SAELens 6 on-disk format (atomically: temp folder, then rename).

    ``SAE.load_from_disk`` of SAELens reads the result (same cfg keys as its ``save_model``;
    the weights file holds exactly the parameters its architecture class declares).
    """
    from safetensors.numpy import save_file  # lazy: safetensors backends, on read

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


# Largest SAE (float32 bytes of all its tensors) load_sae reads unless told otherwise: 8 GiB holds a
# 131k-wide GemmaScope SAE of Gemma-2-9B (d 3,584: 3.8 GB); a larger claim is refused before allocation.
MAX_SAE_BYTES = int(os.environ.get("SAEOT_MAX_SAE_BYTES", 8 << 30))
_FLOAT_DTYPES = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}
_SAFETENSORS_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "I32": 4, "U32": 4, "I64": 8, "U64": 8,
                       "F8_E4M3": 1, "F8_E5M2": 1, **_FLOAT_DTYPES}


def _tensor_headers(path: Path) -> dict[str, tuple[str, tuple]]:
    """name -> (dtype kind, shape) of every tensor in a safetensors or .npz file, read from the
    headers only (nothing is allocated); a header that does not fit the file is refused."""
    size = path.stat().st_size
    out: dict[str, tuple[str, tuple]] = {}
    if path.suffix == ".safetensors":
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 2 or n > min(size - 8, 100 << 20):
                raise SAEFormatError(f"{path}: not a safetensors file (header length {n}, file {size} bytes)")
            try:
                header = json.loads(f.read(n))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise SAEFormatError(f"{path}: unreadable safetensors header ({e})") from None
        if not isinstance(header, dict):
            raise SAEFormatError(f"{path}: safetensors header is not a JSON object")
        data = size - 8 - n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            try:
                dt, shape, (a, b) = info["dtype"], tuple(int(x) for x in info["shape"]), info["data_offsets"]
            except (KeyError, TypeError, ValueError):
                raise SAEFormatError(f"{path}: malformed header entry for {name!r}") from None
            if dt not in _SAFETENSORS_DTYPES or min(shape, default=1) < 0:
                raise SAEFormatError(f"{path}: tensor {name!r} has dtype {dt} / shape {shape}")
            if not 0 <= a <= b <= data or b - a != int(np.prod(shape, dtype=np.int64)) * _SAFETENSORS_DTYPES[dt]:
                raise SAEFormatError(f"{path}: tensor {name!r} {dt}{list(shape)} does not fit the file "
                                     f"(offsets {a}..{b}, {data} data bytes): truncated or corrupt")
            out[name] = ("bf16" if dt == "BF16" else "f" if dt in _FLOAT_DTYPES else "other", shape)
        return out

    try:
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                with z.open(info) as f:
                    shape, dtype = _npy_header(f)
                out[info.filename[:-4]] = ("f" if dtype.kind == "f" else "other", tuple(shape))
    except (zipfile.BadZipFile, ValueError, OSError) as e:
        raise SAEFormatError(f"{path}: not a readable .npz file ({e})") from None
    return out


def _npy_header(f) -> tuple[tuple, np.dtype]:
    """(shape, dtype) of an open .npy stream, from its header only."""
    fmt = np.lib.format
    major, _ = fmt.read_magic(f)
    read = fmt.read_array_header_1_0 if major == 1 else fmt.read_array_header_2_0
    shape, _, dtype = read(f, max_header_size=1 << 20)
    return tuple(shape), dtype


def _positive_int(folder, key, v, what="a positive integer"):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise SAEFormatError(f"{folder}: cfg.json {key}={v!r} must be {what}")
    return int(v)


# an SAE config is a few kB (SAELens 6: ~1 kB); larger files are refused before they are read
MAX_CFG_BYTES = 1 << 20


def _read_cfg(folder: Path) -> dict:
    cfg_path = folder / "cfg.json"
    if not cfg_path.exists():
        return {}
    size = cfg_path.stat().st_size
    if size > MAX_CFG_BYTES:  # SAELens configs are a few kB; never read an unbounded file into memory
        raise SAEFormatError(f"{cfg_path}: {size:,} bytes, over the {MAX_CFG_BYTES:,}-byte limit of an SAE config")
    try:
        raw = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SAEFormatError(f"{cfg_path}: invalid JSON ({e})") from None
    except RecursionError:  # json's parser recurses per nesting level: "[[[[...": one line, not 91
        raise SAEFormatError(f"{cfg_path}: JSON nested too deeply to be an SAE config") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("metadata", {}) or {}, dict):
        raise SAEFormatError(f"{cfg_path}: expected a JSON object (with an object under 'metadata')")
    return raw


def load_sae(folder: Path, *, norm_scaling_factor: float | None = None, layer: int | None = None,
             max_bytes: int | None = None) -> SAE:
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

    Validation (each failure is one :class:`saeot.errors.SAEFormatError` line naming the file):
    cfg.json is a JSON object; tensor names, dtypes (floating) and shapes are read from the file
    headers and checked *before* anything is allocated: ``W_enc`` (d_in, d_sae), ``W_dec``
    (d_sae, d_in) (a transposed one is named as such), ``b_enc`` (d_sae,), ``b_dec`` (d_in,),
    ``threshold`` (d_sae,) for JumpReLU, cfg ``d_in``/``d_sae`` equal to the weights, TopK ``k``
    an integer in 1..d_sae, total size at most ``max_bytes`` (default :data:`MAX_SAE_BYTES`,
    env ``SAEOT_MAX_SAE_BYTES``); then every tensor must be finite.

    ``layer``: the saeot residual layer the SAE is about to be used for; if the SAE's own
    ``hook_name`` names another layer, :class:`saeot.errors.LayerMismatchError` (an SAE without a
    hook name only warns).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise SAEFormatError(f"{folder}: not an SAE folder (expected cfg.json + sae_weights.safetensors, "
                             "or params.npz)")
    raw = _read_cfg(folder)
    cfg = _flatten_cfg(raw)
    wpath = _weights_path(folder)
    heads = _tensor_headers(wpath)
    d_in, d_sae = _check_headers(folder, wpath, heads, cfg, MAX_SAE_BYTES if max_bytes is None else int(max_bytes))
    if not raw and wpath.suffix == ".npz":
        cfg.update(_gemmascope_cfg(folder, d_in, d_sae))
    arch, k, norm, scale, hook = _check_config(folder, wpath, heads, cfg, d_sae, norm_scaling_factor)
    if layer is not None:
        _check_layer(folder, hook, layer)
    w = _read_tensors(wpath, heads)
    _check_tensors(folder, wpath, w)
    th = w.get("threshold")
    if th is None and "log_threshold" in w:  # SAELens JumpReLU training checkpoints
        th = np.exp(w["log_threshold"])
    return SAE(w["W_enc"].astype(np.float32), w["b_enc"].astype(np.float32), w["W_dec"].astype(np.float32),
               w["b_dec"].astype(np.float32), arch, k,
               None if th is None else np.asarray(th, dtype=np.float32), cfg,
               apply_b_dec_to_input=bool(cfg.get("apply_b_dec_to_input", True)), normalize_activations=norm,
               norm_scaling_factor=None if scale is None else float(scale),
               rescale_acts_by_decoder_norm=bool(cfg.get("rescale_acts_by_decoder_norm", False)))


def _weights_path(folder: Path) -> Path:
    """The SAE's tensor file: SAELens' ``sae_weights.safetensors``, else GemmaScope's ``params.npz``."""
    for name in ("sae_weights.safetensors", "params.npz"):
        if (folder / name).exists():
            return folder / name
    raise SAEFormatError(f"{folder}: no sae_weights.safetensors or params.npz")


def _check_headers(folder: Path, wpath: Path, heads: dict, cfg: dict, limit: int) -> tuple[int, int]:
    """(d_in, d_sae) after checking tensor names, dtypes, shapes and total size from the headers
    alone (nothing allocated yet); cfg ``d_in`` / ``d_sae`` must equal the weights'."""
    for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
        if name not in heads:
            raise SAEFormatError(f"{wpath}: missing tensor {name} (has {sorted(heads)})")
    for name, (kind, _) in heads.items():
        if kind not in ("f", "bf16") and name in ("W_enc", "b_enc", "W_dec", "b_dec", "threshold", "log_threshold"):
            raise SAEFormatError(f"{wpath}: tensor {name} is not floating point")
    we = heads["W_enc"][1]
    if len(we) != 2 or min(we) < 1:
        raise SAEFormatError(f"{wpath}: W_enc shape {list(we)} is not (d_in, d_sae) with both >= 1")
    d_in, d_sae = we
    for key, v in (("d_in", d_in), ("d_sae", d_sae)):
        if key in cfg and cfg[key] is not None:
            if _positive_int(folder, key, cfg[key]) != v:
                raise SAEFormatError(f"{folder}: cfg.json {key}={cfg[key]} but W_enc is {list(we)} (d_in, d_sae)")
    wd = heads["W_dec"][1]
    if wd != (d_sae, d_in):
        hint = ": transposed (SAELens stores W_dec as (d_sae, d_in))" if wd == (d_in, d_sae) else ""
        raise SAEFormatError(f"{wpath}: W_dec shape {list(wd)} != (d_sae, d_in) = {[d_sae, d_in]}{hint}")
    want = {"b_enc": (d_sae,), "b_dec": (d_in,), "threshold": (d_sae,), "log_threshold": (d_sae,)}
    for name, shp in want.items():
        if name in heads and heads[name][1] != shp:
            raise SAEFormatError(f"{wpath}: {name} shape {list(heads[name][1])} != {list(shp)}")
    n_bytes = 4 * sum(int(np.prod(s, dtype=np.int64)) for _, s in heads.values())
    if n_bytes > limit:
        raise SAEFormatError(f"{wpath}: tensors need {n_bytes / 2**30:.1f} GiB as float32, over the "
                             f"{limit / 2**30:.1f} GiB limit (SAEOT_MAX_SAE_BYTES); refused before loading")
    return d_in, d_sae


def _gemmascope_cfg(folder: Path, d_in: int, d_sae: int) -> dict:
    """The config of GemmaScope's original release (a bare ``params.npz``): what SAELens'
    gemma-scope loader assumes, with the hook layer from a ``layer_L`` folder on the path."""
    cfg = {"architecture": "jumprelu", "apply_b_dec_to_input": False, "normalize_activations": "none",
           "d_in": d_in, "d_sae": d_sae}
    m = re.search(r"layer_(\d+)", str(folder.resolve()))
    if m:
        cfg["hook_name"] = f"blocks.{int(m.group(1))}.hook_resid_post"
    return cfg


def _check_config(folder: Path, wpath: Path, heads: dict, cfg: dict, d_sae: int, norm_scaling_factor):
    """(architecture, TopK k or None, normalisation, input scale or None, hook name or None), each
    checked against what saeot can encode with."""
    arch = cfg.get("architecture", "standard")
    if arch not in ARCHITECTURES:
        raise SAEFormatError(f"{folder}: unsupported SAE architecture {arch!r}; expected one of {ARCHITECTURES}")
    k = cfg.get("k")
    if k is None and isinstance(cfg.get("activation_fn_kwargs"), dict):
        k = cfg["activation_fn_kwargs"].get("k")
    if arch == "topk":
        if k is None:
            raise SAEFormatError(f"{folder}: topk SAE without k in cfg.json")
        k = _positive_int(folder, "k", k, f"an integer in 1..d_sae={d_sae}")
        if k > d_sae:
            raise SAEFormatError(f"{folder}: cfg.json k={k} > d_sae={d_sae}")
    else:
        k = None
    if arch == "jumprelu" and "threshold" not in heads and "log_threshold" not in heads:
        raise SAEFormatError(f"{wpath}: jumprelu SAE without a threshold tensor")
    norm = cfg.get("normalize_activations", "none")
    if isinstance(norm, bool) or norm is None:  # SAELens < 3 stored a bool
        norm = "expected_average_only_in" if norm else "none"
    if norm not in NORMALISATIONS:
        raise SAEFormatError(f"{folder}: unsupported normalize_activations {norm!r}; expected one of {NORMALISATIONS}")
    for key in ("apply_b_dec_to_input", "rescale_acts_by_decoder_norm"):
        if key in cfg and not isinstance(cfg[key], bool):
            raise SAEFormatError(f"{folder}: cfg.json {key}={cfg[key]!r} must be true or false")
    scale = norm_scaling_factor if norm_scaling_factor is not None else cfg.get("norm_scaling_factor")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not np.isfinite(scale) or scale <= 0):
        raise SAEFormatError(f"{folder}: norm_scaling_factor {scale!r} must be a positive number")
    hook = cfg.get("hook_name")
    if hook is not None:
        if not isinstance(hook, str):
            raise SAEFormatError(f"{folder}: cfg.json hook_name {hook!r} is not a string")
        try:
            hook_layer(hook)
        except ValueError as e:
            raise SAEFormatError(f"{folder}: {e}") from None
    if norm == "expected_average_only_in" and scale is None:  # stacklevel 3: the caller of load_sae
        warnings.warn(f"{folder}: normalize_activations='expected_average_only_in' without a norm_scaling_factor; "
                      "encoding raw activations (as SAELens load_from_disk does)", UserWarning, stacklevel=3)
    return arch, k, norm, scale, hook


def _check_layer(folder: Path, hook: str | None, layer: int) -> None:
    """The SAE's own hook must name the residual layer it is about to be used for."""
    if hook is None:
        warnings.warn(f"{folder}: no hook_name in cfg.json; cannot check that it is an SAE of layer {layer}",
                      UserWarning, stacklevel=3)
    elif hook_layer(hook) != layer:
        raise LayerMismatchError(
            f"{folder}: SAE hook {hook} is residual layer {hook_layer(hook)} ({describe_layer(hook_layer(hook))}), "
            f"but it is used for layer {layer} ({describe_layer(layer)})")


def _read_tensors(wpath: Path, heads: dict) -> dict[str, np.ndarray]:
    """Every tensor of the file as numpy (sizes already known to fit); bf16 widened to float32."""
    if wpath.suffix != ".safetensors":
        try:
            with np.load(wpath, allow_pickle=False) as z:
                return {n: z[n] for n in z.files}
        except (ValueError, OSError) as e:
            raise SAEFormatError(f"{wpath}: unreadable ({e})") from None
    try:
        if any(kind == "bf16" for kind, _ in heads.values()):
            # numpy has no bfloat16: read through torch and widen to float32 (exact: bf16 is a
            # truncated float32), as SAELens does when it loads a bf16 release in float32
            from safetensors.torch import load_file as load_torch  # lazy: safetensors backends, on read

            return {n: (t.float() if t.is_floating_point() else t).numpy() for n, t in load_torch(str(wpath)).items()}
        from safetensors.numpy import load_file  # lazy: safetensors backends, on read

        return load_file(str(wpath))
    except Exception as e:  # noqa: BLE001 - any parse failure of an external file is one line
        raise SAEFormatError(f"{wpath}: unreadable ({type(e).__name__}: {e})") from None


def _check_tensors(folder: Path, wpath: Path, w: dict[str, np.ndarray]) -> None:
    """No NaN / inf, a decoder that is not all zeros (dead rows only warn), no finetuning scale."""
    for name in ("W_enc", "b_enc", "W_dec", "b_dec", "threshold", "log_threshold", "scaling_factor"):
        if name in w:
            bad = int(np.size(w[name]) - np.isfinite(w[name]).sum())
            if bad:
                raise SAEFormatError(f"{wpath}: {name} has {bad} NaN/inf values")
    # an all-zero decoder reconstructs nothing and makes every feature the same direction (decoder
    # cosine then matches every source to target 0): a broken or untrained file, not an SAE
    if not np.any(w["W_dec"]):
        raise SAEFormatError(f"{wpath}: W_dec is all zeros (an untrained or blanked SAE)")
    zero_rows = int((~np.any(w["W_dec"], axis=1)).sum())
    if zero_rows:
        warnings.warn(f"{wpath}: {zero_rows} of {w['W_dec'].shape[0]} decoder rows are all zeros (dead features)",
                      UserWarning, stacklevel=3)
    if "scaling_factor" in w and not np.allclose(w["scaling_factor"], 1.0):
        raise SAEFormatError(f"{folder}: finetuning scaling_factor != 1 is not supported")


def describe_layer(layer: int) -> str:
    """Plain words for a saeot residual layer: ``resid_post of block n`` (n = layer - 1) or the
    embeddings (layer 0 = ``blocks.0.hook_resid_pre``)."""
    return "embeddings, blocks.0.hook_resid_pre" if layer == 0 else \
        f"resid_post of block {layer - 1}, blocks.{layer - 1}.hook_resid_post"


def parse_layer(spec: str | int) -> int:
    """A layer named by the user -> saeot residual layer.

    Accepts a hook name (``blocks.8.hook_resid_post`` -> 9, ``blocks.8.hook_resid_pre`` -> 8),
    ``resid_post.8`` / ``resid_pre.8`` / ``embed`` (the same, short), or a plain integer, which is
    saeot's residual index (0 = embeddings, n = resid_post of block n - 1).

    >>> parse_layer("resid_post.8"), parse_layer("blocks.8.hook_resid_post"), parse_layer("9")
    (9, 9, 9)
    """
    s = str(spec).strip()
    if s.isdigit():
        return int(s)
    if s == "embed":
        return 0
    m = re.fullmatch(r"resid_(pre|post)\.(\d+)", s)
    if m:
        return int(m.group(2)) + (1 if m.group(1) == "post" else 0)
    try:
        return hook_layer(s)
    except ValueError:
        raise InputError(f"layer {spec!r}: expected resid_post.N (block N's output), resid_pre.N, embed, a "
                         "SAELens hook name (blocks.N.hook_resid_post) or a saeot residual index") from None


def find_sae(saes: Path, layer: int) -> Path:
    """The SAE folder for residual ``layer`` inside ``saes``: ``blocks.<n>.hook_resid_post/``
    (named by hook, n = layer - 1) or saeot's ``layer_<layer>/``; the SAE's own hook_name is then
    checked against ``layer`` by :func:`load_sae`."""
    saes = Path(saes)
    for name in (layer_hook_name(layer), f"layer_{layer}"):
        if (saes / name).is_dir():
            return saes / name
    raise SAEFormatError(f"{saes}: no SAE for layer {layer} ({describe_layer(layer)}): expected a folder "
                         f"{layer_hook_name(layer)}/ or layer_{layer}/; or pass the SAE folder itself")


def load_sae_for_layer(saes: Path, layer: int, **kw) -> SAE:
    """:func:`load_sae` of :func:`find_sae` (``saes`` may also be the SAE folder itself), checked
    against ``layer``."""
    saes = Path(saes)
    folder = saes if (saes / "cfg.json").exists() or (saes / "params.npz").exists() else find_sae(saes, layer)
    return load_sae(folder, layer=layer, **kw)


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
