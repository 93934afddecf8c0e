import asyncio
import os
import time

import pytest
import torch
from hypothesis import settings

# One thread per test process: CI machines have 2 cores and the suite must not oversubscribe.
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

# Hypothesis: in CI every run draws the same examples (derandomize, no example database), so a red
# CI run is reproducible and a green one is not luck; locally it keeps exploring new examples.
# Examples it finds that fail are pinned with @example next to the property. Select another
# profile with HYPOTHESIS_PROFILE=dev|ci (hypothesis also detects CI itself; this makes it explicit).
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("dev", derandomize=False, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE")
                      or ("ci" if os.environ.get("CI", "").lower() in ("true", "1") else "dev"))


@pytest.fixture
def rng():
    return torch.Generator().manual_seed(1234)


@pytest.fixture(scope="session")
def klein_folder(tmp_path_factory):
    """A complete tiny FLUX.2 Klein pipeline written with save_pretrained, once per test run."""
    from sakura.models.flux.klein_tiny import write_tiny_klein_folder

    return write_tiny_klein_folder(tmp_path_factory.mktemp("klein"))


@pytest.fixture(scope="session")
def kontext_folder(tmp_path_factory):
    """A complete tiny FLUX.1 Kontext pipeline written with save_pretrained, once per test run."""
    from sakura.models.flux.kontext_tiny import write_tiny_kontext_folder

    return write_tiny_kontext_folder(tmp_path_factory.mktemp("kontext"))


# Integration tests: they start real services (a Ray cluster, nginx, HTTP servers and live edits
# through them, `sakura edit` subprocesses) or run a benchmark end to end. They stay in the default
# suite and in CI; `./dev test -m 'not slow and not integration'` is the quick run (-m replaces the
# default 'not slow'). Listed here, in one place, rather than in each file: (path under tests/,
# substring of the test's name or "" for the whole file). A stale entry fails at collection.
INTEGRATION = [
    ("sakura/cloud/builder/test_distributed.py", ""),          # Ray cluster
    ("sakura/wire/server/test_edge.py", ""),                # nginx edge
    ("sakura/wire/server/test_scale_smoke.py", ""),         # nginx origin + edge, scale model
    ("sakura/wire/server/test_load_smoke.py", "test_load_benchmark_smoke"),  # `sakura serve` subprocess + load bench
    ("sakura/wire/server/test_serve_cli.py", ""),           # `sakura serve` subprocess
    ("sakura/wire/client/test_client.py", "[nginx]"),       # the client against stock nginx
    ("sakura/wire/client/test_edit_privacy.py", ""),        # real `sakura edit` subprocesses
    ("sakura/wire/client/test_edit_hostile.py", ""),        # real `sakura edit` subprocesses vs hostile servers
    ("sakura/emulation/test_hostile_bench.py", ""),         # faults bench
    ("sakura/codec/test_bench_smoke.py", ""),          # codec bench
    ("sakura/bench/test_decode_rates.py", "test_run_writes_rows"),  # decode bench
    ("sakura/test_bench_commands.py", ""),             # the benches moved out of docs/ and argparse
    ("sakura/phone/test_live.py", ""),               # live edits through a server and the pacer
    ("sakura/phone/test_edit_cli.py", ""),           # `sakura edit`, live e2e bench, profile simulation
    ("sakura/models/test_flux2mini_pipeline.py", ""),  # build + serve + streamed edit
    ("sakura/cloud/builder/test_build_klein.py", ""),          # build + serve + streamed Klein edit
    ("sakura/bench/test_realscale.py", "test_realscale_tiny"),  # real-shape bench, tiny preset: build, serve, edit
    ("sakura/wire/client/test_streamed_kv.py", ""),         # streamed edits over an emulated link
    ("sakura/emulation/test_tc.py", ""),                    # tc tbf between network namespaces (root)
    ("sakura/codec/test_decode_pool.py", "test_bench_writes"),  # decode bench
    ("sakura/test_cli.py", "test_demo_end_to_end"),
    ("sakura/test_public_api.py", "example_script"),  # the docs example: build, serve, edit
    ("sakura/test_public_api.py", "plugin"),          # a pip-installed plugin package: build + edit subprocesses
    ("sakura/test_public_api.py", "wheel"),           # pip wheel . installed into a fresh venv
    ("sakura/phone/test_live_reliability.py", ""),          # build + serve + streamed edits (issue 35)
    ("sakura/phone/test_template_trust.py", "test_edit_"),  # build + serve + real `sakura edit`s (issue 35)
    ("sakura/phone/test_template_trust.py", "test_manifest_for_another_model"),
    ("sakura/wire/server/test_fd_pressure.py", "test_server_keeps_serving"),  # `sakura serve` child under ulimit -n 64
    ("sakura/emulation/test_hostile_bench.py", "test_reliability_probes_smoke"),
    ("sakura/cloud/builder/test_large_images.py", "test_large_png"),  # a 6000 x 6000 PNG decoded in a child
]
_TESTS = os.path.dirname(os.path.abspath(__file__))
_stale = [p for p, _ in INTEGRATION if not os.path.isfile(os.path.join(_TESTS, p))]
if _stale:
    raise RuntimeError(f"tests/conftest.py INTEGRATION lists files that do not exist: {_stale}")


def pytest_collection_modifyitems(config, items):
    for item in items:
        rel = os.path.relpath(str(item.path), _TESTS).replace(os.sep, "/")
        if any(rel == p and sub in item.name for p, sub in INTEGRATION):
            item.add_marker(pytest.mark.integration)


# ---------------------------------------------------------------- shared model fixtures
TINY_FLUX2_PX = 16


def _randomised(m):
    """`m` with every parameter jittered (a fresh DiT's zero-initialised output head and gates make
    its output zero, independent of the input), fingerprint recomputed, in eval mode."""
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    m.invalidate_fingerprint()
    return m.eval()


def _make_tiny_flux2(seed=0, **overrides):
    """Tiny random flux2-mini (16 px, 4 px patches, width 32, 1 double + 2 single blocks)."""
    from sakura.models.flux2mini import Flux2MiniConfig, Flux2MiniDiT

    cfg = Flux2MiniConfig(**{"image_size": TINY_FLUX2_PX, "patch_size": 4, "dim": 32, "heads": 2, "double_layers": 1,
                             "single_layers": 2, "text_dim": 16, **overrides})
    torch.manual_seed(seed)
    return _randomised(Flux2MiniDiT(cfg))


def _make_tiny_mini(seed: int = 0, **overrides):
    """A small random sakura-mini (16 px, 4 px patches, width 32, 3 blocks)."""
    from sakura.models.mini import MiniConfig, MiniDiT

    cfg = MiniConfig(**{"image_size": 16, "patch_size": 4, "dim": 32, "depth": 3, "heads": 2, **overrides})
    torch.manual_seed(seed)
    return _randomised(MiniDiT(cfg))


@pytest.fixture
def tiny_mini():
    return _make_tiny_mini()


@pytest.fixture
def mini_factory():
    """Factory of tiny random sakura-mini models: mini_factory(seed=0, **config overrides)."""
    return _make_tiny_mini


@pytest.fixture(scope="session")
def make_tiny_flux2():
    """Factory of tiny random flux2-mini models: make_tiny_flux2(seed=0, **config overrides)."""
    return _make_tiny_flux2


@pytest.fixture(scope="session")
def tiny_images():
    """images(n, seed) -> (n, 3, 16, 16) uniform random pixels, the tiny flux2-mini's size."""
    return lambda n, seed: torch.rand(n, 3, TINY_FLUX2_PX, TINY_FLUX2_PX, generator=torch.Generator().manual_seed(seed))


class RecordingSource:
    """A TemplateKVSource that logs ("layer", i) when the model requests layer i, next to a
    block-execution log, so a test can check each layer is pulled when its block runs."""

    def __init__(self, kv, log: list):
        self.kv, self.log = kv, log
        self.model_fingerprint, self.template_fingerprint = kv.model_fingerprint, kv.template_fingerprint
        self.layout, self.positions, self.instruction = kv.layout, kv.positions, kv.instruction

    @property
    def num_layers(self):
        return self.kv.num_layers

    def layer(self, i):
        self.log.append(("layer", i))
        return self.kv.layer(i)


@pytest.fixture(scope="session")
def recording_source():
    """The RecordingSource class: recording_source(kv, log)."""
    return RecordingSource


# ---------------------------------------------------------------- timing relative to the machine
class LoopLag:
    """How late this event loop ran while a measurement ran: a probe sleeps 5 ms at a time and
    sums how much later than asked it woke. On a loaded machine every emulated time is late by
    about this much, so upper bounds add it (relative to the machine) instead of a fixed margin."""

    STEP_S = 0.005

    def __init__(self) -> None:
        self.late: list[tuple[float, float]] = []   # (woke at, seconds late)

    async def __aenter__(self) -> "LoopLag":
        async def probe():
            while True:
                t = time.monotonic()
                await asyncio.sleep(self.STEP_S)
                now = time.monotonic()
                self.late.append((now, max(0.0, now - t - self.STEP_S)))
        self._task = asyncio.create_task(probe())
        return self

    async def __aexit__(self, *exc) -> None:
        self._task.cancel()

    def between(self, t0: float, t1: float) -> float:
        """Seconds of lateness the loop showed in [t0, t1] (monotonic clock), one probe step beyond."""
        return sum(d for t, d in self.late if t0 <= t <= t1 + self.STEP_S) + self.STEP_S


@pytest.fixture(scope="session")
def loop_lag():
    """The LoopLag class: `async with loop_lag() as lag: ...; lag.between(t0, t1)`."""
    return LoopLag


# ---------------------------------------------------------------- bandwidth traces
@pytest.fixture(scope="session")
def need_trace():
    """``need_trace(spec)``: the loaded trace, or a skip when the file is in neither the trace folder
    (SAKURA_TRACES, ../shared/traces) nor the subset bundled with sakura (sakura/assets/traces)."""
    from sakura.emulation import TraceError, load_trace

    def load(spec: str):
        try:
            return load_trace(spec)
        except TraceError as e:
            pytest.skip(f"trace not available here (not bundled; set SAKURA_TRACES): {e}")

    return load
