"""The engine's speculator from its config (None when speculation is off)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prefixflow.engine.config import EngineConfig
from prefixflow.engine.loading.model_source import ModelSource
from prefixflow.engine.speculative.decoder import NgramProposer, Proposer, Speculator
from prefixflow.engine.speculative.forced import ForcedDrafts
from prefixflow.engine.speculative.runs import SpeculationStats


def build_speculator(
    cfg: EngineConfig,
    target: ModelSource,
    max_model_len: int,
    stats: SpeculationStats,
    target_blocks: int,
    token_bytes: Callable[[], Sequence[bytes]] | None = None,
) -> Speculator | None:
    """``token_bytes``: each token's bytes, so grammar-forced drafts learn the target's own split."""
    spec = cfg.speculative_config
    if spec is None or spec.num_speculative_tokens == 0:
        return None
    proposer: Proposer
    forced = None
    if spec.method == "ngram":
        proposer = NgramProposer(spec)
        if spec.jump_forward:
            forced = ForcedDrafts(target.tokenizer, token_bytes)
    else:
        from prefixflow.engine.speculative.draft import DraftProposer

        proposer = DraftProposer(spec, cfg, target, max_model_len, target_blocks)
    return Speculator(spec, proposer, max_model_len, stats, forced)
