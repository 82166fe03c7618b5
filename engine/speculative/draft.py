"""A draft model in the engine's process, with its own paged KV pool and prefix cache.

Each speculating target request has a shadow request on the draft: the same prompt, sampling
parameters and seed, so the draft samples each position with the same (seed, position) noise as the
target (greedy drafts for greedy targets; coupled draws otherwise, see verify.py). A step first
brings the shadow up to the target's real tokens (its whole prompt the first time, one or two
tokens afterwards), then decodes k drafts. Shadow KV past the tokens the target kept is rolled
back the same way the target's is; only the target's real tokens are hashed into the draft's cache.

The draft's blocks come from a separate pool, sized to the target's block count: the draft can
never push a target request out (a speculation that does not fit is simply not made), and every
request that fits the target fits the draft, whose blocks are smaller.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import replace

from prefixflow.engine.config import EngineConfig
from prefixflow.engine.core.kv_cache_manager import KVCacheManager
from prefixflow.engine.core.request import Request, Status
from prefixflow.engine.core.step_types import ScheduledChunk, SchedulerOutput
from prefixflow.engine.loading.loader import resolve_model
from prefixflow.engine.loading.model_config import ModelConfig
from prefixflow.engine.loading.model_source import ModelSource
from prefixflow.engine.runner.model_runner import ModelRunner
from prefixflow.engine.speculative.config import SpeculativeConfig


def tokenizer_difference(
    target: ModelSource, draft: ModelSource, target_vocab: int, draft_vocab: int
) -> str | None:
    """What differs between the two tokenizers (None when the draft's ids mean what the target's do)."""
    if target_vocab != draft_vocab:
        return f"vocabulary size {draft_vocab} (draft) vs {target_vocab} (target)"
    a, b = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if a != b:
        only = sorted(set(b.items()) - set(a.items()))[:3]
        return f"{len(set(a.items()) ^ set(b.items()))} token-id pairs differ, e.g. draft has {only}"
    if tuple(target.eos_token_ids) != tuple(draft.eos_token_ids):
        return f"EOS ids {tuple(draft.eos_token_ids)} (draft) vs {tuple(target.eos_token_ids)} (target)"
    return None


def parameter_count(cfg: ModelConfig) -> int:
    """Weights of a decoder from its shape (embeddings, attention, MLP), for the size check."""
    h, layers = cfg.hidden_size, cfg.num_layers
    kv = cfg.num_kv_heads * cfg.head_dim
    attn = h * cfg.num_heads * cfg.head_dim * 2 + h * kv * 2
    mlp = 3 * h * cfg.intermediate_size
    return layers * (attn + mlp) + cfg.vocab_size * h * (1 if cfg.tie_word_embeddings else 2)


class DraftProposer:
    lookahead = False

    def __init__(
        self,
        spec: SpeculativeConfig,
        cfg: EngineConfig,
        target: ModelSource,
        max_model_len: int,
        target_blocks: int,
    ) -> None:
        assert spec.model is not None
        self.source = resolve_model(spec.model)
        self.model_cfg = ModelConfig.from_hf(self.source.hf_config)
        target_cfg = ModelConfig.from_hf(target.hf_config)
        problem = tokenizer_difference(target, self.source, target_cfg.vocab_size, self.model_cfg.vocab_size)
        if problem:
            raise ValueError(
                f"speculative_config.model={spec.model!r} does not share the target's tokenizer ({problem}); "
                "a draft model must use the same tokenizer and vocabulary as the model it drafts for"
            )
        draft_params, target_params = parameter_count(self.model_cfg), parameter_count(target_cfg)
        if draft_params >= target_params:
            warnings.warn(
                f"speculative_config.model={spec.model!r} has about {draft_params:,} parameters, not fewer than "
                f"the target's {target_params:,}: drafting costs more than it can save; pick a smaller draft",
                UserWarning,
                stacklevel=2,
            )
        blocks = spec.draft_kv_blocks or target_blocks
        draft_cfg = replace(
            cfg,
            model=spec.model,
            speculative_config=None,
            tensor_parallel_size=1,
            quantization=None,
            kv_offload_bytes=0,
            kv_cache_dir=None,
            num_kv_blocks=blocks,
        )
        self.cfg = draft_cfg
        self.runner = ModelRunner(self.source, self.model_cfg, draft_cfg, max_model_len)
        self.kv = KVCacheManager(self.runner.num_blocks, cfg.block_size, cfg.enable_prefix_caching)
        self.shadows: dict[int, Request] = {}  # target key -> shadow request on the draft
        self.seconds_per_token = 0.0  # moving average of draft time per proposed token (the policy's cost)
        self.draft_s = 0.0

    def _shadow(self, req: Request) -> Request:
        shadow = self.shadows.get(req.key)
        if shadow is None:
            shadow = Request(
                req.index,
                req.request_id,
                list(req.prompt_token_ids),
                req.params,
                req.max_tokens + 64,
                req.seed,
            )
            shadow.status = Status.WAITING
            self.shadows[req.key] = shadow
        return shadow

    def forget(self, live: set[int]) -> None:
        """Free the shadows of target requests that are no longer running (finished, aborted, preempted)."""
        for key in [k for k in self.shadows if k not in live]:
            self.kv.free(self.shadows.pop(key))

    def _sync(self, req: Request, shadow: Request) -> None:
        """Make the shadow's tokens the target's real tokens, keeping KV only where they agree."""
        real = req.token_ids
        n = len(req.token_ids) - req.num_draft_tokens
        keep = min(shadow.num_computed_tokens, n)
        start = max(0, keep - 64)
        lcp = start
        while lcp < keep and shadow.token_ids[lcp] == real[lcp]:
            lcp += 1
        del shadow.token_ids[lcp:]
        shadow.token_ids.extend(real[lcp:n])
        shadow.num_computed_tokens = lcp
        if self.kv.block_table(shadow):
            self.kv.truncate(shadow)

    def propose(self, requests: list[Request], ks: list[int]) -> list[list[int]]:
        start = time.perf_counter()
        try:
            drafts = self._propose(requests, ks)
        except Exception as exc:  # the draft is an optimization: its failure must not fail the target
            warnings.warn(
                f"draft model step failed, decoding without drafts: {exc!r}", RuntimeWarning, stacklevel=2
            )
            self.forget(set())
            return [[] for _ in requests]
        made = sum(len(d) for d in drafts)
        spent = time.perf_counter() - start
        self.draft_s += spent
        if made:
            per_token = spent / made
            self.seconds_per_token = (
                per_token if not self.seconds_per_token else (0.8 * self.seconds_per_token + 0.2 * per_token)
            )
        return drafts

    def _propose(self, requests: list[Request], ks: list[int]) -> list[list[int]]:
        drafts: list[list[int]] = [[] for _ in requests]
        active: list[int] = []
        chunks: list[ScheduledChunk] = []
        budget = self.cfg.max_num_batched_tokens
        for i, (req, k) in enumerate(zip(requests, ks)):
            if k <= 0:
                continue
            shadow = self._shadow(req)
            self._sync(req, shadow)
            if not self.kv.block_table(shadow):  # first time: its prompt, with the draft's cache hits
                prefix = self.kv.cached_prefix(shadow)
                if not self.kv.admit(shadow, prefix, 0):
                    continue
                shadow.num_computed_tokens = len(prefix) * self.kv.block_size
            n = min(shadow.num_tokens - shadow.num_computed_tokens, budget)  # a long prompt: in chunks
            if n <= 0 or not self.kv.can_append(shadow, n + k):
                continue  # no room this step: this request decodes plainly
            budget -= n
            self.kv.append(shadow, n)
            chunks.append(ScheduledChunk(shadow, n, self.kv.block_table(shadow)))
            active.append(i)
        for j in range(max((ks[i] for i in active), default=0)):
            if not chunks:
                break
            out = self.runner.execute(SchedulerOutput(chunks))
            nxt_chunks: list[ScheduledChunk] = []
            nxt_active: list[int] = []
            for i, chunk in zip(active, chunks):
                shadow = chunk.request
                shadow.num_computed_tokens += chunk.num_tokens
                if j == 0:
                    self.kv.commit_computed(shadow)  # real tokens only: drafts are never hashed
                token = out.sampled.get(shadow.key)
                if token is None:
                    continue
                drafts[i].append(token)
                shadow.token_ids.append(token)
                if len(drafts[i]) < ks[i]:
                    self.kv.append(shadow, 1)
                    nxt_chunks.append(ScheduledChunk(shadow, 1, self.kv.block_table(shadow)))
                    nxt_active.append(i)
            chunks, active = nxt_chunks, nxt_active
        return drafts

    def close(self) -> None:
        self.runner.close()
