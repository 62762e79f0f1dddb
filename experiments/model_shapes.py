"""The shapes of real checkpoints, for benchmarks that build random models of them
(experiments/bench_memory.py, experiments/bench_text_rollout.py)."""

# config.json of each checkpoint (Hugging Face hub, Qwen/<name>): hidden_size,
# num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim (hidden /
# heads where the file has none), intermediate_size, vocab_size, tie_word_embeddings,
# q/k/v biases (Qwen2) or q/k norms (Qwen3), rope_theta, rms_norm_eps.
MODELS = {
    "Qwen2.5-0.5B": dict(
        d_model=896, num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64, mlp_dim=4864,
        vocab_size=151936, tie_embeddings=True, qkv_bias=True, rope_theta=1e6, norm_eps=1e-6,
    ),
    "Qwen2.5-1.5B": dict(
        d_model=1536, num_layers=28, num_heads=12, num_kv_heads=2, head_dim=128, mlp_dim=8960,
        vocab_size=151936, tie_embeddings=True, qkv_bias=True, rope_theta=1e6, norm_eps=1e-6,
    ),
    "Qwen3-1.7B": dict(
        d_model=2048, num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128, mlp_dim=6144,
        vocab_size=151936, tie_embeddings=True, qk_norm=True, rope_theta=1e6, norm_eps=1e-6,
    ),
}  # fmt: skip
