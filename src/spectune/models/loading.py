"""Turn a model reference (``default``, a ``.gguf`` file, an HF folder) into a ``LanguageModel``.

Llama-family checkpoints (llama, qwen2, mistral) load into the native runtime; any other
architecture goes through the transformers adapter (``spectune.models.hf``). The choice, and
every other question the metadata answers, is made before a weight is read
(``spectune.models.facts``). Weights come only from GGUF and safetensors files, never from
pickles, and never from a hub.

Every weight the model expects must come from the files, and every tensor in the files
must be used (``check_weights``): a config that names one architecture over another's
tensors would otherwise load with random weights and generate nonsense. Experts who know
better pass ``allow_missing_weights``, which downgrades the error to a ``SpectuneWarning``.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from spectune.errors import ModelLoadError
from spectune.models.base import LanguageModel
from spectune.models.cache_dir import derived_path
from spectune.models.facts import (
    NATIVE_FAMILIES,
    RUNTIMES,
    gguf_header,
    gguf_version,
    model_facts,
    read_json,
)
from spectune.models.hf import HFModel, load_hf_model
from spectune.models.llama import LlamaConfig, LlamaLM, LlamaTransformer
from spectune.models.llamacpp import LLAMACPP, LlamaCppModel
from spectune.models.quant import (
    QUANT_MODES,
    Int4Codes,
    QuantMode,
    int4_codes_from_gguf,
    quantize_net,
)
from spectune.models.refs import DEFAULT_TARGET, default_target_path, resolve_model_path
from spectune.models.weights import check_weights

__all__ = [
    "DEFAULT_TARGET",
    "NATIVE_FAMILIES",
    "RUNTIMES",
    "default_target_path",
    "load_model",
    "gguf_config",
    "gguf_quantized_layers",
    "native_from_gguf",
    "native_from_folder",
    "resolve_model_path",
    "save_native",
    "stored_in_4_bits",
]

# safetensors files of a model folder that hold no weights: a distilled draft's reduced
# vocabulary (``spectune.drafters.loading``).
NOT_WEIGHTS = frozenset({"vocab_subset.safetensors"})


def load_model(
    ref: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    runtime: str = "auto",
    allow_missing_weights: bool = False,
    quantize: QuantMode = "none",
    device: torch.device | str = "cpu",
) -> LanguageModel:
    """Load a target or draft model. ``runtime``: ``auto`` | ``native`` | ``hf`` |
    ``llamacpp`` (a GGUF file on llama.cpp's kernels, ``spectune.models.llamacpp``: the
    file's own tensor types, so ``dtype`` must stay fp32 and ``quantize`` none).

    ``quantize`` (``int8`` | ``int4``) puts the native runtime's linear layers on PyTorch's
    weight-only CPU kernels (``spectune.models.quant``); ``dtype`` stays the dtype of
    everything else (embeddings, norms, attention, the KV cache). ``device``: where the
    forwards run (``spectune.models.devices``). Weights the model expects but the files lack, or
    tensors it does not use, raise ``ModelLoadError``; ``allow_missing_weights`` warns
    instead (missing ones then keep their random initialisation)."""
    try:
        return _load_model(ref, dtype, runtime, allow_missing_weights, quantize, device)
    finally:
        _parsed_gguf.cache_clear()  # the parsed metadata is not needed after a load


def _load_model(
    ref: str | Path,
    dtype: torch.dtype,
    runtime: str,
    allow_missing_weights: bool,
    quantize: QuantMode,
    device: torch.device | str,
) -> LanguageModel:
    if quantize not in QUANT_MODES:
        raise ModelLoadError(f"unknown quantization {quantize!r} (none, int8 or int4)")
    device = torch.device(device)
    if runtime == LLAMACPP:
        return _load_llamacpp(ref, dtype=dtype, quantize=quantize, device=device)
    # Everything the metadata decides is decided before a weight is read.
    facts = model_facts(ref, runtime)
    refusal = facts.precision_refusal(quantize)
    if refusal is not None:
        raise ModelLoadError(refusal)
    if quantize != "none" and device.type != "cpu":
        raise ModelLoadError(
            f"--dtype {quantize} runs on PyTorch's CPU kernels only; use fp32 or bf16 on "
            f"{device.type}"
        )
    model = _load_unquantized(
        ref, dtype=dtype, runtime=facts.runtime, allow_missing_weights=allow_missing_weights
    )
    if device.type != "cpu":
        _to_device(model, device)
    if quantize == "none":
        return model
    if not isinstance(model, LlamaLM):  # precision_refusal said so above
        raise ModelLoadError(f"--dtype {quantize} needs the native runtime")
    path = resolve_model_path(ref)
    sources: dict[str, Int4Codes] = {}
    int8_names: frozenset[str] = frozenset()
    if path.is_file():
        sources, int8_names = gguf_quantized_layers(path, model.net.cfg)
    quantize_net(model.net, quantize, int4_sources=sources, int8_names=int8_names)
    return model


def _load_llamacpp(
    ref: str | Path, *, dtype: torch.dtype, quantize: QuantMode, device: torch.device
) -> LlamaCppModel:
    path = resolve_model_path(ref)
    if not (path.is_file() and path.suffix == ".gguf"):
        raise ModelLoadError(f"--runtime llamacpp runs .gguf files; {path.name} is not one")
    if dtype != torch.float32 or quantize != "none":
        raise ModelLoadError(
            "--runtime llamacpp runs the GGUF's own tensor types; leave --dtype at fp32"
        )
    return LlamaCppModel(path, gguf_config(path), gpu=device.type != "cpu")


def _to_device(model: LanguageModel, device: torch.device) -> None:
    if isinstance(model, LlamaLM):
        model.net.to(device)
    elif isinstance(model, HFModel):
        model.model.to(device)


def _load_unquantized(
    ref: str | Path, *, dtype: torch.dtype, runtime: str, allow_missing_weights: bool
) -> LanguageModel:
    """``ref`` on ``runtime`` as ``model_facts`` chose it (``native`` or ``hf``)."""
    path = resolve_model_path(ref)
    strict = not allow_missing_weights
    if runtime == "native":
        if path.is_file():
            return native_from_gguf(path, dtype=dtype, strict=strict)
        return native_from_folder(path, dtype=dtype, strict=strict)
    return load_hf_model(path, dtype=dtype, allow_missing_weights=allow_missing_weights)


# ---------------------------------------------------------------------------- GGUF


def _gguf_reader(path: Path) -> Any:
    """The file's ``gguf.GGUFReader``, parsed once for all the questions a native load asks
    of it (config, tensors, int4 blocks) when their caches are cold. The reader parses every
    metadata field in Python: 3.5 s and 170 MB for the default model's 49,152-token
    vocabulary, 7.5 s for Gemma 3's 262,144 tokens, so questions asked before loading read
    the header alone (``spectune.models.facts``). ``load_model`` drops it when done."""
    return _parsed_gguf(*gguf_version(path))


@functools.lru_cache(maxsize=1)  # keyed by modification time and size: an edited file is re-read
def _parsed_gguf(path: str, mtime_ns: int, size: int) -> Any:
    import gguf

    try:
        return gguf.GGUFReader(path)
    except Exception as exc:  # the reader raises many kinds on truncated or foreign files
        raise ModelLoadError(f"cannot read GGUF file {path}: {exc}") from exc


def _gguf_field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _gguf_summary(path: Path) -> dict[str, Any]:
    """What choosing a runtime asks of a GGUF: its architecture and whether any layer is
    in Q4_0 / Q4_1 blocks, from its header (``spectune.models.facts.gguf_header``: a few
    hundredths of a second, where ``gguf.GGUFReader`` takes seconds)."""
    import gguf

    header = gguf_header(path)
    four_bit = {gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q4_1}
    return {
        "architecture": str(header.fields.get("general.architecture", "")),
        "four_bit": any(kind in four_bit for kind in header.tensor_types.values()),
    }


def gguf_architecture(path: Path) -> str:
    return str(_gguf_summary(path)["architecture"])


def stored_in_4_bits(ref: str | Path) -> bool:
    """Whether ``ref`` is a Llama-family GGUF whose linear layers are Q4_0 / Q4_1 blocks,
    which the native runtime's int4 kernel takes as stored (``spectune.models.quant``)."""
    path = resolve_model_path(ref)
    if not path.is_file() or path.suffix != ".gguf":
        return False
    summary = _gguf_summary(path)
    return summary["architecture"] == "llama" and bool(summary["four_bit"])


def _unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's rotary re-ordering of q/k rows (interleaved -> half-split)."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


_GGUF_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def native_from_gguf(
    path: Path, *, dtype: torch.dtype = torch.float32, strict: bool = True
) -> LlamaLM:
    """Dequantise a Llama-family GGUF into the native runtime.

    The dequantised fp32 weights are cached as safetensors (see ``spectune.models.cache_dir``);
    later loads read the cache, which takes a fraction of the conversion's time.
    """
    import json as _json

    from safetensors.torch import load_file, save_file

    cached = derived_path(path, "gguf-fp32")
    weights, meta_file = cached / "model.safetensors", cached / "config.json"
    if weights.is_file() and meta_file.is_file():
        try:
            cfg = LlamaConfig.from_dict(_json.loads(meta_file.read_text()))
            return _build(cfg, load_file(str(weights)), dtype, source=path, strict=strict)
        except Exception:  # a damaged cache is rebuilt from the GGUF below (which reports
            # weights that do not fit the model itself)
            pass
    cfg, state = _read_gguf(path)
    _write_cache(meta_file, lambda tmp: tmp.write_text(_json.dumps(cfg.to_dict())))
    _write_cache(weights, lambda tmp: save_file(state, str(tmp)))
    return _build(cfg, state, dtype, source=path, strict=strict)


def _write_cache(target: Path, write: Callable[[Path], object]) -> None:
    """Write a derived file (``spectune.models.cache_dir``) under a temporary name, then
    rename it, so a concurrent reader never sees half of it."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        write(tmp)
        os.replace(tmp, target)
    except OSError:
        pass  # a read-only cache only costs speed


def gguf_config(path: Path, reader: Any | None = None) -> LlamaConfig:
    """A GGUF file's model description, read from its metadata alone (no tensor is touched:
    the llama.cpp backend describes its models with it too, so both runtimes agree)."""
    reader = reader or _gguf_reader(path)
    arch = str(_gguf_field(reader, "general.architecture", ""))

    def meta(key: str, default: Any = None) -> Any:
        return _gguf_field(reader, f"{arch}.{key}", default)

    try:
        hidden = int(meta("embedding_length"))
        heads = int(meta("attention.head_count"))
        kv_heads = int(meta("attention.head_count_kv", heads))
        vocab = int(meta("vocab_size", 0) or len(_gguf_field(reader, "tokenizer.ggml.tokens")))
        names = {t.name for t in reader.tensors}
        eos = _gguf_field(reader, "tokenizer.ggml.eos_token_id")
        return LlamaConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=int(meta("feed_forward_length")),
            num_layers=int(meta("block_count")),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=int(meta("attention.key_length", hidden // heads)),
            rope_theta=float(meta("rope.freq_base", 10000.0)),
            rms_norm_eps=float(meta("attention.layer_norm_rms_epsilon", 1e-5)),
            max_context=int(meta("context_length", 2048)),
            tie_word_embeddings="output.weight" not in names,
            attention_bias="blk.0.attn_q.bias" in names,
            bos_token_id=_gguf_field(reader, "tokenizer.ggml.bos_token_id"),
            eos_token_ids=() if eos is None else (int(eos),),
            pad_token_id=_gguf_field(reader, "tokenizer.ggml.padding_token_id"),
            family=arch,
            name=str(_gguf_field(reader, "general.name", path.stem)),
        )
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"{path}: incomplete GGUF metadata ({exc})") from exc


def _read_gguf(path: Path) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    import gguf

    reader = _gguf_reader(path)
    cfg = gguf_config(path, reader)
    arch, heads, kv_heads = cfg.family, cfg.num_heads, cfg.num_kv_heads
    state: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        if name is None and tensor.name in _GGUF_IGNORED:
            continue
        try:
            values = gguf.dequantize(tensor.data, tensor.tensor_type)
        except Exception as exc:
            raise ModelLoadError(f"{path}: cannot dequantise {tensor.name}: {exc}") from exc
        values = np.asarray(values, dtype=np.float32).reshape(tuple(reversed(tensor.shape)))
        name = name or tensor.name  # a tensor the runtime has no place for: reported unused
        if arch == "llama" and name.endswith("q_proj.weight"):
            values = _unpermute(values, heads)
        elif arch == "llama" and name.endswith("k_proj.weight"):
            values = _unpermute(values, kv_heads)
        state[name] = torch.from_numpy(values.copy())
    return cfg, state


def gguf_quantized_layers(
    path: Path, cfg: LlamaConfig
) -> tuple[dict[str, Int4Codes], frozenset[str]]:
    """The GGUF's linear layers as the int4 kernel takes them, read from the file's blocks.

    Returns (Q4_0 / Q4_1 layers by module name as exact int4 codes, the names of Q8_0
    layers, which keep 8 bits). A tied output head takes the embedding's storage type.
    Cached as safetensors (``spectune.models.cache_dir``), like the dequantised weights.
    """
    from safetensors import safe_open
    from safetensors.torch import save_file

    cached = derived_path(path, "gguf-int4") / "layers.safetensors"
    try:
        with safe_open(str(cached), framework="pt") as handle:
            int8_names = frozenset(json.loads(handle.metadata()["int8"]))
            parts = {key: handle.get_tensor(key) for key in handle.keys()}
        modules = {key.rsplit(".", 1)[0] for key in parts}
        return {
            m: Int4Codes(parts[f"{m}.codes"], parts[f"{m}.scales"], parts[f"{m}.zeros"])
            for m in modules
        }, int8_names
    except Exception:  # none yet, or damaged (safetensors raises its own kinds): read the file
        pass
    sources, int8_names = _read_quantized_layers(path, cfg)
    tensors = {
        f"{module}.{part}": getattr(codes, part).contiguous()
        for module, codes in sources.items()
        for part in ("codes", "scales", "zeros")
    }
    metadata = {"int8": json.dumps(sorted(int8_names))}
    _write_cache(cached, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))
    return sources, int8_names


def _read_quantized_layers(
    path: Path, cfg: LlamaConfig
) -> tuple[dict[str, Int4Codes], frozenset[str]]:
    reader = _gguf_reader(path)
    sources: dict[str, Int4Codes] = {}
    int8_names: set[str] = set()
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        if name is None or not name.endswith(".weight") or name.endswith("norm.weight"):
            continue
        module = name.removesuffix(".weight")
        if name == "embed_tokens.weight":
            if not cfg.tie_word_embeddings:
                continue  # an embedding only: looked up, never multiplied
            module = "lm_head"
        kind = tensor.tensor_type.name
        if kind == "Q8_0":
            int8_names.add(module)
        if kind not in ("Q4_0", "Q4_1"):
            continue
        try:
            codes = int4_codes_from_gguf(np.asarray(tensor.data), kind)
        except ValueError as exc:
            raise ModelLoadError(f"{path}: cannot read {tensor.name}'s blocks: {exc}") from exc
        heads = {"q_proj": cfg.num_heads, "k_proj": cfg.num_kv_heads}.get(module.split(".")[-1])
        if cfg.family == "llama" and heads is not None:
            codes = Int4Codes(
                *(
                    torch.from_numpy(_unpermute(t.numpy(), heads).copy())
                    for t in (codes.codes, codes.scales, codes.zeros)
                )
            )
        sources[module] = codes
    return sources, frozenset(int8_names)


# GGUF tensors the native runtime knowingly does without: rope_freqs holds precomputed
# rotary frequencies, which default rotary embeddings recompute.
_GGUF_IGNORED = frozenset({"rope_freqs.weight"})


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name == "token_embd.weight":
        return "embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "norm.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _GGUF_NAMES:
        return f"layers.{parts[1]}.{_GGUF_NAMES[parts[2]]}.{parts[3]}"
    return None


def _build(
    cfg: LlamaConfig,
    state: dict[str, torch.Tensor],
    dtype: torch.dtype,
    *,
    source: Path,
    strict: bool = True,
) -> LlamaLM:
    with torch.device("meta"):
        net = LlamaTransformer(cfg)
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    expected = {
        k for k in net.state_dict() if not (cfg.tie_word_embeddings and k == "lm_head.weight")
    }
    missing = expected - state.keys()
    # Old checkpoints carry rotary inverse frequencies, which the runtime recomputes.
    unused = {k for k in state.keys() - expected if not k.endswith("rotary_emb.inv_freq")}
    check_weights(source, missing, unused, strict=strict)
    if missing:  # allowed: random weights, as transformers initialises them
        fresh = LlamaTransformer(cfg).state_dict()
        state = {**{k: fresh[k] for k in missing}, **state}
    net.load_state_dict({k: state[k] for k in expected}, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        net.lm_head.weight = net.embed_tokens.weight
    return LlamaLM(net.to(dtype), name=cfg.name)


# ---------------------------------------------------------------------- safetensors


def _config_from_hf(config: dict[str, Any], name: str) -> LlamaConfig:
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    eos = config.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
    rope = config.get("rope_parameters") or {}
    return LlamaConfig(
        vocab_size=int(config["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(config["intermediate_size"]),
        num_layers=int(config["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        rope_theta=float(config.get("rope_theta", rope.get("rope_theta", 10000.0))),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        max_context=int(config.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=bool(config.get("attention_bias", config.get("model_type") == "qwen2")),
        bos_token_id=config.get("bos_token_id"),
        eos_token_ids=eos_ids,
        pad_token_id=config.get("pad_token_id"),
        family=str(config.get("model_type", "llama")),
        name=name,
    )


def native_from_folder(
    path: Path, *, dtype: torch.dtype = torch.float32, strict: bool = True
) -> LlamaLM:
    """Load an HF-layout folder (config.json + *.safetensors) into the native runtime."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    config = read_json(path / "config.json")
    try:
        cfg = _config_from_hf(config, path.name)
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"{path}/config.json: missing or bad field ({exc})") from exc
    files = sorted(f for f in path.glob("*.safetensors") if f.name not in NOT_WEIGHTS)
    if not files:
        raise ModelLoadError(f"{path}: no .safetensors weights (pickled weights are not loaded)")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            loaded = load_file(str(file))
        except (SafetensorError, OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot read {file}: {exc}") from exc
        for key, value in loaded.items():
            state[key.removeprefix("model.")] = value.float()
    return _build(cfg, state, dtype, source=path, strict=strict)


def save_native(model: LlamaLM, path: Path, *, extra_config: dict[str, Any] | None = None) -> None:
    """Write an HF-layout Llama folder that both spectune and transformers load."""
    from safetensors.torch import save_file

    cfg = model.net.cfg
    path.mkdir(parents=True, exist_ok=True)
    state = {
        ("lm_head.weight" if k == "lm_head.weight" else f"model.{k}"): v.detach().contiguous()
        for k, v in model.net.state_dict().items()
        if not (cfg.tie_word_embeddings and k == "lm_head.weight")
    }
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_context,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": cfg.attention_bias,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": list(cfg.eos_token_ids),
        "pad_token_id": cfg.pad_token_id,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    config.update(extra_config or {})
    (path / "config.json").write_text(json.dumps(config, indent=2))
