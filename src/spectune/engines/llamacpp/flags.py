"""A tuned setup as ``llama-server``'s own flags, and the draft as a GGUF it loads.

Flag names as of ``common/arg.cpp`` in the llama.cpp that ``llama-cpp-python`` vendors
(``LLAMACPP_VERSION``). llama-server loads the target and a draft model from GGUF files
only (``target_problem``, ``DRAFT_REFUSALS``); ``draft_gguf`` converts a ``spectune distill
--kind lm`` folder once (cached) for ``tune --engine llamacpp``.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from spectune.engines.drafts import FEATURE_HEAD, HYBRID, DraftKind
from spectune.engines.plan import ExportPlan, prepare
from spectune.engines.tuned import Tuning
from spectune.errors import InvalidParameterError

__all__ = [
    "DRAFT_REFUSALS",
    "LLAMACPP_VERSION",
    "check_draft",
    "draft_gguf",
    "target_problem",
    "to_llamacpp",
]

# The llama.cpp whose llama-server flags ``to_llamacpp`` writes: the one vendored by the
# llama-cpp-python sdist that ``spectune[llamacpp]`` builds. In it ``--draft-max`` /
# ``--draft-min`` are removed (they fail with "the argument has been removed"): the
# draft size is ``--spec-draft-n-max`` / ``--spec-draft-n-min``, and a draft model drafts
# only under ``--spec-type draft-simple`` (without a type, a plain draft GGUF is loaded
# but never used).
LLAMACPP_VERSION = "llama-cpp-python 0.3.36, llama.cpp ggml-org/llama.cpp@0c1e57098"

# The draft kinds llama-server cannot load: why, and what to give it instead.
DRAFT_REFUSALS: dict[DraftKind, str] = {
    "feature-head": FEATURE_HEAD + ", and llama-server's draft-simple loads a standalone "
    "LM draft GGUF: use --draft ngram, or a standalone LM draft as GGUF (spectune distill "
    "--kind lm, converted by spectune tune --engine llamacpp --draft FOLDER)",
    "hybrid": HYBRID + ": use --draft ngram (llama.cpp's ngram-simple)",
    "suffix": "llama.cpp has no suffix drafting (its ngram-simple looks up the request's "
    "own last tokens): use --draft ngram",
    "lm-folder": "llama-server loads a draft model from a GGUF file, not the folder "
    "{draft}: spectune tune --engine llamacpp --draft {draft} converts a spectune distill "
    "--kind lm folder (and measures llama-server's flags), llama.cpp's convert_hf_to_gguf.py "
    "others",
    "hub": "llama-server loads a draft model from a local GGUF file, not the hub id "
    "{draft}: give the path of the draft's GGUF",
}


def target_problem(path: str) -> str | None:
    """Why llama-server cannot load the target at ``path`` (anything but a GGUF file)."""
    if path.endswith(".gguf"):
        return None
    return f"llama-server loads the target from a GGUF file, not {path}: give its .gguf"


def to_llamacpp(tuning: Tuning) -> ExportPlan:
    """``llama-server`` flags (see ``LLAMACPP_VERSION``): a draft model GGUF as ``--spec-type
    draft-simple`` drafting exactly K tokens (``--spec-draft-n-max K``, ``--spec-draft-n-min
    0``, ``--spec-draft-p-min 0``: no early stop on a hesitant draft, like spectune's fixed
    K); n-gram lookup as ``--spec-type ngram-simple``, a 3-token lookup n-gram followed by
    a K-token draft."""
    setup = prepare(tuning, "llamacpp", DRAFT_REFUSALS, target_problem)
    notes = setup.notes
    if setup.draft.kind == "ngram":
        args = [
            "--spec-type",
            "ngram-simple",
            "--spec-ngram-simple-size-n",
            "3",
            "--spec-ngram-simple-size-m",
            str(setup.k),
        ]
        notes.append(
            "llama.cpp's ngram-simple looks up exactly 3 tokens; spectune's n-gram drafter "
            "backs off from 3 to 1 when the longer match fails"
        )
    else:
        assert setup.draft.location is not None
        args = [
            "--spec-type",
            "draft-simple",
            "--spec-draft-model",
            setup.draft.location,
            "--spec-draft-n-max",
            str(setup.k),
            "--spec-draft-n-min",
            "0",
            "--spec-draft-p-min",
            "0",
        ]
    if setup.speculate_max_batch is not None:
        notes.append(
            f"llama-server has no flag to stop speculating above a batch size; speculation "
            f"paid only up to {setup.speculate_max_batch} running requests here, so keep "
            f"--parallel near it or serve larger batches without speculation"
        )
    notes.append(
        f"flag names as of {LLAMACPP_VERSION}; older llama.cpp builds spell the draft size "
        "--draft-max / --draft-min"
    )
    command = shlex.join(["llama-server", "--model", setup.target, *args])
    return ExportPlan("llamacpp", args, command, {}, notes)


def check_draft(draft: str | None) -> Path | None:
    """A draft for llama-server as given, checked: a .gguf file, a ``distill --kind lm``
    folder (``draft_gguf`` converts it), or None for 'ngram' or no draft (no draft model)."""
    if draft in (None, "ngram"):
        return None
    path = Path(draft)
    if (path.suffix == ".gguf" and path.is_file()) or (path / "model.safetensors").is_file():
        return path
    raise InvalidParameterError(
        f"--draft {draft}: llama.cpp takes a draft model as a .gguf file or a "
        "spectune distill --kind lm folder (or 'ngram' for prompt lookup only)"
    )


def draft_gguf(source: Path | None, target: Path) -> Path | None:
    """``check_draft``'s draft as a GGUF llama.cpp loads: a folder converted once (cached)."""
    if source is None or source.is_file():
        return source
    from spectune.models.cache_dir import derived_path
    from spectune.models.gguf_write import write_draft_gguf

    out = derived_path(source / "model.safetensors", "llamacpp-draft").with_suffix(".gguf")
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(".partial")
        write_draft_gguf(source, target, partial)
        partial.replace(out)
    return out
