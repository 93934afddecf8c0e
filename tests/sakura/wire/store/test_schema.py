"""One schema library (pydantic, strict) for codec parameters and manifest JSON: unknown names and
wrong types are one-line errors naming the parameter or field."""

import json

import pytest

from sakura.codec import codec_from_spec
from sakura.wire.store import Manifest, ManifestError
from sakura.wire.store.synthetic import make_synthetic_store


@pytest.mark.parametrize("spec, msg", [
    ("progressive:alpha=5", "unknown parameter"),
    ('uniform:bits="8"', "bits='8'"),
    ("uniform:bits=true", "bits=True"),
    ("cachegen:level=3.5", "level=3.5"),
    ('progressive:gamma="x"', "gamma='x'"),
    ("sakura:alpha=true", "alpha=True"),
    ("lossless:zstd=1", "zstd=1"),
])
def test_codec_parameters_are_strict(spec, msg):
    with pytest.raises(ValueError, match=msg):
        codec_from_spec(spec)


@pytest.mark.parametrize("spec", ["progressive", "progressive:budgets=0.5", "layered:budgets=[1,2]",
                                  "sakura:budget=1", "cachegen:level=2", "uniform:bits=4"])
def test_valid_codec_parameters_still_pass(spec):
    c = codec_from_spec(spec)
    assert codec_from_spec(c.spec).params == c.params  # the spec round-trips through the schema


@pytest.fixture
def manifest_json(tmp_path):
    make_synthetic_store(tmp_path, templates=1, layers=2)
    from sakura.wire.store.manifest import Manifest

    return Manifest.from_bytes((tmp_path / "manifests/synthetic-model/tpl-000.json").read_bytes()).to_json(version=1)


@pytest.mark.parametrize("mutate, msg", [
    (lambda d: d["template_ref"].update(colour="red"), r"template_ref: unknown keys \['colour'\]"),
    (lambda d: d["shards"][0].update(layer="0"), r"shards\[0\].layer: Input should be a valid integer"),
    (lambda d: d["shards"][0].update(tokens=[0, 1, 2]), r"shards\[0\].tokens"),
    (lambda d: d["tables"].append({"name": "", "codec": "c", "params": {}, "object": d["template_ref"]["object"]}),
     r"tables\[\d+\].name"),
    (lambda d: d["shards"][1]["renditions"][0].update(params=[1]), r"shards\[1\].renditions\[0\].params"),
    (lambda d: d.update(kv_layout=None), "kv_layout"),
])
def test_manifest_schema_names_the_field(manifest_json, mutate, msg):
    mutate(manifest_json)
    with pytest.raises(ManifestError, match=msg):
        Manifest.from_bytes(json.dumps(manifest_json).encode(), source="test")
