"""Real SAE files: laid out exactly as GemmaScope and SAELens releases lay them out (toy sizes,
written here with numpy / safetensors, not with saeot's writer), with the expected activations
computed here in plain numpy from the published encoding rules, independently of saeot's code.

Every fixture has a b_dec far from zero, so encoding with the wrong b_dec rule flips many
active/inactive decisions (checked: the test asserts that the wrong rule would fail).
"""

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from saeot.sae import SAE, hook_layer, layer_hook_name, load_sae, sae_metadata, save_sae

D, F = 16, 40


def _weights(seed=0, threshold=True):
    rng = np.random.default_rng(seed)
    w = {"W_enc": rng.standard_normal((D, F)).astype(np.float32),
         "b_enc": (0.3 * rng.standard_normal(F)).astype(np.float32),
         "W_dec": rng.standard_normal((F, D)).astype(np.float32),
         "b_dec": (2.0 * rng.standard_normal(D)).astype(np.float32)}
    if threshold:
        w["threshold"] = np.abs(rng.standard_normal(F)).astype(np.float32)
    return w


def _x(n=200, seed=1):
    return (np.random.default_rng(seed).standard_normal((n, D)) * 3 + 1).astype(np.float32)


def _numpy_jumprelu(x, w, subtract_b_dec):
    pre = (x - w["b_dec"] * subtract_b_dec).astype(np.float64) @ w["W_enc"] + w["b_enc"]
    return np.maximum(pre, 0) * (pre > w["threshold"])


def _check(got_sparse, want, wrong):
    got = got_sparse.toarray()
    np.testing.assert_array_equal(got > 0, want > 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    # the b_dec convention matters on this fixture: the other rule disagrees on many decisions
    assert ((want > 0) != (wrong > 0)).mean() > 0.05


def test_gemmascope_params_npz_release_layout(tmp_path):
    """google/gemma-scope-*-res layout: layer_<L>/width_<W>/average_l0_<n>/params.npz, no cfg.json.
    GemmaScope encodes x @ W_enc + b_enc (no b_dec subtraction), JumpReLU, at blocks.L.hook_resid_post."""
    w = _weights()
    folder = tmp_path / "gemma-scope-2b-pt-res" / "layer_12" / "width_16k" / "average_l0_82"
    folder.mkdir(parents=True)
    np.savez(folder / "params.npz", **w)
    sae = load_sae(folder)
    assert sae.architecture == "jumprelu" and not sae.apply_b_dec_to_input
    assert sae.hook_name == "blocks.12.hook_resid_post" and sae.layer == 13
    x = _x()
    _check(sae.encode(x), _numpy_jumprelu(x, w, False), _numpy_jumprelu(x, w, True))


def test_saelens6_jumprelu_cfg_with_metadata(tmp_path):
    """SAELens 6 save_model layout (JumpReLUSAEConfig.to_dict()), apply_b_dec_to_input false."""
    w = _weights(2)
    w["threshold"][:5] = -0.5  # negative thresholds: SAELens applies relu before the jump mask
    folder = tmp_path / "sae"
    folder.mkdir()
    save_file(w, str(folder / "sae_weights.safetensors"))
    cfg = {"d_in": D, "d_sae": F, "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": False,
           "normalize_activations": "none", "reshape_activations": "none",
           "metadata": {"sae_lens_version": "6.5.0", "sae_lens_training_version": "6.5.0",
                        "model_name": "gemma-2-2b", "hook_name": "blocks.5.hook_resid_post", "hook_head_index": None,
                        "prepend_bos": True, "dataset_path": "monology/pile-uncopyrighted", "context_size": 1024},
           "architecture": "jumprelu"}
    (folder / "cfg.json").write_text(json.dumps(cfg))
    sae = load_sae(folder)
    assert sae.layer == 6 and sae.cfg["model_name"] == "gemma-2-2b"
    x = _x(seed=3)
    want = _numpy_jumprelu(x, w, False)
    assert (want >= 0).all()
    _check(sae.encode(x), want, _numpy_jumprelu(x, w, True))


def test_saelens_pre6_standard_cfg_gpt2_small_res_jb(tmp_path):
    """gpt2-small-res-jb style (SAELens < 6): top-level hook_point, bool normalize_activations,
    no architecture, no apply_b_dec_to_input (SAELens defaults it to True)."""
    w = _weights(4, threshold=False)
    folder = tmp_path / "blocks.8.hook_resid_pre"
    folder.mkdir()
    save_file(w, str(folder / "sae_weights.safetensors"))
    (folder / "cfg.json").write_text(json.dumps({
        "model_name": "gpt2-small", "hook_point": "blocks.8.hook_resid_pre", "hook_point_layer": 8, "d_in": D,
        "d_sae": F, "dtype": "torch.float32", "device": "cpu", "normalize_activations": False, "context_size": 128}))
    sae = load_sae(folder)
    assert sae.architecture == "standard" and sae.apply_b_dec_to_input and sae.layer == 8
    x = _x(seed=5)
    want = np.maximum((x - w["b_dec"]).astype(np.float64) @ w["W_enc"] + w["b_enc"], 0)
    wrong = np.maximum(x.astype(np.float64) @ w["W_enc"] + w["b_enc"], 0)
    _check(sae.encode(x), want, wrong)


def test_saelens6_topk_with_decoder_norm_rescaling(tmp_path):
    w = _weights(6, threshold=False)
    w["W_dec"] *= np.linspace(0.2, 3.0, F, dtype=np.float32)[:, None]  # non-unit decoder rows
    folder = tmp_path / "topk"
    folder.mkdir()
    save_file(w, str(folder / "sae_weights.safetensors"))
    cfg = {"d_in": D, "d_sae": F, "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": True,
           "normalize_activations": "none", "reshape_activations": "none", "k": 5,
           "rescale_acts_by_decoder_norm": True, "architecture": "topk",
           "metadata": {"sae_lens_version": "6.5.0", "hook_name": "blocks.3.hook_resid_pre"}}
    (folder / "cfg.json").write_text(json.dumps(cfg))
    sae = load_sae(folder)
    x = _x(seed=7)
    pre = (x - w["b_dec"]).astype(np.float64) @ w["W_enc"] + w["b_enc"]
    pre = pre * np.linalg.norm(w["W_dec"], axis=1)
    want = np.zeros_like(pre)
    top = np.argsort(-pre, axis=1)[:, :5]
    np.put_along_axis(want, top, np.maximum(np.take_along_axis(pre, top, 1), 0), axis=1)
    got = sae.encode(x).toarray()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    # decode divides by the decoder norm again (SAELens act_times_W_dec)
    rec = want / np.linalg.norm(w["W_dec"], axis=1) @ w["W_dec"] + w["b_dec"]
    np.testing.assert_allclose(sae.decode(sae.encode(x)), rec, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("mode", ["constant_norm_rescale", "layer_norm", "expected_average_only_in"])
def test_normalize_activations_modes(tmp_path, mode):
    w = _weights(8, threshold=False)
    folder = tmp_path / mode
    folder.mkdir()
    save_file(w, str(folder / "sae_weights.safetensors"))
    (folder / "cfg.json").write_text(json.dumps({
        "architecture": "standard", "d_in": D, "d_sae": F, "apply_b_dec_to_input": True,
        "normalize_activations": mode, "metadata": {"sae_lens_version": "6.0.0", "hook_name": "hook_embed"}}))
    x = _x(seed=9).astype(np.float64)
    if mode == "constant_norm_rescale":
        xn = x * np.sqrt(D) / np.linalg.norm(x, axis=1, keepdims=True)
        sae = load_sae(folder)
    elif mode == "layer_norm":
        xc = x - x.mean(1, keepdims=True)
        xn = xc / (xc.std(1, ddof=1, keepdims=True) + 1e-5)
        sae = load_sae(folder)
    else:
        with pytest.warns(UserWarning, match="norm_scaling_factor"):
            load_sae(folder)
        sae = load_sae(folder, norm_scaling_factor=0.25)
        xn = x * 0.25
    want = np.maximum((xn - w["b_dec"]) @ w["W_enc"] + w["b_enc"], 0)
    np.testing.assert_allclose(sae.encode(x).toarray(), want, rtol=1e-4, atol=1e-3)
    assert sae.layer == 0
    if mode == "expected_average_only_in":  # our writer folds the factor, like SAELens does
        back = load_sae(save_sae(sae, tmp_path / "folded"))
        assert back.normalize_activations == "none"
        np.testing.assert_allclose(back.encode(x).toarray(), want, rtol=1e-4, atol=1e-3)


def test_writer_produces_the_saelens6_layout_with_a_real_hook_name(tmp_path):
    rng = np.random.default_rng(10)
    sae = SAE(rng.standard_normal((D, F)).astype(np.float32), rng.standard_normal(F).astype(np.float32),
              rng.standard_normal((F, D)).astype(np.float32), rng.standard_normal(D).astype(np.float32),
              "topk", 4, None, sae_metadata("gemma3-270m", 9))
    folder = save_sae(sae, tmp_path / "layer_9")
    cfg = json.loads((folder / "cfg.json").read_text())
    assert cfg["architecture"] == "topk" and cfg["k"] == 4 and cfg["apply_b_dec_to_input"] is True
    assert cfg["normalize_activations"] == "none" and cfg["rescale_acts_by_decoder_norm"] is False
    assert cfg["metadata"]["hook_name"] == "blocks.8.hook_resid_post" and cfg["metadata"]["hook_layer"] == 8
    assert cfg["metadata"]["sae_lens_version"].startswith("6.")
    from safetensors import safe_open

    with safe_open(str(folder / "sae_weights.safetensors"), framework="np") as f:
        assert set(f.keys()) == {"W_enc", "b_enc", "W_dec", "b_dec"}  # strict load_state_dict in SAELens
    back = load_sae(folder)
    assert back.layer == 9
    x = rng.standard_normal((50, D)).astype(np.float32)
    assert (back.encode(x) != sae.encode(x)).nnz == 0


def test_hook_name_to_layer_convention():
    assert hook_layer("blocks.0.hook_resid_pre") == 0
    assert hook_layer("blocks.0.hook_resid_post") == 1
    assert hook_layer("blocks.17.hook_resid_post") == 18
    assert hook_layer("resid_layer_7") == 7  # saeot's files before this format fix
    for l in range(20):
        assert hook_layer(layer_hook_name(l)) == l
    for bad in ("blocks.3.hook_mlp_out", "blocks.3.attn.hook_z", "blocks.3.hook_resid_mid"):
        with pytest.raises(ValueError, match="not a residual-stream hook"):
            hook_layer(bad)


def test_round_trip_through_sae_lens_when_installed(tmp_path):
    """Optional: SAELens itself reads our files and encodes identically (skipped where sae-lens is
    not installed; see docs/saeot.md for why it is not a test dependency)."""
    sl = pytest.importorskip("sae_lens")
    import torch

    rng = np.random.default_rng(11)
    w = _weights(12)
    sae = SAE(w["W_enc"], w["b_enc"], w["W_dec"], w["b_dec"], "jumprelu", None, w["threshold"],
              sae_metadata("gemma3-270m", 4), apply_b_dec_to_input=False)
    folder = save_sae(sae, tmp_path / "ours")
    theirs = sl.SAE.load_from_disk(str(folder))
    x = rng.standard_normal((64, D)).astype(np.float32)
    with torch.no_grad():
        np.testing.assert_allclose(theirs.encode(torch.from_numpy(x)).numpy(), sae.encode(x).toarray(), atol=1e-5)
