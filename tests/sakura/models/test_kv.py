"""TemplateKV persistence: round trip, and every kind of bad file names its problem."""

import pytest
import torch
from safetensors.torch import save_file

from sakura.models import LayerKV, TemplateKV, TemplateKVError


def _kv(dtype=torch.float32, keep=False):
    g = torch.Generator().manual_seed(0)
    layers = []
    for _ in range(3):
        k = torch.randn(10, 2, 8, generator=g).to(dtype)
        v = torch.randn(10, 2, 8, generator=g).to(dtype)
        m = torch.arange(10) % 3 != 0 if keep else None
        layers.append(LayerKV(k, v, m))
    return TemplateKV(layers, "a" * 64, "b" * 64, {"kind": "test", "grid": [2, 5]},
                      positions=torch.arange(20).reshape(10, 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_round_trip_bit_exact(tmp_path, dtype):
    kv = _kv(dtype, keep=True)
    p = kv.save(tmp_path / "t.safetensors")
    back = TemplateKV.load(p, model_fingerprint="a" * 64, template_fingerprint="b" * 64)
    assert back.layout == kv.layout and torch.equal(back.positions, kv.positions)
    for a, b in zip(kv.layers, back.layers):
        assert a.key.dtype == b.key.dtype
        assert torch.equal(a.key, b.key) and torch.equal(a.value, b.value) and torch.equal(a.keep, b.keep)
    assert back.nbytes == kv.nbytes == 3 * 2 * 10 * 2 * 8 * kv.layers[0].key.element_size()


def test_wrong_fingerprints(tmp_path):
    p = _kv().save(tmp_path / "t.safetensors")
    with pytest.raises(TemplateKVError, match="model"):
        TemplateKV.load(p, model_fingerprint="c" * 64)
    with pytest.raises(TemplateKVError, match="template"):
        TemplateKV.load(p, template_fingerprint="c" * 64)


def test_truncated_file(tmp_path):
    p = _kv().save(tmp_path / "t.safetensors")
    data = p.read_bytes()
    p.write_bytes(data[: len(data) - 100])
    with pytest.raises(TemplateKVError, match="corrupt or truncated"):
        TemplateKV.load(p)


def test_bit_flip_in_data_detected(tmp_path):
    p = _kv().save(tmp_path / "t.safetensors")
    data = bytearray(p.read_bytes())
    data[-7] ^= 0x10  # inside the last tensor's payload: safetensors alone would not notice
    p.write_bytes(bytes(data))
    with pytest.raises(TemplateKVError, match="checksum"):
        TemplateKV.load(p)


def test_not_a_kv_file_and_missing(tmp_path):
    p = tmp_path / "other.safetensors"
    save_file({"x": torch.zeros(2)}, str(p))
    with pytest.raises(TemplateKVError, match="not a sakura template KV"):
        TemplateKV.load(p)
    with pytest.raises(TemplateKVError, match="no such"):
        TemplateKV.load(tmp_path / "nope.safetensors")


def test_future_version_rejected(tmp_path):
    kv = _kv()
    tensors = kv._tensors()
    from sakura.models.kv import _content_digest

    meta = {"format": "sakura.template_kv", "format_version": "99", "model_fingerprint": "a" * 64,
            "template_fingerprint": "b" * 64, "num_layers": "3", "layout": "{}",
            "content_sha256": _content_digest(tensors)}
    p = tmp_path / "future.safetensors"
    save_file(tensors, str(p), metadata=meta)
    with pytest.raises(TemplateKVError, match="newer"):
        TemplateKV.load(p)


def test_validation_names_the_problem():
    kv = _kv()
    with pytest.raises(TemplateKVError, match="key shape .* != value shape"):
        TemplateKV([LayerKV(torch.zeros(4, 2, 8), torch.zeros(4, 2, 4))], "a", "b").validate()
    with pytest.raises(TemplateKVError, match=r"expected \(tokens, heads, head_dim\)"):
        TemplateKV([LayerKV(torch.zeros(4, 16), torch.zeros(4, 16))], "a", "b").validate()
    with pytest.raises(TemplateKVError, match="NaN/inf"):
        TemplateKV([LayerKV(torch.full((4, 2, 8), float("inf")), torch.zeros(4, 2, 8))], "a", "b").validate()
    with pytest.raises(TemplateKVError, match="drops every token"):
        TemplateKV([LayerKV(torch.zeros(4, 2, 8), torch.zeros(4, 2, 8), torch.zeros(4, dtype=torch.bool))],
                   "a", "b").validate()
    with pytest.raises(TemplateKVError, match="heads = 2, the model expects 4"):
        kv.validate(heads=4)
    with pytest.raises(TemplateKVError, match="no layers"):
        TemplateKV([], "a", "b").validate()
    with pytest.raises(TemplateKVError, match="NaN"):
        bad = _kv()
        bad.layers[0].key[0, 0, 0] = float("nan")
        bad.save("/tmp/never-written.safetensors")
