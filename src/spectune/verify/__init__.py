"""Verification: which drafted tokens the target keeps, and which token it adds.

``chain`` holds the algorithm's glossary and the chain verifiers (greedy matching and
rejection sampling), ``tree`` the multi-branch verifier for token trees, ``grouped`` chunked
verification of a long chain, and ``draft`` the dispatch a decoding step calls.
"""

from typing import TYPE_CHECKING

from spectune._lazy import lazy_exports

if TYPE_CHECKING:
    from spectune.verify.chain import VerifyResult, verify_greedy, verify_sampled
    from spectune.verify.draft import verify_draft
    from spectune.verify.grouped import verify_in_groups
    from spectune.verify.tree import verify_tree_greedy, verify_tree_sampled
else:  # names load on first use (spectune._lazy)
    __getattr__ = lazy_exports(
        __name__,
        {
            "spectune.verify.chain": ["VerifyResult", "verify_greedy", "verify_sampled"],
            "spectune.verify.draft": ["verify_draft"],
            "spectune.verify.grouped": ["verify_in_groups"],
            "spectune.verify.tree": ["verify_tree_greedy", "verify_tree_sampled"],
        },
    )

__all__ = [
    "VerifyResult",
    "verify_draft",
    "verify_greedy",
    "verify_in_groups",
    "verify_sampled",
    "verify_tree_greedy",
    "verify_tree_sampled",
]
