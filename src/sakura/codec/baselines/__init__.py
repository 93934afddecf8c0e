"""The baselines: `cachegen` (CacheGen's KV codec, the quality floor), `uniform` (fixed-width
integer quantisation) and `lossless` (the stored bit patterns). Each imports only the shared base."""
