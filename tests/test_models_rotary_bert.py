"""NomicBERT and GTE encoders (the rotary_bert family): small random NomicBertModels and GteModels built in transformers
(no download), converted with `docscore convert`, their final hidden states against transformers' (padded rows,
packed rows, both CPU kernels, a document past the blockwise kernel's 256-query block, each model's own default rope
theta); a sentence-transformers directory with nomic's prompts against SentenceTransformer.encode; the original
remote-code checkpoints' tensor names and config keys converting to the same model; settings docscore does not
compute refused by key and value."""
from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import models
from models.config import config_from_hf
from pipeline.convert import main as convert_main
from pipeline.telemetry import memory
from tests.conftest import SENTENCES, byte_level_bpe, padded
from tests.test_models_modernbert import MAX_SEQ_LEN, SPECIALS, convert_built, documents, save_encoder

pytestmark = pytest.mark.integration  # README.md, "Development"

COMMON = dict(hidden_size=32, intermediate_size=40, num_attention_heads=4, num_hidden_layers=2,
              max_position_embeddings=512, initializer_range=0.2, pad_token_id=0)
# model_type: (config class, model class, overrides); rope_theta left out: each model's own default (1000, 160,000)
KINDS = {"nomic_bert": ("NomicBertConfig", "NomicBertModel", {}),
         "gte": ("GteConfig", "GteModel", {"type_vocab_size": 2})}
NOMIC_PROMPTS = {"query": "search_query: ", "document": "search_document: "}


def build_hf(out: Path, model_type: str) -> Path:
    """A random model of `model_type` saved with save_pretrained, its tokenizer, and the sentence-transformers
    modules around it (mean pooling, normalised)."""
    import torch
    import transformers
    from tokenizers import processors

    tokenizer = byte_level_bpe(SPECIALS)
    tokenizer.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                             special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    config_class, model_class, overrides = KINDS[model_type]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(vocab_size=tokenizer.get_vocab_size(), **{**COMMON, **overrides})
    model = getattr(transformers, model_class)(config).eval()
    out.mkdir(parents=True)
    return save_encoder(model, tokenizer, out, MAX_SEQ_LEN)


@pytest.fixture(scope="module", params=list(KINDS))
def converted(request, tmp_path_factory) -> tuple[str, Path, Path]:
    """(model_type, Hugging Face dir, docscore model dir)."""
    return convert_built(build_hf, request.param, tmp_path_factory)


def transformers_hidden(src: Path, model_type: str, ids: np.ndarray, segments: np.ndarray) -> np.ndarray:
    """The model's last_hidden_state over right-padded rows (attention_mask 1 on tokens), float32."""
    import torch
    import transformers

    model = getattr(transformers, KINDS[model_type][1]).from_pretrained(src, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(input_ids=torch.as_tensor(ids, dtype=torch.long),
                    attention_mask=torch.as_tensor(segments > 0, dtype=torch.long)).last_hidden_state
    return out.numpy()


def hidden(model_dir: Path, docs: list[np.ndarray], attention: str = "native") -> np.ndarray:
    loaded = models.load(str(model_dir), attention=attention)
    ids, segments = padded(docs)
    return np.asarray(loaded.model(jnp.asarray(ids), jnp.asarray(segments)))


@pytest.mark.parametrize("attention", ["native", "flash"])
def test_hidden_states_match_transformers_padded_and_packed(converted, attention):
    model_type, src, model_dir = converted
    loaded = models.load(str(model_dir), attention=attention)
    assert loaded.attention == {"native": "xla", "flash": "blockwise"}[attention]
    config = loaded.config
    assert (config.family, config.is_encoder, config.rope.theta) == (
        "rotary_bert", True, {"nomic_bert": 1_000.0, "gte": 160_000.0}[model_type])
    held = sum(int(leaf.size) for leaf in jax.tree.leaves(nnx.state(loaded.model, nnx.Param)))
    assert memory.parameter_count(config) == held

    docs = documents(config.vocab_size)
    ids, segments = padded(docs)
    ours = np.asarray(loaded.model(jnp.asarray(ids), jnp.asarray(segments)))
    real = segments > 0
    expected = transformers_hidden(src, model_type, ids, segments)
    assert np.abs(expected[real]).max() > 1.0
    error = np.abs(ours[real] - expected[real]).max()
    print(f"{model_type} {attention}: max abs diff {error:.2e}")
    assert error <= 1e-4, (model_type, error)

    # all documents packed into one row (padding after them) equal each alone
    packed_ids = np.pad(np.concatenate(docs), (0, 5))[None]
    packed_segments = np.pad(np.concatenate([np.full(len(d), s + 1, np.int32) for s, d in enumerate(docs)]), (0, 5))[None]
    packed = np.asarray(loaded.model(jnp.asarray(packed_ids), jnp.asarray(packed_segments)))[0]
    alone = np.concatenate([ours[row, :len(d)] for row, d in enumerate(docs)])
    np.testing.assert_allclose(packed[:len(alone)], alone, atol=2e-5, rtol=0)


def test_nomic_embeddings_with_its_prompts_equal_sentence_transformers(tmp_path):
    """A nomic-embed-text style directory: mean pooling, "search_document: " / "search_query: " prompts
    (config_sentence_transformers.json); each role's embeddings equal SentenceTransformer.encode's with that prompt."""
    from sentence_transformers import SentenceTransformer

    src = build_hf(tmp_path / "st", "nomic_bert")
    (src / "config_sentence_transformers.json").write_text(json.dumps({"prompts": NOMIC_PROMPTS,
                                                                       "default_prompt_name": None}))
    assert convert_main(["--hf", str(src), "--out", str(tmp_path / "model")]) == 0
    loaded = models.load(str(tmp_path / "model"), attention="native")
    assert (loaded.pooling, loaded.tokenizer.max_seq_len, loaded.tokenizer.prompts) == ("mean", MAX_SEQ_LEN,
                                                                                      NOMIC_PROMPTS)
    texts = [SENTENCES[i] for i in (0, 2, 4, 8)]  # each within the 48 tokens with its prompt (sentence-transformers truncates longer)
    st = SentenceTransformer(str(src), device="cpu")
    for role, prompt in NOMIC_PROMPTS.items():
        # [CLS] prompt text [SEP], as a window of the role's texts (pipeline/stages/packing.py packs them so)
        docs = [np.concatenate([[2], lead, ids, [3]]).astype(np.int32)
                for lead, ids in loaded.tokenizer.prompted_ids(texts, role)]
        # two documents packed a row
        rows = [np.concatenate(docs[i:i + 2]) for i in range(0, len(docs), 2)]
        ids, _ = padded(rows)
        segments = np.zeros_like(ids)
        for row, i in enumerate(range(0, len(docs), 2)):
            lengths = [len(d) for d in docs[i:i + 2]]
            segments[row, :sum(lengths)] = np.repeat(np.arange(1, len(lengths) + 1), lengths)
        ours = loaded.embed_packed(ids, segments, 2).reshape(-1, 32)[:len(texts)]
        expected = st.encode(texts, prompt=prompt, normalize_embeddings=True)
        error = np.abs(ours - expected).max()
        print(f"nomic {role}: max abs diff {error:.2e}")
        assert error < 1e-5, (role, error)


def copy_dir(src: Path, out: Path, tensors: dict[str, np.ndarray], config: dict) -> Path:
    """`src`'s files in `out`, with these tensors and this config.json."""
    from safetensors.numpy import save_file

    for path in src.rglob("*"):
        if path.is_file() and path.name not in ("model.safetensors", "config.json"):
            (out / path.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            (out / path.relative_to(src)).write_bytes(path.read_bytes())
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config))
    return out


def remote_config(config: dict, model_type: str) -> dict:
    """config.json as the original remote code saved it: nomic's GPT-2 style keys; GTE's model_type "new" with its
    remote-only settings."""
    theta = config["rope_parameters"]["rope_theta"]
    if model_type == "nomic_bert":
        return {"model_type": "nomic_bert", "vocab_size": config["vocab_size"], "n_embd": config["hidden_size"],
                "n_head": config["num_attention_heads"], "n_layer": config["num_hidden_layers"],
                "n_inner": config["intermediate_size"], "n_positions": config["max_position_embeddings"],
                "layer_norm_epsilon": config["layer_norm_eps"], "rotary_emb_base": theta,
                "type_vocab_size": config["type_vocab_size"], "activation_function": "swiglu", "prenorm": False,
                "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False, "qkv_proj_bias": False,
                "mlp_fc1_bias": False, "mlp_fc2_bias": False, "use_rms_norm": False, "causal": False,
                "parallel_block": False, "rotary_scaling_factor": None, "rotary_emb_scale_base": None,
                "architectures": ["NomicBertModel"]}
    return {**{k: v for k, v in config.items() if k != "rope_parameters"}, "model_type": "new",
            "architectures": ["NewForMaskedLM"], "rope_theta": theta, "rope_scaling": None,
            "position_embedding_type": "rope", "logn_attention_scale": False, "layer_norm_type": "layer_norm",
            "pack_qkv": True, "unpad_inputs": True, "use_memory_efficient_attention": True}


@pytest.mark.parametrize("model_type", list(KINDS))
def test_native_and_original_checkpoint_layouts_convert_to_the_same_model(tmp_path, model_type):
    """transformers 5.24's save_pretrained writes the original code's tensor names (fused Wqkv / qkv_proj,
    up_gate_proj, emb_ln, norm1, ...: the inverse of its conversion_mapping.py); the names its modules hold
    (state_dict: q_proj, k_proj, v_proj, gate_proj, ...) convert to the same model, as does the original remote
    code's config.json (GTE's under NewForMaskedLM's "new." prefix)."""
    import transformers
    from safetensors.numpy import load_file

    src = build_hf(tmp_path / "hf", model_type)
    saved = load_file(str(src / "model.safetensors"))
    assert any(("Wqkv" if model_type == "nomic_bert" else "qkv_proj") in name for name in saved)
    model = getattr(transformers, KINDS[model_type][1]).from_pretrained(src)
    native = {name: weight.numpy() for name, weight in model.state_dict().items()}
    assert any("self_attn.q_proj" in name for name in native) and not any("self_attn" in name for name in saved)
    config = json.loads((src / "config.json").read_text())
    (tmp_path / "native").mkdir()
    (tmp_path / "original").mkdir()
    copy_dir(src, tmp_path / "native", native, config)
    prefix = "" if model_type == "nomic_bert" else "new."
    copy_dir(src, tmp_path / "original", {prefix + k: v for k, v in saved.items()}, remote_config(config, model_type))
    docs = documents(config["vocab_size"])[:4]
    outputs = []
    for name in ("hf", "native", "original"):
        assert convert_main(["--hf", str(tmp_path / name), "--out", str(tmp_path / f"{name}-docscore"),
                             "--max_seq_len", "64"]) == 0
        outputs.append(hidden(tmp_path / f"{name}-docscore", docs))
    assert np.array_equal(outputs[0], outputs[1]) and np.array_equal(outputs[0], outputs[2])
    # one tensor under both names is refused
    copy_dir(src, tmp_path / "both", {**saved, **native}, config)
    assert convert_main(["--hf", str(tmp_path / "both"), "--out", str(tmp_path / "both-docscore")]) == 2


NOMIC = {"model_type": "nomic_bert", "vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2,
         "num_attention_heads": 4, "intermediate_size": 40, "max_position_embeddings": 512}
GTE = {**NOMIC, "model_type": "gte"}


@pytest.mark.parametrize("hf, key", [
    ({**NOMIC, "prenorm": True}, "prenorm"),
    ({**NOMIC, "rotary_emb_interleaved": True}, "rotary_emb_interleaved"),
    ({**NOMIC, "rotary_emb_fraction": 0.5}, "rotary_emb_fraction"),
    ({**NOMIC, "qkv_proj_bias": True}, "qkv_proj_bias"),
    ({**NOMIC, "mlp_fc1_bias": True}, "mlp_fc1_bias"),
    ({**NOMIC, "use_rms_norm": True}, "use_rms_norm"),
    ({**NOMIC, "causal": True}, "causal"),
    ({**NOMIC, "parallel_block": True}, "parallel_block"),
    ({**NOMIC, "rotary_scaling_factor": 2.0}, "rotary_scaling_factor"),
    ({**NOMIC, "activation_function": "gelu"}, "activation_function"),
    ({**NOMIC, "n_embd": 64}, "n_embd"),
    ({**NOMIC, "hidden_act": "tanh"}, "hidden_act"),
    ({**NOMIC, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type"),
    ({**NOMIC, "partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({**GTE, "logn_attention_scale": True}, "logn_attention_scale"),
    ({**GTE, "position_embedding_type": "absolute"}, "position_embedding_type"),
    ({**GTE, "layer_norm_type": "rms_norm"}, "layer_norm_type"),
    ({**GTE, "rope_scaling": {"type": "ntk", "factor": 2.0}}, "rope_scaling.type .ntk"),
    ({**GTE, "model_type": "new", "hidden_act": "gelu", "type_vocab_size": 0, "layer_norm_eps": 1e-12}, "rope_theta"),
])
def test_settings_docscore_does_not_compute_are_refused_by_key(hf, key):
    with pytest.raises(models.ModelLoadError, match=key):
        config_from_hf(hf)


@pytest.mark.parametrize("key, value", [("n_inner", 0), ("n_embd", 10**9), ("n_layer", -1), ("layer_norm_epsilon", 2)])
def test_a_remote_nomic_configs_size_out_of_bounds_is_named_by_its_own_key(key, value):
    """The original NomicBERT config.json says n_inner, not transformers' intermediate_size: the message names
    the key the user finds in the file."""
    remote = {"model_type": "nomic_bert", "vocab_size": 100, "n_embd": 32, "n_head": 4, "n_layer": 2, "n_inner": 40,
              "n_positions": 512, "layer_norm_epsilon": 1e-5, "rotary_emb_base": 500}
    with pytest.raises(models.ModelLoadError, match=f"config.json: {key} is {value}"):
        config_from_hf({**remote, key: value})


def test_config_reads_each_models_defaults_and_the_remote_nomic_keys():
    nomic, gte = config_from_hf(NOMIC), config_from_hf(GTE)
    assert (nomic.activation, nomic.type_vocab_size, nomic.qkv_bias, nomic.mlp_output_bias) == ("silu", 2, False, False)
    assert (gte.activation, gte.type_vocab_size, gte.qkv_bias, gte.output_bias, gte.mlp_output_bias, gte.mlp_bias) == (
        "gelu", 1, True, True, True, False)
    assert (nomic.rope.theta, gte.rope.theta) == (1_000.0, 160_000.0)
    remote = {"model_type": "nomic_bert", "vocab_size": 100, "n_embd": 32, "n_head": 4, "n_layer": 2, "n_inner": 40,
              "n_positions": 512, "layer_norm_epsilon": 1e-5, "rotary_emb_base": 500, "activation_function": "swiglu"}
    read = config_from_hf(remote)
    assert (read.hidden_size, read.num_heads, read.num_layers, read.intermediate_size, read.max_positions,
            read.layer_norm_eps, read.rope.theta, read.activation) == (32, 4, 2, 40, 512, 1e-5, 500.0, "silu")
