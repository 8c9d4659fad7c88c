"""Decoding: the step loop that turns prompt tokens into output tokens, and the text around it.

``engine`` decodes one request (``SpeculativeEngine``), ``batch`` advances many together
(``BatchEngine``), ``sequential`` serves a batch one request at a time, ``step`` holds the
pieces of a step both engines share, ``deadline`` bounds a draft pass, and ``text`` turns
the token stream into text with stop strings.
"""

from typing import TYPE_CHECKING

from spectune._lazy import lazy_exports

if TYPE_CHECKING:
    from spectune.decode.batch import BatchEngine, SequenceUpdate
    from spectune.decode.engine import Generation, SpeculativeEngine
else:  # names load on first use (spectune._lazy)
    __getattr__ = lazy_exports(
        __name__,
        {
            "spectune.decode.batch": ["BatchEngine", "SequenceUpdate"],
            "spectune.decode.engine": ["Generation", "SpeculativeEngine"],
        },
    )

__all__ = ["BatchEngine", "Generation", "SequenceUpdate", "SpeculativeEngine"]
