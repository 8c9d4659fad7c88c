"""Tiny on-disk models for the benchmark tests: a toy target and draft in HF layout with a
WordLevel tokenizer that has a chat template (no downloads)."""

from __future__ import annotations

import json
from pathlib import Path

from spectune.models.loading import save_native
from spectune.models.toy import perturbed, toy_model

VOCAB = ["<pad>", "<s>", "</s>", "[UNK]"] + [f"w{i}" for i in range(60)]  # 64 = toy vocab
CHAT_TEMPLATE = (
    "{% for m in messages %}<s> {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<s> {% endif %}"
)


def save_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    inner = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    inner.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=inner,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="[UNK]",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(folder))


def make_models(root: Path) -> tuple[Path, Path]:
    """(target folder, draft folder), both loadable by spectune and transformers."""
    target = toy_model(0, scale=3.0)
    target_dir, draft_dir = root / "target", root / "draft"
    save_native(target, target_dir)
    save_native(perturbed(target, 0.3), draft_dir)
    for folder in (target_dir, draft_dir):
        save_tokenizer(folder)
    return target_dir, draft_dir


def make_prompts(path: Path) -> Path:
    """Two categories, two prompts each, with repeated words so n-gram lookup has matches."""
    lines = []
    for category, base in (("alpha", 4), ("beta", 20)):
        for i in range(2):
            words = " ".join(f"w{base + (j % 5) + i}" for j in range(12))
            lines.append(
                {
                    "id": f"{category}-{i}",
                    "category": category,
                    "messages": [{"role": "user", "content": words}],
                }
            )
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path
