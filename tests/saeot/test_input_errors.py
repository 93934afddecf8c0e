"""Malformed SAE and activation files (issue #35, item 9): each one is a single typed line, from
the library (a ValueError subclass naming the file) and from the CLI (exit status 2, no traceback),
and an SAE is refused for a layer its own hook_name does not name.

Every case here printed a traceback (or, for a NaN decoder, "48 matched" with status 0) before
the loader checked headers, values and layers."""

import json

import numpy as np
import pytest
from safetensors.numpy import save_file
from typer.testing import CliRunner

from saeot.cli import app
from saeot.errors import ActivationFileError, LayerMismatchError, SAEFormatError
from saeot.sae import SAE, load_sae, load_sae_for_layer, sae_metadata, save_sae

D, F = 12, 48


def _good(tmp_path, name="good", layer=2, seed=0):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((F, D)).astype(np.float32)
    W /= np.linalg.norm(W, axis=1, keepdims=True)
    sae = SAE(W.T.copy(), np.zeros(F, np.float32), W, np.zeros(D, np.float32), "topk", 4, None,
              sae_metadata("toy", layer))
    return save_sae(sae, tmp_path / name)


def _edit_weights(folder, fn):
    from safetensors.numpy import load_file

    w = load_file(str(folder / "sae_weights.safetensors"))
    fn(w)
    save_file(w, str(folder / "sae_weights.safetensors"))


def _edit_cfg(folder, fn):
    cfg = json.loads((folder / "cfg.json").read_text())
    fn(cfg)
    (folder / "cfg.json").write_text(json.dumps(cfg))


def _set(d, k, v):
    d[k] = v


CASES = {
    "b_enc wrong shape": (lambda f: _edit_weights(f, lambda w: _set(w, "b_enc", np.zeros(F + 1, np.float32))),
                          "b_enc shape"),
    "W_dec transposed": (lambda f: _edit_weights(f, lambda w: _set(w, "W_dec", np.ascontiguousarray(w["W_dec"].T))),
                         "transposed"),
    "W_enc missing": (lambda f: _edit_weights(f, lambda w: w.pop("W_enc")), "missing tensor W_enc"),
    "cfg.json invalid": (lambda f: (f / "cfg.json").write_text("{\"d_in\": 12,"), "invalid JSON"),
    "cfg.json a list": (lambda f: (f / "cfg.json").write_text("[1, 2]"), "expected a JSON object"),
    "k many": (lambda f: _edit_cfg(f, lambda c: _set(c, "k", "many")), "k='many'"),
    "k negative": (lambda f: _edit_cfg(f, lambda c: _set(c, "k", -5)), "k=-5"),
    "k above d_sae": (lambda f: _edit_cfg(f, lambda c: _set(c, "k", F + 1)), "k=49 > d_sae=48"),
    "d_sae zero": (lambda f: _edit_cfg(f, lambda c: _set(c, "d_sae", 0)), "d_sae=0"),
    "W_enc NaN": (lambda f: _edit_weights(f, lambda w: w["W_enc"].__setitem__((0, 0), np.nan)), "W_enc has 1 NaN/inf"),
    "W_enc inf": (lambda f: _edit_weights(f, lambda w: w["W_enc"].__setitem__((1, 3), np.inf)), "W_enc has 1 NaN/inf"),
    "W_dec all NaN": (lambda f: _edit_weights(f, lambda w: w["W_dec"].fill(np.nan)), f"W_dec has {F * D} NaN/inf"),
    "integer W_enc": (lambda f: _edit_weights(f, lambda w: _set(w, "W_enc", w["W_enc"].astype(np.int32))),
                      "not floating point"),
    "bad hook_name": (lambda f: _edit_cfg(f, lambda c: c["metadata"].__setitem__("hook_name", "blocks.3.attn.hook_z")),
                      "not a residual-stream hook"),
    "truncated weights": (lambda f: (f / "sae_weights.safetensors").write_bytes(
        (f / "sae_weights.safetensors").read_bytes()[:-100]), "truncated or corrupt"),
    # issue 44: a 91-line RecursionError, an unbounded read, and an accepted all-zero decoder before
    "cfg.json deeply nested": (lambda f: (f / "cfg.json").write_text("[" * 200_000 + "]" * 200_000), "nested too deeply"),
    "cfg.json huge": (lambda f: (f / "cfg.json").write_text("{" + " " * (2 << 20) + "}"), "byte limit"),
    "W_dec all zero": (lambda f: _edit_weights(f, lambda w: w["W_dec"].fill(0.0)), "W_dec is all zeros"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_sae_is_one_typed_line(tmp_path, case):
    folder = _good(tmp_path)
    load_sae(folder)  # the unedited file is fine
    edit, words = CASES[case]
    edit(folder)
    with pytest.raises(SAEFormatError) as e:
        load_sae(folder)
    msg = str(e.value)
    assert words in msg and str(folder) in msg and "\n" not in msg


def _arrays(tmp_path, n=400, seed=1):
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal((n, D)).astype(np.float32) for _ in range(2))
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    return tmp_path / "a.npy", tmp_path / "b.npy"


def _match(tmp_path, sae_a, sae_b, la="resid_post.1", lb="resid_post.1", extra=()):
    a, b = (tmp_path / "a.npy", tmp_path / "b.npy")
    return CliRunner().invoke(app, ["match", "--sae-a", str(sae_a), "--sae-b", str(sae_b), "--layer-a", la,
                                    "--layer-b", lb, "--acts-a", str(a), "--acts-b", str(b), "--method", "all",
                                    "--out", str(tmp_path / "m.json"), *extra])


@pytest.mark.parametrize("case", ["W_dec all NaN", "W_dec transposed", "k many", "cfg.json invalid", "d_sae zero",
                                  "cfg.json deeply nested", "W_dec all zero"])
def test_cli_refuses_a_malformed_sae_with_status_2(tmp_path, case):
    _arrays(tmp_path)
    good = _good(tmp_path, "a")
    bad = _good(tmp_path, "b", seed=1)
    assert _match(tmp_path, good, bad).exit_code == 0  # the two good SAEs match (layer 2 = resid_post.1)
    CASES[case][0](bad)
    r = _match(tmp_path, good, bad)
    assert r.exit_code == 2 and "matched" not in r.output
    lines = [l for l in r.output.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("saeot: error:") and CASES[case][1] in lines[0]


def test_sae_of_another_layer_is_refused(tmp_path):
    """A layer-4 SAE (hook blocks.3.hook_resid_post) placed in layer_2/ is not used for layer 2."""
    saes = tmp_path / "saes"
    src = _good(tmp_path, "saes/layer_2", layer=4)
    assert json.loads((src / "cfg.json").read_text())["metadata"]["hook_name"] == "blocks.3.hook_resid_post"
    with pytest.raises(LayerMismatchError, match="residual layer 4 .*resid_post of block 3.* used for layer 2"):
        load_sae_for_layer(saes, 2)
    assert load_sae_for_layer(saes / "layer_2", 4).layer == 4  # by path, for the layer it is
    _arrays(tmp_path)
    r = _match(tmp_path, src, src, la="2", lb="resid_post.3")
    assert r.exit_code == 2 and "used for layer 2" in r.output and len(r.output.strip().splitlines()) == 1


def test_folder_named_by_hook_is_found(tmp_path):
    """SAEs may sit in folders named by their hook (blocks.<n>.hook_resid_post/): no off-by-one folder index."""
    _good(tmp_path, "saes/blocks.8.hook_resid_post", layer=9)
    assert load_sae_for_layer(tmp_path / "saes", 9).hook_name == "blocks.8.hook_resid_post"


def test_ten_gigabyte_sae_refused_before_allocation(tmp_path):
    """A consistent safetensors header claiming 10 GB (a sparse file: nothing is written) is refused
    from its header; the loader never reads, let alone allocates, the tensors."""
    import tracemalloc

    folder = tmp_path / "huge"
    folder.mkdir()
    d, f = 4096, 327_680  # W_enc + W_dec: 2 * 4096 * 327680 * 4 bytes = 10.7 GB
    shapes = {"W_enc": [d, f], "b_enc": [f], "W_dec": [f, d], "b_dec": [d]}
    header, off = {}, 0
    for k, s in shapes.items():
        n = int(np.prod(s)) * 4
        header[k] = {"dtype": "F32", "shape": s, "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header).encode()
    with open(folder / "sae_weights.safetensors", "wb") as fh:
        fh.write(len(hb).to_bytes(8, "little") + hb)
        fh.truncate(8 + len(hb) + off)
    (folder / "cfg.json").write_text(json.dumps({"architecture": "standard", "d_in": d, "d_sae": f}))
    tracemalloc.start()
    with pytest.raises(SAEFormatError, match="over the 8.0 GiB limit"):
        load_sae(folder)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 50 << 20


@pytest.mark.parametrize("bad, words", [
    (lambda a: a.astype(np.int32), "2-D float array"),
    (lambda a: a[:, :5], "d = 5, the SAE expects d_in = 12"),
    (lambda a: a[:-7], "393 rows, expected 400"),
    (lambda a: a.ravel(), "2-D float array"),
    (lambda a: np.where(np.arange(len(a))[:, None] == 3, np.nan, a).astype(np.float32), "NaN/inf"),
])
def test_malformed_activation_arrays(tmp_path, bad, words):
    a, b = _arrays(tmp_path)
    np.save(b, bad(np.load(b)))
    good = _good(tmp_path, "s")
    r = _match(tmp_path, good, good)
    assert r.exit_code == 2 and words in r.output and len(r.output.strip().splitlines()) == 1


def test_activation_cache_shard_with_nan(tmp_path):
    """A NaN in a cached shard (saeot collect's format) is named with its shard, not averaged into W2."""
    from saeot.collect import load_activations

    cache = tmp_path / "acts"
    cache.mkdir()
    x = np.random.default_rng(0).standard_normal((8, D)).astype(np.float32)
    x[2, 2] = np.nan
    save_file({"layer_1": x, "tokens": np.arange(8), "chunk": np.zeros(8, np.int64), "pos": np.arange(8)},
              str(cache / "shard_00000.safetensors"))
    (cache / "manifest.json").write_text(json.dumps({"layers": [1], "n_shards": 1, "d_model": D, "model": "toy"}))
    with pytest.raises(ActivationFileError, match="shard_00000.safetensors: layer_1 has 1 NaN/inf"):
        load_activations(cache, 1)
    (cache / "manifest.json").write_text(json.dumps({"layers": [1], "n_shards": 1, "d_model": D + 1, "model": "t"}))
    with pytest.raises(ActivationFileError, match="expected \\(rows, 13\\)"):
        load_activations(cache, 1)


def test_compress_takes_saes_by_path_and_checks_their_layer(tmp_path):
    """`compress --sae LAYER=PATH`: the SAE's hook must be that layer (checked before the model loads)."""
    sae4 = _good(tmp_path, "sae4", layer=4)
    (tmp_path / "acts").mkdir()
    r = CliRunner().invoke(app, ["compress", "--acts", str(tmp_path / "acts"), "--layers", "2",
                                 "--sae", f"resid_post.1={sae4}", "--model", "tiny-random"])
    assert r.exit_code == 2 and "used for layer 2" in r.output and len(r.output.strip().splitlines()) == 1
    r = CliRunner().invoke(app, ["compress", "--acts", str(tmp_path / "acts"), "--layers", "2", "--sae", "nonsense"])
    assert r.exit_code == 2 and "LAYER=PATH" in r.output


def test_bf16_sae_loads_as_its_float32_values(tmp_path):
    """A bfloat16 SAE (SAELens releases exist in bf16) passed the header check, then failed with
    "data type 'bfloat16' not understood"; now it loads, widened exactly to float32."""
    import torch
    from safetensors.torch import load_file as load_torch, save_file as save_torch

    folder = _good(tmp_path)
    w = load_torch(str(folder / "sae_weights.safetensors"))
    save_torch({n: t.to(torch.bfloat16) for n, t in w.items()}, str(folder / "sae_weights.safetensors"))
    sae = load_sae(folder)
    assert sae.W_dec.dtype == np.float32
    np.testing.assert_array_equal(sae.W_dec, w["W_dec"].to(torch.bfloat16).float().numpy())
    assert not np.array_equal(sae.W_dec, w["W_dec"].numpy())  # really rounded: the file was bf16
    x = np.random.default_rng(0).standard_normal((5, D)).astype(np.float32)
    assert sae.encode(x).shape == (5, F)
