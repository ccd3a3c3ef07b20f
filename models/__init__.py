"""docscore models: Flax NNX BERT-family encoder (BERT, RoBERTa, XLM-RoBERTa, CamemBERT, DistilBERT, MPNet), ModernBERT
encoder, rotary BERT encoder (NomicBERT, GTE), T5 encoder (T5, mT5), GPT-2 decoder and Llama-family decoder (Llama, Mistral, Qwen2, Qwen3, Phi-3/Phi-4, Gemma 2,
Gemma 3, OLMo 2, OLMo 3, Granite, SmolLM3)
with injected attention, their model directories (Orbax params), Hugging Face import, tokenizer windows,
the device mesh (sharding.py) and float32 matmul precision.

Public API: `load(name_or_path, attention=, dtype=, cache_dir=, matmul_precision=) -> LoadedModel`, `load_tokenizer`, `ModelLoadError`,
`ModelConfig`, `DocTokenizer`, `EncodedDoc`. Nothing here knows about kernels beyond `kernels.attention` (the
layers) and `kernels.resolve` (the loader's choice of kernel).
"""
from models.config import ModelConfig
from models.errors import ModelLoadError
from models.loader import LoadedModel, load, load_tokenizer
from models.tokenizer import DocTokenizer, EncodedDoc

__all__ = ["load", "load_tokenizer", "LoadedModel", "ModelLoadError", "ModelConfig", "DocTokenizer", "EncodedDoc"]
