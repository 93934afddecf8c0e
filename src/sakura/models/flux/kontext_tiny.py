"""A complete tiny FLUX.1 Kontext pipeline (random weights, built in code: CLIP and T5 text
encoders with byte-level tokenizers, a 2x VAE, a 1 + 2 block Flux transformer) written with
`save_pretrained`: what a user's download looks like on disk, small enough for tests and for
trying `sakura build --model kontext:/folder@16` without a real checkpoint.

    python -m sakura.models.flux.kontext_tiny /tmp/tiny-kontext
"""

from __future__ import annotations

import sys

import torch


def write_tiny_kontext_folder(folder):
    """Write the tiny pipeline to `folder` (created); returns it. Deterministic (seed 0)."""
    from diffusers import AutoencoderKL, FluxKontextPipeline, FluxTransformer2DModel  # lazy: diffusers ([flux] extra)
    from diffusers.schedulers import FlowMatchEulerDiscreteScheduler  # lazy: diffusers ([flux] extra)
    from tokenizers.pre_tokenizers import ByteLevel  # lazy: tokenizers
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizerFast, T5Config, T5EncoderModel, T5TokenizerFast  # lazy: transformers ([flux] extra)

    torch.manual_seed(0)
    # CLIP: byte-level BPE with no merges (every byte a token); T5: a unigram over printable ASCII
    alpha = sorted(ByteLevel.alphabet())
    clip_vocab = {c: i for i, c in enumerate(alpha + [a + "</w>" for a in alpha] + ["<|startoftext|>", "<|endoftext|>"])}
    clip_tok = CLIPTokenizerFast(vocab=clip_vocab, merges=[], model_max_length=77)
    t5_vocab = [(p, 0.0) for p in ("<pad>", "</s>", "<unk>")] + [(c, -1.0) for c in ["▁"] + [chr(i) for i in range(32, 127)]]
    t5_tok = T5TokenizerFast(vocab=t5_vocab, extra_ids=0, model_max_length=32)  # 32 prompt tokens (FLUX.1: 512)
    clip = CLIPTextModel(CLIPTextConfig(vocab_size=len(clip_vocab), hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=77,
                                        projection_dim=16, bos_token_id=clip_vocab["<|startoftext|>"],
                                        eos_token_id=clip_vocab["<|endoftext|>"], pad_token_id=clip_vocab["<|endoftext|>"]))
    t5 = T5EncoderModel(T5Config(vocab_size=len(t5_vocab), d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2))
    vae = AutoencoderKL(block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, latent_channels=4,
                        norm_num_groups=4, sample_size=16, shift_factor=0.1, scaling_factor=0.5)
    transformer = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=2,
                                         attention_head_dim=16, num_attention_heads=2, joint_attention_dim=16,
                                         pooled_projection_dim=16, guidance_embeds=True, axes_dims_rope=(4, 6, 6))
    with torch.no_grad():  # zero-initialised gates make a fresh Flux block the identity; make every path matter
        for p in transformer.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    # FLUX.1 Kontext [dev]'s scheduler settings (resolution-dependent shift)
    sched = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                            base_image_seq_len=256, max_image_seq_len=4096)
    pipe = FluxKontextPipeline(scheduler=sched, vae=vae, text_encoder=clip, tokenizer=clip_tok, text_encoder_2=t5,
                               tokenizer_2=t5_tok, transformer=transformer)
    pipe.save_pretrained(folder)
    return folder


if __name__ == "__main__":  # pragma: no cover
    print(write_tiny_kontext_folder(sys.argv[1] if len(sys.argv) > 1 else "tiny-kontext"))
