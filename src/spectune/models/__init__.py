"""Models: the ``LanguageModel`` contract, the native Llama runtime, loaders and adapters."""

from typing import TYPE_CHECKING

from spectune._lazy import lazy_exports

if TYPE_CHECKING:
    from spectune.models.base import KVCache, LanguageModel, ModelInfo, ModelOutput
    from spectune.models.llama import LlamaConfig, LlamaLM, LlamaTransformer
    from spectune.models.loading import default_target_path, load_model, save_native
else:  # names load on first use (spectune._lazy)
    __getattr__ = lazy_exports(
        __name__,
        {
            "spectune.models.base": ["KVCache", "LanguageModel", "ModelInfo", "ModelOutput"],
            "spectune.models.llama": ["LlamaConfig", "LlamaLM", "LlamaTransformer"],
            "spectune.models.loading": ["default_target_path", "load_model", "save_native"],
        },
    )

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
