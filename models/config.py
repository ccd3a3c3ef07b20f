"""`ModelConfig`: the architecture of a model, read from a Hugging Face config.json.

Holds the two supported families (BERT encoder, GPT-2 decoder), their field mapping and the bounds every
size must fall in; refuses anything else. Must not hold weights, tokenizers or kernel choices.
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

# ModelConfig size field -> its key in each family's config.json (errors name the key the file holds).
HF_KEYS = {
    "bert": {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_hidden_layers",
             "num_heads": "num_attention_heads", "intermediate_size": "intermediate_size",
             "max_positions": "max_position_embeddings", "type_vocab_size": "type_vocab_size"},
    "gpt2": {"vocab_size": "vocab_size", "hidden_size": "n_embd", "num_layers": "n_layer", "num_heads": "n_head",
             "intermediate_size": "n_inner", "max_positions": "n_positions"},
}
# Upper bounds of each size: far above any BERT or GPT-2 model (BERT-large: 24 layers, hidden 1024; GPT-2 XL:
# 48 layers, hidden 1600, vocabulary 50,257), far below values that would take minutes or all memory just to
# build the model's shape (num_hidden_layers: 10**7 spun for 300+ s before any other check).
MAX_SIZES = {"num_layers": 512, "hidden_size": 65_536, "num_heads": 1_024, "intermediate_size": 262_144,
             "vocab_size": 4_194_304, "max_positions": 1_048_576, "type_vocab_size": 1_024}


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
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise ModelLoadError(
            f"{path}: model_type {model_type!r} is not supported; docscore models are the BERT "
            f"family (model_type 'bert', encoder) and the GPT-2 family (model_type 'gpt2', decoder)")
    try:
        config = _bert(hf) if family == "bert" else _gpt2(hf)
    except KeyError as missing:
        raise ModelLoadError(f"{path}: {model_type} config lacks the field {missing}; "
                             f"save the model's config with transformers' save_pretrained") from None
    check_bounds(config, path)
    if config.hidden_size % config.num_heads:
        raise ModelLoadError(f"{path}: hidden size {config.hidden_size} is not a multiple of "
                             f"{config.num_heads} attention heads")
    return config


def check_bounds(config: ModelConfig, path: str = "config.json") -> None:
    """Raise ModelLoadError naming the file and the key when a size is not a whole number in [1, its
    MAX_SIZES bound], or layer_norm_eps is not a small positive number."""
    for field, key in HF_KEYS[config.family].items():
        value, limit = getattr(config, field), MAX_SIZES[field]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
            raise ModelLoadError(
                f"{path}: {key} is {_shown(value)}; it must be a whole number from 1 to {limit:,} (docscore's bound "
                f"for {field}); set {key} to the model's real value (the one its weights were trained with), or "
                "re-create the model directory with `docscore convert`")
    eps = config.layer_norm_eps
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        key = "layer_norm_eps" if config.family == "bert" else "layer_norm_epsilon"
        raise ModelLoadError(f"{path}: {key} is {_shown(eps)}; it must be a number between 0 and 1 (e.g. 1e-12); "
                             "set it to the model's real value, or re-create the model directory with `docscore convert`")


def _shown(value: Any) -> str:
    """The value as config.json writes it, cut to 40 characters (a list or object by its type)."""
    if not isinstance(value, (int, float, str, bool, type(None))):
        return f"a JSON {type(value).__name__}"
    try:
        text = json.dumps(value)
    except ValueError:  # an integer too long to print (sys.set_int_max_str_digits)
        return "a number too long to print"
    return text if len(text) <= 40 else text[:40] + "..."


def _activation(name: str) -> str:
    if not isinstance(name, str) or name not in ACTIVATIONS:
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
    hidden, inner = hf["n_embd"], hf.get("n_inner")
    if inner is None:  # as transformers: n_inner null means 4 x n_embd (0 is a size, and out of bounds)
        inner = 4 * hidden if type(hidden) is int else hidden
    if hf.get("add_cross_attention"):
        raise ModelLoadError("GPT-2 with add_cross_attention is not supported (decoder-only models only)")
    if not hf.get("scale_attn_weights", True):
        raise ModelLoadError("GPT-2 with scale_attn_weights=false is not supported")
    return ModelConfig(
        family="gpt2", vocab_size=hf["vocab_size"], hidden_size=hidden, num_layers=hf["n_layer"],
        num_heads=hf["n_head"], intermediate_size=inner,
        max_positions=hf["n_positions"], layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        activation=_activation(hf.get("activation_function", "gelu_new")),
        scale_attn_by_inverse_layer_idx=bool(hf.get("scale_attn_by_inverse_layer_idx", False)))


def read_config(path: str, text: str) -> ModelConfig:
    """The ModelConfig of config.json text read from `path` (named in errors)."""
    try:
        hf = json.loads(text)
    except (ValueError, RecursionError) as err:  # JSONDecodeError, a number too long to convert, deep nesting
        raise ModelLoadError(f"{path}: not valid JSON ({str(err)[:200] or type(err).__name__}); re-create the model "
                             "directory with `docscore convert`") from None
    if not isinstance(hf, dict):
        raise ModelLoadError(f"{path}: a JSON {type(hf).__name__}, expected a JSON object (a Hugging Face config.json); "
                             "re-create the model directory with `docscore convert`")
    try:
        return config_from_hf(hf, path)
    except ModelLoadError as err:
        message = str(err)
        raise ModelLoadError(message if message.startswith(path) else f"{path}: {message}") from None
