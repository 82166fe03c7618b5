"""``n > 1``: one prompt becomes n engine requests, folded back into one ``RequestOutput``.

The n requests carry the same prompt tokens and are queued next to each other (prefix order puts
equal prompts together), so the scheduler admits the first and holds the others while the prompt's
blocks are being computed; they then map the same physical KV blocks through the prefix cache
(reference-counted) and compute only the prompt's last partial block before decoding apart. One
prefill, n decodes.

Seeds: sample 0 keeps the request's seed, so ``n=4`` begins with the same text as ``n=1``; sample j
gets ``sampler.sample_seed(seed, j)``. Noise still depends on (seed, position) only, so every sample
is batch-invariant. Unseeded requests get one engine seed per sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from prefixflow.engine.core.request import RequestSpec
from prefixflow.engine.outputs import CompletionOutput, RequestOutput
from prefixflow.engine.sampling.sampler import sample_seed
from prefixflow.engine.sampling.sampling_params import SamplingParams


@dataclass
class SampleGroup:
    """The samples of one prompt, as they finish."""

    index: int
    n: int
    prompt: str | None
    done: dict[int, RequestOutput] = field(default_factory=dict)


class SampleGroups:
    """Expands prompts into per-sample requests and folds finished samples back per prompt.

    Each sample request gets an internal ``index`` unique within the call (the caller's indexes
    and request ids need not be); outputs get the caller's index back."""

    def __init__(self) -> None:
        self._samples: dict[int, tuple[SampleGroup, int]] = {}
        self._next = 0

    def expand(
        self, index: int, request_id: str, prompt_ids: list[int], params: SamplingParams, prompt: str | None
    ) -> list[RequestSpec]:
        group = SampleGroup(index, params.n, prompt)
        specs = []
        for j in range(params.n):
            p = params
            if params.n > 1:
                p = replace(params, n=1, seed=None if params.seed is None else sample_seed(params.seed, j))
            self._samples[self._next] = (group, j)
            specs.append(RequestSpec(self._next, request_id, prompt_ids, p))
            self._next += 1
        return specs

    def finish(self, out: RequestOutput) -> RequestOutput | None:
        """Record a finished sample; return the prompt's output once all its samples are in."""
        group, sample = self._samples.pop(out.index)
        group.done[sample] = out
        if len(group.done) < group.n:
            return None
        if group.n == 1:
            return replace(out, index=group.index, prompt=group.prompt)
        return combine(group)


def combine(group: SampleGroup) -> RequestOutput:
    outs = [group.done[j] for j in range(group.n)]
    first = outs[0]
    samples = tuple(
        CompletionOutput(j, o.text, o.token_ids, o.finish_reason, o.stop_reason, o.logprobs, o.error)
        for j, o in enumerate(outs)
    )
    firsts = [o.time_to_first_token for o in outs if o.time_to_first_token is not None]
    return replace(
        first,
        index=group.index,
        samples=samples,
        prompt=group.prompt,
        num_output_tokens=sum(o.num_output_tokens for o in outs),
        latency=max(o.latency for o in outs),
        time_to_first_token=min(firsts) if firsts else None,
        metadata={**first.metadata, "cached_tokens_per_sample": [o.num_cached_tokens for o in outs]},
    )
