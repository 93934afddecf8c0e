"""A complete tiny FLUX.2 Klein KV pipeline (random weights, built in code) written with
`save_pretrained`: what a user's download looks like on disk, small enough for tests and for
trying `sakura build --model klein:/folder@16` without a real checkpoint.

    python -m sakura.models.flux.klein_tiny /tmp/tiny-klein
"""

from __future__ import annotations

import sys

import torch


def _byte_tokenizer():
    """A byte-level Qwen tokenizer with the chat markers and no merges: every byte is a token."""
    from tokenizers.pre_tokenizers import ByteLevel  # lazy: tokenizers
    from transformers import Qwen2TokenizerFast  # lazy: transformers ([flux] extra)

    vocab = {c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}
    for s in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        vocab[s] = len(vocab)
    tok = Qwen2TokenizerFast(vocab=vocab, merges=[], pad_token="<|endoftext|>", eos_token="<|im_end|>", unk_token=None)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return tok, len(vocab)


def write_tiny_klein_folder(folder):
    from diffusers import AutoencoderKLFlux2, Flux2KleinKVPipeline, Flux2Transformer2DModel  # lazy: diffusers ([flux] extra)
    from diffusers.schedulers import FlowMatchEulerDiscreteScheduler  # lazy: diffusers ([flux] extra)
    from transformers import Qwen3Config, Qwen3ForCausalLM  # lazy: transformers ([flux] extra)

    torch.manual_seed(0)
    tok, n_vocab = _byte_tokenizer()
    text = Qwen3ForCausalLM(Qwen3Config(vocab_size=n_vocab, hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
                                        head_dim=8, max_position_embeddings=64))
    vae = AutoencoderKLFlux2(block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
                             up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, latent_channels=4,
                             norm_num_groups=4, sample_size=16)
    transformer = Flux2Transformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=2,
                                          attention_head_dim=16, num_attention_heads=2, joint_attention_dim=48,
                                          timestep_guidance_channels=32, mlp_ratio=2.0, axes_dims_rope=(4, 4, 4, 4),
                                          guidance_embeds=False)
    with torch.no_grad():  # a fresh Flux2 block is close to the identity; make every path matter
        for p in transformer.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    sched = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, shift_terminal=None)
    pipe = Flux2KleinKVPipeline(scheduler=sched, vae=vae, text_encoder=text, tokenizer=tok, transformer=transformer)
    pipe.save_pretrained(folder)
    return folder


if __name__ == "__main__":  # pragma: no cover
    print(write_tiny_klein_folder(sys.argv[1] if len(sys.argv) > 1 else "tiny-klein"))
