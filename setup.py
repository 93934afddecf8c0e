"""Build hooks beyond pyproject.toml's metadata: the native decoder, libsakura_decode.

The C11 library in native/ is compiled at install as an *optional* extension module
`sakura._sakura_decode`: without a C compiler the install still succeeds and the package decodes
with numba (`sakura.codec.native.decoder()` says which). It holds no Python C API: the package
loads it with ctypes, and the very same sources build for iOS/Android (docs/native.md).

Every vector path this architecture has is compiled in (x86-64: scalar, sse4 = x86-64-v2,
avx2 = x86-64-v3; aarch64: scalar, neon), each kernel file with its own target flags; the
library picks the best the CPU runs at first use.
"""

from __future__ import annotations

import platform

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

COMMON = ["native/src/model.c", "native/src/rans.c", "native/src/prog.c", "native/src/cachegen.c",
          "native/src/dispatch.c"]
# -ffp-contract=off: no fused multiply-adds, so every path rounds as numba's kernels do
CFLAGS = ["-std=c11", "-O3", "-ffp-contract=off", "-fvisibility=hidden"]


def kernel_paths(machine: str) -> list[tuple[str, list[str]]]:
    """(path, extra compiler flags) of the kernel files for this machine."""
    m = machine.lower()
    paths = [("scalar", ["-fno-tree-vectorize"])]
    if m in ("x86_64", "amd64"):
        paths += [("sse4", ["-march=x86-64-v2"]), ("avx2", ["-march=x86-64-v3"])]
    elif m in ("aarch64", "arm64"):
        paths += [("neon", [])]
    return paths


class BuildNative(build_ext):
    """Compile the per-path kernel files with their own flags, then link them into the extension."""

    def build_extension(self, ext: Extension) -> None:
        if ext.name == "sakura._sakura_decode":
            objects = []
            for name, flags in kernel_paths(platform.machine()):
                objects += self.compiler.compile([f"native/src/kern_{name}.c"], output_dir=self.build_temp,
                                                 include_dirs=["native/include"], extra_postargs=CFLAGS + flags)
            ext.extra_objects = objects
        super().build_extension(ext)

    def get_export_symbols(self, ext: Extension) -> list[str]:
        return [] if ext.name == "sakura._sakura_decode" else super().get_export_symbols(ext)


setup(
    ext_modules=[Extension("sakura._sakura_decode", sources=COMMON, include_dirs=["native/include"],
                           extra_compile_args=CFLAGS, libraries=["m"], optional=True)],
    cmdclass={"build_ext": BuildNative},
)
