"""Which CPU the native decoders compile for: this host, or a phone-class proxy.

A phone's cores have 128-bit SIMD (Arm NEON). The decode kernels are JIT-compiled by numba for
the CPU they run on, and on an AVX-512 server that means 512-bit vectors and VBMI2's expanding
loads / compressing stores (`kernels.VECTOR_LANES`), which no phone has. Decode rates measured
that way flatter every phone figure built from them.

`SAKURA_DECODE_TARGET=phone` selects the phone-class path for the whole process:
  - numba generates code for `PHONE_CPU` (x86-64-v2: SSE4.2, 128-bit vectors, no AVX, no F16C),
    not for the host (`NUMBA_CPU_NAME` / `NUMBA_CPU_FEATURES`, set here before numba loads);
  - the AVX-512 vector-intrinsic kernels are off; `kernels.VECTOR_LANES` = 8 selects the 128-bit
    ones (a byte shuffle by a table row per lane mask: SSSE3 `pshufb`, which NEON has as `tbl`);
  - torch's CPU kernels run their baseline (non-AVX) versions (`ATEN_CPU_CAPABILITY=default`).
The JIT target is fixed when numba starts compiling, so a process that wants both (`sakura bench
decode`) runs the phone-class side in a child process started with `phone_env()`.

x86-64-v2 is a proxy, not a phone: it has the same vector width as NEON but not NEON's
instructions (no fp16 conversion instruction, for one: `_f16_bits` becomes a short integer
sequence there, where an Arm core converts in one instruction). Rates move ~1.5x between VMs;
compare the two targets side by side in one run.
"""

from __future__ import annotations

import os
import sys

from numba.core import config
from numba.core.registry import cpu_target
import llvmlite.binding as llvm

ENV = "SAKURA_DECODE_TARGET"
TARGETS = ("host", "phone")
PHONE_CPU = "x86-64-v2"
#: LLVM features of the phone proxy beyond the CPU name's own: none (x86-64-v2's defaults)
PHONE_FEATURES = ""


class DecodeTargetError(ValueError):
    """An unknown decode target, or a phone target asked for after numba chose the host's."""


def current() -> str:
    """This process's decode target: "host" (default) or "phone" (from SAKURA_DECODE_TARGET)."""
    t = os.environ.get(ENV, "host").strip().lower() or "host"
    if t not in TARGETS:
        raise DecodeTargetError(f"{ENV}={t!r}: expected one of {', '.join(TARGETS)}")
    return t


def phone_env(base: dict | None = None) -> dict:
    """An environment for a child process that decodes on the phone-class path."""
    env = dict(os.environ if base is None else base)
    env[ENV] = "phone"
    env["NUMBA_CPU_NAME"] = PHONE_CPU
    env["NUMBA_CPU_FEATURES"] = PHONE_FEATURES
    env["ATEN_CPU_CAPABILITY"] = "default"
    return env


def configure() -> str:
    """Apply this process's target before numba compiles anything (called by `sakura.codec` on
    import, ahead of numba). Returns the target. If numba's configuration was read already,
    its CPU settings are rewritten in place: they are read again when the JIT target machine is
    made, at the first compile or cache load."""
    t = current()
    if t != "phone":
        return t
    for k, v in (("NUMBA_CPU_NAME", PHONE_CPU), ("NUMBA_CPU_FEATURES", PHONE_FEATURES)):
        os.environ[k] = v
    os.environ.setdefault("ATEN_CPU_CAPABILITY", "default")
    cfg = sys.modules.get("numba.core.config")
    if cfg is not None:
        cfg.CPU_NAME, cfg.CPU_FEATURES = PHONE_CPU, PHONE_FEATURES
    return t


def jit_cpu() -> str:
    """The CPU numba generates code for in this process (its name and explicit features)."""
    name = config.CPU_NAME or llvm.get_host_cpu_name()
    return name if config.CPU_FEATURES in (None, "") else f"{name} [{config.CPU_FEATURES}]"


def check() -> None:
    """Raise if the phone target was asked for but numba's JIT was already built for the host
    (numba imported and compiling before `sakura.codec`): its rates would be the host's."""
    if current() != "phone":
        return

    cg = cpu_target.target_context.codegen()
    if cg._get_host_cpu_name() != PHONE_CPU or cg._tm_features != PHONE_FEATURES:
        raise DecodeTargetError(f"{ENV}=phone but numba compiles for {cg._get_host_cpu_name()!r}: "
                                "set it before anything imports numba (or use target.phone_env() for a child)")
