"""The names HF config classes give the routed-expert count and the top-k (torch-free).

One list for every reader (preflight, the synthetic rules, the scaled configs, the memory
budget): ``moe_num_experts``/``moe_topk`` are aria_text's, ``moe_k`` ernie4_5_moe's, ``moe_top_k`` dbrx's
ffn_config.
"""

EXPERT_COUNT_KEYS = ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")
TOP_K_KEYS = ("num_experts_per_tok", "top_k_experts", "experts_per_token", "moe_top_k", "moe_topk", "moe_k")
