"""Gemma 3's multimodal checkpoints (model_type gemma3, Gemma3ForConditionalGeneration: gemma-3-4b, 12b, 27b)
converted as their text model. A tiny random one built by transformers (a one-layer vision tower beside a text model
with local and global layers, the tokenizer's <image_soft_token> inside its vocabulary as in the released models) and
saved with save_pretrained, converted by the `docscore convert` entry point: its token log-probabilities equal the
model's own forward without pixel_values; the tensor names of either transformers save convert to the same
parameters; the vision encoder is left out with a note. Its config.json is read as transformers fills it (its
text_config a Gemma3TextConfig)."""
from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import models
from models.checkpoint import stored_shapes
from models.config import config_from_hf, hf_keys, read_config
from models.model_dir import read_metadata
from pipeline.convert import main as convert_main
from tests.conftest import padded, transformers_logprobs
from tests.test_models_llama import assert_gemma_sizes_as, documents

# the text model: local layers 0 and 2 (a 16-token window, a theta of their own), a global one with linear rope
# scaling (as gemma-3-4b's), an attention scale of its own
TEXT = dict(hidden_size=64, intermediate_size=112, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, max_position_embeddings=640, sliding_window=16, query_pre_attn_scalar=24,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"], initializer_range=0.2,
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100_000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 1_000.0}})
# SigLIP at its smallest: a 28-pixel image in 14-pixel patches, one layer, 2 x 2 image tokens
VISION = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=48, num_hidden_layers=1,
              num_attention_heads=2, image_size=28, patch_size=14)
# the released models' text vocabulary runs 64 ids past the tokenizer's (262,208 for 262,144 tokens), whose added
# <image_soft_token> (262,144) it covers
VOCAB_ROOM = 64
# the names the two transformers saves give a tensor (transformers 4.50's, which 5.x's save writes too) -> those
# transformers 4.52-4.57 saved with
NAMES_4_52 = (("language_model.model.", "model.language_model."), ("language_model.lm_head.", "lm_head."),
              ("vision_tower.", "model.vision_tower."), ("multi_modal_projector.", "model.multi_modal_projector."))


def build_multimodal(out: Path, *, tie: bool = True) -> Path:
    """A random Gemma3ForConditionalGeneration saved as transformers saves it, with a tokenizer holding
    <image_soft_token> (its image_token_index) inside the text vocabulary."""
    import torch
    import transformers
    from tokenizers import AddedToken, Tokenizer

    from tests.test_models_llama import build_tokenizer

    out.mkdir(parents=True)
    base = build_tokenizer(out)
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken("<image_soft_token>", special=True)])
    tokenizer.save(str(out / "tokenizer.json"))
    config = transformers.Gemma3Config(
        text_config={**TEXT, "vocab_size": base + VOCAB_ROOM}, vision_config=VISION, mm_tokens_per_image=4,
        image_token_index=base, tie_word_embeddings=tie, initializer_range=0.2)
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # Gemma's norms start at zeros; scales of their own catch a norm read into the wrong place
        for name, weight in model.named_parameters():
            if "norm" in name:
                weight.mul_(1 + 0.2 * torch.randn_like(weight)).add_(0.2 * torch.randn_like(weight))
    model.save_pretrained(out)
    return out


def with_4_52_names(src: Path, out: Path) -> Path:
    """`src` with its tensors under the names transformers 4.52-4.57 saved a Gemma3ForConditionalGeneration with."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, out)
    tensors = load_file(str(src / "model.safetensors"))
    renamed = {next((new + key[len(old):] for old, new in NAMES_4_52 if key.startswith(old)), key): tensor
               for key, tensor in tensors.items()}
    assert len(renamed) == len(tensors) and all(key.startswith(("model.", "lm_head.")) for key in renamed)
    save_file(renamed, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def convert(src: Path, out: Path) -> tuple[int, str]:
    """The `docscore convert --hf` entry point; (exit code, what it printed)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = convert_main(["--hf", str(src), "--out", str(out)])
    return code, printed.getvalue()


@pytest.fixture(scope="module")
def multimodal(tmp_path_factory) -> tuple[Path, Path, str]:
    """(the Hugging Face directory, its docscore model directory, what convert printed)."""
    root = tmp_path_factory.mktemp("gemma3")
    hf_dir = build_multimodal(root / "hf")
    code, printed = convert(hf_dir, root / "docscore")
    assert code == 0, printed
    return hf_dir, root / "docscore", printed


@pytest.mark.integration
@pytest.mark.parametrize("attention", ["native", "flash"])
def test_multimodal_checkpoint_scores_text_as_its_own_text_only_forward(multimodal, attention):
    hf_dir, model_dir, _ = multimodal
    loaded = models.load(str(model_dir), attention=attention)
    assert loaded.attention == {"native": "xla", "flash": "blockwise"}[attention]
    assert (loaded.config.model_type, loaded.config.sliding_layers, loaded.config.tie_word_embeddings) == (
        "gemma3", (0, 2), True)
    image_token = json.loads((hf_dir / "config.json").read_text())["image_token_index"]
    docs = documents(loaded.config.vocab_size)
    docs[2][5] = image_token  # in the released models' vocabulary it has an embedding row, which transformers reads
    ids, segments = padded(docs)
    ours = loaded.token_logprobs(ids, segments)
    expected = transformers_logprobs(hf_dir, ids, segments, "Gemma3ForConditionalGeneration")  # no pixel_values
    assert np.abs(expected).max() > 1.0  # not a near-uniform model
    assert np.abs(ours - expected).max() <= 1e-4, np.abs(ours - expected).max()


@pytest.mark.integration
def test_image_soft_token_inside_the_vocabulary_is_kept(multimodal):
    """The multimodal models' vocabulary covers the tokenizer's <image_soft_token> (262,144 < 262,208), so convert
    keeps it (the text models', 262,144 rows, drop it): the converted tokenizer reads it as transformers' does."""
    from tokenizers import Tokenizer

    hf_dir, model_dir, printed = multimodal
    assert "left out: past the model's embedding table" not in printed, printed
    image_token = json.loads((hf_dir / "config.json").read_text())["image_token_index"]
    theirs = Tokenizer.from_file(str(hf_dir / "tokenizer.json")).encode("an <image_soft_token> here").ids
    ids = models.load(str(model_dir), attention="native").tokenizer.encode_windows(["an <image_soft_token> here"])[0]
    assert image_token in theirs and list(ids.windows[0]) == theirs


@pytest.mark.integration
def test_vision_encoder_is_left_out_with_a_note(multimodal):
    """The converted directory holds the text model's parameters alone, as many numbers as the checkpoint's text
    tensors (its vision tower's and projector's are not read), and convert says so."""
    from safetensors.numpy import load_file

    hf_dir, model_dir, printed = multimodal
    assert ("docscore convert: note: Gemma3ForConditionalGeneration is a multimodal model: its text model was "
            "converted") in printed and "vision encoder (vision_tower, multi_modal_projector) left out" in printed
    assert "task head was not converted" not in printed  # its head is the language model's, which docscore computes
    tensors = load_file(str(hf_dir / "model.safetensors"))
    vision = {k for k in tensors if k.startswith(("vision_tower.", "multi_modal_projector."))}
    assert vision and all(k.startswith("language_model.model.") for k in set(tensors) - vision)  # 5.x's save
    stored = stored_shapes(str(model_dir / "params"))
    assert not [name for name in stored if re.search("vision|projector|patch|siglip", name)]
    text_numbers = sum(t.size for k, t in tensors.items() if k not in vision)
    assert sum(int(np.prod(shape)) for shape, _ in stored.values()) == text_numbers


@pytest.mark.integration
@pytest.mark.parametrize("tie", [True, False], ids=["tied", "own-head"])
def test_either_transformers_saves_names_convert_to_the_same_parameters(tmp_path, tie):
    """transformers 4.50 saved the text model under language_model.model.* (and an untied head as
    language_model.lm_head.weight), as 5.x's save writes it again; 4.52-4.57 saved model.language_model.* and
    lm_head.weight. transformers 5 loads both into one model, and docscore converts both to the same parameters."""
    import torch
    import transformers

    saved = build_multimodal(tmp_path / "hf", tie=tie)
    renamed = with_4_52_names(saved, tmp_path / "hf-4.52")
    theirs = [transformers.Gemma3ForConditionalGeneration.from_pretrained(d, dtype=torch.float32).state_dict()
              for d in (saved, renamed)]
    assert theirs[0].keys() == theirs[1].keys() and all(torch.equal(theirs[0][k], theirs[1][k]) for k in theirs[0])
    fingerprints, shapes = [], []
    for src in (saved, renamed):
        code, printed = convert(src, tmp_path / f"{src.name}-docscore")
        assert code == 0, printed
        fingerprints.append(read_metadata(str(tmp_path / f"{src.name}-docscore")).fingerprint)
        shapes.append(stored_shapes(str(tmp_path / f"{src.name}-docscore" / "params")))
    # the fingerprint is a digest of every parameter, config.json and tokenizer.json (the same files here)
    assert fingerprints[0] == fingerprints[1] and shapes[0] == shapes[1]
    assert ("lm_head/kernel" in shapes[0]) == (not tie)


@pytest.mark.integration
def test_a_tensor_under_both_names_is_refused(tmp_path):
    from safetensors.numpy import load_file, save_file

    src = build_multimodal(tmp_path / "hf")
    tensors = load_file(str(src / "model.safetensors"))
    tensors["model.language_model.norm.weight"] = tensors["language_model.model.norm.weight"]
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    code, printed = convert(src, tmp_path / "out")
    assert code == 2 and "holds both 'language_model.model.norm.weight' and 'model.language_model.norm.weight'" in printed


# shaped as gemma-3-4b-it's config.json (transformers 4.50 wrote it): its text_config names only the sizes that differ
# from Gemma3TextConfig's defaults (no heads, kv heads, head_dim, vocabulary or positions)
GEMMA3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
    "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
    "model_type": "gemma3", "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text", "num_hidden_layers": 34,
                    "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                      "patch_size": 14, "vision_use_head": False}}
# gemma-3-27b's text model: head_dim and query_pre_attn_scalar of its own
GEMMA3_27B_TEXT = {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text",
                   "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
                   "query_pre_attn_scalar": 168, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                   "sliding_window": 1024}


def assert_reads_as(ours, theirs) -> None:
    """docscore's ModelConfig has the sizes, layers, windows and rotary settings of transformers' Gemma3TextConfig."""
    from models.rope import Rope

    full, local = theirs.rope_parameters["full_attention"], theirs.rope_parameters["sliding_attention"]
    assert_gemma_sizes_as(ours, theirs)
    assert ours.sliding_window == theirs.sliding_window
    assert ours.rope == Rope(full["rope_theta"], full["rope_type"], full.get("factor", 1.0))
    assert ours.local_rope == Rope(local["rope_theta"])


def test_multimodal_config_reads_its_text_config_as_transformers_fills_it():
    import transformers

    for text in (GEMMA3_4B["text_config"], GEMMA3_27B_TEXT):
        hf = {**GEMMA3_4B, "text_config": text}
        ours, theirs = config_from_hf(hf), transformers.Gemma3Config.from_dict(hf)
        assert_reads_as(ours, theirs.text_config)
        assert (ours.model_type, ours.family, ours.causal, ours.tie_word_embeddings) == ("gemma3", "llama", True, True)
    ours = config_from_hf(GEMMA3_4B)
    assert (ours.vocab_size, ours.num_heads, ours.kv_heads, ours.head_dim, ours.max_positions) == (
        262_208, 8, 4, 256, 131_072)
    assert ours.sliding_layers == tuple(i for i in range(34) if (i + 1) % 6) and ours.rope.factor == 8.0
    # the head is tied as the top-level tie_word_embeddings says (text_config's is not read), as transformers ties it
    for top, inner in ((False, True), (True, False)):
        hf = {**GEMMA3_4B, "tie_word_embeddings": top, "text_config": {**GEMMA3_4B["text_config"],
                                                                       "tie_word_embeddings": inner}}
        assert config_from_hf(hf).tie_word_embeddings is top
    assert hf_keys(ours)["max_positions"] == "text_config.max_position_embeddings"  # what load's messages name
    # transformers' Gemma3ForConditionalGeneration caps neither its logits nor its scores, whatever text_config says
    capped = {**GEMMA3_4B["text_config"], "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0}
    ours = config_from_hf({**GEMMA3_4B, "text_config": capped})
    assert (ours.final_logit_cap, ours.attention_logit_cap) == (0.0, 0.0)


@pytest.mark.parametrize("change, says", [
    ({"text_config": "absent"}, "model_type 'gemma3' (Gemma 3's multimodal model) holds its text model's config "
                                "under text_config, which is missing"),
    ({"text_config": None}, "text_config, which is null"),
    ({"text_config": [1, 2]}, "text_config, which is a JSON list, not an object"),
    ({"text_config": {"model_type": "gemma2"}}, 'text_config.model_type "gemma2" is not supported'),
    ({"text_config": {**GEMMA3_4B["text_config"], "use_bidirectional_attention": True}},
     "text_config.use_bidirectional_attention true is not supported"),
    ({"text_config": {**GEMMA3_4B["text_config"], "num_attention_heads": 0}},
     "model/config.json: text_config: num_attention_heads is 0"),
    ({"text_config": {**GEMMA3_4B["text_config"], "hidden_activation": "gelu"}},
     "model/config.json: text_config: hidden_activation 'gelu' is not supported"),
    ({"quantization_config": {"quant_method": "bitsandbytes"}}, "quantization_config quant_method 'bitsandbytes'"),
], ids=["no-text-config", "null-text-config", "text-config-a-list", "other-text-model", "both-ways", "bad-size", "bad-activation",
        "quantized"])
def test_multimodal_refusals_name_the_key(change, says):
    hf = {**GEMMA3_4B, **change}
    if hf["text_config"] == "absent":
        del hf["text_config"]
    with pytest.raises(models.ModelLoadError, match=re.escape(says)):
        read_config("model/config.json", json.dumps(hf))
