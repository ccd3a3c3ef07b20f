"""docscore models: Flax NNX BERT encoder and GPT-2 decoder with injected attention, their model
directories (Orbax params), Hugging Face import and tokenizer windows.

Public API: `load(name_or_path, attention=, dtype=, cache_dir=) -> LoadedModel`, `ModelLoadError`,
`ModelConfig`, `DocTokenizer`, `EncodedDoc`. Nothing here knows about kernels beyond `kernels.attention`.
"""
from models.config import ModelConfig
from models.errors import ModelLoadError
from models.loader import LoadedModel, load
from models.tokenizer import DocTokenizer, EncodedDoc

__all__ = ["load", "LoadedModel", "ModelLoadError", "ModelConfig", "DocTokenizer", "EncodedDoc"]
