"""The drafter contracts: propose tokens, then hear what the target committed.

A drafter is any source of guesses. It receives the committed context (prompt and
output so far) on every call and keeps whatever private state it likes in sync with it;
the engine never reaches into a drafter. Two shapes:

- ``Drafter``: one sequence (``reset``/``propose``/``commit``); what the single-sequence
  engine drives, and what simple drafters (n-gram lookup, test doubles) implement.
- ``DraftRows``: rows of a batch (``add``/``move``/``free``/``propose(requests)``/
  ``commit(row, ...)``); what the batched engine drives. A learned drafter is written
  once, as a row set over rows that its source opens (``ModelDrafter.open``); its
  ``Drafter`` face is a one-row set (``OneRow``), so a sequence drafts the same
  tokens alone or batched. Simple drafters are lifted to row sets by one adapter
  (``spectune.drafters.batched.PerSequenceDrafters``).

Optional faces a drafter may have, so that adding a drafter means implementing these
protocols, never registering it anywhere: ``TreeSource`` (its token-tree form, what
``--tree`` drafts with), ``Described`` (what it is, in words, for start-up lines) and
``Renewable`` (a copy with its own per-request state, what the server gives each request).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import torch
from torch import Tensor

from spectune.draft import MAX_TREE_NODES, Draft, Refusal
from spectune.errors import DrafterError, InvalidParameterError
from spectune.sampling import SamplingParams

__all__ = [
    "Described",
    "DraftRequest",
    "DraftRows",
    "DraftSource",
    "Drafter",
    "ModelFree",
    "OneRow",
    "RowDrafter",
    "SequenceScorer",
    "TargetFeatures",
    "TreeShape",
    "TreeSource",
    "describe",
    "fresh_drafter",
    "guessed_token",
    "guesses",
    "model_free",
    "propose_ready",
    "shadow_guess",
]


@dataclass(frozen=True)
class TargetFeatures:
    """Target hidden states the engine already computed, handed to drafters that read them.

    ``hidden[i]`` is the target's last hidden state at context position ``start + i``
    (the state that predicted the token at ``start + i + 1``).
    """

    start: int
    hidden: Tensor  # [n, hidden_size]


@runtime_checkable
class Drafter(Protocol):
    """A source of draft tokens: ``propose`` guesses, ``commit`` hears what was kept."""

    name: str

    def reset(self) -> None:
        """Forget all per-request state (a new request begins)."""
        ...

    def propose(
        self,
        context: Sequence[int],
        num_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        """Propose up to ``num_tokens`` tokens to follow ``context`` (prompt + output so far).

        Sampling drafters draw from the processed distribution (``params``), using
        ``generator``, and return those exact probabilities.
        """
        ...

    def commit(self, context: Sequence[int], features: TargetFeatures | None) -> None:
        """Hear the committed context after a step (accepted tokens plus the target's token).

        ``features`` carries the target hidden states computed by that step, for drafters
        that read them; others ignore it.
        """
        ...


@runtime_checkable
class Renewable(Protocol):
    """A drafter that can make a copy of itself for a new request: the same weights (or
    index), its own empty per-request state."""

    def fresh(self) -> Drafter: ...


@runtime_checkable
class ModelFree(Protocol):
    """Optional: a drafter that runs no model (a lookup: n-gram, suffix), whose drafts are
    one-hot and cost about nothing to ask for. Its one-token guess may be checked on plain
    steps at any temperature (``StepPlan.shadow``, ``guesses``)."""

    model_free: bool


def model_free(drafter: object) -> bool:
    """Whether ``drafter`` (a drafter or a batch's draft row set) runs no model (``ModelFree``)."""
    return isinstance(drafter, ModelFree) and drafter.model_free


def guesses(drafter: object, params: SamplingParams) -> bool:
    """Whether a plain step that asks for it (``StepPlan.shadow``) may have ``drafter``'s
    one-token guess checked: a model-free drafter's at any temperature; a model's at
    temperature 0 only, where its draft is one-hot (a sampled draft carries probabilities,
    and a guess drawn from them would be kept by verification more often than the target
    emits it). Whether a model's guess is worth its draft step is the policy's call."""
    return model_free(drafter) or params.greedy


def shadow_guess(
    drafter: Drafter,
    context: Sequence[int],
    params: SamplingParams,
    generator: torch.Generator | None,
) -> int | None:
    """The drafter's one-token guess for a plain step (``StepPlan.shadow``, ``guesses``);
    None where it has none, or where it fails (a guess is only evidence: never an error)."""
    try:
        return guessed_token(drafter.propose(context, 1, params, generator), params)
    except Exception:  # noqa: BLE001 - the step is plain either way
        return None


def guessed_token(answer: Draft | Refusal, params: SamplingParams) -> int | None:
    """The first token of a chain draft that is one-hot under ``params`` (a shadow guess):
    any chain at temperature 0, where verification keeps exactly the target's argmax; a
    draft without probabilities (a lookup's) at any temperature. None for anything else."""
    if isinstance(answer, Refusal) or answer.parents is not None or not len(answer):
        return None
    if answer.probs is not None and not params.greedy:
        return None
    return int(answer.tokens[0])


def fresh_drafter(drafter: Drafter) -> Drafter:
    """A drafter with the same weights and its own (empty) per-request state (what the
    server and the experiments give each request); ``InvalidParameterError`` for a drafter
    that cannot copy itself."""
    if isinstance(drafter, Renewable):
        return drafter.fresh()
    raise InvalidParameterError(f"cannot copy a {type(drafter).__name__} drafter")


@dataclass(frozen=True)
class TreeShape:
    """How a token tree grows: children per expanded node, node budget, pruning threshold
    (``spectune.drafters.tree``)."""

    width: int = 2
    nodes: int = 16
    min_path_prob: float = 0.0

    def __post_init__(self) -> None:
        if not 1 <= self.width <= 8:
            raise InvalidParameterError(f"tree width must be in [1, 8], got {self.width}")
        if not 1 <= self.nodes <= MAX_TREE_NODES:
            raise InvalidParameterError(
                f"tree node budget must be in [1, {MAX_TREE_NODES}], got {self.nodes}"
            )
        if not 0.0 <= self.min_path_prob < 1.0:
            raise InvalidParameterError("min_path_prob must be in [0, 1)")


@runtime_checkable
class TreeSource(Protocol):
    """A drafter with a token-tree form (``spectune.drafters.pairing.tree_drafter_for``
    checks the target's side; the drafter checks its own)."""

    def tree(self, shape: TreeShape) -> Drafter:
        """The tree-drafting form of this drafter, with its own per-request state;
        ``InvalidParameterError`` where this drafter cannot draft trees."""
        ...


@runtime_checkable
class Described(Protocol):
    """A drafter that says what it is: kind, name, and how it covers the target's
    vocabulary (the start-up line of ``generate`` and ``serve``)."""

    def describe(self) -> str: ...


def describe(drafter: Drafter) -> str:
    """What drafts, in words: its own ``describe``, else its name and class."""
    if isinstance(drafter, Described):
        return drafter.describe()
    return f"{drafter.name} ({type(drafter).__name__})"


@runtime_checkable
class SequenceScorer(Protocol):
    """A drafter that can give, in one teacher-forced pass, the distribution it would draft
    from after every prefix of a sequence (what ``spectune select`` needs to estimate the
    acceptance rate without a decoding loop). Drafters without it are scored by proposing
    one token per prefix."""

    def score_sequence(
        self,
        tokens: Sequence[int],
        target_hidden: Tensor | None,  # [len(tokens) - 1, hidden]: h[i] predicted token i + 1
        params: SamplingParams,
    ) -> Tensor:
        """[len(tokens) - 1, vocab]: row i is the draft distribution for token i + 1."""
        ...


@dataclass(frozen=True)
class DraftRequest:
    """One sequence's ask in a draft pass."""

    row: int
    context: Sequence[int]  # committed tokens: prompt + output so far
    k: int  # draft tokens wanted
    params: SamplingParams
    generator: torch.Generator | None


class DraftRows(Protocol):
    """A drafter's state for the rows of a batch (row r: the sequence in the engine's row r)."""

    name: str

    def add(self, row: int, prompt: Sequence[int], features: TargetFeatures | None) -> None:
        """A sequence joins at ``row`` (the row is empty)."""
        ...

    def move(self, src: int, dst: int) -> None:
        """The sequence at ``src`` now lives at ``dst`` (``dst`` was freed)."""
        ...

    def free(self, row: int) -> None:
        """The sequence at ``row`` left the batch."""
        ...

    def propose(self, requests: Sequence[DraftRequest], num_rows: int) -> list[Draft | Refusal]:
        """One draft (or a refusal saying why not) per request, in request order.

        ``num_rows`` is the number of active rows (requests cover a subset of them).
        Raising fails every request of the pass; the engine then decodes them plainly.
        """
        ...

    def commit(self, row: int, context: Sequence[int], features: TargetFeatures | None) -> None:
        """Hear the committed context of ``row`` after a step."""
        ...


@runtime_checkable
class DraftSource(Protocol):
    """What drafts, as the batched engine needs it: weights (or a recipe for simple
    drafters) that open a row set over the rows of a batch."""

    name: str

    def open(self, rows: int, capacity: int | None = None, slack: int = 0) -> DraftRows:
        """A row set over ``rows`` rows of at most ``capacity`` tokens each (None: the
        source's own limit); ``slack``: slots padding may write past a row's length."""
        ...


def propose_ready(
    requests: Sequence[DraftRequest],
    refuse: Callable[[DraftRequest], Draft | Refusal | None],
    draft: Callable[[list[DraftRequest]], list[Draft]],
) -> list[Draft | Refusal]:
    """One answer per request, in order: what ``refuse`` says for a request it turns away
    (a reason, or an empty draft), else its draft from one ``draft`` call over the rest."""
    answers = [refuse(req) for req in requests]
    ready = [req for req, answer in zip(requests, answers, strict=True) if answer is None]
    drafts = iter(draft(ready) if ready else [])
    return [next(drafts) if answer is None else answer for answer in answers]


S = TypeVar("S", bound=DraftRows)


class OneRow(Generic[S]):
    """Row 0 of a one-row ``DraftRows`` driven as one sequence: the state behind a
    learned drafter's ``Drafter`` face. The row set is opened on first use; a sequence
    joins it on its first ``commit`` (or ``propose``), and ``reset`` frees it."""

    def __init__(self, open_rows: Callable[[], S]) -> None:
        self._open = open_rows
        self._state: S | None = None
        self.joined = False

    @property
    def state(self) -> S:
        if self._state is None:
            self._state = self._open()
        return self._state

    def reset(self) -> None:
        if self.joined:
            self.state.free(0)
        self.joined = False

    def join(self, context: Sequence[int], features: TargetFeatures | None = None) -> None:
        """The sequence joins row 0 with ``context`` as its prompt, unless it has."""
        if not self.joined:
            self.state.add(0, context, features)
            self.joined = True

    def commit(self, context: Sequence[int], features: TargetFeatures | None) -> None:
        if self.joined:
            self.state.commit(0, context, features)
        else:
            self.join(context, features)

    def propose(
        self,
        context: Sequence[int],
        num_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        """The row set's draft for row 0; a refusal raises ``DrafterError`` (the engine
        then decodes the request plainly, as for any failing drafter)."""
        self.join(context)
        request = DraftRequest(0, context, num_tokens, params, generator)
        answer = self.state.propose([request], 1)[0]
        if isinstance(answer, Refusal):  # the engine makes it a drafter_error reason
            raise DrafterError(answer.kind.value if answer.detail is None else answer.detail)
        return answer


class RowDrafter:
    """A learned drafter's ``Drafter`` face: ``reset``, ``propose`` and ``commit`` drive its
    one-row set (``self.row``, set by the subclass), so the model drafter and the
    feature drafter write them once."""

    row: OneRow[Any]

    def reset(self) -> None:
        self.row.reset()

    def propose(
        self,
        context: Sequence[int],
        num_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        return self.row.propose(context, num_tokens, params, generator)

    def commit(self, context: Sequence[int], features: TargetFeatures | None) -> None:
        """The committed tokens (and, for a feature head, the target states the step just
        verified) go to the row set's row."""
        self.row.commit(context, features)
