"""`docscore convert --hf SRC --out DST`: the command's flags and messages over models/hf_import.py's
convert_hf_dir (which holds the conversion itself). Must not map tensors or read weights."""
from __future__ import annotations

import sys

from models.errors import ModelLoadError
from models.hf_import import (convert_hf_dir, dropped_decoder, dropped_head, dropped_masked_lm_head,
                              dropped_special_tokens, dropped_vision, embedder_only, transformer_folder)
from models.model_dir import remove_unfinished
from pipeline.cli import SubcommandParser
from pipeline.interrupt import exit_on_interrupt
from pipeline.process_setup import unusable_backend


def main(argv: list[str]) -> int:
    parser = SubcommandParser(
        prog="docscore convert",
        description="Convert a Hugging Face model directory (config.json, tokenizer.json, *.safetensors; "
                    "BERT/RoBERTa/XLM-RoBERTa/CamemBERT/DistilBERT/MPNet, ModernBERT, NomicBERT/GTE (nomic_bert, gte, new), T5/mT5 (t5, mt5: the encoder), "
                    "GPT-2 or Llama/Mistral/Qwen2/Qwen3/"
                    "Phi-3 and Phi-4 (phi3)/Gemma 2 (gemma2)/Gemma 3 text (gemma3_text)/OLMo 2 (olmo2)/OLMo 3 (olmo3)/"
                    "Granite (granite)/SmolLM3 (smollm3) family; Gemma 3's multimodal models (gemma3) as their text "
                    "model; EuroBERT (eurobert), an encoder with Llama's blocks: a plain directory embeds with mean "
                    "pooling, its masked-LM head not read), or "
                    "a sentence-transformers directory around one (its pooling, Dense modules and prompts kept), into "
                    "a docscore model directory (Orbax params).")
    parser.add_argument("--hf", required=True, help="Hugging Face model directory to read")
    parser.add_argument("--out", required=True, help="docscore model directory to write: a local path that does not "
                                                     "exist yet, or an empty directory")
    parser.add_argument("--max_seq_len", type=int, default=None,
                        help="longest model input in tokens (default: sentence_bert_config.json's "
                             "max_seq_length, or the tokenizer_config.json model_max_length of a directory "
                             "sentence-transformers 6 saved, else the model's position count, or the sliding window "
                             "of a decoder whose every layer slides (Mistral, Phi-3) when it is shorter; local windows "
                             "beside global layers (Gemma 2 and 3, OLMo 3, ModernBERT) do not shorten it)")
    args = parser.parse_args(argv)
    empty = [flag for flag, value in (("--hf", args.hf), ("--out", args.out)) if not value.strip()]
    if empty:  # an unset variable: '' would be read as this folder ("already exists")
        print(f"docscore convert: {empty[0]} is empty or white space (an unset variable?); pass a directory",
              file=sys.stderr)
        return 2

    problem = unusable_backend()  # convert_hf_dir starts JAX: its error would blame the weights file
    if problem:
        print(f"docscore convert: {problem}", file=sys.stderr)
        return 2

    def interrupted() -> str:
        removed = remove_unfinished()
        return (f"docscore convert: interrupted; nothing was written to {args.out}"
                + (f" (its partial copy {', '.join(removed)} was removed)" if removed else ""))

    try:
        with exit_on_interrupt(interrupted):
            metadata = convert_hf_dir(args.hf, args.out, max_seq_len=args.max_seq_len)
    except ModelLoadError as err:
        print(f"docscore convert: {err}", file=sys.stderr)
        return 2
    model_folder = transformer_folder(args.hf)
    prompts_left_out = None if metadata.include_prompt else (
        "its sentence-transformers pooling leaves a prompt's tokens out (include_prompt false), which docscore does "
        "not compute, so `docscore run` refuses --document_prompt and --query_prompt with it")
    for note in (dropped_head(model_folder), dropped_vision(model_folder), dropped_decoder(model_folder),
                 dropped_masked_lm_head(model_folder),
                 dropped_special_tokens(args.hf, args.out),
                 embedder_only(args.out, metadata), prompts_left_out):
        if note:
            print(f"docscore convert: note: {note}", file=sys.stderr)
    pooled = f", {metadata.pooling} pooling" if metadata.pooling else ""  # a decoder without one embeds nothing
    pooled += "".join(f", {role} prompt {text!r}" for role, text in metadata.prompts.items())
    print(f"wrote {args.out}: {metadata.family}, max_seq_len {metadata.max_seq_len}{pooled}, "
          f"fingerprint {metadata.fingerprint[:12]}")
    return 0
