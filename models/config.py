"""`ModelConfig`: the architecture of a model, read from a Hugging Face config.json.

Holds the supported families (BERT-family encoder: BERT, RoBERTa, XLM-RoBERTa, CamemBERT, DistilBERT, MPNet; ModernBERT encoder;
rotary BERT encoder: NomicBERT, GTE; T5 encoder: T5, mT5; GPT-2 decoder; Llama-family decoder: Llama, Mistral, Qwen2, Qwen3, Phi-3/Phi-4, Gemma 2, Gemma 3 and the text model
of its multimodal release, OLMo 2, OLMo 3, Granite, SmolLM3; and EuroBERT, a Llama-family encoder),
their field mapping and the bounds every size must fall in; refuses anything else. Must not hold weights, tokenizers or kernel choices.
Rotary settings (Rope) are read by models/rope.py, and the value checks both use are models/config_values.py's.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

from models.config_values import LAYER_TYPES, positive_number, shown
from models.errors import ModelLoadError
from models.rope import PARTIAL_ROTARY_MODEL_TYPES, Rope, layer_type_ropes, read_rope, rope_type_key

Family = Literal["bert", "modernbert", "rotary_bert", "t5", "gpt2", "llama"]
ENCODER_FAMILIES = ("bert", "modernbert", "rotary_bert", "t5")  # bidirectional models whose outputs are embeddings
# Llama-family model_types that are encoders (masked LMs): they always attend both ways, whatever is_causal says, and a
# plain Hugging Face directory of one converts as an embedder with mean pooling, as an encoder family's does
LLAMA_ENCODERS = ("eurobert",)
# families whose MLP is models/llama.py GatedFeedForward, down(act(gate(x)) * up(x)): the memory estimate counts
# three [tokens, intermediate] tensors for it where BERT's and GPT-2's hold one (pipeline/telemetry/memory.py); a T5's
# is gated or not by checkpoint (ModelConfig.gated_feed_forward)
GATED_MLP_FAMILIES = ("llama", "modernbert", "rotary_bert")

# Hugging Face activation name -> our name (the module maps our name to a function).
ACTIVATIONS = {
    "gelu": "gelu",            # exact erf GELU (BERT)
    "gelu_new": "gelu_tanh",   # tanh approximation (GPT-2)
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "relu": "relu",
}
# HF model_type -> family: RoBERTa, XLM-RoBERTa and CamemBERT are BERT with positions counted past the padding id,
# DistilBERT is BERT without token types under other names, MPNet is RoBERTa's positions without token types plus one
# relative position bias table all its layers share; Mistral, Qwen2, Qwen3, Phi-3 (and Phi-4, model_type phi3:
# Llama's block with fused weights, split at convert), Gemma 2, Gemma 3 (its text model), OLMo 2, OLMo 3, Granite and
# SmolLM3 are Llama's architecture with a few config switches; EuroBERT is Llama's blocks as an encoder (LLAMA_ENCODERS). NomicBERT and GTE (and GTE's remote-code model_type
# "new") are BERT's post-norm blocks with rotary positions and a gated MLP, differing in biases and activation. mT5 is T5's code under another model_type (MT5Config's defaults differ).
FAMILIES = {"bert": "bert", "roberta": "bert", "xlm-roberta": "bert", "camembert": "bert", "distilbert": "bert",
            "mpnet": "bert", "gpt2": "gpt2",
            "llama": "llama", "mistral": "llama", "qwen2": "llama", "qwen3": "llama", "gemma3_text": "llama",
            "gemma3": "llama", "gemma2": "llama", "phi3": "llama", "olmo2": "llama", "olmo3": "llama",
            "granite": "llama", "smollm3": "llama", "eurobert": "llama", "modernbert": "modernbert",
            "nomic_bert": "rotary_bert", "gte": "rotary_bert", "new": "rotary_bert",
            "t5": "t5", "mt5": "t5"}
# model_types whose position ids start after the padding id (transformers' create_position_ids_from_input_ids)
POSITIONS_AFTER_PADDING = ("roberta", "xlm-roberta", "camembert", "mpnet")
# MPNet's relative position bias as transformers 5.24 computes it: its positions count past padding id 1 whatever
# pad_token_id says (MPNetEmbeddings.padding_idx), and MPNetEncoder.compute_position_bias looks key-query offsets up in
# 32 buckets (its num_buckets default, not relative_attention_num_buckets) of a table of relative_attention_num_buckets
# rows, so a table of fewer rows than 32 cannot be run
MPNET_PADDING_IDX = 1
MPNET_BUCKETS = 32
MPNET_MAX_DISTANCE = 128  # MPNetEncoder.relative_position_bucket's max_distance, fixed as its buckets are

# ModelConfig size field -> its key in each family's config.json (errors name the key the file holds); a model_type
# with keys of its own (DistilBERT) has its own entry (hf_keys).
HF_KEYS = {
    "bert": {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_hidden_layers",
             "num_heads": "num_attention_heads", "intermediate_size": "intermediate_size",
             "max_positions": "max_position_embeddings", "type_vocab_size": "type_vocab_size"},
    "gpt2": {"vocab_size": "vocab_size", "hidden_size": "n_embd", "num_layers": "n_layer", "num_heads": "n_head",
             "intermediate_size": "n_inner", "max_positions": "n_positions"},
    "distilbert": {"vocab_size": "vocab_size", "hidden_size": "dim", "num_layers": "n_layers", "num_heads": "n_heads",
                   "intermediate_size": "hidden_dim", "max_positions": "max_position_embeddings"},
    "mpnet": {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_hidden_layers",
              "num_heads": "num_attention_heads", "intermediate_size": "intermediate_size",
              "max_positions": "max_position_embeddings", "relative_attention_buckets": "relative_attention_num_buckets"},
    "modernbert": {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_hidden_layers",
                   "num_heads": "num_attention_heads", "intermediate_size": "intermediate_size",
                   "max_positions": "max_position_embeddings"},
    "rotary_bert": {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_hidden_layers",
                    "num_heads": "num_attention_heads", "head_size": "head_dim", "intermediate_size": "intermediate_size",
                    "max_positions": "max_position_embeddings"},
    "llama": {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_hidden_layers",
              "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads",
              "head_size": "head_dim", "intermediate_size": "intermediate_size",
              "max_positions": "max_position_embeddings"},
}
HF_KEYS["t5"] = {"vocab_size": "vocab_size", "hidden_size": "d_model", "num_layers": "num_layers", "num_heads": "num_heads",
                 "head_size": "d_kv", "intermediate_size": "d_ff", "max_positions": "n_positions",
                 "relative_attention_buckets": "relative_attention_num_buckets",
                 "relative_attention_max_distance": "relative_attention_max_distance"}
# Gemma3ForConditionalGeneration (model_type gemma3): its text model's keys under text_config
HF_KEYS["gemma3"] = {field: f"text_config.{key}" for field, key in HF_KEYS["llama"].items()}
# Upper bounds of each size: far above any BERT or GPT-2 model (BERT-large: 24 layers, hidden 1024; GPT-2 XL:
# 48 layers, hidden 1600, vocabulary 50,257), far below values that would take minutes or all memory just to
# build the model's shape, before any other check could refuse them.
MAX_SIZES = {"num_layers": 512, "hidden_size": 65_536, "num_heads": 1_024, "num_kv_heads": 1_024,
             "head_size": 65_536, "intermediate_size": 262_144,
             "vocab_size": 4_194_304, "max_positions": 1_048_576, "type_vocab_size": 1_024,
             "relative_attention_buckets": 1_024, "relative_attention_max_distance": 1_048_576}
LLAMA_ACTIVATIONS = ("silu", "swish")  # transformers maps both to SiLU


# A Dense module's activation_function (sentence-transformers: a torch module path) -> our name
DENSE_ACTIVATIONS = {"torch.nn.modules.linear.Identity": "identity", "torch.nn.modules.activation.Tanh": "tanh"}


@dataclasses.dataclass(frozen=True)
class Dense:
    """A sentence-transformers Dense module after the pooling: activation(pooled @ kernel + bias)."""

    in_features: int
    out_features: int
    bias: bool
    activation: str  # DENSE_ACTIVATIONS' names


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    family: Family
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_positions: int                             # positions a segment can use (the table holds position_offset more)
    layer_norm_eps: float
    activation: str
    type_vocab_size: int = 0                       # bert, rotary_bert (token type 0 is added to every token)
    position_offset: int = 0                       # bert: RoBERTa's first position id (pad_token_id + 1)
    relative_attention_buckets: int = 0            # bert (MPNet), t5: relative position bias table rows, one for all layers
    relative_attention_max_distance: int = 0       # t5: the offset from which one bucket (MPNet's is fixed: MPNET_MAX_DISTANCE)
    gated_feed_forward: bool = False               # t5: T5 v1.1's and mT5's gated MLP (wi_0, wi_1), not wi alone
    scale_attn_by_inverse_layer_idx: bool = False  # gpt2 only
    num_kv_heads: int = 0                          # llama: grouped-query key/value heads (0: num_heads)
    head_size: int = 0                             # llama: config.json's head_dim, t5: d_kv (0: hidden_size // num_heads)
    rope: Rope = Rope()                            # llama, rotary_bert, modernbert (its global layers')
    local_rope: Rope | None = None                 # modernbert: its local layers' rotary settings (None: rope's)
    qkv_bias: bool = False                         # llama: Qwen2's q/k/v biases, or attention_bias; modernbert's Wqkv
    qk_norm: bool = False                          # llama: Qwen3's RMSNorm of each head's q and k before rotary
    qk_norm_across_heads: bool = False             # llama: OLMo 2's q/k RMSNorm is over all heads at once, not each
    output_bias: bool = False                      # llama: attention_bias also biases o_proj; modernbert's Wo
    mlp_bias: bool = False                         # llama, modernbert
    mlp_output_bias: bool = False                  # rotary_bert: GTE's down_proj bias (its gate and up have none)
    norm_bias: bool = True                         # modernbert: its LayerNorms have biases (norm_bias)
    tie_word_embeddings: bool = False              # llama (GPT-2 is always tied)
    # llama: False for a decoder embedder saved without its untied head (Qwen3-Embedding-8B, e5-mistral): it embeds
    # but scores no tokens. Not in config.json: the checkpoint tells (models/hf_import.py, models/loader.py).
    lm_head: bool = True
    # llama: the token embedding's multiplier (0: none): Gemma's sqrt(hidden), Granite's embedding_multiplier
    embed_scale: float = 0.0
    pre_norms: bool = True                         # llama: RMSNorms before the attention and the MLP (OLMo 2: none)
    post_norms: bool = False                       # llama: RMSNorms of the attention's and MLP's outputs (Gemma, OLMo 2)
    query_pre_attn_scalar: float = 0.0             # llama: Gemma's attention scale is its -1/2 power (0: head_dim's)
    attention_multiplier: float = 0.0              # llama: Granite's attention scale itself (0: as above)
    residual_multiplier: float = 0.0               # llama: Granite's scale of a block's outputs before each add (0: none)
    logits_divisor: float = 0.0                    # llama: Granite's logits_scaling, which divides the logits (0: none)
    nope_layers: tuple[int, ...] = ()              # llama: SmolLM3's layers without rotary positions (NoPE)
    bidirectional: bool = False                    # llama: every token attends both ways (EmbeddingGemma, EuroBERT): an embedder
    # llama: Gemma 2's soft caps, cap * tanh(x / cap) (0: none): of the attention scores (attn_logit_softcapping, the
    # kernels' soft_cap) and of the LM head's logits (final_logit_softcapping), where transformers applies them
    attention_logit_cap: float = 0.0
    final_logit_cap: float = 0.0
    # a sentence-transformers model's Dense modules after its pooling (LaBSE, EmbeddingGemma): not in config.json,
    # but metadata.json's `dense` (models/model_dir.py)
    dense: tuple[Dense, ...] = ()
    # local attention: the kernels' window (|i - j| < sliding_window; kernels/interface.py), 0: none. llama:
    # Mistral/Qwen2's span (causal); modernbert: local_attention // 2 + 1 (each way)
    sliding_window: int = 0
    sliding_layers: tuple[int, ...] = ()           # llama, modernbert: the layers that attend within sliding_window
    model_type: str = ""                           # config.json's model_type (names its keys: hf_keys)

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden_size // self.num_heads

    @property
    def position_table(self) -> int:
        """Rows of an encoder's or GPT-2's position table (RoBERTa's first position_offset rows are never read)."""
        return self.max_positions + self.position_offset

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def default_seq_len(self) -> int:
        """Window length `docscore convert` picks when none is given: the positions, or the window of a decoder
        whose every layer slides (past it, memory grows while each token still sees only the window). A model with
        global layers beside its local ones is not bounded by it: they see the whole text (ModernBERT, Gemma 3)."""
        if self.sliding_window and not self.is_encoder and len(self.sliding_layers) == self.num_layers:
            return min(self.max_positions, self.sliding_window)
        return self.max_positions

    def layer_window(self, layer: int) -> int:
        """The local attention window of `layer` (0: it attends to its whole segment)."""
        return self.sliding_window if layer in self.sliding_layers else 0

    def layer_rope(self, layer: int) -> Rope:
        """The rotary settings of `layer`: ModernBERT's local layers have their own (local_rope_theta)."""
        return self.local_rope if self.local_rope is not None and layer in self.sliding_layers else self.rope

    @property
    def is_encoder(self) -> bool:
        """An encoder's outputs are embeddings: an encoder family's model, or a Llama-family one that is (EuroBERT)."""
        return self.family in ENCODER_FAMILIES or self.model_type in LLAMA_ENCODERS

    @property
    def causal(self) -> bool:
        """Whether a token attends only to those before it (a decoder's, unless it attends both ways)."""
        return not self.is_encoder and not self.bidirectional

    @property
    def gated_mlp(self) -> bool:
        return self.family in GATED_MLP_FAMILIES or self.gated_feed_forward


def with_checkpoint_head(config: ModelConfig, has_head: bool, pooling: str | None) -> ModelConfig:
    """`config` as its checkpoint holds it: a decoder embedder (a pooling) whose untied head the checkpoint lacks
    (Qwen3-Embedding-8B, e5-mistral saved as their base model) has none, lm_head False; convert and load both ask."""
    if pooling and config.family == "llama" and not config.tie_word_embeddings and not has_head:
        return dataclasses.replace(config, lm_head=False)
    return config


def config_from_hf(hf: dict[str, Any], path: str = "config.json") -> ModelConfig:
    """The ModelConfig of a Hugging Face config dict; `path` only names the file in errors."""
    model_type = hf.get("model_type")
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if model_type is None:
        raise ModelLoadError(f"{path}: has no model_type, so its architecture is unknown; save the model's config with "
                             "transformers' save_pretrained (it writes model_type)")
    if family is None:
        raise ModelLoadError(
            f"{path}: model_type {model_type!r} is not supported; docscore models are the BERT "
            f"family (model_type 'bert', 'roberta', 'xlm-roberta', 'camembert', 'distilbert' or 'mpnet', encoder), ModernBERT (model_type "
            f"'modernbert', encoder), NomicBERT and GTE (model_type 'nomic_bert', 'gte' or 'new', encoder), T5's encoder (model_type 't5' or 'mt5', its decoder not read), the GPT-2 family (model_type 'gpt2', "
            f"decoder) and the Llama family (model_type 'llama', 'mistral', 'qwen2', 'qwen3', 'phi3', 'gemma2', "
            f"'gemma3_text', 'gemma3' (Gemma 3's multimodal release read as its text model), 'olmo2', 'olmo3', "
            f"'granite' or 'smollm3', decoder; 'eurobert', an encoder with Llama's blocks)")
    quantized = hf.get("quantization_config")
    if quantized:
        method = quantized.get("quant_method") if isinstance(quantized, dict) else quantized
        raise ModelLoadError(f"{path}: a quantized checkpoint (quantization_config quant_method {method!r}) is not "
                             "supported; docscore reads float weights: convert the model's unquantized release")
    if model_type == "gemma3":
        return _gemma3_text_model(hf, path)
    # transformers 5 builds a bidirectional mask for any decoder whose config says so (masking_utils), and
    # sentence-transformers embeds with it: a Llama-family decoder then attends both ways, as Gemma 3 does with its own
    # key; where docscore has not checked transformers' both-ways mask (GPT-2, sliding windows) it is refused
    causal_key = family not in ENCODER_FAMILIES and model_type not in LLAMA_ENCODERS  # EuroBertModel never reads it
    if causal_key and "is_causal" in hf and hf["is_causal"] is None:
        raise ModelLoadError(f"{path}: is_causal null: transformers attends both ways in a padded batch and causally "
                             "in an unpadded one (its sdpa path skips the mask), so the model has no one answer; set "
                             "is_causal true or false")
    both_ways = causal_key and "is_causal" in hf and not hf["is_causal"]
    if both_ways and (family != "llama" or model_type == "gemma3_text"):
        instead = " (set use_bidirectional_attention instead)" if model_type == "gemma3_text" else ""
        raise ModelLoadError(f"{path}: is_causal {shown(hf['is_causal'])}: transformers runs this {model_type} with "
                             "bidirectional attention (every token sees the whole text), which docscore computes for "
                             f"the Llama family only{instead}; its embeddings and scores would differ from the model's")
    try:
        config = {"bert": {"distilbert": _distilbert, "mpnet": _mpnet}.get(model_type, _bert), "gpt2": _gpt2,
                  "llama": {"gemma3_text": _gemma3, "gemma2": _gemma2, "phi3": _phi3, "olmo2": _olmo2, "olmo3": _olmo3,
                            "granite": _granite, "smollm3": _smollm3, "eurobert": _eurobert}.get(model_type, _llama),
                  "modernbert": _modernbert, "rotary_bert": _rotary_bert, "t5": _t5}[family](hf)
        config = dataclasses.replace(config, model_type=model_type, bidirectional=config.bidirectional or both_ways)
    except KeyError as missing:
        raise ModelLoadError(f"{path}: {model_type} config lacks the field {missing}; "
                             f"save the model's config with transformers' save_pretrained") from None
    check_bounds(config, path, _file_keys(hf))
    if both_ways and config.sliding_window:
        raise ModelLoadError(f"{path}: is_causal {shown(hf['is_causal'])} with a sliding window of "
                             f"{config.sliding_window} is not supported: docscore computes a both-ways {model_type} "
                             "without local attention only")
    if config.family == "llama" and config.num_heads % config.kv_heads:
        raise ModelLoadError(f"{path}: num_attention_heads {config.num_heads} is not a multiple of "
                             f"num_key_value_heads {config.kv_heads}")
    head_dim_given = config.family == "t5" or (  # T5's d_kv (mT5-small: 6 heads of 64 over d_model 512)
        config.family in ("llama", "rotary_bert") and
        (hf.get("head_dim") is not None or model_type in ("qwen3", "gemma3_text")))
    if not head_dim_given and config.hidden_size % config.num_heads:
        raise ModelLoadError(f"{path}: hidden size {config.hidden_size} is not a multiple of "
                             f"{config.num_heads} attention heads")
    if config.family in ("llama", "modernbert", "rotary_bert") and config.head_dim % 2:  # rotary embeddings turn pairs of dimensions
        raise ModelLoadError(f"{path}: head_dim {config.head_dim} (hidden_size / num_attention_heads, or head_dim) is "
                             "odd; rotary position embeddings need an even head_dim, as transformers does")
    return config


def hf_keys(config: ModelConfig) -> dict[str, str]:
    """ModelConfig size field -> the key config.json holds it under, for this model_type (HF_KEYS)."""
    return HF_KEYS.get(config.model_type) or HF_KEYS[config.family]


def _file_keys(hf: dict[str, Any]) -> dict[str, str]:
    """transformers' key -> the key this config.json holds it under, where they differ: the original remote-code
    NomicBERT keys (n_inner for intermediate_size, ...), so that a message names what the user can find in the file."""
    if hf.get("model_type") != "nomic_bert":
        return {}
    return {ours: theirs for theirs, ours in NOMIC_REMOTE_KEYS.items() if theirs in hf and ours not in hf}


def check_bounds(config: ModelConfig, path: str = "config.json", file_keys: dict[str, str] | None = None) -> None:
    """Raise ModelLoadError naming the file and the key when a size is not a whole number in [1, its
    MAX_SIZES bound], or layer_norm_eps is not a small positive number. `file_keys` renames a key as the file
    holds it (_file_keys)."""
    file_keys = file_keys or {}
    for field, key in hf_keys(config).items():
        key = file_keys.get(key, key)
        value, limit = getattr(config, field), MAX_SIZES[field]
        if field == "max_positions" and config.position_offset and type(value) is int:
            value += config.position_offset  # config.json's max_position_embeddings, as the message names it
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
            raise ModelLoadError(
                f"{path}: {key} is {shown(value)}; it must be a whole number from 1 to {limit:,} (docscore's bound "
                f"for {field}); set {key} to the model's real value (the one its weights were trained with), or "
                "re-create the model directory with `docscore convert`")
    eps = config.layer_norm_eps
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        key = {"bert": "layer_norm_eps", "gpt2": "layer_norm_epsilon", "llama": "rms_norm_eps",
               "modernbert": "norm_eps", "rotary_bert": "layer_norm_eps", "t5": "layer_norm_epsilon"}[config.family]
        key = file_keys.get(key, key)
        raise ModelLoadError(f"{path}: {key} is {shown(eps)}; it must be a number between 0 and 1 (e.g. 1e-12); "
                             "set it to the model's real value, or re-create the model directory with `docscore convert`")


def _activation(key: str, name: Any, known: dict[str, str] = ACTIVATIONS) -> str:
    """The activation config.json's `key` names (among `known`), or a refusal naming the key (what to change)."""
    if not isinstance(name, str) or name not in known:
        raise ModelLoadError(f"{key} {shown(name)} is not supported (supported: {sorted(known)})")
    return known[name]


def _bert(hf: dict[str, Any]) -> ModelConfig:
    for key in ("is_decoder", "add_cross_attention"):  # causal / encoder-decoder BERT: docscore's encoder attends both ways
        if hf.get(key):
            raise ModelLoadError(f"BERT with {key}=true is not supported; docscore's BERT is an encoder (every token "
                                 "attends to the whole text): convert the model saved as an encoder")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ModelLoadError(f"position_embedding_type {hf['position_embedding_type']!r} is not "
                             "supported; only 'absolute' BERT position embeddings are")
    positions, offset = hf["max_position_embeddings"], 0
    if hf["model_type"] in POSITIONS_AFTER_PADDING:
        # RoBERTa numbers a text's tokens from pad_token_id + 1 (transformers' default pad_token_id is 1), so the
        # table's first rows are never read and a segment has that many fewer positions
        pad = hf.get("pad_token_id", 1)
        if isinstance(pad, bool) or not isinstance(pad, int) or pad < 0:
            raise ModelLoadError(f"pad_token_id is {shown(pad)}; {hf['model_type']} numbers positions from "
                                 "pad_token_id + 1, so it must be a whole number >= 0 (RoBERTa's is 1)")
        offset = pad + 1
        if type(positions) is int and positions <= offset:
            raise ModelLoadError(f"max_position_embeddings {positions} leaves no position past pad_token_id {pad} "
                                 f"(a {hf['model_type']} text's first position is {offset}); set it to the model's "
                                 "real value")
        positions = positions - offset if type(positions) is int else positions
    return ModelConfig(
        family="bert", vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"], max_positions=positions, position_offset=offset,
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12), activation=_activation("hidden_act", hf.get("hidden_act", "gelu")),
        type_vocab_size=hf.get("type_vocab_size", 2))


def _distilbert(hf: dict[str, Any]) -> ModelConfig:
    """DistilBertModel: BERT's post-norm blocks under other names, no token types, LayerNorm eps fixed at 1e-12.
    Its position table is read from the checkpoint either way: with sinusoidal_pos_embds, transformers fills it with
    the sinusoids and saves it as position_embeddings."""
    return ModelConfig(
        family="bert", vocab_size=hf["vocab_size"], hidden_size=hf["dim"], num_layers=hf["n_layers"],
        num_heads=hf["n_heads"], intermediate_size=hf["hidden_dim"], max_positions=hf["max_position_embeddings"],
        layer_norm_eps=1e-12, activation=_activation("activation", hf.get("activation", "gelu")), type_vocab_size=0)


def _mpnet(hf: dict[str, Any]) -> ModelConfig:
    """MPNetModel: BERT's post-norm blocks (attn.q/k/v/o, intermediate, output) and exact GELU, positions counted past
    padding id 1 as RoBERTa's (MPNET_PADDING_IDX, whatever pad_token_id says), no token types, and one relative
    position bias table [relative_attention_num_buckets, heads] shared by every layer, added to the scaled scores of
    each head at the bucket of the key-query offset (models/layers.py relative_position_buckets)."""
    buckets = hf.get("relative_attention_num_buckets", MPNET_BUCKETS)
    if type(buckets) is int and 0 < buckets < MPNET_BUCKETS:
        raise ModelLoadError(f"relative_attention_num_buckets {buckets} is not supported: transformers' MPNet looks "
                             f"offsets up in {MPNET_BUCKETS} buckets whatever this says, so a table of {buckets} rows "
                             "fails there for any text of two tokens or more; set it to the model's real value (32)")
    config = _bert({**hf, "pad_token_id": MPNET_PADDING_IDX, "type_vocab_size": 0})
    return dataclasses.replace(config, relative_attention_buckets=buckets)


# T5Config's and MT5Config's defaults where a config.json leaves the key out (transformers 5.24), and the window length
# docscore stops at when config.json has no n_positions: T5's positions are relative, so transformers runs any length,
# but T5 was trained on 512 tokens (t5-base's config.json says n_positions 512)
T5 = {"vocab_size": 32128, "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_layers": 6, "num_heads": 8,
      "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128, "layer_norm_epsilon": 1e-6,
      "feed_forward_proj": "relu", "n_positions": 512}
MT5 = {**T5, "vocab_size": 250112, "d_ff": 1024, "num_layers": 8, "num_heads": 6, "feed_forward_proj": "gated-gelu"}


def _t5(hf: dict[str, Any]) -> ModelConfig:
    """T5EncoderModel, and the encoder of T5Model / T5ForConditionalGeneration (model_type t5; mt5 is the same code): the
    token embedding unscaled, pre-norm blocks (T5's RMSNorm; attention without biases or 1/sqrt(d) scaling, d_kv wide
    heads, a relative position bias by key-query offset in relative_attention_num_buckets bidirectional buckets up to
    relative_attention_max_distance, from one table layer 0 holds and every layer adds; a ReLU MLP, or a gated one
    with feed_forward_proj gated-*), a final RMSNorm. The MLP as transformers 5 reads it: feed_forward_proj's
    "gated-ACT" or "ACT" (gated-gelu: gelu_new), over which config.json's own is_gated_act and dense_act_fn win.
    A decoder stack's config (is_decoder) is refused: docscore embeds with the encoder."""
    if hf.get("is_decoder"):
        raise ModelLoadError(f"is_decoder {shown(hf['is_decoder'])}: this config describes a {hf['model_type']} decoder "
                             "stack (causal, attending to an encoder's output), not an encoder; docscore embeds with "
                             "T5's encoder: convert T5EncoderModel, or the whole model, whose decoder is not read")
    hf = {**(MT5 if hf["model_type"] == "mt5" else T5), **hf}
    proj = hf["feed_forward_proj"]
    parts = proj.split("-") if isinstance(proj, str) else []
    if not parts or len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise ModelLoadError(f"feed_forward_proj {shown(proj)} is not supported; transformers reads 'ACT' or "
                             "'gated-ACT' (T5's 'relu', T5 v1.1's and mT5's 'gated-gelu')")
    gated = hf.get("is_gated_act", parts[0] == "gated")
    if not isinstance(gated, bool):
        raise ModelLoadError(f"is_gated_act is {shown(gated)}; it must be true or false (or left out: "
                             "feed_forward_proj says)")
    activation = hf.get("dense_act_fn", "gelu_new" if proj == "gated-gelu" else parts[-1])
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        named = f"dense_act_fn {shown(activation)}" if "dense_act_fn" in hf else f"feed_forward_proj {shown(proj)}"
        raise ModelLoadError(f"{named} is not supported; docscore computes T5's MLP with the activations "
                             f"{sorted(ACTIVATIONS)}")
    buckets, distance = hf["relative_attention_num_buckets"], hf["relative_attention_max_distance"]
    # with fewer than 4 buckets, or a max_distance within the exact ones, torch's bucket arithmetic divides by zero
    if type(buckets) is int and 0 < buckets < 4:
        raise ModelLoadError(f"relative_attention_num_buckets {buckets} is not supported: T5's bidirectional buckets "
                             "need at least 4 (transformers fails with fewer); set it to the model's real value (32)")
    if type(buckets) is int and type(distance) is int and 0 < distance <= buckets // 4:
        raise ModelLoadError(f"relative_attention_max_distance {distance} is not supported: it must exceed the "
                             f"{buckets // 4} offsets relative_attention_num_buckets {buckets} counts exactly (transformers "
                             "divides by zero otherwise); set it to the model's real value (128)")
    return ModelConfig(
        family="t5", vocab_size=hf["vocab_size"], hidden_size=hf["d_model"], num_layers=hf["num_layers"],
        num_heads=hf["num_heads"], head_size=hf["d_kv"], intermediate_size=hf["d_ff"], max_positions=hf["n_positions"],
        layer_norm_eps=hf["layer_norm_epsilon"], activation=ACTIVATIONS[activation],
        relative_attention_buckets=buckets, relative_attention_max_distance=distance, gated_feed_forward=gated)


# ModernBertConfig's defaults where a config.json leaves the key out
MODERNBERT_ROPE_THETA = {"full_attention": 160_000.0, "sliding_attention": 10_000.0}
MODERNBERT_THETA_KEYS = {"full_attention": "global_rope_theta", "sliding_attention": "local_rope_theta"}


def _modernbert(hf: dict[str, Any]) -> ModelConfig:
    """ModernBertModel (and its *ForMaskedLM etc. base): pre-norm blocks with bias-free LayerNorms (unless
    norm_bias), no norm before layer 0's attention, fused Wqkv, rotary positions with one theta for global and one
    for local layers, a GeGLU MLP, a final norm. Read as transformers 5 reads it: layer_types, else every
    global_attn_every_n_layers-th layer (from 0) global and the others local; a local layer sees keys
    |i - j| <= local_attention // 2 (transformers' sliding_window), the kernels' window local_attention // 2 + 1."""
    layers = hf["num_hidden_layers"]
    sliding = _local_layers(hf, "global_attn_every_n_layers", 3, global_first=True,
                            says="every that many layers, from layer 0, attends globally")
    window = 0
    if sliding:
        span = hf.get("local_attention", 128)
        if isinstance(span, bool) or not isinstance(span, int) or span < 0:
            raise ModelLoadError(f"local_attention is {shown(span)}; it must be a whole number >= 0 (the span of a "
                                 "local layer's attention)")
        window = span // 2 + 1  # transformers keeps |i - j| <= local_attention // 2
    hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
    head_dim = hf.get("head_dim")
    if head_dim is not None and type(hidden) is int and type(heads) is int and heads > 0 and head_dim != hidden // heads:
        raise ModelLoadError(f"head_dim {shown(head_dim)} is not supported; ModernBERT's attention heads are "
                             f"hidden_size / num_attention_heads ({hidden // heads}) wide, and transformers would "
                             "rotate them by head_dim: remove head_dim")
    bias = hf.get("attention_bias", False)
    ropes = _modernbert_ropes(hf)
    return ModelConfig(
        family="modernbert", vocab_size=hf["vocab_size"], hidden_size=hidden, num_layers=layers, num_heads=heads,
        intermediate_size=hf["intermediate_size"], max_positions=hf["max_position_embeddings"],
        layer_norm_eps=hf.get("norm_eps", 1e-5),
        activation=_activation("hidden_activation", hf.get("hidden_activation", "gelu")),
        rope=ropes["full_attention"], local_rope=ropes["sliding_attention"], qkv_bias=bool(bias), output_bias=bool(bias),
        mlp_bias=bool(hf.get("mlp_bias", False)), norm_bias=bool(hf.get("norm_bias", False)),
        sliding_window=window, sliding_layers=sliding)


def _local_layers(hf: dict[str, Any], key: str | None, default: int, *, global_first: bool,
                  says: str = "") -> tuple[int, ...]:
    """The sliding_attention layers of a config with local and global layers, as transformers 5 reads it:
    layer_types, else every `key`-th layer global (`default` when the file leaves `key` out, or always without a key:
    Gemma 2's every other layer; the first of each group when global_first, as ModernBERT's; the last, as Gemma 3's)
    and the others local. Refuses a pattern or list transformers could not run, naming it."""
    if hf.get("layer_types") is not None:
        return _marked_sliding(hf)
    every = hf.get(key, default) if key else default
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ModelLoadError(f"{key} is {shown(every)}; it must be a whole number >= 1 ({says})")
    shift = 0 if global_first else 1
    return tuple(i for i in range(_layer_count(hf)) if (i + shift) % every)


def _layer_count(hf: dict[str, Any]) -> int:
    """num_hidden_layers where it is a whole number in bounds, else 0 (check_bounds refuses it, naming the key)."""
    layers = hf.get("num_hidden_layers")
    return layers if type(layers) is int and 0 < layers <= MAX_SIZES["num_layers"] else 0


def _marked_sliding(hf: dict[str, Any]) -> tuple[int, ...]:
    """The layers config.json's layer_types marks sliding_attention; a list that is not one of LAYER_TYPES per
    layer is refused."""
    layers, layer_types = hf["num_hidden_layers"], hf["layer_types"]
    _check_layer_types(layer_types)
    if type(layers) is int and len(layer_types) != layers:
        raise ModelLoadError(f"layer_types has {len(layer_types)} entries for num_hidden_layers {layers}; it "
                             "names one attention type per layer")
    return tuple(i for i, kind in enumerate(layer_types) if kind == "sliding_attention")


def _modernbert_ropes(hf: dict[str, Any]) -> dict[str, Rope]:
    """Each layer type's Rope, as ModernBertConfig reads them: rope_parameters[type] (transformers 5), whose
    rope_theta, when absent, is global_rope_theta / local_rope_theta (earlier configs), else 160,000 / 10,000;
    rope_scaling applies to both. Only the default rotary type is computed here."""
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    for key, value in (("rope_parameters", params), ("rope_scaling", scaling)):
        if not isinstance(value, dict):
            raise ModelLoadError(f"{key} is {shown(value)}; expected a JSON object")
    if params and not all(kind in LAYER_TYPES for kind in params):
        raise ModelLoadError(f"rope_parameters holds {sorted(map(str, params))[:4]}; ModernBERT's are per layer type "
                             f"({' and '.join(LAYER_TYPES)}), as transformers 5 saves them")
    ropes = {}
    for kind in LAYER_TYPES:
        own = params.get(kind) or {}
        if not isinstance(own, dict):
            raise ModelLoadError(f"rope_parameters.{kind} is {shown(own)}; expected a JSON object")
        merged = {**own, **scaling}
        where = "rope_scaling" if scaling else f"rope_parameters.{kind}"
        rope_type = merged.get("rope_type", merged.get("type", "default"))
        if rope_type != "default":
            raise ModelLoadError(f"{where}.rope_type {shown(rope_type)} is not supported; docscore's ModernBERT "
                                 "computes the default rotary positions only")
        theta_key = f"rope_parameters.{kind}.rope_theta" if "rope_theta" in merged else MODERNBERT_THETA_KEYS[kind]
        theta = merged.get("rope_theta", hf.get(MODERNBERT_THETA_KEYS[kind], MODERNBERT_ROPE_THETA[kind]))
        ropes[kind] = Rope(theta=positive_number(theta_key, theta))
    return ropes


# NomicBertConfig's and GteConfig's defaults where a config.json leaves the key out (transformers 5.24; their
# default_theta is each rope_theta's). GTE's remote-code model_type "new" gets none: its NewConfig's defaults are its
# own, so such a config.json must hold every key (save_pretrained writes them all).
ROTARY_BERT = {
    "nomic_bert": {"vocab_size": 30528, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                   "intermediate_size": 3072, "hidden_act": "silu", "max_position_embeddings": 2048,
                   "type_vocab_size": 2, "layer_norm_eps": 1e-12, "rope_theta": 1_000.0},
    "gte": {"vocab_size": 250048, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
            "intermediate_size": 3072, "hidden_act": "gelu", "max_position_embeddings": 8192, "type_vocab_size": 1,
            "layer_norm_eps": 1e-12, "rope_theta": 160_000.0},
}
# The original remote-code NomicBERT config.json's keys (a GPT2Config's) -> NomicBertConfig's
NOMIC_REMOTE_KEYS = {"n_embd": "hidden_size", "n_head": "num_attention_heads", "n_layer": "num_hidden_layers",
                     "n_inner": "intermediate_size", "n_positions": "max_position_embeddings",
                     "layer_norm_epsilon": "layer_norm_eps", "rotary_emb_base": "rope_theta"}
# Remote-code settings (NomicBERT's, GTE's) and the one value with which that code computes what transformers'
# NomicBertModel / GteModel compute; any other is refused (None: null, as the released configs say)
NOMIC_REMOTE_SETTINGS = {"prenorm": False, "rotary_emb_interleaved": False, "rotary_emb_fraction": 1.0,
                         "qkv_proj_bias": False, "mlp_fc1_bias": False, "mlp_fc2_bias": False, "use_rms_norm": False,
                         "causal": False, "parallel_block": False, "rotary_scaling_factor": None,
                         "rotary_emb_scale_base": None, "scale_attn_by_inverse_layer_idx": False,
                         "scale_attn_weights": True, "activation_function": "swiglu"}
GTE_REMOTE_SETTINGS = {"position_embedding_type": "rope", "logn_attention_scale": False, "layer_norm_type": "layer_norm"}
ROTARY_BERT_ACTIVATIONS = {**ACTIVATIONS, "silu": "silu", "swish": "silu"}  # transformers' ACT2FN names


def _rotary_bert(hf: dict[str, Any]) -> ModelConfig:
    """NomicBertModel (nomic-embed-text) and GteModel (gte-multilingual-base, snowflake-arctic-embed-m-v2.0; GTE's
    remote-code model_type "new" read alike): word and token-type-0 embeddings and a LayerNorm, BERT's post-norm
    blocks (attention with rotary positions over whole heads, no position table; a gated MLP, down(act(gate(x)) *
    up(x))). NomicBERT has no biases and SiLU by default; GTE biases q/k/v/o and the MLP's down projection, GELU by
    default. The original remote-code NomicBERT keys (n_embd, rotary_emb_base, ...) are read where their meaning is
    one, and a remote-code setting that would compute otherwise (prenorm, interleaved or partial rotary, biases, a
    scaling factor, GTE's logn attention scale, ...) is refused naming its key."""
    model_type = hf["model_type"]
    hf = {**ROTARY_BERT.get(model_type, {}), **_native_nomic_keys(hf)}
    settings = NOMIC_REMOTE_SETTINGS if model_type == "nomic_bert" else GTE_REMOTE_SETTINGS
    native = "NomicBertModel" if model_type == "nomic_bert" else "GteModel"  # transformers has no model_type "new"
    for key, only in settings.items():
        if key in hf and hf[key] != only and not (only is None and hf[key] is None):
            raise ModelLoadError(f"{key} {shown(hf[key])} is not supported: the {native} transformers 5.24 computes "
                                 f"is the original's with {key} {shown(only)}; docscore computes that one")
    hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
    head_size = _head_size(hf.get("head_dim"), hidden, heads)
    if "rope_theta" not in hf and not hf.get("rope_parameters"):  # model_type "new": NewConfig's default is its own
        raise ModelLoadError(f"model_type {model_type!r} (GTE's remote code) config lacks rope_theta; save the "
                             "model's config with its code's save_pretrained, which writes it")
    biased = model_type != "nomic_bert"
    return ModelConfig(
        family="rotary_bert", vocab_size=hf["vocab_size"], hidden_size=hidden, num_layers=hf["num_hidden_layers"],
        num_heads=heads, head_size=head_size, intermediate_size=hf["intermediate_size"],
        max_positions=hf["max_position_embeddings"], layer_norm_eps=hf["layer_norm_eps"],
        activation=_activation("hidden_act", hf["hidden_act"], ROTARY_BERT_ACTIVATIONS),
        type_vocab_size=_whole("type_vocab_size", hf["type_vocab_size"]), rope=read_rope(hf, head_size),
        qkv_bias=biased, output_bias=biased, mlp_output_bias=biased)


def _head_size(head_dim: Any, hidden: Any, heads: Any) -> Any:
    """config.json's head_dim, else as transformers hidden_size // num_attention_heads (config_from_hf checks that it
    divides; sizes that are no whole numbers give 1 here and are refused by check_bounds)."""
    if head_dim is not None:
        return head_dim
    return max(1, hidden // heads) if type(hidden) is int and type(heads) is int and heads > 0 else 1


def _native_nomic_keys(hf: dict[str, Any]) -> dict[str, Any]:
    """`hf` with the remote-code NomicBERT keys it holds under NomicBertConfig's names (NOMIC_REMOTE_KEYS; the
    remote activation_function "swiglu" as hidden_act silu); one both names give different values is refused."""
    renamed = dict(hf)
    for theirs, ours in {**NOMIC_REMOTE_KEYS, "activation_function": "hidden_act"}.items():
        if theirs not in hf or hf["model_type"] != "nomic_bert":
            continue
        value = "silu" if theirs == "activation_function" and hf[theirs] == "swiglu" else hf[theirs]
        if ours in hf and hf[ours] != value:
            raise ModelLoadError(f"{theirs} {shown(hf[theirs])} and {ours} {shown(hf[ours])} disagree; the "
                                 "original NomicBERT code reads the first, transformers the second")
        renamed[ours] = value
    return renamed


def _whole(key: str, value: Any) -> int:
    """A count config.json holds that may be 0 (no token types), or a refusal naming its key."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SIZES[key]:
        raise ModelLoadError(f"{key} is {shown(value)}; it must be a whole number from 0 to {MAX_SIZES[key]:,}")
    return value


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
        activation=_activation("activation_function", hf.get("activation_function", "gelu_new")),
        scale_attn_by_inverse_layer_idx=bool(hf.get("scale_attn_by_inverse_layer_idx", False)))


# The biases as transformers builds each model, whatever else its config says: attention_bias (q/k/v and o_proj)
# where the model reads it, mlp_bias likewise; Qwen2 always has q/k/v biases and no others; Mistral and Phi-3 none
ATTENTION_BIAS_READ = ("llama", "qwen3", "olmo2", "olmo3", "granite", "smollm3", "eurobert")
MLP_BIAS_READ = ("llama", "granite", "smollm3", "eurobert")


def _llama(hf: dict[str, Any]) -> ModelConfig:
    """LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM configs (transformers 4.x and
    5.x layouts), and the Llama blocks the other model types' readers start from."""
    model_type, hidden, heads = hf["model_type"], hf["hidden_size"], hf["num_attention_heads"]
    activation = hf.get("hidden_act", "silu")
    if activation not in LLAMA_ACTIVATIONS:
        raise ModelLoadError(f"hidden_act {activation!r} is not supported for {model_type}; the gated MLP "
                             f"of docscore's Llama decoder uses one of {list(LLAMA_ACTIVATIONS)}")
    head_size = _head_size(hf.get("head_dim", QWEN3_HEAD_DIM if model_type == "qwen3" else None), hidden, heads)
    kv_heads = hf.get("num_key_value_heads")
    attention_bias = model_type in ATTENTION_BIAS_READ and bool(hf.get("attention_bias", False))
    mlp_bias = model_type in MLP_BIAS_READ and bool(hf.get("mlp_bias", False))
    return ModelConfig(
        family="llama", vocab_size=hf["vocab_size"], hidden_size=hidden, num_layers=hf["num_hidden_layers"],
        num_heads=heads, intermediate_size=hf["intermediate_size"],
        max_positions=hf["max_position_embeddings"], layer_norm_eps=hf.get("rms_norm_eps", 1e-6),
        activation="silu", num_kv_heads=heads if kv_heads is None else kv_heads, head_size=head_size,
        rope=read_rope(hf, head_size, partial=model_type in PARTIAL_ROTARY_MODEL_TYPES),
        qkv_bias=model_type == "qwen2" or attention_bias, output_bias=attention_bias,
        qk_norm=model_type == "qwen3",
        mlp_bias=mlp_bias, tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        **_sliding_window(hf))


PHI3_RMS_NORM_EPS = 1e-5  # Phi3Config's, where _llama's default is Llama's 1e-6
# Phi3Config's original_max_position_embeddings: a field of its own, so it (this default where the file leaves it
# out) wins over the one in the rope settings
PHI3_ORIGINAL_MAX_POSITIONS = 4096
# Phi3Config reads rope_type yarn as longrope (su too, but transformers 5.24 then fails its own validation, so su is
# refused as any other unknown type)
PHI3_LONGROPE_NAMES = ("yarn",)


def _phi3(hf: dict[str, Any]) -> ModelConfig:
    """Phi3ForCausalLM (model_type phi3: Phi-3-mini, Phi-3-medium, Phi-3.5-mini, Phi-4, Phi-4-mini) as transformers 5
    reads Phi3Config: Llama's block (its fused qkv_proj and gate_up_proj are split at convert), no biases whatever
    attention_bias says, rms_norm_eps 1e-5 when left out, sliding_window (null when left out) on every layer. Its
    rotary types are default and longrope (Phi-3's 128k releases, Phi-3.5, Phi-4-mini; yarn read as longrope, its
    original context the top-level original_max_position_embeddings, 4096 when left out); linear and llama3, which
    read_rope computes, are refused here as Phi3Config refuses them. partial_rotary_factor (Phi-4-mini's 0.75) turns a
    head's first int(head_dim * factor) dimensions only (models/rope.py _rotary_dim)."""
    hf = {"rms_norm_eps": PHI3_RMS_NORM_EPS, "original_max_position_embeddings": PHI3_ORIGINAL_MAX_POSITIONS, **hf}
    field = "rope_scaling" if hf.get("rope_scaling") else "rope_parameters"  # the settings read_rope reads
    params = hf.get(field)
    if isinstance(params, dict) and params.get(rope_type_key(params)) in PHI3_LONGROPE_NAMES:
        hf = {**hf, field: {**params, rope_type_key(params): "longrope"}}
    config = _llama(hf)
    if config.rope.kind not in ("default", "longrope"):
        raise ModelLoadError(f"rope_type {config.rope.kind!r} is not supported for phi3; transformers' Phi3Config "
                             "takes 'default' and 'longrope' (or 'yarn', read as longrope) only")
    return config


# Olmo2Config's defaults where a config.json leaves the key out (Olmo3Config's too); a num_key_value_heads left out
# or null is one per head, and the rotary theta 10,000, as _llama reads them
OLMO2 = {"vocab_size": 50_304, "hidden_size": 4096, "intermediate_size": 11_008, "num_hidden_layers": 32,
         "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5}


def _olmo2(hf: dict[str, Any]) -> ModelConfig:
    """Olmo2ForCausalLM (model_type olmo2: OLMo-2-0425-1B, OLMo-2-1124-7B and 13B) as transformers 5 reads
    Olmo2Config: Llama's blocks with their norms moved after the attention and the MLP (each output normalised
    before it is added; nothing normalised before them), q and k each normalised by one RMSNorm over all their heads
    (num_heads x head_dim wide, before the heads are split and rotated), attention_bias on q/k/v and o_proj, never an
    MLP bias. A key the file leaves out is Olmo2Config's (OLMO2; rms_norm_eps 1e-5, an untied head)."""
    config = _llama({**OLMO2, **hf})
    return dataclasses.replace(config, pre_norms=False, post_norms=True, qk_norm=True, qk_norm_across_heads=True)


# Olmo3Config's: every layer type's rotary theta (its default_theta, whatever rope_theta says for the sliding ones:
# transformers 5 reads rope_theta for the full_attention layers only), the window, and one global layer in four
OLMO3_ROPE_THETAS = {"full_attention": ("rope_theta", 500_000.0), "sliding_attention": (None, 500_000.0)}
OLMO3_SLIDING_WINDOW = 4096
OLMO3_GLOBAL_EVERY = 4


def _olmo3(hf: dict[str, Any]) -> ModelConfig:
    """Olmo3ForCausalLM (model_type olmo3: Olmo-3-7B and 32B) as transformers 5 reads Olmo3Config: OLMo 2's blocks
    (_olmo2) with local layers (layer_types, else three of every four, the fourth global) attending within
    sliding_window (4096 when left out), and a rotary setting per layer type: rope_parameters[type], a non-null
    rope_scaling laid over the global layers' (Olmo-3's released yarn), a theta left out 500,000. A rope_theta other than 500,000 without a theta in rope_parameters.sliding_attention (and local layers to
    rotate) is refused: transformers 5 rotates only the global layers by it (the local ones by 500,000), where
    transformers 4.x rotated every layer by it, so the two disagree on the model."""
    hf = {**OLMO2, **hf}
    sliding = _local_layers(hf, None, OLMO3_GLOBAL_EVERY, global_first=False)
    window = _local_window(hf, OLMO3_SLIDING_WINDOW) if sliding else 0
    own = hf.get("rope_parameters")
    sliding_theta = isinstance(own, dict) and isinstance(own.get("sliding_attention"), dict) and \
        "rope_theta" in own["sliding_attention"]
    theta = hf.get("rope_theta", OLMO3_ROPE_THETAS["full_attention"][1])
    if sliding and not sliding_theta and theta != OLMO3_ROPE_THETAS["sliding_attention"][1]:
        raise ModelLoadError(f"rope_theta {shown(theta)} is not supported for olmo3: transformers 5 rotates only "
                             "the full_attention layers by it and the sliding_attention ones by Olmo3Config's 500,000 "
                             "(transformers 4.x rotated every layer by it); set rope_parameters.sliding_attention."
                             "rope_theta to the theta the model was trained with")
    blocks = _olmo2({key: value for key, value in hf.items() if not key.startswith("rope_")})
    ropes = layer_type_ropes(hf, OLMO3_ROPE_THETAS, "OLMo 3", blocks.head_size)
    return dataclasses.replace(blocks, rope=ropes["full_attention"], local_rope=ropes["sliding_attention"],
                               sliding_window=window, sliding_layers=sliding)


# GraniteConfig's defaults where a config.json leaves the key out (kv heads and theta as OLMO2's)
GRANITE = {"vocab_size": 32_000, "hidden_size": 4096, "intermediate_size": 11_008, "num_hidden_layers": 32,
           "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6}
# Granite's multipliers, 1.0 when left out (GraniteConfig's) -> the ModelConfig field each sets
GRANITE_MULTIPLIERS = {"embedding_multiplier": "embed_scale", "attention_multiplier": "attention_multiplier",
                       "residual_multiplier": "residual_multiplier", "logits_scaling": "logits_divisor"}


def _granite(hf: dict[str, Any]) -> ModelConfig:
    """GraniteForCausalLM (model_type granite: granite-3.0, 3.1, 3.2 and 3.3's dense 2b and 8b) as transformers 5
    reads GraniteConfig: Llama's blocks (attention_bias and mlp_bias as Llama reads them) with four multipliers: the
    token embedding times embedding_multiplier, attention scores scaled by attention_multiplier (in place of
    head_dim ** -0.5), each attention and MLP output times residual_multiplier before it is added, the logits
    divided by logits_scaling. A key the file leaves out is GraniteConfig's (GRANITE; each multiplier 1.0)."""
    hf = {**GRANITE, **hf}
    multipliers = {field: positive_number(key, hf.get(key, 1.0)) for key, field in GRANITE_MULTIPLIERS.items()}
    return dataclasses.replace(_llama(hf), **multipliers)


# SmolLM3Config's defaults where a config.json leaves the key out (a null num_key_value_heads is one per head)
SMOLLM3 = {"vocab_size": 128_256, "hidden_size": 2048, "intermediate_size": 11_008, "num_hidden_layers": 36,
           "num_attention_heads": 16, "num_key_value_heads": 4, "max_position_embeddings": 32_768,
           "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "rope_theta": 2_000_000.0, "no_rope_layer_interval": 4}


def _smollm3(hf: dict[str, Any]) -> ModelConfig:
    """SmolLM3ForCausalLM (model_type smollm3: SmolLM3-3B) as transformers 5 reads SmolLM3Config: Llama's blocks
    (attention_bias and mlp_bias as Llama reads them) whose layers no_rope_layers marks 0 have no rotary positions
    (NoPE: q and k as projected; one 0 or 1 per layer, 1 rotating; left out, every no_rope_layer_interval-th layer is
    0, the last of each group), and local layers where use_sliding_window (layer_types, else the NoPE layers when
    sliding_window is set) attending within sliding_window. A key the file leaves out is SmolLM3Config's (SMOLLM3:
    4 kv heads, a tied head, theta 2,000,000); pretraining_tp is not read, as transformers' SmolLM3 does not."""
    hf = {**SMOLLM3, **hf}
    rotates = hf.get("no_rope_layers")
    if rotates is None:
        every = hf["no_rope_layer_interval"]
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ModelLoadError(f"no_rope_layer_interval is {shown(every)}; it must be a whole number >= 1 (every "
                                 "that many layers, the last has no rotary positions)")
        rotates = [int((i + 1) % every != 0) for i in range(_layer_count(hf))]
    elif not isinstance(rotates, list) or len(rotates) != _layer_count(hf):
        what = f"has {len(rotates)} entries" if isinstance(rotates, list) else f"is {shown(rotates)}"
        raise ModelLoadError(f"no_rope_layers {what} for num_hidden_layers {shown(hf['num_hidden_layers'])}; it "
                             "lists one 0 (no rotary positions) or 1 (rotary positions) per layer")
    elif any(isinstance(mark, bool) or mark not in (0, 1) for mark in rotates):
        other = next(mark for mark in rotates if isinstance(mark, bool) or mark not in (0, 1))
        raise ModelLoadError(f"no_rope_layers holds {shown(other)}; each layer's entry must be 0 (no rotary "
                             "positions) or 1 (rotary positions)")
    nope = tuple(i for i, mark in enumerate(rotates) if not mark)
    window, use_window = hf.get("sliding_window"), bool(hf.get("use_sliding_window", False))
    if hf.get("layer_types") is not None:
        sliding = _marked_sliding(hf)
        if sliding and (not use_window or window is None):
            raise ModelLoadError(f"layer_types marks layers {list(sliding)[:8]} sliding_attention, but "
                                 "use_sliding_window is false or sliding_window null: transformers' SmolLM3 then masks "
                                 "them by a window in its eager and sdpa attention (or fails without one) and not in "
                                 "its flash attention; set use_sliding_window and sliding_window, or drop layer_types")
    else:  # as SmolLM3Config fills layer_types
        sliding = nope if use_window and window is not None else ()
    return dataclasses.replace(_llama(hf), nope_layers=nope, sliding_layers=sliding,
                               sliding_window=_local_window(hf, None) if sliding else 0)


# EuroBertConfig's defaults where a config.json leaves the key out (transformers 5.24: a num_key_value_heads left out
# or null is one per head, rope_parameters' theta LlamaConfig's 10,000, as _llama reads them; its pad_token_id 128001
# is the tokenizer's business, not the model's)
EUROBERT = {"vocab_size": 128_256, "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
            "num_attention_heads": 12, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False}


def _eurobert(hf: dict[str, Any]) -> ModelConfig:
    """EuroBertModel / EuroBertForMaskedLM (model_type eurobert: EuroBERT-210m, 610m, 2.1B) as transformers 5 reads
    EuroBertConfig: Llama's blocks (attention_bias and mlp_bias read as Llama's) and final norm, every token attending
    both ways (EuroBertAttention is never causal, whatever is_causal says), positions counted from 0 in every text. An
    encoder: it embeds (mean pooling unless its sentence-transformers Pooling says otherwise) and scores no tokens, so
    its masked-LM head is never read (lm_head False). A key the file leaves out is EuroBertConfig's (EUROBERT)."""
    config = _llama({**EUROBERT, **hf})
    return dataclasses.replace(config, bidirectional=True, lm_head=False, tie_word_embeddings=False)


# Gemma 3's rotary theta per layer type where rope_parameters[type] leaves it out: the key that holds it, its default
GEMMA3_ROPE_THETAS = {"full_attention": ("rope_theta", 1_000_000.0), "sliding_attention": ("rope_local_base_freq", 10_000.0)}
# Gemma3TextConfig's defaults where a config.json leaves the key out: a multimodal release's text_config holds
# little more than the sizes that differ from them (gemma-3-4b's: no heads, kv heads, vocabulary or positions)
GEMMA3 = {"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
          "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131_072,
          "rms_norm_eps": 1e-6, "sliding_window": 4096, "sliding_window_pattern": 6, "query_pre_attn_scalar": 256,
          "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True, "final_logit_softcapping": None}
# the sizes _gemma3 (and _gemma2) read as Gemma3TextConfig (Gemma2Config) fills them: a null one is refused by
# check_bounds, as transformers' strict config refuses it (where the Llama family's null num_key_value_heads is one per
# head)
GEMMA_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps")


def _gemma3(hf: dict[str, Any]) -> ModelConfig:
    """Gemma3ForCausalLM / Gemma3TextModel (model_type gemma3_text): Llama's blocks with Gemma's changes (_gemma_blocks),
    q/k norms, local layers (layer_types, else all but every sliding_window_pattern-th) attending within
    sliding_window with their own rotary theta. With use_bidirectional_attention (EmbeddingGemma) every token attends
    both ways, a local one to |i - j| < sliding_window // 2 + 1, as transformers reads it. A size the file leaves out
    is Gemma3TextConfig's (num_key_value_heads 4, not one per head as in the Llama family). final_logit_softcapping
    caps the logits, as Gemma3ForCausalLM does; attn_logit_softcapping is not read: transformers' Gemma3Attention
    never passes it to its attention (5.24), so the scores are not capped."""
    bidirectional = bool(hf.get("use_bidirectional_attention", False))
    _gemma_activation(hf, GEMMA3)
    hf = {**{key: GEMMA3[key] for key in GEMMA_SIZES}, **hf}  # transformers fills a size left out, never a null one
    sliding = _local_layers(hf, "sliding_window_pattern", GEMMA3["sliding_window_pattern"], global_first=False,
                            says="every that many layers, the last of them attends globally")
    blocks = _gemma_blocks(hf, GEMMA3, sliding)
    if sliding and bidirectional:
        blocks["sliding_window"] = blocks["sliding_window"] // 2 + 1  # Gemma3TextConfig: |i - j| < window // 2 + 1
    ropes = layer_type_ropes(hf, GEMMA3_ROPE_THETAS, "Gemma 3", blocks["head_size"])
    return ModelConfig(**blocks, rope=ropes["full_attention"], local_rope=ropes["sliding_attention"], qk_norm=True,
                       bidirectional=bidirectional,
                       final_logit_cap=_soft_cap(hf, "final_logit_softcapping", GEMMA3["final_logit_softcapping"]))


# Gemma2Config's defaults where a config.json leaves the key out
GEMMA2 = {"vocab_size": 256_000, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
          "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 8192,
          "rms_norm_eps": 1e-6, "sliding_window": 4096, "query_pre_attn_scalar": 256,
          "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True, "attn_logit_softcapping": 50.0,
          "final_logit_softcapping": 30.0}


def _gemma2(hf: dict[str, Any]) -> ModelConfig:
    """Gemma2ForCausalLM / Gemma2Model (model_type gemma2: gemma-2-2b, 9b, 27b): Llama's blocks with Gemma's changes
    (_gemma_blocks), no q/k norms, one rotary setting for every layer (read_rope, as Llama's), local layers (layer_types,
    else every other one from layer 0, as Gemma2Config fills it) attending within sliding_window, the attention
    scores capped at attn_logit_softcapping and the logits at final_logit_softcapping (cap * tanh(x / cap); null: not
    capped). A size or cap the file leaves out is Gemma2Config's. use_bidirectional_attention is refused:
    transformers' Gemma 2 then builds a causal mask but tells its kernels is_causal false, so its eager and flash
    attention disagree."""
    if hf.get("use_bidirectional_attention"):
        raise ModelLoadError(f"use_bidirectional_attention {shown(hf['use_bidirectional_attention'])} is not "
                             "supported for gemma2: transformers' Gemma 2 masks causally in its eager attention and "
                             "attends both ways in its flash attention; set it to false or null")
    _gemma_activation(hf, GEMMA2)
    hf = {**{key: GEMMA2[key] for key in GEMMA_SIZES}, **hf}  # transformers fills a size left out, never a null one
    sliding = _local_layers(hf, None, 2, global_first=False)
    return ModelConfig(**_gemma_blocks(hf, GEMMA2, sliding), rope=read_rope(hf, hf["head_dim"]),
                       attention_logit_cap=_soft_cap(hf, "attn_logit_softcapping", GEMMA2["attn_logit_softcapping"]),
                       final_logit_cap=_soft_cap(hf, "final_logit_softcapping", GEMMA2["final_logit_softcapping"]))


def _gemma_activation(hf: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Refuse a Gemma MLP activation other than the GELU-tanh its gated MLP uses."""
    activation = hf.get("hidden_activation", defaults["hidden_activation"])
    if activation != "gelu_pytorch_tanh":
        raise ModelLoadError(f"hidden_activation {activation!r} is not supported for {hf['model_type']}; its gated MLP "
                             "uses 'gelu_pytorch_tanh'")


def _gemma_blocks(hf: dict[str, Any], defaults: dict[str, Any], sliding: tuple[int, ...]) -> dict[str, Any]:
    """The ModelConfig fields Gemma 2 and Gemma 3 read alike (hf with the sizes left out filled from `defaults`), as
    transformers 5 reads them: the token embedding times sqrt(hidden_size), RMSNorms also after the attention and
    the MLP (their (1 + weight) scale is folded into the weight at convert), a GELU-tanh gated MLP, an attention
    scale of query_pre_attn_scalar ** -0.5, the `sliding` layers attending within sliding_window, a head tied to
    the embedding unless tie_word_embeddings is false."""
    layers, hidden = hf["num_hidden_layers"], hf["hidden_size"]
    window = _local_window(hf, defaults["sliding_window"]) if sliding else 0
    scalar = positive_number("query_pre_attn_scalar", hf.get("query_pre_attn_scalar", defaults["query_pre_attn_scalar"]))
    bias = bool(hf.get("attention_bias", False))
    return dict(
        family="llama", vocab_size=hf["vocab_size"], hidden_size=hidden, num_layers=layers,
        num_heads=hf["num_attention_heads"], intermediate_size=hf["intermediate_size"],
        max_positions=hf["max_position_embeddings"], layer_norm_eps=hf["rms_norm_eps"],
        activation="gelu_tanh", num_kv_heads=hf["num_key_value_heads"], head_size=hf["head_dim"],
        qkv_bias=bias, output_bias=bias,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", defaults["tie_word_embeddings"])),
        sliding_window=window, sliding_layers=sliding,
        embed_scale=float(hidden) ** 0.5 if type(hidden) is int and hidden > 0 else 1.0, post_norms=True,
        query_pre_attn_scalar=scalar)


def _local_window(hf: dict[str, Any], default: int | None) -> int:
    """sliding_window (`default` when the file leaves it out) of a config with sliding_attention layers: a whole
    number >= 1, or a refusal naming it (transformers cannot build those layers' mask without one)."""
    window = hf.get("sliding_window", default)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ModelLoadError(f"sliding_window is {shown(window)}; it must be a whole number >= 1 (layer_types has "
                             "sliding_attention layers)")
    return window


def _soft_cap(hf: dict[str, Any], key: str, default: float | None) -> float:
    """A soft cap as transformers reads it (`default` where the file leaves `key` out): null is none (0.0); else a
    positive, finite number, or a refusal naming the key (a cap of 0 makes every score NaN)."""
    value = hf.get(key, default)
    return 0.0 if value is None else positive_number(key, value, ", or null for none")


def _gemma3_text_model(hf: dict[str, Any], path: str) -> ModelConfig:
    """Gemma3ForConditionalGeneration (model_type gemma3: gemma-3-4b, 12b, 27b) read as its text model, as
    transformers 5 runs it on text alone (no pixel_values): text_config is a Gemma3TextConfig, its defaults filling
    what the file leaves out, and the head is tied to the token embedding as the top-level tie_word_embeddings says
    (default true; text_config's own is not read). Its logits are never capped: Gemma3ForConditionalGeneration does
    not read text_config's final_logit_softcapping (transformers 5.24). Errors name text_config's keys."""
    text = hf.get("text_config")
    if not isinstance(text, dict):
        what = ("missing" if "text_config" not in hf else "null" if text is None
                else f"a JSON {type(text).__name__}, not an object")
        raise ModelLoadError(f"{path}: model_type 'gemma3' (Gemma 3's multimodal model) holds its text model's config "
                             f"under text_config, which is {what}; save the model's config with transformers' "
                             "save_pretrained")
    inner = text.get("model_type", "gemma3_text")
    if inner != "gemma3_text":
        raise ModelLoadError(f"{path}: text_config.model_type {shown(inner)} is not supported; Gemma 3's multimodal "
                             "model's text model is 'gemma3_text'")
    if text.get("use_bidirectional_attention"):
        raise ModelLoadError(f"{path}: text_config.use_bidirectional_attention "
                             f"{shown(text['use_bidirectional_attention'])} is not supported; docscore reads Gemma 3's "
                             "multimodal model as the causal language model it is released as")
    tie = hf.get("tie_word_embeddings", GEMMA3["tie_word_embeddings"])
    where = f"{path}: text_config"
    try:
        config = config_from_hf({**text, "model_type": "gemma3_text", "tie_word_embeddings": tie,
                                 "final_logit_softcapping": None}, where)
    except ModelLoadError as err:
        message = str(err)
        raise ModelLoadError(message if message.startswith(where) else f"{where}: {message}") from None
    return dataclasses.replace(config, model_type="gemma3")


# transformers' config defaults where a config.json leaves the key out (MistralConfig, Qwen2Config, Qwen3Config;
# Phi3Config's window is null)
DEFAULT_SLIDING_WINDOW = 4096
QWEN2_MAX_WINDOW_LAYERS = 28
QWEN3_HEAD_DIM = 128  # Qwen3Config's head_dim, not hidden_size // num_attention_heads


def _check_layer_types(layer_types: Any) -> None:
    """Refuse a layer_types that is not a list of LAYER_TYPES, naming what else it holds."""
    others = (sorted(set(map(str, layer_types)) - set(LAYER_TYPES)) if isinstance(layer_types, list)
              else [f"a JSON {type(layer_types).__name__}, not a list"])
    if others:
        raise ModelLoadError(f"layer_types holds {', '.join(map(repr, others[:3]))}, which is not supported; each "
                             "layer must be 'full_attention' or 'sliding_attention'")


def _sliding_window(hf: dict[str, Any]) -> dict[str, Any]:
    """sliding_window and sliding_layers, as transformers applies them: Mistral's window (4096 when the key
    is absent) and Phi-3's (none when absent) on every layer; Qwen2's and Qwen3's only when use_sliding_window, on
    the layers layer_types says are sliding_attention, else on those from max_window_layers (28 when absent) on. A
    config transformers itself cannot run (a sliding layer without a window) or would run otherwise than it reads is
    refused."""
    model_type, layer_types = hf["model_type"], hf.get("layer_types")
    none = {"sliding_window": 0, "sliding_layers": ()}
    layers = hf["num_hidden_layers"] if type(hf.get("num_hidden_layers")) is int else 0
    if model_type not in ("mistral", "phi3", "qwen2", "qwen3"):  # Llama, OLMo 2, Granite: none; OLMo 3, SmolLM3: theirs
        return none
    if layer_types is not None:
        _check_layer_types(layer_types)
    marked = None if layer_types is None else tuple(i for i, kind in enumerate(layer_types) if kind == "sliding_attention")
    if model_type in ("mistral", "phi3"):
        window = hf.get("sliding_window", DEFAULT_SLIDING_WINDOW if model_type == "mistral" else None)
        if window is not None and marked is not None and len(marked) != layers:
            full = [i for i in range(layers) if i not in marked]
            model_class = {"mistral": "MistralForCausalLM", "phi3": "Phi3ForCausalLM"}[model_type]
            raise ModelLoadError(f"layer_types marks layers {full[:8]} full_attention, but transformers' "
                                 f"{model_class} ignores layer_types (its sliding_window applies to every layer); "
                                 "remove layer_types or set sliding_window to null")
        sliding = tuple(range(layers)) if window is not None else ()
    else:  # qwen2, qwen3
        window = hf.get("sliding_window", DEFAULT_SLIDING_WINDOW) if hf.get("use_sliding_window") else None
        if marked is not None:
            if marked and window is None:
                raise ModelLoadError(f"layer_types marks layers {list(marked)} sliding_attention but the config has "
                                     "no window (use_sliding_window false or sliding_window null), so transformers "
                                     "cannot run it; set use_sliding_window and sliding_window, or drop layer_types")
            sliding = marked
        else:
            first = hf.get("max_window_layers", QWEN2_MAX_WINDOW_LAYERS)
            first = first if type(first) is int else QWEN2_MAX_WINDOW_LAYERS
            sliding = tuple(range(first, layers)) if window is not None else ()
    if not sliding:
        return none
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ModelLoadError(f"sliding_window is {shown(window)}; it must be a whole number >= 1 or null")
    return {"sliding_window": window, "sliding_layers": sliding}


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
