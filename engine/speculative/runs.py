"""A verified run's two ends in the scheduler: fitting drafts into a step, and settling what survived.

Drafts are appended to ``token_ids`` before a step, so the run of k+1 positions (the last real token
and k drafts) is scheduled, allocated and computed as an ordinary chunk. ``settle`` rolls
``token_ids`` back to the real tokens and returns the tokens to append: the accepted drafts and the
target's token at the first mismatch (or after the last draft). The scheduler then rolls
``num_computed_tokens`` back to the accepted length, hashes only accepted blocks and frees the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prefixflow.engine.core.kv_cache_manager import KVCacheManager
from prefixflow.engine.core.request import Request

JUMP_FORWARD = "jump_forward"  # drafts the grammar forced (forced.py), counted apart from the method's own
CROSS_REQUEST = "cross_request"  # drafts from other requests' outputs (output_pool.py)
Origin = str | None  # where a draft came from: None for the method's own, else one of the above


@dataclass
class SpeculationStats:
    """Per method: draft tokens proposed, accepted, and verified runs (mean accepted length = accepted / runs).
    A run that mixes drafts of several origins (the method's own, grammar-forced, cross-request) counts
    once under each."""

    proposed: dict[str, int] = field(default_factory=dict)
    accepted: dict[str, int] = field(default_factory=dict)
    runs: dict[str, int] = field(default_factory=dict)
    method: str = "ngram"

    def record(self, proposed: int, accepted: int, method: str | None = None) -> None:
        m = method or self.method
        self.proposed[m] = self.proposed.get(m, 0) + proposed
        self.accepted[m] = self.accepted.get(m, 0) + accepted
        self.runs[m] = self.runs.get(m, 0) + 1

    def as_dict(self) -> dict[str, dict[str, float]]:
        """Per method: proposed, accepted, runs, acceptance rate and mean accepted length (drafts
        accepted per verified run; each run also adds the target's own next token)."""
        out: dict[str, dict[str, float]] = {}
        for m, proposed in self.proposed.items():
            accepted, runs = self.accepted[m], self.runs[m]
            out[m] = {
                "proposed": proposed,
                "accepted": accepted,
                "runs": runs,
                "acceptance_rate": accepted / proposed if proposed else 0.0,
                "mean_accepted_length": accepted / runs if runs else 0.0,
            }
        return out


def fit_drafts(req: Request, n: int, kv: KVCacheManager) -> int:
    """The chunk size for a request with drafts, after dropping the drafts that do not fit ``n``
    (the step's token budget) or the free blocks: a run never makes anyone else preempt."""
    req.drop_drafts(keep=max(0, min(req.num_draft_tokens, n - 1)))
    while req.num_draft_tokens and not kv.can_append(req, 1 + req.num_draft_tokens):
        req.drop_drafts(keep=req.num_draft_tokens - 1)
    return min(req.num_tokens - req.num_computed_tokens, n)


def accepted_length(drafts: list[int], targets: list[int]) -> int:
    """How many drafts the target's samples confirm, from the first on."""
    m = 0
    while m < len(drafts) and targets[m] == drafts[m]:
        m += 1
    return m


def settle(req: Request, targets: list[int], stats: SpeculationStats) -> list[int]:
    """Roll ``req`` back to its real tokens; return the accepted drafts plus the target's next token."""
    d = req.num_draft_tokens
    drafts = req.token_ids[len(req.token_ids) - d :]
    m = accepted_length(drafts, targets)
    req.drop_drafts()
    state = req.spec
    origins: list[Origin] = list(state.origins if state is not None else ())[:d]
    origins += [None] * (d - len(origins))
    for kind in dict.fromkeys(origins):
        proposed = sum(1 for o in origins if o == kind)
        stats.record(proposed, sum(1 for o in origins[:m] if o == kind), kind)
    if state is not None:
        state.observe(origins, m)
    return targets[: m + 1]
