"""Adding a drafter means implementing protocols, never registering it: its tree form
(``TreeSource``), its start-up line (``Described``), its batch form (``DraftSource``) and
its history (``HistoryUser``) come from the drafter itself; the start-up lines of the
shipped drafters read as they always did."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from spectune.control.base import FixedK
from spectune.decode.batch import BatchEngine
from spectune.draft import Draft
from spectune.drafters import (
    FeatureDrafter,
    HybridDrafter,
    ModelDrafter,
    NgramDrafter,
    ScriptedDrafter,
    SuffixDrafter,
    TreeShape,
)
from spectune.drafters.base import DraftRequest, TargetFeatures
from spectune.drafters.batched import PerRow, batch_source
from spectune.drafters.pairing import drafter_summary, tree_drafter_for, with_history
from spectune.drafters.scripted import ScriptedRows
from spectune.drafters.suffix_history import HistoryStore
from spectune.errors import InvalidParameterError
from spectune.models.llama import LlamaLM
from spectune.models.vocab import TargetVocabModel
from spectune.sampling import SamplingParams
from spectune.server.engines import DraftSource

VOCAB = 64


def sevens(context: Sequence[int], k: int) -> list[int]:
    return [7] * k


class Repeater:
    """A new drafter, known to no module of the package: it proposes 7s, has a tree form
    (a wider repeater), describes itself, and opens row sets of its own."""

    def __init__(self, width: int = 1) -> None:
        self.width = width
        self.name = f"repeater{width}"
        self.inner = ScriptedDrafter(sevens, vocab_size=VOCAB, name=self.name)

    def reset(self) -> None:
        self.inner.reset()

    def propose(
        self,
        context: Sequence[int],
        num_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        return self.inner.propose(context, num_tokens, params, generator)

    def commit(self, context: Sequence[int], features: TargetFeatures | None) -> None:
        self.inner.commit(context, features)

    def tree(self, shape: TreeShape) -> Repeater:
        return Repeater(shape.width)

    def describe(self) -> str:
        return f"{self.name} (repeats 7, width {self.width})"

    def open(self, rows: int, capacity: int | None = None, slack: int = 0) -> ScriptedRows:
        return ScriptedRows(sevens_draft, name=self.name)


def sevens_draft(request: DraftRequest) -> Draft:
    return Draft(torch.full((request.k,), 7, dtype=torch.long), None)


def test_a_new_drafter_needs_only_the_protocols(toy_target: LlamaLM) -> None:
    drafter = Repeater()
    tree = tree_drafter_for(drafter, toy_target, TreeShape(3, 8))
    assert isinstance(tree, Repeater) and tree.width == 3
    assert drafter_summary(drafter) == "repeater1 (repeats 7, width 1)"
    assert drafter_summary(tree) == "repeater3 (repeats 7, width 3)"
    assert batch_source(drafter) is drafter  # a source batches as itself
    served = DraftSource(drafter)
    assert served.for_batch() is drafter and served.name == "repeater1"
    engine = BatchEngine(
        toy_target, served.for_batch(), max_batch=2, policy_factory=lambda p: FixedK(3)
    )
    params = SamplingParams(max_tokens=4)
    engine.add("a", [1, 5, 9], params)
    engine.add("b", [1, 7], params)
    steps = [update.record for update in engine.step()]
    assert [s.positions for s in steps] == [3, 3] and all(s.fallback is None for s in steps)


def test_a_drafter_without_the_faces_gets_the_defaults(toy_target: LlamaLM) -> None:
    plain = ScriptedDrafter(sevens, vocab_size=VOCAB, name="plain")
    assert drafter_summary(plain) == "plain (ScriptedDrafter)"
    with pytest.raises(InvalidParameterError, match="token trees need a draft model"):
        tree_drafter_for(plain, toy_target, TreeShape())
    assert with_history(plain, HistoryStore(100)) is plain
    with pytest.raises(InvalidParameterError, match="cannot copy"):
        batch_source(plain)  # per-row copies need ``fresh``
    assert isinstance(batch_source(NgramDrafter()), PerRow)


def test_history_reaches_suffix_and_hybrid_drafters(toy_draft: LlamaLM) -> None:
    history = HistoryStore(100)
    suffix = with_history(SuffixDrafter(None, name="suffix:none"), history)
    assert isinstance(suffix, SuffixDrafter) and suffix.history is history
    hybrid = with_history(HybridDrafter(SuffixDrafter(None), ModelDrafter(toy_draft)), history)
    assert isinstance(hybrid, HybridDrafter) and hybrid.suffix.history is history


def test_the_shipped_drafters_start_up_lines(
    toy_draft: LlamaLM, toy_feature_drafter: FeatureDrafter
) -> None:
    """The lines ``generate`` and ``serve`` print, each drafter's own ``describe``."""
    model = ModelDrafter(toy_draft)
    m = model.name
    assert drafter_summary(None) == "none (plain decoding)"
    assert drafter_summary(NgramDrafter()) == "ngram (prompt lookup)"
    assert drafter_summary(model) == f"{m} (draft model)"
    reduced = ModelDrafter(toy_draft, vocab_subset=torch.arange(32), name="reduced")
    assert drafter_summary(reduced) == "reduced (draft model, reduced vocabulary of 32 tokens)"
    wider = ModelDrafter(TargetVocabModel(toy_draft, 60))
    assert drafter_summary(wider).endswith(
        "(draft model, drafting over the 60 token ids shared by its vocabulary (64) and the "
        "target's (60))"
    )
    assert drafter_summary(model.tree(TreeShape(2, 8))) == (
        f"tree:{toy_draft.info.name}:w2n8 (draft-model token tree, width 2, 8 nodes)"
    )
    feature = toy_feature_drafter
    assert drafter_summary(feature).startswith(f"{feature.name} (feature head")
    assert drafter_summary(feature.tree(TreeShape(3, 16))).startswith(
        f"tree:{feature.name}:w3n16 (feature-head token tree, width 3, 16 nodes"
    )
    suffix = SuffixDrafter(None, name="suffix:none")
    assert drafter_summary(suffix) == "suffix:none (suffix lookup, no corpus)"
    hybrid = HybridDrafter(suffix, model, merge_greedy=True)
    assert drafter_summary(hybrid) == (
        f"suffix:none+{m} (suffix lookup or {m} (draft model), per step; at T = 0 by situation)"
    )
