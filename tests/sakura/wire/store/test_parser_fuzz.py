"""Fuzzing the parsers that read what a server or a disk hands us: the manifest (and index)
parser and the TemplateKV loader. Any mutated input gives a typed error (`ManifestError`,
`TemplateKVError`) or a valid result: never another exception, never a large allocation.
Bounded (max_examples), derandomised in CI by the profile in tests/conftest.py. The codec
decoders are fuzzed in tests/sakura/codec (issue 17)."""

from __future__ import annotations

import json
import tracemalloc

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from sakura.models.kv import LayerKV, TemplateKV, TemplateKVError, _content_digest
from sakura.wire.store import ManifestError, Store
from sakura.wire.store.manifest import Manifest, manifest_tree
from sakura.wire.store.synthetic import make_synthetic_store

pytestmark = pytest.mark.timeout(300)
FUZZ = settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
                deadline=None)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("fstore")
    make_synthetic_store(root, templates=1, layers=2, tokens=16, width=16)
    return root


@pytest.fixture(scope="module")
def manifest_bytes(store):
    (fp, tid), = Store(store).manifest_keys()
    return Store(store).manifest_path(fp, tid).read_bytes()


def _parse(data: bytes) -> None:
    tracemalloc.start()
    try:
        try:
            Manifest.from_bytes(data, source="fuzz")
        except ManifestError:
            pass
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 * len(data) + (4 << 20), f"parsing {len(data)} bytes allocated {peak} bytes"


edits = st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.sampled_from(["flip", "del", "ins", "dup"]),
                           st.binary(min_size=1, max_size=8)), min_size=1, max_size=6)


def _mutate(data: bytes, ops) -> bytes:
    b = bytearray(data)
    for pos, op, chunk in ops:
        i = int(pos * len(b)) if b else 0
        if op == "flip" and b:
            b[i] ^= chunk[0] or 1
        elif op == "del":
            del b[i:i + len(chunk)]
        elif op == "ins":
            b[i:i] = chunk
        elif op == "dup":
            b[i:i] = b[i:i + 64] * 4
    return bytes(b)


@FUZZ
@given(ops=edits)
def test_manifest_byte_mutations_give_typed_errors(manifest_bytes, ops):
    _parse(_mutate(manifest_bytes, ops))


# adversarial JSON values, as text, placed anywhere in the tree
hostile_text = st.one_of(
    st.integers(1, 20_000).map(lambda n: "[" * n + "]" * n),          # deep nesting (RecursionError)
    st.integers(1, 3000).map(lambda n: '{"a":' * n + "1" + "}" * n),
    st.integers(20, 6000).map(lambda n: "9" * n),                      # 5,000-digit integers (ValueError)
    st.integers(20, 6000).map(lambda n: "-" + "1" * n),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-0", "true", "null", '""', "[]", "{}",
                     '"\\ud800"', '"' + "x" * 5000 + '"', "1.5", "-1", "0"]),
)


def _paths(tree, prefix=()):
    yield prefix
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _paths(v, prefix + (i,))


@FUZZ
@given(which=st.floats(0, 1, exclude_max=True), value=hostile_text)
@example(which=0.0, value="[" * 100_000 + "]" * 100_000)
def test_manifest_hostile_values_anywhere_give_typed_errors(manifest_bytes, which, value):
    tree = manifest_tree(manifest_bytes)
    paths = list(_paths(tree))
    path = paths[int(which * len(paths))]
    marker = "\u0000MARK\u0000"
    if not path:
        text = value
    else:
        node = tree
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = marker
        text = json.dumps(tree).replace(json.dumps(marker), value)
    _parse(text.encode("utf-8", "surrogatepass"))


@pytest.mark.parametrize("body", ["[" * 50_000 + "]" * 50_000, '{"schema": ' + "7" * 5000 + "}"])
def test_store_commands_report_hostile_manifests_in_one_line(store, tmp_path, body):
    import shutil

    from sakura.cli.main import app

    root = tmp_path / "s"
    shutil.copytree(store, root)
    (fp, tid), = Store(root).manifest_keys()
    Store(root).manifest_path(fp, tid).write_text(body)
    r = CliRunner().invoke(app, ["store", "verify", str(root)])
    assert r.exit_code == 1 and "PROBLEM" in r.output and "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    r = CliRunner().invoke(app, ["store", "stats", str(root)])
    assert r.exit_code == 0 and r.exception is None, r.output
    r = CliRunner().invoke(app, ["store", "gc", str(root), "--dry-run"])
    assert r.exit_code == 2 and "unreadable" in r.output and not isinstance(r.exception, RecursionError)
    (root / "index.json").write_text("[" * 50_000)
    r = CliRunner().invoke(app, ["store", "verify", str(root)])
    assert r.exit_code == 1 and "index.json: unreadable" in r.output


# ------------------------------------------------------------------------------ TemplateKV

def _kv() -> TemplateKV:
    g = torch.Generator().manual_seed(0)
    layers = [LayerKV(torch.randn(4, 2, 8, generator=g), torch.randn(4, 2, 8, generator=g)) for _ in range(3)]
    return TemplateKV(layers, model_fingerprint="a" * 64, template_fingerprint="b" * 64, layout={"kind": "t"})


@pytest.fixture(scope="module")
def kv_bytes(tmp_path_factory):
    p = tmp_path_factory.mktemp("kv") / "t.safetensors"
    _kv().save(p)
    return p.read_bytes()


def _load(tmp_path, data: bytes) -> None:
    p = tmp_path / "m.safetensors"
    p.write_bytes(data)
    try:
        kv = TemplateKV.load(p)
    except TemplateKVError:
        return
    # a mutation that loads must be the same content, and never more than the file held
    assert kv.nbytes <= len(data)
    ref = _kv()
    assert kv.num_layers == ref.num_layers
    assert all(torch.equal(a.key, b.key) and torch.equal(a.value, b.value) for a, b in zip(kv.layers, ref.layers))


@FUZZ
@given(ops=edits)
def test_template_kv_byte_mutations_give_typed_errors(tmp_path, kv_bytes, ops):
    _load(tmp_path, _mutate(kv_bytes, ops))


@FUZZ
@given(ops=edits.map(lambda o: [(p * 0.1, *rest) for p, *rest in o]))  # the 8-byte length + JSON header
def test_template_kv_header_mutations_give_typed_errors(tmp_path, kv_bytes, ops):
    _load(tmp_path, _mutate(kv_bytes, ops))


meta_values = st.one_of(st.text(max_size=40), st.sampled_from(["1", "-1", "0", "6", "99", "1.0", " 1", "", "{}",
                                                                 "[", "null", "9" * 5000, "[" * 5000]))


@FUZZ
@given(key=st.sampled_from(["format", "format_version", "model_fingerprint", "template_fingerprint", "num_layers",
                            "layout", "content_sha256", "extra"]),
       value=meta_values, recompute=st.booleans())
def test_template_kv_metadata_edits_give_typed_errors(tmp_path, key, value, recompute):
    from safetensors.torch import save_file

    kv = _kv()
    tensors = kv._tensors()
    meta = {"format": "sakura.template_kv", "format_version": "2", "model_fingerprint": "a" * 64,
            "template_fingerprint": "b" * 64, "num_layers": "3", "layout": '{"kind": "t"}'}
    meta["content_sha256"] = _content_digest(tensors, meta)
    meta[key] = value
    if recompute and key != "content_sha256":  # a writer that checksums its own bad metadata
        meta["content_sha256"] = _content_digest(tensors, meta)
    p = tmp_path / "meta.safetensors"
    save_file(tensors, str(p), metadata=meta)
    _load(tmp_path, p.read_bytes())


def test_template_kv_metadata_is_covered_by_the_checksum(tmp_path):
    """The two cases found: `num_layers: "1"` loaded 1 of 3 layers, `format_version: "-1"` loaded."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    p = _kv().save(tmp_path / "t.safetensors")
    with safe_open(str(p), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    for key, bad, msg in (("num_layers", "1", "checksum"), ("format_version", "-1", "format_version"),
                          ("layout", '{"kind": "other"}', "checksum")):
        m = dict(meta, **{key: bad})
        q = tmp_path / f"{key}.safetensors"
        save_file(tensors, str(q), metadata=m)
        with pytest.raises(TemplateKVError, match=msg):
            TemplateKV.load(q)
