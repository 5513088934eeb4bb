"""The tiny shape every derived config takes and the config attribute names each rule of matrix/shrink.py reads:
the rules work on attribute *names*, so a new architecture with the usual names needs no code."""

# The tiny shape. Why: 8 heads split evenly on tp 2/4 and unevenly on tp 3 (3/3/2); 2 kv heads are
# fewer than tp 3/4 ranks; head_dim 16 keeps weights small; 384 = 6 grains of 64 splits evenly on tp
# 2/3 and unevenly on tp 4, 256 = 4 grains keeps every expert shard non-empty up to tp 4.
HEADS = 8
KV_HEADS = 2
HEAD_DIM = 16
DENSE_FFN = 384
EXPERT_FFN = 256
EXPERTS = 4
VOCAB = 512
POSITIONS = 512
WINDOW = 16  # shorter than the 24-token probe prompt, so the sliding-window path really runs
MAX_LAYERS = 4
MAX_GQA_RATIO = 4
MAX_PARAMS = 2_000_000  # 8 MB of fp32 weights: "a tiny checkpoint" is checked, not hoped for

# Attribute-name groups (first present wins for reading; every present one is written).
LAYER_KEYS = (
    "num_hidden_layers",
    "n_layer",
    "num_layers",
    "n_layers",
    "decoder_layers",
    "encoder_layers",
    "num_decoder_layers",
    "num_encoder_layers",
)
HEAD_KEYS = (
    "num_attention_heads",
    "n_head",
    "n_heads",
    "num_heads",
    "attention_heads",
    # an encoder-decoder's causal LM is its decoder (marian, whisper, trocr, prophetnet): its count is read first; the
    # encoder's is written alike so the config stays one an encoder-decoder model could be built from
    "decoder_attention_heads",
    "num_decoder_attention_heads",
    "encoder_attention_heads",
    "num_encoder_attention_heads",
    # the sliding-window layers' count (inkling), read only where no other name is
    "swa_num_attention_heads",
)
"""The query head count's names, one list for both readers: matrix/shrink.py (the tiny config's heads) and
matrix/shapes/real_shape.py (the real checkpoint's), so both take the same name first."""
KV_KEYS = (
    "num_key_value_heads",
    "swa_num_key_value_heads",
    "num_kv_heads",
    "kv_n_heads",
    "n_kv_heads",
    "num_query_groups",
    "multi_query_group_num",
)
HIDDEN_KEYS = (
    "hidden_size",
    "n_embd",
    "d_model",
    "embed_dim",
    "emb_dim",
    "hidden_dim",
    "model_dim",
    "word_embed_proj_dim",
    "embedding_size",
    "adapter_in_dim",
    "input_embedding_size",
    "output_embedding_size",
    "lru_width",
    "attention_hidden_size",
    "router_hidden_size",
)
HEAD_DIM_KEYS = (
    "head_dim",
    "attention_head_dim",
    "d_head",
    "kv_channels",
    "dim_head",
    "attention_head_size",
    "swa_head_dim",
    "mamba_d_head",
    "mamba_head_dim",
    "mamba_headdim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_head_dim",
    "index_head_dim",
    "v_head_dim",
    "qk_nope_head_dim",
)
DENSE_FFN_KEYS = (
    "intermediate_size",
    "n_inner",
    "ffn_dim",
    "ffn_hidden_size",
    "decoder_ffn_dim",
    "encoder_ffn_dim",
    "dim_ff",
    "dff",
    "d_ff",
    "feed_forward_size",
    "intermediate_size_mlp",
    "dense_intermediate_size",
    "shared_intermediate_size",
    "d_inner",
)
EXPERT_FFN_KEYS = (
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "shared_experts_intermediate_size",
    "moe_shared_expert_intermediate_size",
    "expert_ffn_hidden_size",
    "expert_intermediate_size",
)
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
TOP_K_KEYS = ("num_experts_per_tok", "moe_top_k", "moe_topk", "num_experts_per_token", "moe_k")
POSITION_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "n_ctx",
    "max_seq_len",
    "seq_length",
    "max_target_positions",
    "context_length",
    "original_max_position_embeddings",
    "model_max_length",
)
WINDOW_KEYS = (
    "sliding_window",
    "window_size",
    "sliding_window_size",
    "attention_window_size",
    "local_attention_window_len",
    "attention_chunk_size",
    "local_attention",
    "block_size",
    "chunk_size",
    "mamba_chunk_size",
    "local_attn_chunk_length",
)
# Fixed small values for low-rank / state sizes (MLA, linear attention, SSM).
SMALL_KEYS = {
    "kv_lora_rank": 32,
    "q_lora_rank": 48,
    "o_lora_rank": 32,
    "rotary_dim": 8,
    "adapter_rank": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_num_heads": 4,
    "index_n_heads": 4,
    "index_topk": 16,
    "mamba_d_state": 16,
    "state_size": 16,
    "ssm_state_size": 16,
    "mamba_dt_rank": 8,
    "time_step_rank": 8,
    "laurel_rank": 16,
    "hidden_size_per_layer_input": 16,
    "vocab_size_per_layer_input": VOCAB,
    "num_nextn_predict_layers": 0,
    "mtp_num_layers": 0,
    "pronunciation_embed_dim": 32,
    "shape_embed_dim": 32,
    "hc_lowrank": 16,
}
# Boundaries counted in layers ("the first k layers are dense"): 1 keeps one layer of each kind.
LAYER_BOUNDARY_KEYS = (
    "first_k_dense_replace",
    "max_window_layers",
    "moe_layer_end_index",
    "num_dense_layers",
    "loop_layer_index_end",
    "moe_layer_start_index",
    "num_kv_shared_layers",
)
LAYER_PERIOD_KEYS = (
    "decoder_sparse_step",
    "moe_layer_freq",
    "attn_layer_period",
    "expert_layer_period",
    "sliding_window_pattern",
    "full_attention_interval",
)
LAYER_OFFSET_KEYS = ("attn_layer_offset", "expert_layer_offset")
TOKEN_ID_PREFERRED = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
# Real-config fields that describe the checkpoint, not the architecture: never copied into a tiny entry.
NOT_STRUCTURE = {
    "architectures",
    "transformers_version",
    "model_type",
    "torch_dtype",
    "dtype",
    "_name_or_path",
    "auto_map",
    "quantization_config",
    "task_specific_params",
    "id2label",
    "label2id",
    "_commit_hash",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "use_cache",
    "tokenizer_class",
    "_attn_implementation",
    "_attn_implementation_autoset",
    "_experts_implementation",
    "initializer_range",
    "name_or_path",
    "rope_scaling",
}
