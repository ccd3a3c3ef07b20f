"""`ModelConfig`: the architecture of a model, read from a Hugging Face config.json.

Holds the two supported families (BERT encoder, GPT-2 decoder) and their field mapping; refuses
anything else. Must not hold weights, tokenizers or kernel choices.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

from models.errors import ModelLoadError

Family = Literal["bert", "gpt2"]

# Hugging Face activation name -> our name (the module maps our name to a function).
ACTIVATIONS = {
    "gelu": "gelu",            # exact erf GELU (BERT)
    "gelu_new": "gelu_tanh",   # tanh approximation (GPT-2)
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "relu": "relu",
}
FAMILIES = {"bert": "bert", "gpt2": "gpt2"}  # HF model_type -> family


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    family: Family
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_positions: int
    layer_norm_eps: float
    activation: str
    type_vocab_size: int = 0                       # bert only
    scale_attn_by_inverse_layer_idx: bool = False  # gpt2 only

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def is_encoder(self) -> bool:
        return self.family == "bert"


def config_from_hf(hf: dict[str, Any], path: str = "config.json") -> ModelConfig:
    """The ModelConfig of a Hugging Face config dict; `path` only names the file in errors."""
    model_type = hf.get("model_type")
    family = FAMILIES.get(model_type)
    if family is None:
        raise ModelLoadError(
            f"{path}: model_type {model_type!r} is not supported; docscore models are the BERT "
            f"family (model_type 'bert', encoder) and the GPT-2 family (model_type 'gpt2', decoder)")
    try:
        config = _bert(hf) if family == "bert" else _gpt2(hf)
    except KeyError as missing:
        raise ModelLoadError(f"{path}: {model_type} config lacks the field {missing}; "
                             f"save the model's config with transformers' save_pretrained") from None
    if config.hidden_size % config.num_heads:
        raise ModelLoadError(f"{path}: hidden size {config.hidden_size} is not a multiple of "
                             f"{config.num_heads} attention heads")
    return config


def _activation(name: str) -> str:
    if name not in ACTIVATIONS:
        raise ModelLoadError(f"activation {name!r} is not supported (supported: {sorted(ACTIVATIONS)})")
    return ACTIVATIONS[name]


def _bert(hf: dict[str, Any]) -> ModelConfig:
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ModelLoadError(f"position_embedding_type {hf['position_embedding_type']!r} is not "
                             "supported; only 'absolute' BERT position embeddings are")
    return ModelConfig(
        family="bert", vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"], max_positions=hf["max_position_embeddings"],
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12), activation=_activation(hf.get("hidden_act", "gelu")),
        type_vocab_size=hf.get("type_vocab_size", 2))


def _gpt2(hf: dict[str, Any]) -> ModelConfig:
    hidden = hf["n_embd"]
    if hf.get("add_cross_attention"):
        raise ModelLoadError("GPT-2 with add_cross_attention is not supported (decoder-only models only)")
    if not hf.get("scale_attn_weights", True):
        raise ModelLoadError("GPT-2 with scale_attn_weights=false is not supported")
    return ModelConfig(
        family="gpt2", vocab_size=hf["vocab_size"], hidden_size=hidden, num_layers=hf["n_layer"],
        num_heads=hf["n_head"], intermediate_size=hf.get("n_inner") or 4 * hidden,
        max_positions=hf["n_positions"], layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        activation=_activation(hf.get("activation_function", "gelu_new")),
        scale_attn_by_inverse_layer_idx=bool(hf.get("scale_attn_by_inverse_layer_idx", False)))


def read_config(path: str, text: str) -> ModelConfig:
    """The ModelConfig of config.json text read from `path` (named in errors)."""
    try:
        hf = json.loads(text)
    except json.JSONDecodeError as err:
        raise ModelLoadError(f"{path}: not valid JSON ({err}); re-create the model directory with "
                             "`docscore convert`") from None
    if not isinstance(hf, dict):
        raise ModelLoadError(f"{path}: expected a JSON object (a Hugging Face config.json)")
    try:
        return config_from_hf(hf, path)
    except ModelLoadError as err:
        message = str(err)
        raise ModelLoadError(message if message.startswith(path) else f"{path}: {message}") from None
