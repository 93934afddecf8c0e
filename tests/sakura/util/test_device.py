"""sakura.util.device: --device / --dtype resolution (CPU here; the CUDA checks skip without one)."""

import pytest
import torch

from sakura.util.device import DeviceError, resolve, resolve_device, resolve_dtype

cuda = pytest.mark.cuda
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_auto_picks_what_this_machine_has():
    dev = resolve_device("auto")
    want = "cuda" if torch.cuda.is_available() else (
        "mps" if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available() else "cpu")
    assert dev.type == want
    assert resolve_device(None) == dev


def test_cpu_defaults_to_float32_and_names_parse():
    assert resolve("cpu", "auto") == (torch.device("cpu"), torch.float32)
    assert resolve_dtype("bf16", "cpu") is torch.bfloat16
    assert resolve_dtype("FP16", "cpu") is torch.float16
    assert resolve_dtype(torch.float32) is torch.float32
    assert resolve_device(torch.device("cpu")).type == "cpu"


@pytest.mark.parametrize("device", ["gpu", "tpu", "cuda:x"])
def test_bad_device_is_one_line(device):
    with pytest.raises(DeviceError) as e:
        resolve_device(device)
    assert "\n" not in str(e.value) and str(e.value).startswith("device ")


def test_bad_dtype_is_one_line():
    with pytest.raises(DeviceError, match="dtype"):
        resolve_dtype("int8", "cpu")
    with pytest.raises(DeviceError):
        resolve_dtype(torch.int32)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_refused():
    with pytest.raises(DeviceError, match="CUDA is not available"):
        resolve_device("cuda")


@cuda
@needs_cuda
def test_cuda_auto_dtype_is_half():
    assert resolve("auto", "auto")[1] in (torch.bfloat16, torch.float16)


@cuda
@needs_cuda
def test_mini_on_cuda_matches_cpu_fingerprint_and_edits():
    from sakura.cloud.tasks import get_template
    from sakura.models import load_model

    cpu = load_model("sakura-mini", device="cpu")
    gpu = load_model("sakura-mini", device="cuda", dtype="bf16")
    assert gpu.fingerprint() == cpu.fingerprint()  # the shipped weights name the model on every device
    t = get_template("look-00", 64)
    kv = gpu.extract_template_kv(t.image[None], t.instruction)
    assert kv.layers[0].key.device.type == "cpu"  # KV comes back to the host (the wire's side)
    img = gpu.edit(t.image[None], template_kv=kv.to(torch.float16), steps=2).image
    ref = cpu.edit(t.image[None], template_kv=cpu.extract_template_kv(t.image[None], t.instruction), steps=2).image
    assert img.device.type == "cpu" and float((img - ref).abs().mean()) < 0.05


def test_device_options_leave_auto_out_and_check_names():
    from sakura.util.device import device_options

    assert device_options("auto", "auto") == {}
    assert device_options("cpu", "bf16") == {"device": "cpu", "dtype": "bf16"}
    with pytest.raises(DeviceError):
        device_options("gpu", "auto")


def test_errors_name_the_argument_not_a_cli_flag():
    """The Python API raises these too: `sakura.build(device="tpu")` names `device`, not `--device`."""
    for kwargs in ({"device": "tpu"}, {"dtype": "fp8"}):
        with pytest.raises(DeviceError) as e:
            resolve(**kwargs)
        (arg,) = kwargs
        assert str(e.value).startswith(f"{arg} ") and "--" not in str(e.value), str(e.value)
