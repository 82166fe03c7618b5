"""One function per engine: run token-id prompts greedily with EOS ignored and measure the same things.

Every runner returns a ``RunResult``: wall time, token counts, per-request time to first token and
inter-token latency (time between tokens after the first), and the generated token ids. All requests
arrive at once (offline), so time to first token counts from the start of the run.
"""

from __future__ import annotations

import copy
import gc
import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from benchmarks.common import BenchModel, Timer, mean, percentiles, synchronize


@dataclass
class RunResult:
    engine: str
    requests: int
    prompt_tokens: int
    output_tokens: int
    elapsed_s: float
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    def summary(self) -> dict:
        """JSON-ready figures (token lists left out)."""
        t = self.elapsed_s
        ttft, itl = percentiles(self.ttft_s), percentiles(self.itl_s)
        return {
            "engine": self.engine,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "elapsed_s": t,
            "output_tok_s": self.output_tokens / t if t else None,
            "total_tok_s": (self.prompt_tokens + self.output_tokens) / t if t else None,
            "ttft_mean_s": mean(self.ttft_s),
            **{f"ttft_{k}_s": v for k, v in ttft.items()},
            "itl_mean_s": mean(self.itl_s),
            **{f"itl_{k}_s": v for k, v in itl.items()},
            **self.extra,
        }


def best_of(repeats: int, run: Callable[[], RunResult]) -> RunResult:
    """The fastest of ``repeats`` runs (a shared host adds noise only upwards); records how many."""
    results = [run() for _ in range(max(1, repeats))]
    best = min(results, key=lambda r: r.elapsed_s)
    best.extra["repeats"] = len(results)
    best.extra["elapsed_all_s"] = [r.elapsed_s for r in results]
    return best


def _itl(first: float | None, last: float, n: int) -> float | None:
    return (last - first) / (n - 1) if first is not None and n > 1 else None


# ---------------------------------------------------------------- prefixflow


def run_prefixflow(
    llm, prompts: Sequence[Sequence[int]], max_tokens: Sequence[int], name: str = "prefixflow"
):
    """Greedy, ``ignore_eos``; engine statistics of this call only go to ``extra``."""
    from prefixflow.engine import SamplingParams

    params = [SamplingParams(max_tokens=int(n), ignore_eos=True) for n in max_tokens]
    before = copy.copy(llm.stats())
    with Timer(_engine_device(llm)) as timer:
        outs = llm.generate([list(p) for p in prompts], params)
    after = llm.stats()
    errors = [o.error for o in outs if not o.ok]
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed in prefixflow, e.g. {errors[0]}")
    delta = {
        k: getattr(after, k) - getattr(before, k)
        for k in ("steps", "prompt_tokens", "cached_prompt_tokens", "computed_prompt_tokens", "preemptions")
    }
    delta["prefix_hit_rate"] = delta["cached_prompt_tokens"] / max(1, delta["prompt_tokens"])
    if hasattr(after, "host_s"):  # host-side time per step: the device's idle gap on GPU
        host = after.host_s - before.host_s
        delta["host_ms_per_step"] = 1000 * host / max(1, delta["steps"])
        delta["engine_elapsed_s"] = after.elapsed_s - before.elapsed_s
    ttft = [o.time_to_first_token for o in outs if o.time_to_first_token is not None]
    itl = [_itl(o.time_to_first_token, o.latency, o.num_output_tokens) for o in outs]
    return RunResult(
        engine=name,
        requests=len(outs),
        prompt_tokens=sum(o.num_prompt_tokens for o in outs),
        output_tokens=sum(o.num_output_tokens for o in outs),
        elapsed_s=timer.seconds,
        ttft_s=ttft,
        itl_s=[x for x in itl if x is not None],
        outputs=[list(o.token_ids) for o in outs],
        extra=delta,
    )


def _engine_device(llm) -> torch.device | None:
    return getattr(getattr(llm.engine, "runner", None), "device", None)


def make_llm(bm: BenchModel, **options):
    """A prefixflow ``LLM`` on the benchmark model's own tensors."""
    from benchmarks.common import engine_options, model_source
    from prefixflow.engine import LLM

    return LLM(model_source(bm), **engine_options(bm, **options))


def release(obj: object | None = None) -> None:
    """Drop what the caller deleted and hand cached device memory back (engines and peers run in turn)."""
    del obj
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- transformers generate (static batches)


class _StepClock:
    """A stopping criterion that never stops and records when each decoding step produced its token."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        synchronize(self.device)
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def run_hf_generate(
    bm: BenchModel, prompts: Sequence[Sequence[int]], max_tokens: Sequence[int], batch_size: int = 16
) -> RunResult:
    """Padded static batches in input order: left padding, greedy, ``max_new_tokens`` = the batch's max.

    Tokens generated past a request's own ``max_tokens`` are dropped: only requested tokens count.
    """
    from transformers import GenerationConfig, StoppingCriteriaList

    dev, pad = bm.device, bm.pad_token_id
    ttft, itl, outputs = [], [], []
    padded_prompt_tokens = generated = 0
    synchronize(dev)
    start = time.perf_counter()
    for b in range(0, len(prompts), batch_size):
        batch = [list(p) for p in prompts[b : b + batch_size]]
        wants = [int(n) for n in max_tokens[b : b + batch_size]]
        width, steps = max(map(len, batch)), max(wants)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, p in enumerate(batch):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        clock = _StepClock(dev)
        gen = GenerationConfig(
            do_sample=False, max_new_tokens=steps, min_new_tokens=0, eos_token_id=None, pad_token_id=pad
        )
        with torch.inference_mode():
            out = bm.model.generate(
                input_ids=ids.to(dev),
                attention_mask=mask.to(dev),
                generation_config=gen,
                stopping_criteria=StoppingCriteriaList([clock]),
            )
        new = out[:, width:].tolist()
        padded_prompt_tokens += width * len(batch)
        generated += len(batch) * len(new[0])
        for row, n in zip(new, wants):
            outputs.append(row[:n])
            got = min(n, len(clock.times))
            ttft.append(clock.times[0] - start)
            if got > 1:
                itl.append((clock.times[got - 1] - clock.times[0]) / (got - 1))
    synchronize(dev)
    elapsed = time.perf_counter() - start
    return RunResult(
        engine="hf_generate",
        requests=len(prompts),
        prompt_tokens=sum(len(p) for p in prompts),
        output_tokens=sum(len(o) for o in outputs),
        elapsed_s=elapsed,
        ttft_s=ttft,
        itl_s=itl,
        outputs=outputs,
        extra={
            "batch_size": batch_size,
            "padded_prompt_tokens": padded_prompt_tokens,
            "generated_tokens": generated,
        },
    )


# ---------------------------------------------------------------- transformers continuous batching


def continuous_batching_support(model: torch.nn.Module) -> str | None:
    """None when ``generate_batch`` / the continuous-batching manager exists, else the reason it does not."""
    import transformers

    if not hasattr(model, "init_continuous_batching"):
        return (
            f"transformers {transformers.__version__} has no continuous batching (init_continuous_batching)"
        )
    return None


def _cb_config(device: torch.device, num_blocks: int | None, max_batch_tokens: int | None, block_size: int):
    """A ``ContinuousBatchingConfig`` when this transformers has one (else None: defaults apply)."""
    try:
        from transformers.generation.configuration_utils import ContinuousBatchingConfig
    except ImportError:
        return None
    if device.type == "cuda" and num_blocks is None:
        return None  # let transformers size the cache from free GPU memory
    names = inspect.signature(ContinuousBatchingConfig).parameters
    kw = {"num_blocks": num_blocks, "max_batch_tokens": max_batch_tokens}
    kw["page_size" if "page_size" in names else "block_size"] = block_size
    return ContinuousBatchingConfig(**{k: v for k, v in kw.items() if k in names and v is not None})


def run_hf_continuous(
    bm: BenchModel,
    prompts: Sequence[Sequence[int]],
    max_tokens: Sequence[int],
    num_blocks: int | None = None,
    max_batch_tokens: int | None = None,
    block_size: int = 256,
) -> RunResult:
    """transformers' continuous batching (paged attention), one request per prompt with its own max tokens.

    Uses the manager that ``generate_batch`` wraps, because ``generate_batch`` takes one
    ``max_new_tokens`` for all prompts. On CPU pass ``num_blocks``/``max_batch_tokens`` (its defaults
    size the cache from GPU memory).
    """
    from transformers import GenerationConfig

    model, dev = bm.model, bm.device
    gen = GenerationConfig(do_sample=False, max_new_tokens=max(max_tokens), eos_token_id=None, pad_token_id=0)
    kwargs: dict = {"generation_config": gen}
    cm_params = inspect.signature(model.continuous_batching_context_manager).parameters
    cb = _cb_config(dev, num_blocks, max_batch_tokens, block_size)
    if cb is not None and "continuous_batching_config" in cm_params:
        kwargs["continuous_batching_config"] = cb
    if "warmup" in cm_params:
        kwargs["warmup"] = dev.type == "cuda"
    if "block" in cm_params:
        kwargs["block"] = True
    results: dict[str, object] = {}
    # no_grad (not inference_mode), as generate_batch does: the manager's cache and graphs outlive a step
    with torch.no_grad(), model.continuous_batching_context_manager(**kwargs) as manager:
        attn = getattr(model.config, "_attn_implementation", None)
        stamps_kw = {"record_timestamps": True} if _accepts(manager.add_request, "record_timestamps") else {}
        synchronize(dev)
        start = time.perf_counter()
        ids = [
            manager.add_request(list(p), request_id=f"r{i}", max_new_tokens=int(n), **stamps_kw)
            for i, (p, n) in enumerate(zip(prompts, max_tokens))
        ]
        while len(results) < len(ids):
            res = manager.get_result(timeout=1)
            if res is None:
                if not manager.is_running():
                    raise RuntimeError("transformers continuous batching stopped before finishing")
                continue
            if _finished(res):
                results[res.request_id] = res
        synchronize(dev)
        elapsed = time.perf_counter() - start
    outputs, ttft, itl = [], [], []
    for rid in ids:
        res = results[rid]
        if res.error:
            raise RuntimeError(f"transformers continuous batching failed request {rid}: {res.error}")
        outputs.append(list(res.generated_tokens))
        stamps = getattr(res, "timestamps", None) or []
        if stamps:
            ttft.append(stamps[0] - start)
            if len(stamps) > 1:
                itl.append((stamps[-1] - stamps[0]) / (len(stamps) - 1))
    return RunResult(
        engine="hf_continuous",
        requests=len(prompts),
        prompt_tokens=sum(len(p) for p in prompts),
        output_tokens=sum(len(o) for o in outputs),
        elapsed_s=elapsed,
        ttft_s=ttft,
        itl_s=itl,
        outputs=outputs,
        extra={"attn_implementation": attn, "per_token_timestamps": bool(stamps_kw)},
    )


def _finished(res) -> bool:
    """A continuous-batching result in a terminal state (``is_finished`` where this version has it)."""
    if hasattr(res, "is_finished"):
        return bool(res.is_finished())
    return getattr(res.status, "name", str(res.status)).upper() in ("FINISHED", "FAILED")


def _accepts(fn, name: str) -> bool:
    """Whether ``fn`` names the keyword ``name`` (a ``**kwargs`` catch-all does not count)."""
    return name in inspect.signature(fn).parameters


def greedy_agreement(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> float:
    """Fraction of requests whose generated token ids are identical (a same-weights sanity check)."""
    pairs = list(zip(a, b))
    return sum(list(x) == list(y) for x, y in pairs) / len(pairs) if pairs else 0.0
