"""Models: the ``LanguageModel`` contract, the native Llama runtime, loaders and adapters."""

from spectune.models.base import KVCache, LanguageModel, ModelInfo, ModelOutput
from spectune.models.llama import LlamaConfig, LlamaLM, LlamaTransformer
from spectune.models.loading import default_target_path, load_model, save_native

__all__ = [
    "KVCache",
    "LanguageModel",
    "LlamaConfig",
    "LlamaLM",
    "LlamaTransformer",
    "ModelInfo",
    "ModelOutput",
    "default_target_path",
    "load_model",
    "save_native",
]
