"""The configurations ``spectune tune --engine vllm`` measures: one ``--speculative-config``
each, one vLLM server each.

A ``Candidate`` is one configuration; its ``family`` is the configuration without its K
(``num_speculative_tokens``), so that a batch-size schedule can give each batch size the K
of one family that measured best there. The grid (``Grid``):

- ``off``: no speculation, the baseline every ratio is taken against.
- ``ngram``: vLLM's prompt lookup at each K and each (``prompt_lookup_min``,
  ``prompt_lookup_max``) pair.
- ``suffix``: suffix decoding (arctic-inference) at each K, tree depth
  (``suffix_decoding_max_tree_depth``), minimum token probability
  (``suffix_decoding_min_token_prob``), with the global cache of earlier responses on
  (vLLM's default, 10000 requests) or off (``suffix_decoding_max_cached_requests`` = 0).
- ``eagle3``: an EAGLE-3 head folder (``spectune convert --draft``) at each of its K.
- ``draft_model``: a draft model folder at each K.
- vLLM's built-in methods at their defaults, for comparison: ngram with lookup 5/5 (at the
  largest K; ngram has no default K) and suffix with nothing set (K = its tree depth, 24).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

__all__ = ["MODEL_FREE", "ONE_K_METHODS", "QUICK", "Candidate", "Grid", "candidates"]

MODEL_FREE = ("ngram", "suffix")
# Methods that draft at their num_speculative_tokens or not at all: in a batch-size
# schedule their ranges' K must be 0 or that bound (vLLM 0.32's suffix proposer asserts
# it; ngram and the EAGLE family take any K up to it).
ONE_K_METHODS = frozenset({"suffix"})
SUFFIX_CACHE_ON = 10000  # vLLM's default suffix_decoding_max_cached_requests


@dataclass(frozen=True)
class Candidate:
    """One vLLM speculation configuration."""

    name: str  # "suffix K=3 depth 24 p>=0.1 cache on"
    family: str  # the name without K: configurations that differ only in K
    k: int  # num_speculative_tokens; 0 for off
    config: Mapping[str, Any] | None  # --speculative-config; None: off
    builtin: bool = False  # one of vLLM's methods at its defaults

    def scheduled(self, schedule: list[tuple[int, int, int]]) -> dict[str, Any]:
        """This configuration with a batch-size schedule: ``num_speculative_tokens`` is
        the schedule's largest K (vLLM clamps every range's K to it)."""
        assert self.config is not None, "off has no schedule"
        config = dict(self.config)
        config["num_speculative_tokens"] = max(k for _, _, k in schedule)
        config["num_speculative_tokens_per_batch_size"] = [list(r) for r in schedule]
        return config


@dataclass(frozen=True)
class Grid:
    """Which configurations to measure."""

    methods: tuple[str, ...] = MODEL_FREE
    k: tuple[int, ...] = (2, 4)  # ngram, suffix and draft_model K values
    ngram_lookup: tuple[tuple[int, int], ...] = ((2, 4),)  # (min, max) pairs
    suffix_depth: tuple[int, ...] = (24,)
    suffix_min_prob: tuple[float, ...] = (0.1,)
    suffix_cache: tuple[bool, ...] = (True, False)
    eagle_head: Path | None = None
    eagle_k: tuple[int, ...] = (1, 2, 3, 4)
    draft_model: Path | None = None
    builtins: bool = True  # vLLM's ngram and suffix at their defaults

    def quick(self) -> Grid:
        """The CI-sized grid: one K, one setting of each method, no built-ins beside."""
        return replace(
            self,
            k=(3,),
            ngram_lookup=self.ngram_lookup[:1],
            suffix_depth=self.suffix_depth[:1],
            suffix_min_prob=self.suffix_min_prob[:1],
            suffix_cache=(True,),
            eagle_k=(2,),
            builtins=False,
        )


QUICK = Grid().quick()


def _number(value: float) -> str:
    return f"{value:g}"


def candidates(grid: Grid) -> list[Candidate]:
    """Off first, then every configuration of the grid, then the built-ins that are not
    already in it (configurations are compared by their JSON)."""
    out = [Candidate("off", "off", 0, None)]
    if "ngram" in grid.methods:
        for low, high in grid.ngram_lookup:
            family = f"ngram lookup {low}-{high}"
            for k in grid.k:
                config = {
                    "method": "ngram",
                    "num_speculative_tokens": k,
                    "prompt_lookup_min": low,
                    "prompt_lookup_max": high,
                }
                out.append(Candidate(f"{family} K={k}", family, k, config))
    if "suffix" in grid.methods:
        for depth in grid.suffix_depth:
            for prob in grid.suffix_min_prob:
                for cache in grid.suffix_cache:
                    family = (
                        f"suffix depth {depth} p>={_number(prob)} cache {'on' if cache else 'off'}"
                    )
                    for k in grid.k:
                        config = {
                            "method": "suffix",
                            "num_speculative_tokens": k,
                            "suffix_decoding_max_tree_depth": depth,
                            "suffix_decoding_min_token_prob": prob,
                            "suffix_decoding_max_cached_requests": SUFFIX_CACHE_ON if cache else 0,
                        }
                        out.append(Candidate(f"{family} K={k}", family, k, config))
    heads = [
        ("eagle3", "eagle3", grid.eagle_head, grid.eagle_k),
        ("draft_model", "draft model", grid.draft_model, grid.k),
    ]
    for method, label, folder, ks in heads:
        if folder is None:
            continue
        family = f"{label} {folder.name}"
        for k in ks:
            config = {"method": method, "model": str(folder), "num_speculative_tokens": k}
            out.append(Candidate(f"{family} K={k}", family, k, config))
    if grid.builtins:
        k = max(grid.k)
        defaults = [
            Candidate(
                f"ngram defaults (lookup 5-5, K={k})",
                f"ngram defaults (lookup 5-5, K={k})",
                k,
                {"method": "ngram", "num_speculative_tokens": k},
                builtin=True,
            ),
            # No K given: vLLM drafts up to the tree depth, 24.
            Candidate("suffix defaults", "suffix defaults", 24, {"method": "suffix"}, True),
        ]
        for default in defaults:
            # A grid member that is a built-in at its defaults is measured once, as both.
            key = _key(_resolved(default.config))
            match = [i for i, c in enumerate(out) if _key(c.config) == key]
            if match:
                out[match[0]] = replace(out[match[0]], builtin=True)
            else:
                out.append(default)
    return out


def _key(config: Mapping[str, Any] | None) -> str:
    return json.dumps(config, sort_keys=True)


def _resolved(config: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """A built-in's configuration with vLLM's defaults written out, to find it in a grid."""
    if config is None:
        return None
    if config["method"] == "ngram":
        return {**config, "prompt_lookup_min": 5, "prompt_lookup_max": 5}
    return {
        **config,
        "num_speculative_tokens": 24,
        "suffix_decoding_max_tree_depth": 24,
        "suffix_decoding_min_token_prob": 0.1,
        "suffix_decoding_max_cached_requests": SUFFIX_CACHE_ON,
    }
