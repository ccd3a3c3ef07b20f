"""`docscore convert --hf SRC --out DST`: a Hugging Face model directory (config.json, tokenizer.json,
*.safetensors) -> a docscore model directory, for the BERT (BERT, RoBERTa, XLM-RoBERTa, CamemBERT, DistilBERT, MPNet), ModernBERT,
rotary BERT (NomicBERT, GTE), T5
(T5, mT5: the encoder), GPT-2 and Llama (Llama, Mistral, Qwen2, Qwen3, Phi-3/Phi-4, Gemma 2, Gemma 3, the text model of Gemma 3's
multimodal release, OLMo 2, OLMo 3, Granite, SmolLM3; EuroBERT, an encoder) families.

Holds the name mapping from Hugging Face tensors to our parameter tree (the command's flags: pipeline/convert.py).
Reads safetensors only (never pickle); must not run models.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable

import numpy as np
from safetensors import safe_open

from models.architecture import check_param_shapes
from models.config import (DENSE_ACTIVATIONS, LLAMA_ENCODERS, MAX_SIZES, Dense, ModelConfig,
                           read_config, with_checkpoint_head)
from models.errors import ModelLoadError
from models.checkpoint import stored_shapes
from models.model_dir import CONFIG, METADATA, PARAMS, ModelMetadata, check_new_dir, write_model_dir
from models.tokenizer import MIN_SEQ_LEN, DocTokenizer

# Tensors of task heads and buffers that carry no encoder/decoder weights.
IGNORED_PREFIXES = ("pooler.", "cls.", "classifier.", "qa_outputs.", "lm_head.",
                    "pre_classifier.", "vocab_transform.", "vocab_layer_norm.", "vocab_projector.")  # DistilBERT's heads
IGNORED_SUFFIXES = ("position_ids", "attn.bias", "attn.masked_bias", "rotary_emb.inv_freq")


class TensorSource:
    """The tensors of a Hugging Face checkpoint, taken one by one so leftovers can be reported."""

    def __init__(self, tensors: dict[str, np.ndarray], where: str, prefix: str):
        self.tensors, self.where, self.prefix = tensors, where, prefix
        self.taken: set[str] = set()

    def take(self, name: str) -> np.ndarray:
        key = self.prefix + name
        if key not in self.tensors:
            raise ModelLoadError(f"{self.where}: tensor {key!r} is missing; is this the checkpoint that "
                                 "belongs to config.json?")
        self.taken.add(key)
        return self.tensors[key]

    def linear(self, name: str, transpose: bool = True) -> dict[str, np.ndarray]:
        """A torch Linear ([out, in], transposed) or GPT-2 Conv1D ([in, out]) as {kernel, bias}."""
        weight = self.take(f"{name}.weight")
        return {"kernel": weight.T if transpose else weight, "bias": self.take(f"{name}.bias")}

    def norm(self, name: str) -> dict[str, np.ndarray]:
        if self.prefix + f"{name}.gamma" in self.tensors:  # original BERT checkpoints
            return {"scale": self.take(f"{name}.gamma"), "bias": self.take(f"{name}.beta")}
        return {"scale": self.take(f"{name}.weight"), "bias": self.take(f"{name}.bias")}

    def check_all_used(self, task_heads: list[str] = ()) -> None:
        """Every tensor was taken or is one docscore leaves out; `task_heads` (config.json's architectures with
        a head docscore does not compute) explain leftovers."""
        left = [k for k in self.tensors if k not in self.taken and not k.endswith(IGNORED_SUFFIXES)
                and not k[len(self.prefix):].startswith(IGNORED_PREFIXES) and not k.startswith(IGNORED_PREFIXES)]
        if left:
            why = (f"config.json names {', '.join(task_heads)}, a task head docscore does not compute; convert the "
                   "base model's checkpoint" if task_heads else "is this the checkpoint that belongs to config.json?")
            raise ModelLoadError(f"{self.where}: tensors {sorted(left)[:5]} have no place in the model; {why}")


def bert_embeddings(src: TensorSource) -> dict[str, Any]:
    """The word and position tables and LayerNorm every BERT-family checkpoint names alike (BERT's token types aside)."""
    return {"word": {"embedding": src.take("embeddings.word_embeddings.weight")},
            "position": {"embedding": src.take("embeddings.position_embeddings.weight")},
            "norm": src.norm("embeddings.LayerNorm")}


def bert_params(src: TensorSource, config: ModelConfig) -> dict[str, Any]:
    """Hugging Face BertModel (and RobertaModel, XLMRobertaModel: the same names) -> our BertEncoder tree."""
    def layer(i: int) -> dict[str, Any]:
        p = f"encoder.layer.{i}."
        return {
            "attention": {"query": src.linear(p + "attention.self.query"), "key": src.linear(p + "attention.self.key"),
                          "value": src.linear(p + "attention.self.value"),
                          "output": src.linear(p + "attention.output.dense")},
            "attention_norm": src.norm(p + "attention.output.LayerNorm"),
            "feed_forward": {"up": src.linear(p + "intermediate.dense"), "down": src.linear(p + "output.dense")},
            "output_norm": src.norm(p + "output.LayerNorm"),
        }
    return {
        "embeddings": {**bert_embeddings(src),
                       "token_type": {"embedding": src.take("embeddings.token_type_embeddings.weight")}},
        "layers": {i: layer(i) for i in range(config.num_layers)},
    }


def distilbert_params(src: TensorSource, config: ModelConfig) -> dict[str, Any]:
    """Hugging Face DistilBertModel names -> our BertEncoder tree (no token types)."""
    def layer(i: int) -> dict[str, Any]:
        p = f"transformer.layer.{i}."
        return {
            "attention": {"query": src.linear(p + "attention.q_lin"), "key": src.linear(p + "attention.k_lin"),
                          "value": src.linear(p + "attention.v_lin"), "output": src.linear(p + "attention.out_lin")},
            "attention_norm": src.norm(p + "sa_layer_norm"),
            "feed_forward": {"up": src.linear(p + "ffn.lin1"), "down": src.linear(p + "ffn.lin2")},
            "output_norm": src.norm(p + "output_layer_norm"),
        }
    return {
        "embeddings": bert_embeddings(src),
        "layers": {i: layer(i) for i in range(config.num_layers)},
    }


def mpnet_params(src: TensorSource, config: ModelConfig) -> dict[str, Any]:
    """Hugging Face MPNetModel names -> our BertEncoder tree (no token types; the encoder's relative_attention_bias,
    one table for every layer). Its pooler, unused by sentence-transformers' pooling, is left out as BERT's."""
    def layer(i: int) -> dict[str, Any]:
        p = f"encoder.layer.{i}."
        return {
            "attention": {"query": src.linear(p + "attention.attn.q"), "key": src.linear(p + "attention.attn.k"),
                          "value": src.linear(p + "attention.attn.v"), "output": src.linear(p + "attention.attn.o")},
            "attention_norm": src.norm(p + "attention.LayerNorm"),
            "feed_forward": {"up": src.linear(p + "intermediate.dense"), "down": src.linear(p + "output.dense")},
            "output_norm": src.norm(p + "output.LayerNorm"),
        }
    return {
        "embeddings": bert_embeddings(src),
        "layers": {i: layer(i) for i in range(config.num_layers)},
        "relative_attention_bias": {"embedding": src.take("encoder.relative_attention_bias.weight")},
    }


def gpt2_params(src: TensorSource, config: ModelConfig) -> dict[str, Any]:
    """Hugging Face GPT2Model names -> our GPT2Decoder tree (fused c_attn split into q, k, v)."""
    def layer(i: int) -> dict[str, Any]:
        p = f"h.{i}."
        qkv = src.linear(p + "attn.c_attn", transpose=False)
        kernels, biases = np.split(qkv["kernel"], 3, axis=1), np.split(qkv["bias"], 3)
        return {
            "attention_norm": src.norm(p + "ln_1"),
            "attention": {"query": {"kernel": kernels[0], "bias": biases[0]},
                          "key": {"kernel": kernels[1], "bias": biases[1]},
                          "value": {"kernel": kernels[2], "bias": biases[2]},
                          "output": src.linear(p + "attn.c_proj", transpose=False)},
            "feed_forward_norm": src.norm(p + "ln_2"),
            "feed_forward": {"up": src.linear(p + "mlp.c_fc", transpose=False),
                             "down": src.linear(p + "mlp.c_proj", transpose=False)},
        }
    params = {
        "token_embedding": {"embedding": src.take("wte.weight")},
        "position_embedding": {"embedding": src.take("wpe.weight")},
        "layers": {i: layer(i) for i in range(config.num_layers)},
        "final_norm": src.norm("ln_f"),
    }
    head = src.tensors.get("lm_head.weight")
    if head is not None and not np.array_equal(head, params["token_embedding"]["embedding"]):
        raise ModelLoadError(f"{src.where}: lm_head.weight differs from wte.weight; only GPT-2 models with "
                             "the output head tied to the token embedding are supported")
    return params


# LlamaBlock's norms -> their Hugging Face names: Llama's two, Gemma 3's four (its post_attention_layernorm
# normalises the attention's output, where Llama's is the norm before the MLP)
LLAMA_NORMS = {"attention_norm": "input_layernorm", "feed_forward_norm": "post_attention_layernorm"}
GEMMA3_NORMS = {"attention_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
                "feed_forward_norm": "pre_feedforward_layernorm", "post_feed_forward_norm": "post_feedforward_layernorm"}
# OLMo 2's (and 3's) two: Gemma's names for the norms after the attention and the MLP, none before them
OLMO2_NORMS = {"post_attention_norm": "post_attention_layernorm", "post_feed_forward_norm": "post_feedforward_layernorm"}


def llama_params(src: TensorSource, config: ModelConfig, norms: dict[str, str] = LLAMA_NORMS,
                 norm_offset: float = 0.0) -> dict[str, Any]:
    """Hugging Face LlamaModel / MistralModel / Qwen2Model / Qwen3Model names -> our LlamaDecoder tree; lm_head.weight
    becomes the output head unless tie_word_embeddings. A tied checkpoint whose lm_head.weight differs from the
    embedding is refused: transformers then unties them and scores with that head. `norms`: the block's norms'
    names; `norm_offset` is added to every RMSNorm weight (Gemma scales by 1 + weight)."""
    def dense(name: str, bias: bool) -> dict[str, np.ndarray]:
        weights = {"kernel": src.take(f"{name}.weight").T}
        return {**weights, "bias": src.take(f"{name}.bias")} if bias else weights

    def norm(name: str) -> dict[str, np.ndarray]:
        weight = src.take(f"{name}.weight")
        # in float32: a bfloat16 1 + w would lose w's low bits
        return {"scale": weight.astype(np.float32) + np.float32(norm_offset) if norm_offset else weight}

    def layer(i: int) -> dict[str, Any]:
        p = f"layers.{i}."
        attention = {"query": dense(p + "self_attn.q_proj", config.qkv_bias),
                     "key": dense(p + "self_attn.k_proj", config.qkv_bias),
                     "value": dense(p + "self_attn.v_proj", config.qkv_bias),
                     "output": dense(p + "self_attn.o_proj", config.output_bias)}
        if config.qk_norm:
            attention["query_norm"] = norm(p + "self_attn.q_norm")
            attention["key_norm"] = norm(p + "self_attn.k_norm")
        return {
            **{ours: norm(p + theirs) for ours, theirs in norms.items()},
            "attention": attention,
            "feed_forward": {name: dense(p + f"mlp.{name}_proj", config.mlp_bias) for name in ("gate", "up", "down")},
        }
    params = {
        "token_embedding": {"embedding": src.take("embed_tokens.weight")},
        "layers": {i: layer(i) for i in range(config.num_layers)},
        "final_norm": norm("norm"),
    }
    if not config.tie_word_embeddings and config.lm_head:
        head = src.tensors.get("lm_head.weight")
        if head is None:
            raise ModelLoadError(f"{src.where}: tensor 'lm_head.weight' is missing and tie_word_embeddings is "
                                 "false; docscore scores with the causal-LM head (save the *ForCausalLM model), or "
                                 "embeds without one when the directory is a sentence-transformers model with a "
                                 "Pooling module")
        src.taken.add("lm_head.weight")
        params["lm_head"] = {"kernel": head.T}
    elif config.tie_word_embeddings:
        head = src.tensors.get("lm_head.weight")
        if head is not None and not np.array_equal(head, params["token_embedding"]["embedding"]):
            raise ModelLoadError(f"{src.where}: lm_head.weight differs from embed_tokens.weight although config.json "
                                 "sets tie_word_embeddings true (transformers then scores with lm_head); set "
                                 "tie_word_embeddings false in config.json to convert the checkpoint's own head")
    return params


def gemma3_params(src: TensorSource, config: ModelConfig) -> dict[str, Any]:
    """Gemma3ForCausalLM / Gemma3TextModel (and Gemma2ForCausalLM / Gemma2Model: the same names without q_norm and
    k_norm, which config.qk_norm leaves out) names -> our LlamaDecoder tree: Llama's, with four norms a block, each
    RMSNorm's weight w stored as the 1 + w it scales by."""
    return llama_params(src, config, norms=GEMMA3_NORMS, norm_offset=1.0)


def olmo2_params(src: TensorSource, config: ModelConfig) -> dict[str, Any]:
    """Olmo2ForCausalLM / Olmo2Model (and Olmo3's: the same names) -> our LlamaDecoder tree: Llama's, with a block's
    two norms after its attention and MLP and its q_norm / k_norm over all heads ([heads x head_dim] wide)."""
    return llama_params(src, config, norms=OLMO2_NORMS)


def phi3_params(src: TensorSource, config: ModelConfig) -> dict[str, Any]:
    """Phi3ForCausalLM / Phi3Model names -> our LlamaDecoder tree: each layer's fused self_attn.qkv_proj split into
    q_proj, k_proj and v_proj (rows: heads x head_dim, then kv_heads x head_dim twice, as transformers slices them)
    and mlp.gate_up_proj into gate_proj (its first half, the activated one: transformers' chunk(2)) and up_proj,
    then read as Llama's."""
    query, kv, inner = config.num_heads * config.head_dim, config.kv_heads * config.head_dim, config.intermediate_size
    for i in range(config.num_layers):
        for fused, rows in ((f"layers.{i}.self_attn.qkv_proj.weight", {"q": query, "k": kv, "v": kv}),
                            (f"layers.{i}.mlp.gate_up_proj.weight", {"gate": inner, "up": inner})):
            weight, module = src.take(fused), fused.rsplit(".", 2)[0]
            if weight.ndim != 2 or weight.shape[0] != sum(rows.values()):
                raise ModelLoadError(f"{src.where}: tensor {src.prefix + fused!r} has shape {list(weight.shape)}, but "
                                     f"config.json's sizes make it {sum(rows.values())} rows; is this the checkpoint "
                                     "that belongs to config.json?")
            # the parts under Llama's names, for llama_params to take (numpy views: nothing is copied)
            parts = dict(zip((f"{src.prefix}{module}.{part}_proj.weight" for part in rows),
                             np.split(weight, np.cumsum(list(rows.values()))[:-1])))
            both = [name for name in parts if name in src.tensors]
            if both:
                raise ModelLoadError(f"{src.where}: holds both {src.prefix + fused!r} and {both[0]!r}; a Phi-3 "
                                     "checkpoint holds the fused tensor only")
            src.tensors.update(parts)
    return llama_params(src, config)


# ModernBertForMaskedLM's prediction head and decoder (tied to the embedding), and the prediction head the
# classification models put before their classifier: at the checkpoint's root, beside the model under "model."
MODERNBERT_HEADS = ("head.", "decoder.")


def modernbert_params(src: TensorSource, config: ModelConfig) -> dict[str, Any]:
    """Hugging Face ModernBertModel names -> our ModernBertEncoder tree: the fused Wqkv split into q, k, v (rows
    [q; k; v], each heads x head_dim, as transformers views them), the MLP's Wi into its activated half (our
    gate: transformers' `input`, the first half) and the half it multiplies (our up: its `gate`); LayerNorms
    without bias unless norm_bias; no attention norm in layer 0."""
    def dense(name: str, bias: bool) -> dict[str, np.ndarray]:
        weights = {"kernel": src.take(f"{name}.weight").T}
        return {**weights, "bias": src.take(f"{name}.bias")} if bias else weights

    def norm(name: str) -> dict[str, np.ndarray]:
        scale = {"scale": src.take(f"{name}.weight")}
        return {**scale, "bias": src.take(f"{name}.bias")} if config.norm_bias else scale

    def split(params: dict[str, np.ndarray], parts: int) -> list[dict[str, np.ndarray]]:
        kernels = np.split(params["kernel"], parts, axis=1)
        biases = np.split(params["bias"], parts) if "bias" in params else [None] * parts
        return [{"kernel": k} if b is None else {"kernel": k, "bias": b} for k, b in zip(kernels, biases)]

    def layer(i: int) -> dict[str, Any]:
        p = f"layers.{i}."
        query, key, value = split(dense(p + "attn.Wqkv", config.qkv_bias), 3)
        gate, up = split(dense(p + "mlp.Wi", config.mlp_bias), 2)
        block = {
            "attention": {"query": query, "key": key, "value": value, "output": dense(p + "attn.Wo", config.output_bias)},
            "feed_forward_norm": norm(p + "mlp_norm"),
            "feed_forward": {"gate": gate, "up": up, "down": dense(p + "mlp.Wo", config.mlp_bias)},
        }
        return {"attention_norm": norm(p + "attn_norm"), **block} if i else block

    params = {
        "embeddings": {"word": {"embedding": src.take("embeddings.tok_embeddings.weight")},
                       "norm": norm("embeddings.norm")},
        "layers": {i: layer(i) for i in range(config.num_layers)},
        "final_norm": norm("final_norm"),
    }
    src.taken.update(k for k in src.tensors if k.startswith(MODERNBERT_HEADS))  # heads docscore does not compute
    return params


def t5_params(src: TensorSource, config: ModelConfig) -> dict[str, Any]:
    """Hugging Face T5EncoderModel names (the encoder of T5Model and T5ForConditionalGeneration too, whose decoder
    read_safetensors leaves out: SEQ2SEQ_DECODERS) -> our T5Encoder tree: block i's layer.0 (norm, attention) and
    layer.1 (norm, DenseReluDense: wi, or the gated wi_0 and wi_1, then wo), none with a bias; block 0's
    relative_attention_bias, which transformers shares with every later block; the final norm. The token table is
    encoder.embed_tokens.weight where the checkpoint holds one (transformers then unties it from shared.weight), else
    shared.weight."""
    def linear(name: str) -> dict[str, np.ndarray]:
        return {"kernel": src.take(f"{name}.weight").T}

    def layer(i: int) -> dict[str, Any]:
        p = f"encoder.block.{i}.layer."
        mlp = p + "1.DenseReluDense."
        feed_forward = ({"gate": linear(mlp + "wi_0"), "up": linear(mlp + "wi_1"), "down": linear(mlp + "wo")}
                        if config.gated_feed_forward else {"up": linear(mlp + "wi"), "down": linear(mlp + "wo")})
        return {
            "attention_norm": {"scale": src.take(p + "0.layer_norm.weight")},
            "attention": {ours: linear(p + f"0.SelfAttention.{theirs}")
                          for ours, theirs in (("query", "q"), ("key", "k"), ("value", "v"), ("output", "o"))},
            "feed_forward_norm": {"scale": src.take(p + "1.layer_norm.weight")},
            "feed_forward": feed_forward,
        }
    own = src.prefix + "encoder.embed_tokens.weight" in src.tensors
    if own and src.prefix + "shared.weight" in src.tensors:
        src.taken.add(src.prefix + "shared.weight")  # the decoder's and head's table, which docscore does not compute
    return {
        "token_embedding": {"embedding": src.take("encoder.embed_tokens.weight" if own else "shared.weight")},
        "relative_attention_bias": {"embedding": src.take("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight")},
        "layers": {i: layer(i) for i in range(config.num_layers)},
        "final_norm": {"scale": src.take("encoder.final_layer_norm.weight")},
    }


# The original (remote-code) checkpoints' tensor names -> transformers 5.24's, as its conversion_mapping.py renames
# them on load ("nomic_bert", "gte": substrings replaced in this order; GTE's "new." prefix is a prefix of FAMILY_PARAMS)
ORIGINAL_NAMES = {
    "nomic_bert": (("encoder.layers.", "layers."), ("emb_ln.", "embeddings.LayerNorm."),
                   ("attn.out_proj.", "self_attn.o_proj."), ("mlp.fc11.", "mlp.up_proj."),
                   ("mlp.fc12.", "mlp.gate_proj."), ("mlp.fc2.", "mlp.down_proj."),
                   ("norm1.", "post_attention_layernorm."), ("norm2.", "post_mlp_layernorm.")),
    "gte": (("encoder.layer.", "layers."), ("attention.o_proj.", "self_attn.o_proj."),
            ("attn_ln.", "post_attention_layernorm."), ("mlp_ln.", "post_mlp_layernorm.")),
}
# ... and their fused projections, split by rows into equal parts in this order (transformers' Chunk(dim=0))
ORIGINAL_FUSED = {
    "nomic_bert": {"attn.Wqkv.": ("self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj.")},
    "gte": {"attention.qkv_proj.": ("self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj."),
            "mlp.up_gate_proj.": ("mlp.up_proj.", "mlp.gate_proj.")},
}


def native_rotary_bert_names(src: TensorSource, model_type: str) -> None:
    """src's tensors under transformers' NomicBertModel / GteModel names, where the checkpoint holds the original
    code's (ORIGINAL_NAMES, ORIGINAL_FUSED: the fused ones split, as numpy views); a checkpoint holding one tensor
    under both names is refused."""
    kind = "nomic_bert" if model_type == "nomic_bert" else "gte"  # "new" is GTE's
    names, fused = ORIGINAL_NAMES[kind], ORIGINAL_FUSED[kind]
    for key in [key for key in src.tensors if key.startswith(src.prefix)]:
        name = key[len(src.prefix):]
        for before, after in names:
            name = name.replace(before, after)
        parts = {name: src.tensors[key]}
        for whole, pieces in fused.items():
            if whole in name:
                tensor = src.tensors[key]
                if tensor.shape[0] % len(pieces):
                    raise ModelLoadError(f"{src.where}: tensor {key!r} has {tensor.shape[0]} rows, which do not "
                                         f"split into {len(pieces)} equal parts; is this the checkpoint that belongs "
                                         "to config.json?")
                parts = dict(zip((name.replace(whole, piece) for piece in pieces), np.split(tensor, len(pieces))))
        if list(parts) == [name] and name == key[len(src.prefix):]:
            continue
        both = [new for new in parts if src.prefix + new in src.tensors]
        if both:
            raise ModelLoadError(f"{src.where}: holds both {key!r} and {src.prefix + both[0]!r}, one tensor under "
                                 "the original code's name and transformers'; save the model again with "
                                 "save_pretrained")
        src.tensors.update({src.prefix + new: tensor for new, tensor in parts.items()})
        src.taken.add(key)


def rotary_bert_params(src: TensorSource, config: ModelConfig) -> dict[str, Any]:
    """Hugging Face NomicBertModel / GteModel names (or the original code's: native_rotary_bert_names) -> our
    RotaryBertEncoder tree: q/k/v/o and the MLP's gate, up and down, biased as config says (GTE: all but gate and
    up), the two LayerNorms after the attention and the MLP."""
    native_rotary_bert_names(src, config.model_type)

    def dense(name: str, bias: bool) -> dict[str, np.ndarray]:
        weights = {"kernel": src.take(f"{name}.weight").T}
        return {**weights, "bias": src.take(f"{name}.bias")} if bias else weights

    def layer(i: int) -> dict[str, Any]:
        p = f"layers.{i}."
        return {
            "attention": {ours: dense(p + f"self_attn.{theirs}_proj", config.output_bias if theirs == "o" else
                                      config.qkv_bias)
                          for ours, theirs in (("query", "q"), ("key", "k"), ("value", "v"), ("output", "o"))},
            "attention_norm": src.norm(p + "post_attention_layernorm"),
            "feed_forward": {"gate": dense(p + "mlp.gate_proj", config.mlp_bias),
                             "up": dense(p + "mlp.up_proj", config.mlp_bias),
                             "down": dense(p + "mlp.down_proj", config.mlp_output_bias)},
            "output_norm": src.norm(p + "post_mlp_layernorm"),
        }
    embeddings = {"word": {"embedding": src.take("embeddings.word_embeddings.weight")},
                  "norm": src.norm("embeddings.LayerNorm")}
    if config.type_vocab_size:
        embeddings["token_type"] = {"embedding": src.take("embeddings.token_type_embeddings.weight")}
    return {"embeddings": embeddings, "layers": {i: layer(i) for i in range(config.num_layers)}}


FAMILY_PARAMS: dict[str, tuple[tuple[str, ...], Callable[[TensorSource, ModelConfig], dict[str, Any]]]] = {
    "bert": (("bert.", "roberta.", ""), bert_params),  # BertForX under "bert.", RobertaForX under "roberta.",
                                                      # the bare model at the root
    "gpt2": (("transformer.", ""), gpt2_params),   # GPT2LMHeadModel under "transformer.", GPT2Model at the root
    "llama": (("model.", ""), llama_params),        # *ForCausalLM under "model.", the bare model at the root
    "modernbert": (("model.", ""), modernbert_params),  # ModernBertForX under "model.", the bare model at the root
    # NomicBertForX under "nomic_bert.", GteForX under "gte.", the remote code's NewForX under "new."
    "rotary_bert": (("nomic_bert.", "gte.", "new.", ""), rotary_bert_params),
    "distilbert": (("distilbert.", ""), distilbert_params),  # a model_type whose names are its own (params_reader)
    "mpnet": (("mpnet.", ""), mpnet_params),  # MPNetForX under "mpnet.", the bare model at the root
    "gemma3_text": (("model.", ""), gemma3_params),
    "phi3": (("model.", ""), phi3_params),  # Phi3ForCausalLM under "model.", Phi3Model at the root
    "gemma3": (("model.language_model.",), gemma3_params),  # multimodal_text_tensors' names
    "gemma2": (("model.", ""), gemma3_params),
    "olmo2": (("model.", ""), olmo2_params),
    "olmo3": (("model.", ""), olmo2_params),
    "t5": (("",), t5_params),  # T5EncoderModel, T5Model and T5ForConditionalGeneration at the root
}
# A tensor every checkpoint of the family holds, found to tell which prefix the checkpoint uses.
MARKERS = {"bert": "embeddings.word_embeddings.weight", "gpt2": "wte.weight", "llama": "embed_tokens.weight",
           "modernbert": "embeddings.tok_embeddings.weight", "rotary_bert": "embeddings.word_embeddings.weight",
           "distilbert": "embeddings.word_embeddings.weight", "mpnet": "embeddings.word_embeddings.weight",
           "gemma3_text": "embed_tokens.weight",
           "gemma3": "embed_tokens.weight", "gemma2": "embed_tokens.weight", "phi3": "embed_tokens.weight",
           "olmo2": "embed_tokens.weight", "olmo3": "embed_tokens.weight",
           "t5": "encoder.final_layer_norm.weight"}

# Gemma3ForConditionalGeneration's text model under the names transformers 4.52-4.57 saved it with (and 5.x loads),
# each from the name transformers 4.50 saved it with (and 5.x saves again: its save writes the checkpoint's first names)
MULTIMODAL_TEXT_NAMES = {"gemma3": (("language_model.model.", "model.language_model."),
                                    ("language_model.lm_head.", "lm_head."))}
# its vision encoder, under either save's names: never read (gemma-3-27b's is 400M parameters)
MULTIMODAL_VISION_PREFIXES = {"gemma3": ("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                                         "model.multi_modal_projector.")}

# an encoder-decoder checkpoint's decoder (T5Model, T5ForConditionalGeneration: t5-base, mT5): never read, since docscore
# embeds with the encoder as sentence-transformers does (T5EncoderModel); lm_head is an IGNORED_PREFIXES head
SEQ2SEQ_DECODERS = {"t5": ("decoder.",), "mt5": ("decoder.",)}


def multimodal_text_tensors(tensors: dict[str, np.ndarray], model_type: str, where: str) -> dict[str, np.ndarray]:
    """The text model's tensors of a multimodal checkpoint (read without its vision encoder's) under one set of names,
    as transformers' conversion mapping renames them; a checkpoint holding a tensor under both names is refused."""
    renamed = {}
    for key, tensor in tensors.items():
        new = next((after + key[len(before):] for before, after in MULTIMODAL_TEXT_NAMES[model_type]
                    if key.startswith(before)), key)
        if new in renamed or (new != key and new in tensors):
            raise ModelLoadError(f"{where}: holds both {key!r} and {new!r}, one tensor under the names of two "
                                 "transformers versions; save the model again with save_pretrained")
        renamed[new] = tensor
    return renamed


def params_reader(config: ModelConfig) -> str:
    """The FAMILY_PARAMS entry of a config: its model_type's own where it has one (DistilBERT), else its family's."""
    return config.model_type if config.model_type in FAMILY_PARAMS else config.family


SAFETENSORS_INDEX = "model.safetensors.index.json"  # a sharded checkpoint's weight_map: tensor -> shard file
SAFETENSORS_FILE = "model.safetensors"


def checkpoint_files(src: str) -> list[str]:
    """The safetensors files transformers would load from `src`: model.safetensors, else the shards its index
    names, else every *.safetensors (a checkpoint saved under another name). Other files beside them (Mistral's
    consolidated.safetensors, a copy; an index a later unsharded save left behind) are not read. A shard the
    index names must be there."""
    if os.path.isfile(os.path.join(src, SAFETENSORS_FILE)):
        return [SAFETENSORS_FILE]
    index = os.path.join(src, SAFETENSORS_INDEX)
    if os.path.exists(index):
        try:
            with open(index, encoding="utf-8") as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ModelLoadError(f"{index}: not a safetensors index with a weight_map ({err}); save the model again "
                                 "with save_pretrained") from None
        missing = [f for f in files if not os.path.isfile(os.path.join(src, f))]
        if missing:
            raise ModelLoadError(f"{src}: {len(missing)} of the {len(files)} shards {SAFETENSORS_INDEX} lists are "
                                 f"missing ({', '.join(missing[:3])}); download the checkpoint again")
        return files
    return sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))


# safetensors dtypes whose tensors numpy holds (an FP8 tensor has no numpy dtype)
SAFETENSORS_DTYPES = ("F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL")


def read_safetensors(src: str, leave_out: tuple[str, ...] = ()) -> tuple[dict[str, np.ndarray], str]:
    """Every tensor of the checkpoint's files in `src` (checkpoint_files) but those whose names start with one of
    `leave_out`, as float32/int numpy arrays, and a name for errors."""
    files = checkpoint_files(src)
    if not files:
        has_pickle = any(f.endswith((".bin", ".pt", ".pth", ".ckpt")) for f in os.listdir(src))
        hint = (" (it has PyTorch pickle files, which docscore never loads: re-save with "
                "save_pretrained(dir, safe_serialization=True))" if has_pickle else "")
        if os.path.isfile(os.path.join(src, METADATA)) and os.path.isdir(os.path.join(src, PARAMS)):
            hint = " (it is a docscore model directory, converted already: pass it to `docscore run --model`)"
        raise ModelLoadError(f"{src}: no *.safetensors weights found{hint}")
    tensors = {}
    for name in files:
        path = os.path.join(src, name)
        try:
            with safe_open(path, framework="flax") as f:
                for key in f.keys():
                    if key.startswith(leave_out):
                        continue
                    dtype = f.get_slice(key).get_dtype()
                    if dtype not in SAFETENSORS_DTYPES:
                        raise ModelLoadError(f"{path}: tensor {key!r} is {dtype}; docscore reads float32, float16 and "
                                             "bfloat16 weights (and integer tensors): save the model in one of those "
                                             "(e.g. torch_dtype=torch.bfloat16)")
                    array = np.asarray(f.get_tensor(key))
                    tensors[key] = array.astype(np.float32) if array.dtype.kind == "f" or array.dtype.name == "bfloat16" else array
        except ModelLoadError:
            raise
        except Exception as err:  # safetensors raises its own SafetensorError
            raise ModelLoadError(f"{path}: cannot read safetensors ({err}); the file is corrupt or incomplete") from None
    where = os.path.join(src, files[0]) if len(files) == 1 else f"{src}/*.safetensors"
    return tensors, where


def tensor_prefix(tensors: dict[str, np.ndarray], family: str, marker: str) -> str:
    for prefix in FAMILY_PARAMS[family][0]:
        if prefix + marker in tensors:
            return prefix
    return ""


# sentence-transformers modules whose computation docscore's embeddings are, in this order: the encoder or decoder,
# mean, CLS or last-token pooling, Dense projections, L2 normalisation (docscore normalises every embedding)
SENTENCE_TRANSFORMERS_MODULES = ("Transformer", "Pooling", "Dense", "Normalize")
# the feature a sentence-transformers Dense module reads and writes by default: the pooled embedding
EMBEDDING_FEATURE = "sentence_embedding"


def read_json_file(path: str) -> Any:
    """A JSON file of the source directory; ModelLoadError naming it when it cannot be read or parsed."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError) as err:
        raise ModelLoadError(f"{path}: cannot be read ({type(err).__name__}: {err})") from None
    except (ValueError, RecursionError) as err:
        raise ModelLoadError(f"{path}: not valid JSON ({' '.join(str(err).split())[:200]})") from None


def json_object(path: str) -> dict[str, Any]:
    value = read_json_file(path)
    if not isinstance(value, dict):
        raise ModelLoadError(f"{path}: a JSON {type(value).__name__}, not an object")
    return value


def sentence_transformers_modules(src: str) -> dict[str, str]:
    """{module type's last name: its folder} from a sentence-transformers directory's modules.json (the
    usual three when there is none); refuses a module docscore does not compute (LayerNorm, ...),
    which sentence-transformers would apply after pooling."""
    listing = os.path.join(src, "modules.json")
    if not os.path.exists(listing):
        return {"Pooling": "1_Pooling"}
    modules = read_json_file(listing)
    if not isinstance(modules, list):
        raise ModelLoadError(f"{listing}: a JSON {type(modules).__name__}, not the list of modules "
                             "sentence-transformers writes")
    found = {}
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1] if isinstance(module, dict) else ""
        if kind not in SENTENCE_TRANSFORMERS_MODULES:
            raise ModelLoadError(f"{listing}: module {module!r} is not supported; docscore computes only "
                                 f"{', '.join(SENTENCE_TRANSFORMERS_MODULES)} (the model, mean, CLS or last-token pooling, Dense, "
                                 "normalisation), "
                                 "so its embeddings would differ from the sentence-transformers model's")
        found[kind] = str(module.get("path", ""))
    return found


def sentence_transformers_dense(src: str, hidden_size: int) -> tuple[list[Dense], dict[str, Any]]:
    """The Dense modules of a sentence-transformers directory, in modules.json's order (after the Pooling, before
    the Normalize), and their parameters as the models' `dense` (models/layers.py embedding_dense): each folder's
    config.json (in_features, out_features, bias, activation_function) and model.safetensors (linear.weight,
    linear.bias). ([], {}) without any."""
    listing = os.path.join(src, "modules.json")
    if not os.path.exists(listing):
        return [], {}
    modules = read_json_file(listing)  # sentence_transformers_modules has checked its shape and kinds
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    folders = [str(m.get("path", "")) for m, kind in zip(modules, kinds) if kind == "Dense"]
    if not folders:
        return [], {}
    dense_at = [i for i, kind in enumerate(kinds) if kind == "Dense"]
    if "Pooling" not in kinds or dense_at[0] < kinds.index("Pooling") or kinds[dense_at[0]:dense_at[-1] + 1] != ["Dense"] * len(dense_at) \
            or ("Normalize" in kinds and kinds.index("Normalize") < dense_at[-1]):
        raise ModelLoadError(f"{listing}: modules {kinds}: docscore computes Dense modules one after another between "
                             "the Pooling and the Normalize")
    specs, layers, width = [], {}, hidden_size
    widest = MAX_SIZES["hidden_size"]  # the widest embedding a model directory's metadata.json may record (model_dir)
    for k, folder in enumerate(folders):
        path = os.path.join(src, folder)
        config = json_object(os.path.join(path, "config.json"))
        activation = config.get("activation_function", "torch.nn.modules.activation.Tanh")  # Dense's default
        # sentence-transformers adds the input back (use_residual; projected when the widths differ, else with no
        # tensor of its own to give it away) or reads and writes other features than the sentence embedding: not
        # docscore's activation(x @ kernel + bias), so the embeddings would silently differ
        if config.get("use_residual"):
            raise ModelLoadError(f"{os.path.join(path, 'config.json')}: use_residual {json.dumps(config['use_residual'])} "
                                 "is not supported; docscore computes a Dense module as activation(x W + b), without "
                                 "the input sentence-transformers adds back")
        names = (config.get("module_input_name", EMBEDDING_FEATURE), config.get("module_output_name"))
        if names[0] != EMBEDDING_FEATURE or names[1] not in (None, EMBEDDING_FEATURE):
            raise ModelLoadError(f"{os.path.join(path, 'config.json')}: module_input_name {json.dumps(names[0])} and "
                                 f"module_output_name {json.dumps(names[1])} are not supported; docscore's Dense modules "
                                 f"read and write the pooled {EMBEDDING_FEATURE!r}")
        if activation not in DENSE_ACTIVATIONS:
            raise ModelLoadError(f"{os.path.join(path, 'config.json')}: activation_function {activation!r} is not "
                                 f"supported; docscore computes {', '.join(DENSE_ACTIVATIONS)}")
        spec = Dense(in_features=config.get("in_features"), out_features=config.get("out_features"),
                     bias=config.get("bias", True), activation=DENSE_ACTIVATIONS[activation])
        if spec.in_features != width or type(spec.out_features) is not int or not 1 <= spec.out_features <= widest \
                or type(spec.bias) is not bool:
            raise ModelLoadError(f"{os.path.join(path, 'config.json')}: in_features {spec.in_features!r}, out_features "
                                 f"{spec.out_features!r}, bias {spec.bias!r}: expected in_features {width} (the "
                                 f"embedding it receives), out_features from 1 to {widest:,} and a true or false bias")
        tensors, where = read_safetensors(path)
        source = TensorSource(tensors, where, "")
        weight = source.take("linear.weight")
        if weight.shape != (spec.out_features, spec.in_features):
            raise ModelLoadError(f"{where}: linear.weight is {list(weight.shape)}; its config.json says "
                                 f"[{spec.out_features}, {spec.in_features}]")
        linear = {"kernel": weight.T}
        if spec.bias:
            linear["bias"] = source.take("linear.bias")
        source.check_all_used()
        specs.append(spec)
        layers[k] = {"linear": linear}
        width = spec.out_features
    return specs, {"layers": layers}


def transformer_folder(src: str) -> str:
    """The folder of `src` that holds the model's own files (config.json, tokenizer, weights): the Transformer
    module's path in modules.json (an older sentence-transformers layout keeps them in 0_Transformer/), else src."""
    path = sentence_transformers_modules(src).get("Transformer", "")
    return os.path.join(src, path) if path else src


def refuse_a_module_folder(src: str) -> None:
    """`--hf MODEL/0_Transformer`: the folder converts, but without the pooling and settings its parent's
    sentence-transformers modules apply (a CLS pooling would be silently computed as mean pooling)."""
    folder = os.path.abspath(src)
    parent = os.path.dirname(folder)
    if not os.path.isfile(os.path.join(parent, "modules.json")):
        return
    path = sentence_transformers_modules(parent).get("Transformer", "")
    if path and os.path.normpath(os.path.join(parent, path)) == os.path.normpath(folder):
        raise ModelLoadError(f"{src} is the Transformer module of the sentence-transformers model {parent} (its "
                             f"modules.json): pass --hf {parent}, so that its pooling and settings are applied too")


def sentence_bert_config(src: str, model_folder: str) -> str:
    """sentence_bert_config.json: beside modules.json, or (an older layout) in the Transformer module's folder."""
    return next((path for path in (os.path.join(src, "sentence_bert_config.json"),
                                   os.path.join(model_folder, "sentence_bert_config.json")) if os.path.exists(path)),
                os.path.join(src, "sentence_bert_config.json"))


def pooling_modes(config: dict[str, Any]) -> list[str]:
    """The pooling a sentence-transformers Pooling config.json asks for: `pooling_mode` (6.x: a mode or a list of
    them, "mean", "cls", ...) or the pooling_mode_* switches earlier versions write (pooling_mode_mean_tokens)."""
    if "pooling_mode" in config:
        mode = config["pooling_mode"]
        return [mode] if isinstance(mode, str) else [str(m) for m in mode] if isinstance(mode, list) else [repr(mode)]
    return sorted(k for k, v in config.items() if k.startswith("pooling_mode_") and v)


# Each pooling docscore computes (models/heads.py POOLINGS) as the Pooling config.json spells it: sentence-transformers
# 6's pooling_mode, or the one pooling_mode_* switch set by earlier versions
POOLING_MODES = {"mean": (["mean"], ["pooling_mode_mean_tokens"]), "cls": (["cls"], ["pooling_mode_cls_token"]),
                 "lasttoken": (["lasttoken"], ["pooling_mode_lasttoken"])}
UNSET_MAX_LENGTH = 10 ** 9  # transformers writes model_max_length 1e30 when a tokenizer has none


def sentence_transformers_pooling(src: str) -> str | None:
    """The pooling (POOLINGS) of a sentence-transformers directory's Pooling module; None when it has none (a plain
    Hugging Face model). Any other mode, or several at once, is refused: its embeddings would not be the model's."""
    pooling = os.path.join(src, sentence_transformers_modules(src).get("Pooling", "1_Pooling"), "config.json")
    if not os.path.exists(pooling):
        return None
    modes = pooling_modes(json_object(pooling))
    found = next((name for name, spellings in POOLING_MODES.items() if modes in spellings), None)
    if found is None:
        raise ModelLoadError(f"{pooling}: pooling {modes} is not supported; docscore computes one pooling, mean, cls or "
                             "lasttoken (pooling_mode \"mean\", \"cls\" or \"lasttoken\"; pooling_mode_mean_tokens, "
                             "pooling_mode_cls_token or pooling_mode_lasttoken "
                             "in earlier sentence-transformers versions)")
    return found


def sentence_transformers_max_len(src: str, model_folder: str | None = None) -> tuple[int | None, str]:
    """The longest input of a sentence-transformers directory and where it was read: sentence_bert_config.json's
    max_seq_length, else (sentence-transformers 6 keeps it there) tokenizer_config.json's model_max_length."""
    sbert = sentence_bert_config(src, model_folder or src)
    length = json_object(sbert).get("max_seq_length") if os.path.exists(sbert) else None
    if length is not None and (type(length) is not int or length < 1):
        raise ModelLoadError(f"{sbert}: max_seq_length {length!r} is not a positive whole number; fix it, or remove "
                             "it and pass --max_seq_len")
    if length is not None:
        return length, f"{sbert}'s max_seq_length"
    tokenizer_config = os.path.join(model_folder or src, "tokenizer_config.json")
    if os.path.exists(os.path.join(src, "modules.json")) and os.path.exists(tokenizer_config):
        value = json_object(tokenizer_config).get("model_max_length")
        if type(value) is int and 1 <= value < UNSET_MAX_LENGTH:
            return value, f"{tokenizer_config}'s model_max_length"
    return None, ""


def sentence_transformers_prompts(src: str, pooling: str | None) -> dict[str, str]:
    """The prompts of a sentence-transformers directory (config_sentence_transformers.json) as encode_document's and
    encode_query's documentation picks them: a document's is the first of its "document", "passage" and "corpus"
    prompts, a query's its "query" prompt, each else the default_prompt_name's (as encode() applies it); empty ones
    left out (models/tokenizer.py PROMPT_ROLES). sentence-transformers 6.3 itself adds empty "document" and "query"
    prompts to every model, so its encode_document never takes "passage" (e5's) and neither method the default:
    docscore applies the model's saved prompts, as encode(text, prompt=...) given them. A mean or CLS Pooling that
    leaves the prompt's tokens out (include_prompt false: pools_prompt) is refused: docscore pools them too."""
    settings = os.path.join(src, "config_sentence_transformers.json")
    if pooling is None or not os.path.exists(settings):  # a language model embeds nothing to prompt
        return {}
    config = json_object(settings)
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise ModelLoadError(f"{settings}: prompts is not an object of prompt names to strings")
    default = config.get("default_prompt_name")
    if default and default not in prompts:
        raise ModelLoadError(f"{settings}: default_prompt_name {default!r} is not one of its prompts "
                             f"({', '.join(map(repr, prompts)) or 'none'}); name one of them, or remove it")
    fallback = prompts[default] if default else ""
    document = next((prompts[name] for name in ("document", "passage", "corpus") if name in prompts), fallback)
    found = {role: text for role, text in (("document", document), ("query", prompts.get("query", fallback))) if text}
    if found and not pools_prompt(src, pooling):
        # sentence-transformers masks the prompt's tokens (the leading specials with them) before pooling: a mean
        # over the text alone, and CLS pooling takes the first token after the prompt
        left_out = "the mean" if pooling == "mean" else "CLS pooling, which then takes the first token after it"
        raise ModelLoadError(f"{pooling_config_path(src)}: include_prompt false leaves the prompt's tokens out of "
                             f"{left_out}, which docscore does not; its embeddings would differ from the model's")
    return found


def pooling_config_path(src: str) -> str:
    """The config.json of a sentence-transformers directory's Pooling module."""
    return os.path.join(src, sentence_transformers_modules(src).get("Pooling", "1_Pooling"), "config.json")


def pools_prompt(src: str, pooling: str | None) -> bool:
    """Whether a prompt's tokens count in the pooling as docscore computes it: false only where the Pooling module
    says include_prompt false for a mean or CLS pooling (the last token is never the prompt's)."""
    if pooling not in ("mean", "cls"):
        return True
    path = pooling_config_path(src)
    return not (os.path.exists(path) and json_object(path).get("include_prompt") is False)


def with_sentence_transformers_text_rules(src: str, tokenizer_text: str, model_folder: str | None = None) -> str:
    """tokenizer.json with what sentence-transformers does to a text before its tokenizer: do_lower_case
    (sentence_bert_config.json) becomes a Lowercase normalizer ahead of the tokenizer's own (its prompts are read
    by sentence_transformers_prompts)."""
    sbert = sentence_bert_config(src, model_folder or src)
    if not os.path.exists(sbert) or not json_object(sbert).get("do_lower_case"):
        return tokenizer_text
    from tokenizers import Tokenizer, normalizers

    tokenizer = Tokenizer.from_str(tokenizer_text)
    own = tokenizer.normalizer
    tokenizer.normalizer = normalizers.Lowercase() if own is None else normalizers.Sequence([normalizers.Lowercase(), own])
    return tokenizer.to_str()


def without_unembedded_special_tokens(tokenizer_text: str, vocab_size: int) -> str:
    """tokenizer.json without the added special tokens whose ids the model has no embedding row for: every Gemma 3
    tokenizer holds <image_soft_token> at id 262,144, past the text models' 262,144 rows (gemma-3-1b, gemma-3-270m,
    EmbeddingGemma). A control token, it is never meant in a document; left in, a text spelling it out would reach
    the model as an id past its table (transformers fails there), so it is dropped and such text is tokenised as
    text. Other ids past the table (in the tokenizer's own vocabulary, or added tokens that are not special) are
    left for DocTokenizer.check_vocab to refuse."""
    from tokenizers import Tokenizer

    try:
        data = json.loads(tokenizer_text)
        added = data.get("added_tokens") or []
        own = Tokenizer.from_str(tokenizer_text).get_vocab(with_added_tokens=False)
    except Exception:  # not a tokenizer.json (tokenizers raises plain Exception): DocTokenizer.from_str says why
        return tokenizer_text
    if not isinstance(added, list):
        return tokenizer_text
    kept = [t for t in added if not (isinstance(t, dict) and t.get("special") is True and isinstance(t.get("id"), int)
                                     and t["id"] >= vocab_size and t.get("content") not in own)]
    if len(kept) == len(added):
        return tokenizer_text
    # tokenizers numbers the added tokens outside its vocabulary in order, whatever ids the file gives: dropping one
    # ahead of another would renumber it, so only the last ones are dropped
    first_dropped = min(t["id"] for t in added if t not in kept)
    if any(isinstance(t, dict) and t.get("content") not in own and (t.get("id") or 0) > first_dropped for t in kept):
        return tokenizer_text
    data["added_tokens"] = kept
    return json.dumps(data, ensure_ascii=False, indent=2)


def dropped_special_tokens(src: str, dst: str) -> str | None:
    """What convert says of the added special tokens the converted `dst` left out of `src`'s tokenizer.json
    (without_unembedded_special_tokens), or None when it kept them all."""
    def added(path: str) -> list[str]:
        tokens = read_json_file(os.path.join(path, "tokenizer.json")).get("added_tokens") or []
        return [t.get("content") for t in tokens if isinstance(t, dict)]

    kept = set(added(dst))
    dropped = [token for token in added(transformer_folder(src)) if token not in kept]
    if not dropped:
        return None
    return (f"the tokenizer's special token{'s' if len(dropped) > 1 else ''} {', '.join(dropped)} "
            f"{'were' if len(dropped) > 1 else 'was'} left out: past the model's embedding table (Gemma 3's "
            "<image_soft_token> is, in its text models), so a text spelling one out is tokenised as text")


# architectures whose weights are the encoder or decoder docscore computes (a task head on top is left out); Gemma 3's
# multimodal ForConditionalGeneration is its text model's language-model head over a vision encoder (dropped_vision)
BASE_ARCHITECTURE_ENDINGS = ("Model", "ForMaskedLM", "ForCausalLM", "LMHeadModel", "ForPreTraining",
                             "ForConditionalGeneration")


def task_heads(config: dict[str, Any]) -> list[str]:
    """The architectures of config.json that put a task head on the base model (BertForSequenceClassification)."""
    architectures = config.get("architectures") or []
    return [a for a in architectures if isinstance(a, str) and not a.endswith(BASE_ARCHITECTURE_ENDINGS)]


def dropped_head(src: str) -> str | None:
    """What a converted model leaves out when config.json names a task head: docscore computes the base
    model's embeddings, so `--task classify` is zero-shot, not the trained head."""
    heads = task_heads(json_object(os.path.join(src, "config.json")))
    if not heads:
        return None
    return (f"{', '.join(heads)}'s task head was not converted: docscore computes the base model (an encoder's embeddings, "
            "a decoder's token log-probabilities), and --task classify scores labels zero-shot by similarity, not with "
            "the trained head")


def architecture_names(config: dict) -> str:
    """config.json's architectures as convert's notes name the model (its model_type when it lists none)."""
    return ", ".join(a for a in config.get("architectures") or [] if isinstance(a, str)) or config["model_type"]


def holds_tensors(src: str, prefixes: tuple[str, ...]) -> bool:
    """Whether any checkpoint file of `src` holds a tensor whose name starts with one of `prefixes`."""
    for name in checkpoint_files(src):
        with safe_open(os.path.join(src, name), framework="flax") as f:
            if any(key.startswith(prefixes) for key in f.keys()):
                return True
    return False


def dropped_vision(src: str) -> str | None:
    """What convert says of a multimodal checkpoint (model_type gemma3), whose text model alone it converts; None for
    any other."""
    config = json_object(os.path.join(src, "config.json"))
    if config.get("model_type") not in MULTIMODAL_VISION_PREFIXES:
        return None
    names = architecture_names(config)
    return (f"{names} is a multimodal model: its text model was converted (scoring text as transformers does without "
            "pixel_values) and its vision encoder (vision_tower, multi_modal_projector) left out, so docscore reads text, "
            "not images")


def dropped_decoder(src: str) -> str | None:
    """What convert says of an encoder-decoder checkpoint (T5's) whose encoder alone it converted; None when the
    checkpoint holds no decoder (T5EncoderModel, as sentence-transformers saves a T5) or is no such model."""
    config = json_object(os.path.join(src, "config.json"))
    prefixes = SEQ2SEQ_DECODERS.get(config.get("model_type")) if isinstance(config.get("model_type"), str) else None
    if not prefixes:
        return None
    if not holds_tensors(src, prefixes):
        return None
    names = architecture_names(config)
    return (f"{names} is an encoder-decoder model: its encoder was converted (what sentence-transformers embeds with, "
            "T5EncoderModel) and its decoder (decoder.*, lm_head) left out, so docscore embeds text with it; it "
            "generates and scores no tokens")


def dropped_masked_lm_head(src: str) -> str | None:
    """What convert says of a Llama-family encoder's checkpoint (EuroBertForMaskedLM's) holding a masked-LM head,
    which it does not read; None for any other."""
    config = json_object(os.path.join(src, "config.json"))
    if config.get("model_type") not in LLAMA_ENCODERS:
        return None
    if not holds_tensors(src, ("lm_head.",)):
        return None
    names = architecture_names(config)
    return (f"{names}'s masked-LM head (lm_head) was not converted: {config['model_type']} is an encoder, converted as "
            "an embedder: --task embed, similarity and classify take it; loglik and choice refuse it")


def embedder_only(dst: str, metadata: ModelMetadata) -> str | None:
    """What convert says of a decoder embedder it wrote without a language-model head (its checkpoint had no untied
    lm_head.weight: with_checkpoint_head); None for any other model directory (an encoder's, EuroBERT's too: it never
    has one)."""
    if not metadata.pooling:
        return None
    path = os.path.join(dst, CONFIG)
    with open(path, encoding="utf-8") as f:
        config = read_config(path, f.read())
    if config.is_encoder:
        return None
    if with_checkpoint_head(config, "lm_head/kernel" in stored_shapes(os.path.join(dst, PARAMS)), metadata.pooling).lm_head:
        return None
    return ("the checkpoint has no lm_head.weight (a decoder embedder saved as its base model), so the model converted "
            "as an embedder only: --task embed, similarity and classify take it; loglik and choice refuse it")


def plain_pooling(config: ModelConfig) -> str | None:
    """The pooling of a directory without a sentence-transformers Pooling: an encoder's mean (a Llama-family encoder's,
    EuroBERT's, too), a decoder's none (a language model)."""
    return "mean" if config.is_encoder else None


def convert_hf_dir(src: str, dst: str, *, max_seq_len: int | None = None, source: str | None = None,
                   exist_ok: bool = False) -> ModelMetadata:
    """Convert the Hugging Face directory `src` into the docscore model directory `dst` (atomic)."""
    if not os.path.isdir(src):
        raise ModelLoadError(f"{src}: not a directory; --hf takes a Hugging Face model directory "
                             "(config.json, tokenizer.json, *.safetensors)")
    if os.path.abspath(dst) == os.path.abspath(src):
        raise ModelLoadError(f"--out {dst}: the --hf directory itself; convert into a new directory, e.g. "
                             f"--out {os.path.normpath(dst)}-docscore")
    if not exist_ok:  # before reading gigabytes of weights
        check_new_dir(dst)
    refuse_a_module_folder(src)
    root, src = src, transformer_folder(src)  # the model's files; the sentence-transformers settings stay at root
    texts = {}
    for name in ("config.json", "tokenizer.json"):
        path = os.path.join(src, name)
        try:
            if not os.path.isfile(path) and os.path.exists(path):  # a FIFO would wait for a writer forever
                raise IsADirectoryError("not a regular file")
            with open(path, encoding="utf-8") as f:
                texts[name] = f.read()
        except FileNotFoundError:
            fix = ("save a fast tokenizer with tokenizer.save_pretrained(dir)" if name == "tokenizer.json"
                   else "save the model with save_pretrained(dir)")
            raise ModelLoadError(f"{path}: missing; {fix}") from None
        except (OSError, UnicodeDecodeError) as err:
            raise ModelLoadError(f"{path}: cannot be read as UTF-8 text ({type(err).__name__}: {err})") from None
    config = read_config(os.path.join(src, "config.json"), texts["config.json"])
    # also refuses modules it cannot compute; a plain Hugging Face encoder (EuroBERT too) is mean-pooled, a decoder
    # embeds nothing
    pooling = sentence_transformers_pooling(root) or plain_pooling(config)
    if pooling is None and config.bidirectional:
        # attending both ways it scores no tokens, and without a pooling it embeds nothing: no task could run it
        key = "use_bidirectional_attention true" if config.model_type == "gemma3_text" else "is_causal false"
        raise ModelLoadError(f"{os.path.join(src, 'config.json')}: {key} makes this {config.model_type} attend both "
                             "ways, so it scores no tokens (loglik, choice), and the directory has no sentence-transformers "
                             "Pooling (modules.json, 1_Pooling/config.json) to embed with; convert the "
                             "sentence-transformers directory it belongs to")
    st_len, st_origin = sentence_transformers_max_len(root, src)
    if st_origin.endswith("model_max_length") and st_len > config.max_positions:
        st_len = config.max_positions  # as sentence-transformers caps a tokenizer's length at the model's positions
    texts["tokenizer.json"] = with_sentence_transformers_text_rules(root, texts["tokenizer.json"], src)
    texts["tokenizer.json"] = without_unembedded_special_tokens(texts["tokenizer.json"], config.vocab_size)
    seq_len = next(n for n in (max_seq_len, st_len, config.default_seq_len) if n is not None)
    if not MIN_SEQ_LEN <= seq_len <= config.max_positions:
        origin = ("--max_seq_len" if max_seq_len is not None else st_origin if st_len is not None else
                  "the config's default")
        raise ModelLoadError(f"{src}: max_seq_len {seq_len} ({origin}) must be between {MIN_SEQ_LEN} (what `docscore "
                             f"run` takes) and the model's {config.max_positions} positions; pass --max_seq_len in "
                             "that range")
    prompts = sentence_transformers_prompts(root, pooling)
    tokenizer = DocTokenizer.from_str(texts["tokenizer.json"], max_seq_len=seq_len,
                                      path=os.path.join(src, "tokenizer.json"), prompts=prompts)
    prompt_tokens = max(map(tokenizer.prompt_tokens, prompts), default=0)
    if seq_len <= tokenizer.n_special + prompt_tokens:
        beside = f" and its {prompt_tokens}-token prompt" if prompt_tokens else ""
        raise ModelLoadError(f"{src}: max_seq_len {seq_len} leaves no room for text beside the tokenizer's "
                             f"{tokenizer.n_special} special tokens{beside}; pass a larger --max_seq_len")
    tokenizer.check_vocab(config.vocab_size, os.path.join(src, "config.json"))

    tensors, where = read_safetensors(src, leave_out=MULTIMODAL_VISION_PREFIXES.get(config.model_type, ())
                                      + SEQ2SEQ_DECODERS.get(config.model_type, ()))
    if config.model_type in MULTIMODAL_TEXT_NAMES:
        tensors = multimodal_text_tensors(tensors, config.model_type, where)
    config = with_checkpoint_head(config, "lm_head.weight" in tensors, pooling)
    reader = params_reader(config)
    tensor_source = TensorSource(tensors, where, tensor_prefix(tensors, reader, MARKERS[reader]))
    params = FAMILY_PARAMS[reader][1](tensor_source, config)
    tensor_source.check_all_used(task_heads(json.loads(texts["config.json"])))
    dense, dense_params = sentence_transformers_dense(root, config.hidden_size) if pooling else ([], {})
    if dense:
        config = dataclasses.replace(config, dense=tuple(dense))
        params["dense"] = dense_params
    try:
        check_param_shapes(params, config, where)
    except ValueError as err:
        raise ModelLoadError(str(err)) from None
    return write_model_dir(dst, params=params, config_text=texts["config.json"],
                           tokenizer_text=texts["tokenizer.json"], family=config.family, max_seq_len=seq_len,
                           source=source or os.path.abspath(root), exist_ok=exist_ok, pooling=pooling,
                           prompts=prompts, dense=[dataclasses.asdict(spec) for spec in dense],
                           include_prompt=pools_prompt(root, pooling))

