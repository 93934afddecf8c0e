"""Where a model runs and in what precision: the one place that turns ``--device`` / ``--dtype``
(or the Python API's ``device=`` / ``dtype=``) into torch objects.

    resolve_device("auto")            -> cuda, else mps, else cpu
    resolve_dtype("auto", device)     -> bfloat16 on cuda (float16 where bf16 is unsupported),
                                         float16 on mps, float32 on cpu
    model_device(module)              -> the device of a module's first parameter (cpu when none)

The KV on the wire is what the codecs define (fp16 shards); a model casts injected layers to its
own device and dtype on arrival, so a store built on a GPU in bf16 serves a phone in fp32.
"""

from __future__ import annotations

from typing import Any
import resource
import sys

#: accepted ``--dtype`` names -> torch attribute
DTYPE_NAMES = {"auto": None, "float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16",
               "half": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16"}


class DeviceError(ValueError):
    """A device or dtype the user asked for that does not exist here (one line)."""


def resolve_device(device: Any = "auto"):
    """``"auto"`` / None: cuda when available, else mps, else cpu; ``"cuda"``, ``"cuda:1"``,
    ``"mps"``, ``"cpu"`` or a ``torch.device``: checked to exist here (DeviceError otherwise)."""
    import torch  # lazy: torch; off --help and argument errors

    if device is None or (isinstance(device, str) and device.strip().lower() == "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = device if isinstance(device, torch.device) else torch.device(str(device).strip().lower())
    except (RuntimeError, TypeError) as e:
        raise DeviceError(f"device {device!r}: not a device name (auto, cpu, cuda, cuda:N, mps)") from e
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device {str(device)!r}: CUDA is not available on this machine")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DeviceError(f"device {str(device)!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise DeviceError(f"device {str(device)!r}: MPS is not available on this machine")
    elif dev.type != "cpu":
        raise DeviceError(f"device {str(device)!r}: unsupported device type {dev.type!r} (auto, cpu, cuda, mps)")
    return dev


def resolve_dtype(dtype: Any = "auto", device: Any = None):
    """``"auto"`` / None: float32 on cpu, bfloat16 on cuda (float16 if the GPU lacks bf16), float16
    on mps; else one of float32/fp32, float16/fp16/half, bfloat16/bf16 or a ``torch.dtype``."""
    import torch  # lazy: torch; off --help and argument errors

    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise DeviceError(f"dtype {str(dtype)!r}: expected float32, float16 or bfloat16")
        return dtype
    key = "auto" if dtype is None else str(dtype).strip().lower()
    if key not in DTYPE_NAMES:
        raise DeviceError(f"dtype {dtype!r}: expected auto, float32, float16 or bfloat16 (fp32, fp16, bf16)")
    if DTYPE_NAMES[key] is not None:
        return getattr(torch, DTYPE_NAMES[key])
    dev = resolve_device(device) if not isinstance(device, torch.device) else device
    if dev.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if dev.type == "mps":
        return torch.float16
    return torch.float32


def resolve(device: Any = "auto", dtype: Any = "auto"):
    """(torch.device, torch.dtype) for a ``--device`` / ``--dtype`` pair."""
    dev = resolve_device(device)
    return dev, resolve_dtype(dtype, dev)


def device_options(device: Any = "auto", dtype: Any = "auto") -> dict[str, Any]:
    """The ``device=`` / ``dtype=`` keyword options for `load_model`, leaving out the ``auto``
    ones: a plugin factory that takes no such options keeps loading until one is asked for (the
    bundled loaders default to auto themselves). A bad name fails here, in one line."""
    resolve(device, dtype)
    return {k: v for k, v in (("device", device), ("dtype", dtype))
            if v is not None and not (isinstance(v, str) and v.strip().lower() == "auto")}


def model_device(module: Any):
    """Device of `module`'s first parameter (or buffer); cpu for a module without either."""
    import torch  # lazy: torch; off --help and argument errors

    for t in list(module.parameters())[:1] + list(module.buffers())[:1]:
        return t.device
    return torch.device("cpu")


def synchronize(device: Any) -> None:
    """Wait for queued work on `device` (cuda/mps) so a wall-clock timer measures it; no-op on cpu."""
    import torch  # lazy: torch; off --help and argument errors

    dev = torch.device(device) if not isinstance(device, torch.device) else device
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()


def peak_memory(device: Any) -> dict[str, float]:
    """{"host_peak_rss_bytes", "device_peak_bytes"}: this process's peak resident set (ru_maxrss)
    and, on cuda, torch's peak allocated bytes since the last `reset_peak_memory`."""
    import torch  # lazy: torch; off --help and argument errors

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {"host_peak_rss_bytes": float(rss if sys.platform == "darwin" else rss * 1024)}
    dev = torch.device(device) if not isinstance(device, torch.device) else device
    out["device_peak_bytes"] = float(torch.cuda.max_memory_allocated(dev)) if dev.type == "cuda" else 0.0
    return out


def reset_peak_memory(device: Any) -> None:
    import torch  # lazy: torch; off --help and argument errors

    dev = torch.device(device) if not isinstance(device, torch.device) else device
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
