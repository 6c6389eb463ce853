"""Architecture hyper-parameters of a Llama-family decoder, independent of the file format."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    tie_embeddings: bool = False
    max_position: int = 4096
    attention_bias: bool = False  # Qwen2 has q/k/v biases
    architecture: str = "llama"

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.kv_size * dtype_bytes

    @property
    def linear_params(self) -> int:
        """Weights of the linear layers (q/k/v, o, gate/up, down in every layer, and the head)."""
        h = self.hidden_size
        per_layer = h * (self.q_size + 2 * self.kv_size) + self.q_size * h + 3 * h * self.intermediate_size
        return self.num_layers * per_layer + self.vocab_size * h

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_hf_config(cls, cfg: dict) -> ModelConfig:
        heads = cfg["num_attention_heads"]
        arch = (cfg.get("architectures") or ["LlamaForCausalLM"])[0]
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rope_theta=_rope_theta(cfg),
            rms_eps=float(cfg.get("rms_norm_eps", 1e-5)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_position=int(cfg.get("max_position_embeddings", 4096)),
            attention_bias=bool(cfg.get("attention_bias", False)) or arch.startswith("Qwen2"),
            architecture=arch,
        )


def _rope_theta(cfg: dict) -> float:
    """transformers 5 nests it under rope_parameters; older configs keep it at the top level."""
    params = cfg.get("rope_parameters") or {}
    if params.get("rope_type", "default") not in ("default", None):
        raise ValueError(f"rope scaling {params.get('rope_type')!r} is not supported")
    return float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
