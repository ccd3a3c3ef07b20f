"""docscore models: Flax NNX BERT encoder and GPT-2 decoder with injected attention, their model
directories (Orbax params), Hugging Face import and tokenizer windows.

Public API: `load(name_or_path, attention=, dtype=, cache_dir=) -> LoadedModel`, `load_tokenizer`, `ModelLoadError`,
`ModelConfig`, `DocTokenizer`, `EncodedDoc`. Nothing here knows about kernels beyond `kernels.attention`.
"""
from models.config import ModelConfig
from models.errors import ModelLoadError
from models.loader import LoadedModel, load, load_tokenizer
from models.tokenizer import DocTokenizer, EncodedDoc

__all__ = ["load", "load_tokenizer", "LoadedModel", "ModelLoadError", "ModelConfig", "DocTokenizer", "EncodedDoc"]
