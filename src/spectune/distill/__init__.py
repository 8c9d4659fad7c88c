"""Draft distillation: corpus (``data``), losses, draft kinds (``models``), training loop
(``train``), checkpoints, export, and the end-to-end ``pipeline`` behind ``spectune distill``."""
