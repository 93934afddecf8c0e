"""Edit photos from Python: the phone side's public API (`Editor`, `edit`).

An `Editor` keeps what a phone app keeps between edits warm: the model, the template gallery, the
bandwidth and round-trip estimators, the device profile. `Editor.edit(photo, template)` fetches the
template's manifest and reference image (kept in the gallery), streams what pays and computes the
rest, and returns an `EditResult`: the image, the per-layer record and the PSNR it held. With the
server down, a template already in the gallery is edited on the device. The photo never leaves the
process: the only requests sent are for public template objects.

One HTTP session for the `Editor`'s life: its gallery refreshes, listings and every edit's shard
fetches go through one `ClientThread` (one event loop in one thread, one pool of keep-alive
connections), so the second edit finds its connections warm. `close()` (or ``with Editor(...)``)
ends it; an editor dropped without `close` is closed when it is collected, or at exit.

    from sakura.phone.editor import Editor
    with Editor("http://127.0.0.1:8080", model="sakura-mini") as editor:
        result = editor.edit("photo.jpg", template="sticker-00")
    result.save("edited.png")
    print(result.to_dict()["layers"])
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import torch
from PIL import Image

from sakura.models import load_model
from sakura.util.device import device_options
from sakura.wire.client import (ClientThread, DeadlineExceeded, IntegrityError, NotFound, RedirectRefused, TemplateClient,
                                WrongManifest)
from sakura.wire.store.manifest import ManifestError
from sakura.wire.store.template_ref import split_template_images

from .estimator import BandwidthEstimator, RttEstimator
from .discovery import TemplateNotOffered, offered_manifest, LIST_DEADLINE_S, offered_templates
from .gallery import Gallery, decode_template_ref
from .limits import MANIFEST_DEADLINE_BYTES, LimitError, check_template_ref, step_deadline_s
from . import live
from .live import DEFAULT_MAX_INFLIGHT, NO_MANIFEST, StreamedEdit, _short, streamed_edit
from .photo import load_photo
from .plan import LOCAL
from .policies import EDIT_POLICIES, make_policy
from sakura.util.figures import save_grid

log = logging.getLogger("sakura.phone")


class TemplateUnavailable(ValueError):
    """The template can be had neither from the server nor from the gallery (one line, with why)."""


def refresh_failure(e: BaseException, template: str) -> str:
    """One line saying why the gallery refresh failed, by kind: a corrupt manifest or template
    image is not "server unavailable"."""
    # (kind, line, add the exception's text): the first kind that matches says it; order matters
    # (ManifestError and LimitError are ValueErrors, which alone mean a bad template image)
    kinds: tuple[tuple[type[BaseException], str, bool], ...] = (
        (WrongManifest, "server's manifest for {t} is for another model or template", True),
        (ManifestError, "server sent a corrupt manifest for {t}", True),
        (LimitError, "server's manifest for {t} is over this model's limits", True),
        (NotFound, "server has no template {t}", False),
        (IntegrityError, "server sent damaged bytes for {t}", True),
        (DeadlineExceeded, "server too slow", True),
        (RedirectRefused, "server redirected elsewhere", True),
        (ValueError, "server's template image for {t} is unusable", True),  # decode_template_ref
    )
    for kind, says, with_why in kinds:
        if isinstance(e, kind):
            line = says.format(t=template)
            return f"{line} ({_short(e, 100)})" if with_why else line
    # the root cause (connection refused, DNS, reset) says more than the retry wrapper, whose
    # message starts with the 64-hex template fingerprint
    cause = e.__cause__ or e
    return f"server unavailable ({_short(cause, 140)})"


#: What `EditResult.floor_psnr_db` rests on (it is not a guarantee for the photo at hand).
FLOOR_BASIS = ("estimate: each rung's image distortion at build time on the build's calibration photos (predicted by "
               "its sensitivity model, one rendition a template measured; the manifest's flags say which)")


def floor_heldout_error() -> dict[str, Any] | None:
    """The floor estimate's error on held-out photos as `sakura bench faults` last published it
    (sakura/assets/floor_heldout.json), or None if the package carries no measurement."""
    try:
        d = json.loads(files("sakura.assets").joinpath("floor_heldout.json").read_text())
    except (OSError, ValueError):
        return None
    keys = ("edits", "below_floor_fraction", "p95_shortfall_db", "max_shortfall_db", "command")
    return {k: d.get(k) for k in keys}


@dataclass
class EditResult:
    """One edit's outcome.

    image: (1, 3, S, S) float32 in [0, 1], on the model's device.
    photo, template_image: the inputs as the model saw them ((1, 3, S, S) and (R, 3, S, S)).
    streamed: the executor's full record (`StreamedEdit`: per-shard `ShardRecord`s, events, timings).
    messages: what the user should know (gallery fallback, a copy not kept), one line each.
    """

    image: torch.Tensor
    photo: torch.Tensor
    template_image: torch.Tensor
    template_id: str
    policy: str
    streamed: StreamedEdit
    messages: list[str] = field(default_factory=list)

    @property
    def latency_s(self) -> float:
        """Photo in to edited image out, seconds (manifest fetch included when it ran inside the edit)."""
        return self.streamed.latency_s

    @property
    def floor_psnr_db(self) -> float:
        """Image PSNR (dB) vs the lossless-KV edit that the renditions used imply (inf: every layer
        lossless or computed here; nan: the manifest carries no image distortions). An ESTIMATE:
        see `floor_estimate`."""
        return self.streamed.implied_psnr_db if self.streamed.quality_known else math.nan

    @property
    def floor_estimate(self) -> dict[str, Any]:
        """The floor named for what it is: ``psnr_db`` (`floor_psnr_db`), its ``basis`` (the build
        measured each rung on its calibration photos, not on this photo) and ``heldout_error_db``:
        how far edits of photos the build never saw landed below their floor (``below_floor_fraction``,
        ``p95_shortfall_db``, ``max_shortfall_db``; measured by `sakura bench faults`, shipped in
        sakura/assets/floor_heldout.json; None where absent)."""
        return {"psnr_db": self.floor_psnr_db, "basis": FLOOR_BASIS, "heldout_error_db": floor_heldout_error()}

    def layers(self) -> list[dict[str, Any]]:
        """Per layer: how its KV arrived ("fetched" or "computed here"), the rendition, bytes and
        timings (seconds since the edit started; None where it did not happen)."""
        def t(x: float) -> float | None:
            return None if x != x else round(float(x), 6)

        out = []
        for r in self.streamed.records:
            local = r.source == LOCAL or not r.source
            out.append({"layer": r.index, "how": "computed here" if local else "fetched",
                        "rendition": None if local else r.source, "bytes": int(r.nbytes),
                        "requested_s": t(r.t_request), "fetched_s": t(r.fetch_end), "decoded_s": t(r.decode_end),
                        "needed_s": t(r.needed), "delivered_s": t(r.delivered), "local_compute_s": round(r.local_s, 6),
                        "stall_s": round(r.stall_s, 6), "note": r.note or None})
        return out

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able record (what `sakura edit --json` prints)."""
        b = self.streamed.breakdown()
        floor = self.floor_psnr_db
        floor = None if floor != floor else ("inf" if math.isinf(floor) else round(floor, 3))
        return {"template": self.template_id, "policy": self.policy, "path": self.streamed.path,
                "latency_s": round(self.latency_s, 6), "bytes_fetched": int(b["bytes"]),
                "layers_computed_here": int(b["local_shards"]), "layers_total": len(self.streamed.records),
                "stall_s": round(b["stall_s"], 6),
                "floor_psnr_db": floor, "floor_estimate": {**self.floor_estimate, "psnr_db": floor},
                "layers": self.layers(), "events": list(self.streamed.events), "messages": list(self.messages)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def save(self, path: str | Path, *, compare: bool = True) -> list[Path]:
        """Write the edited image (format by suffix) and, with ``compare``, ``<stem>.compare.png``
        (photo | template | edit) beside it. Returns the paths written."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        arr = (self.image[0].detach().float().cpu().permute(1, 2, 0).numpy() * 255).round().astype("uint8")
        Image.fromarray(arr).save(path)
        written = [path]
        if compare:
            side = path.with_name(path.stem + ".compare.png")
            save_grid(side, [self.photo.cpu(), self.template_image[:1].cpu(), self.image.cpu()],
                      ["photo", "template", "edit"])
            written.append(side)
        return written


class Editor:
    """Edits photos with templates streamed from one server, keeping model, gallery and link
    estimates warm across edits.

    Args:
        server: the cache server's base URL, http(s)://host[:port] (`sakura serve`, nginx, an edge).
        model: a model spec for `sakura.load_model` (e.g. "sakura-mini", "klein:/folder@512", a
            plugin's name) or an already loaded model.
        gallery: the template gallery folder (default $SAKURA_GALLERY or ~/.cache/sakura/gallery).
        policy: "sakura" (plan + local fallback), "sakura-meet" or "raw-stream" (lossless only).
        prior_mbps: the bandwidth estimate before the first transfer, Mbit/s.
        decode_workers: decode threads (None: one per core).
        device, dtype: where a model given by spec runs ("auto": cuda, then mps, then cpu; bf16 on
            cuda, fp32 on cpu); streamed KV (fp16 on the wire) is cast on arrival.
        accept_new_template: the gallery pins each template id to the template it first saw
            (`TemplateChanged` for another under that id); True takes the server's new one.
    Raises ValueError (one line) for a bad server URL, policy or model spec.
    """

    def __init__(self, server: str, *, model: Any = "sakura-mini", gallery: str | Path | None = None,
                 policy: str = "sakura", prior_mbps: float = 10.0, decode_workers: int | None = None,
                 device: str = "auto", dtype: str = "auto", accept_new_template: bool = False) -> None:
        parts = urlsplit(server) if isinstance(server, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"server must be http(s)://host[:port], got {server!r}")
        if policy not in EDIT_POLICIES:
            raise ValueError(f"policy must be one of {', '.join(EDIT_POLICIES)}, got {policy!r}")
        if not (isinstance(prior_mbps, (int, float)) and prior_mbps > 0 and math.isfinite(prior_mbps)):
            raise ValueError(f"prior_mbps must be a positive number, got {prior_mbps!r}")
        self.server = server.rstrip("/")
        self.model = load_model(model, **device_options(device, dtype)) if isinstance(model, str) else model
        self.gallery = Gallery(gallery, accept_new=accept_new_template)
        self.model_name = model if isinstance(model, str) else type(self.model).__name__
        self.policy = policy
        self.bandwidth = BandwidthEstimator(prior_bps=prior_mbps * 1e6 / 8)
        self.rtt = RttEstimator()
        self._prior_mbps = prior_mbps
        self._decode_workers = decode_workers
        self._profile = None
        self._link: ClientThread | None = None

    @property
    def link(self) -> ClientThread:
        """The editor's one HTTP session and its event loop (opened on first use, kept until `close`)."""
        if self._link is None or self._link.closed:
            self._link = ClientThread(self.server, name="sakura-editor", max_connections=DEFAULT_MAX_INFLIGHT)
        return self._link

    def close(self) -> None:
        """Close the HTTP session and end its thread (a later call opens a new one)."""
        if self._link is not None:
            self._link.close()
            self._link = None

    def __enter__(self) -> "Editor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def profile(self):
        """The device profile the planner assumes (per-layer compute, decode rates), measured once."""
        if self._profile is None:
            self._profile = live.profile_model(self.model, repeats=1)  # (looked up there: a test may pin it)
            if self._decode_workers:
                self._profile.decode_workers = self._decode_workers
        return self._profile

    def templates(self, *, timeout_s: float = 5.0) -> list:
        """What the server offers for this model (`OfferedTemplate`s); raises on an unreachable server."""
        fp = self.model.fingerprint()
        return self.link.run(lambda c: offered_templates(
            c.sharing(connect_timeout=timeout_s, read_timeout=timeout_s, max_retries=1), self.server, fp, LIST_DEADLINE_S))

    def _fetch_template(self, template: str) -> tuple[Any, bytes]:
        """The template's manifest and reference bytes from the server, each under a deadline
        sized from the current bandwidth estimate."""
        fp, size = self.model.fingerprint(), self.model.cfg.image_size
        rate_bps = max(self.bandwidth.predict_bps() or self._prior_mbps * 1e6 / 8, 0.01e6 / 8)

        async def refresh(c: TemplateClient):  # what a gallery screen fetches: manifest + template image
            # the one manifest this edit needs, by id (a 404: TemplateNotOffered, with the listing)
            m = await offered_manifest(c, fp, template, self.model_name,
                                       deadline_s=step_deadline_s(MANIFEST_DEADLINE_BYTES, rate_bps))
            check_template_ref(m, size)  # before a byte of it is buffered
            ref = await c.fetch_object(m.template_ref.object,
                                       deadline_s=step_deadline_s(m.template_ref.object.bytes, rate_bps))
            return m, ref.data

        return self.link.run(lambda c: refresh(c.sharing(connect_timeout=2.0, read_timeout=5.0, max_retries=1)))

    def edit_requires_template(self) -> None:
        """Raise `TemplateNotOffered` listing what the server offers for this model (no template given)."""
        fp = self.model.fingerprint()
        self.link.run(lambda c: offered_manifest(c.sharing(connect_timeout=2.0, read_timeout=5.0, max_retries=1),
                                                 fp, None, self.model_name, deadline_s=5.0))

    def edit(self, photo: str | Path | torch.Tensor, template: str, *, steps: int = 8, seed: int = 0) -> EditResult:
        """Edit ``photo`` (a file path, or a (1, 3, S, S) tensor in [0, 1]) with ``template``.

        Always completes when the template is known (server or gallery): what the link cannot
        deliver in time is computed here. Raises `TemplateNotOffered` (with what the server offers)
        when the server says it has no such template, `TemplateUnavailable` when the server cannot be
        reached and the gallery has no copy, `TemplateChanged` when the server's template differs
        from the one pinned under this id, `sakura.phone.photo.PhotoError` for an unusable photo file."""
        if not isinstance(template, str) or not template:
            raise ValueError(f"template must be a template id, got {template!r}")
        size = self.model.cfg.image_size
        if isinstance(photo, torch.Tensor):
            if photo.ndim != 4 or photo.shape[:2] != (1, 3) or tuple(photo.shape[2:]) != (size, size):
                raise ValueError(f"photo tensor must be (1, 3, {size}, {size}), got {tuple(photo.shape)}")
            img = photo.float()
        else:
            img = load_photo(photo, size)
        fp = self.model.fingerprint()
        messages: list[str] = []
        manifest, timage, why = None, None, None
        try:
            manifest, ref = self._fetch_template(template)
            timage = decode_template_ref(ref, manifest.template_ref.media_type, image_size=size)
        except TemplateNotOffered:  # the server answered that it has no such template: say what it has
            raise
        except Exception as e:  # any other failure falls back to the gallery; the message says which kind
            manifest, why = None, refresh_failure(e, template)
        if manifest is not None:
            try:
                self.gallery.put(fp, template, manifest.to_bytes(), ref, manifest.template_ref.media_type)
            except OSError as e:  # the server delivered: edit anyway, say the copy was not kept
                messages.append(f"warning: gallery at {self.gallery.root} is not writable "
                                f"({e.strerror or type(e).__name__}); editing without caching {template}")
        else:
            manifest = self.gallery.manifest(fp, template)
            timage = self.gallery.template_image(fp, template, image_size=size)
            if timage is None:
                raise TemplateUnavailable(f"cannot get template {template!r} from {self.server}: {why}; and it is "
                                          f"not in the gallery at {self.gallery.root}")
            messages.append(f"{why}; using the gallery's copy of {template}")
            if manifest is None:
                messages.append("no manifest cached: computing the template on the device")
        if self.policy == "raw-stream" and manifest is not None and not all(
                any(r.name == "lossless" for r in s.renditions) for s in manifest.shards):
            # raw-stream is the uncompressed baseline: it says so rather than stream another rung under its name
            messages.append("raw-stream streams the lossless rendition, which this store's ladder lacks (build "
                            "with --ladder lossless,...): every layer is computed on the device")
        for m in messages:
            log.info("%s", m)  # also in EditResult.messages (the CLI prints those)
        # a task's instruction id (bundled models) or the prompt (Klein); the model checks its kind
        instruction = manifest.kv_layout.get("instruction", 0) if manifest is not None else 0
        timages = split_template_images(timage)  # (R, 3, S, S): R reference images
        res = streamed_edit(self.model, img, base_url=self.server, template_id=template, template_image=timages,
                            instruction=instruction, policy=make_policy(self.policy), profile=self.profile,
                            bandwidth=self.bandwidth, rtt=self.rtt, steps=steps, seed=seed,
                            manifest=manifest if manifest is not None else NO_MANIFEST, allow_fast_path=True,
                            link=self.link)
        return EditResult(image=res.image, photo=img, template_image=timages, template_id=template,
                          policy=self.policy, streamed=res, messages=messages)


def edit(photo: str | Path | torch.Tensor, *, server: str, template: str, model: Any = "sakura-mini",
         steps: int = 8, seed: int = 0, **editor_options: Any) -> EditResult:
    """One edit in one call: ``Editor(server, model=model, **editor_options).edit(photo, template)``.
    For many edits keep an `Editor` (the model, gallery and link estimates stay warm)."""
    return Editor(server, model=model, **editor_options).edit(photo, template, steps=steps, seed=seed)
