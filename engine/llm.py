"""The public facade: ``LLM(model=...)`` then ``generate`` / ``generate_stream`` / ``score_choices``."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import fields, replace
from typing import Any, cast

from prefixflow.engine.config import EngineConfig
from prefixflow.engine.core.call_streams import CallStreams
from prefixflow.engine.core.llm_engine import LLMEngine
from prefixflow.engine.core.request import RequestSpec
from prefixflow.engine.core.stats import EngineStats
from prefixflow.engine.loading.model_source import ModelSource
from prefixflow.engine.outputs import RequestOutput
from prefixflow.engine.sampling.sample_groups import SampleGroups
from prefixflow.engine.sampling.sampling_params import SamplingParams

Prompt = str | Sequence[int]
Choice = str | Sequence[int]  # a choice to score: text, or the exact token ids


class LLM:
    """Loads a model once and runs batches of prompts through the continuous-batching engine.

    ``model`` is a preset name (``tiny``), the embedded default (``smollm2-135m-instruct``), an HF
    directory, a ``.gguf`` file or an in-memory ``ModelSource``; other keywords are ``EngineConfig``
    fields. With ``tensor_parallel_size=N`` it owns N-1 worker processes: use it as a context manager
    or call ``close()`` to stop them deterministically.
    """

    def __init__(self, model: str | ModelSource = "tiny", **options: Any) -> None:
        known = {f.name for f in fields(EngineConfig)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown engine option(s) {unknown}; valid options: {sorted(known - {'model'})}")
        name = model.name if isinstance(model, ModelSource) else str(model)
        self.config = EngineConfig(model=name, **options)
        self.engine = LLMEngine(self.config, model)
        self._streams = CallStreams(self.engine)
        self.tokenizer = self.engine.tokenizer
        self.max_model_len = self.engine.max_model_len
        self.vocab_size = self.engine.model_cfg.vocab_size  # what sampling values are checked against
        # prompts taken from a non-list iterable per refill (see generate_stream)
        self.stream_window = max(256, 4 * self.config.max_num_seqs)

    def generate(
        self,
        prompts: Iterable[Prompt] | Prompt,
        params: SamplingParams | Iterable[SamplingParams] | None = None,
        request_ids: Iterable[str] | None = None,
    ) -> list[RequestOutput]:
        """All outputs, in input order (one per prompt; ``outputs`` holds its ``n`` samples)."""
        outputs = list(self.generate_stream(prompts, params, request_ids))
        return sorted(outputs, key=lambda o: o.index)

    def generate_stream(
        self,
        prompts: Iterable[Prompt] | Prompt,
        params: SamplingParams | Iterable[SamplingParams] | None = None,
        request_ids: Iterable[str] | None = None,
    ) -> Iterator[RequestOutput]:
        """Yield each prompt's output as soon as it (every one of its samples) finishes; errors first.

        A list (any ``Sequence``) is prefix-sorted as a whole. Any other iterable (a generator, a
        file reader) is consumed lazily, ``stream_window`` prompts at a time, topping the engine up
        whenever fewer than ``max_num_seqs`` requests are left, so memory stays bounded however long
        the input is; prefix order then holds within each window.
        """
        if isinstance(prompts, str) or (
            isinstance(prompts, Sequence) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [cast(Prompt, prompts)]
        if isinstance(prompts, Sequence):
            listed = cast(Sequence[Prompt], prompts)
            n = len(listed)
            param_list: Iterable[SamplingParams] = self._broadcast_params(params, n)
            ids = [str(i) for i in range(n)] if request_ids is None else [str(r) for r in request_ids]
            if len(ids) != n:
                raise ValueError(f"{len(ids)} request_ids for {n} prompts")
            yield from self._run_prompts(zip(listed, param_list, ids), window=None)
            return
        param_iter = (
            itertools.repeat(params or SamplingParams())
            if params is None or isinstance(params, SamplingParams)
            else iter(params)
        )
        id_iter = (
            (str(i) for i in itertools.count()) if request_ids is None else (str(r) for r in request_ids)
        )
        yield from self._run_prompts(zip(prompts, param_iter, id_iter), window=self.stream_window)

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]] | Sequence[Sequence[Mapping[str, Any]]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation (a list of ``{"role", "content"}`` messages) or to a
        list of conversations, through the model's chat template; outputs in input order. A
        conversation the template cannot render comes back as an error output."""
        one = bool(messages) and isinstance(messages[0], Mapping)
        conversations: list[Any] = [messages] if one else list(messages)
        texts: list[str | None] = []
        problems: dict[int, str] = {}
        for i, conversation in enumerate(conversations):
            try:
                texts.append(self.apply_chat_template(list(conversation), add_generation_prompt))
            except Exception as exc:
                texts.append(None)
                problems[i] = f"cannot apply the chat template: {exc}"
        token_ids = [
            self.tokenizer.encode(t, add_special_tokens=False) if t is not None else [] for t in texts
        ]
        outs = self.generate(token_ids, params)
        return [
            self.engine.error_output(i, out.request_id, [], problems[i])
            if i in problems
            else replace(out, prompt=texts[i])
            for i, out in enumerate(outs)
        ]

    def _run_prompts(
        self, items: Iterable[tuple[Prompt, SamplingParams, str]], window: int | None
    ) -> Iterator[RequestOutput]:
        """Feed (prompt, params, id) items to the engine, all at once (``window`` None) or ``window``
        at a time whenever fewer than ``max_num_seqs`` of this call's requests are left, and yield
        per-prompt outputs as they finish. Each window is one owned stream (``CallStreams``)."""
        groups = SampleGroups()
        source = enumerate(items)
        streams: deque[Iterator[RequestOutput]] = deque()
        in_flight, exhausted = 0, False
        try:
            while True:
                if not exhausted and (window is None or in_flight < self.config.max_num_seqs):
                    batch = list(source) if window is None else list(itertools.islice(source, window))
                    exhausted = window is None or len(batch) < window
                    specs: list[RequestSpec] = []
                    for i, (prompt, p, rid) in batch:
                        token_ids, problem = self._tokenize(prompt)
                        problem = problem or self.engine.validate(token_ids, p)
                        text = prompt if isinstance(prompt, str) else None
                        if problem:
                            yield replace(self.engine.error_output(i, rid, token_ids, problem), prompt=text)
                        else:
                            specs += groups.expand(i, rid, token_ids, p, text)
                    if specs:
                        streams.append(self._run(specs))
                        in_flight += len(specs)
                    continue
                if not streams:
                    return
                try:
                    out = next(streams[0])
                except StopIteration:
                    streams.popleft()
                    continue
                in_flight -= 1
                done = groups.finish(out)
                if done is not None:
                    yield done
        finally:
            for stream in streams:  # the caller stopped early: abort only this call's requests
                close = getattr(stream, "close", None)
                if close is not None:
                    close()

    def score_choices(
        self,
        prompts: Sequence[Prompt],
        choices: Sequence[Sequence[Choice]],
        usage: list[dict[str, Any]] | None = None,
    ) -> list[list[float] | str]:
        """Total log-probability of each choice (a string, or token ids to score exactly those
        tokens) as a continuation of its prompt.

        Every choice of a prompt is one request ``prompt + choice``; with prefix ordering they run
        next to each other and share the prompt's KV blocks through the prefix cache. Pass a list as
        ``usage`` to receive, per prompt, ``{"tokens": ..., "cached_tokens": ...}`` summed over its
        choice requests (the engine's own accounting of what the prefix cache served) and
        ``"choice_tokens"``: how many tokens each choice was scored over (for per-token averages).
        """
        results: list[list[float] | str] = [[] for _ in choices]
        counts: list[dict[str, Any]] = [{} for _ in choices]
        for i, scores, use in self.score_choices_stream(prompts, choices):
            results[i], counts[i] = scores, use
        if usage is not None:
            usage[:] = counts
        return results

    def score_choices_stream(
        self, prompts: Sequence[Prompt], choices: Sequence[Sequence[Choice]]
    ) -> Iterator[tuple[int, list[float] | str, dict[str, Any]]]:
        """``score_choices`` one prompt at a time: ``(prompt index, scores or error message, usage)`` as
        soon as every choice of that prompt is scored (errors first), so a caller can report each
        prompt's result while the rest of the batch is still running."""
        if len(prompts) != len(choices):
            raise ValueError(f"{len(choices)} choice lists for {len(prompts)} prompts")
        results: list[list[float] | str] = [[0.0] * len(c) for c in choices]
        specs: list[RequestSpec] = []
        owner: dict[int, tuple[int, int]] = {}
        greedy = SamplingParams(max_tokens=1)
        prompt_lens = [0] * len(prompts)
        for i, (prompt, opts) in enumerate(zip(prompts, choices)):
            prompt_ids, problem = self._tokenize(prompt)
            prompt_lens[i] = len(prompt_ids)
            if not problem and not opts:
                problem = "no choices given"
            for j, choice in enumerate(opts):
                if problem:
                    break
                if isinstance(choice, str):
                    choice_ids = self.tokenizer.encode(choice, add_special_tokens=False) if choice else []
                else:
                    choice_ids, problem = self._tokenize(choice)
                    if problem:
                        problem = f"choice {choice!r}: {problem}"
                        break
                if not choice_ids:
                    problem = f"choice {choice!r} tokenizes to nothing"
                    break
                full = prompt_ids + choice_ids
                checked = prompt_ids if isinstance(choice, str) else full  # given ids: in the vocabulary?
                problem = self.engine.validate(checked, greedy) or (
                    f"prompt + choice has {len(full)} tokens; max_model_len is {self.max_model_len}"
                    if len(full) >= self.max_model_len
                    else None
                )
                owner[len(specs)] = (i, j)
                specs.append(RequestSpec(len(specs), f"{i}:{j}", full, greedy, score_from=len(prompt_ids)))
            if problem:
                results[i] = problem
        counts: list[dict[str, Any]] = [
            {"tokens": 0, "cached_tokens": 0, "choice_tokens": [0] * len(c)} for c in choices
        ]
        for index, (i, j) in owner.items():
            counts[i]["choice_tokens"][j] = len(specs[index].prompt_token_ids) - prompt_lens[i]
        for i, result in enumerate(results):
            if isinstance(result, str):
                yield i, result, counts[i]
        keep = [spec for spec in specs if not isinstance(results[owner[spec.index][0]], str)]
        left = [0] * len(prompts)
        for spec in keep:
            left[owner[spec.index][0]] += 1
        for out in self._run(keep):
            i, j = owner[out.index]
            scores = results[i]
            assert not isinstance(scores, str)
            scores[j] = out.metadata["score"]
            counts[i]["tokens"] += out.num_prompt_tokens
            counts[i]["cached_tokens"] += out.num_cached_tokens
            left[i] -= 1
            if left[i] == 0:
                yield i, scores, counts[i]

    def _run(self, specs: list[RequestSpec]) -> Iterator[RequestOutput]:
        """This call's requests only: other calls' streams on this LLM may be open at the same time."""
        if self.config.ordering == "prefix":
            specs = sorted(
                specs, key=lambda s: s.prompt_token_ids
            )  # lexicographic = depth-first over the prefix trie
        return self._streams.run(specs)

    def _tokenize(self, prompt: Prompt) -> tuple[list[int], str | None]:
        if isinstance(prompt, str):
            bos = getattr(self.tokenizer, "bos_token", None)
            add_special = not (bos and prompt.startswith(bos))  # a chat template may have added BOS already
            return self.tokenizer.encode(prompt, add_special_tokens=add_special), (
                None if prompt else "empty prompt"
            )
        if prompt is None:
            return [], "prompt is None"
        try:
            ids = list(prompt)
        except TypeError:
            return [], f"prompt must be a string or a list of token ids, got {type(prompt).__name__}"
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            bad = next(t for t in ids if not isinstance(t, int) or isinstance(t, bool))
            return [], f"token ids must be integers, got {bad!r}"
        return ids, None

    @staticmethod
    def _broadcast_params(
        params: SamplingParams | Iterable[SamplingParams] | None, n: int
    ) -> list[SamplingParams]:
        if params is None:
            return [SamplingParams()] * n
        if isinstance(params, SamplingParams):
            return [params] * n
        items = list(params)
        if len(items) != n:
            raise ValueError(f"{len(items)} SamplingParams for {n} prompts")
        return items

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        template = getattr(self.tokenizer, "chat_template", None) or self.engine.source.chat_template
        if not template:
            raise ValueError(f"model {self.config.model!r} has no chat template")
        text: str = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, chat_template=template
        )
        return text

    def close(self) -> None:
        """Stop the tensor-parallel worker processes now (garbage collection and interpreter exit do it
        too), after every block file the disk tier (``kv_cache_dir``) still has to write. The LLM cannot
        generate afterwards. Idempotent."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> EngineStats:
        return self.engine.stats

    def add_step_listener(self, listener: Callable[[EngineStats], None]) -> Callable[[], None]:
        """Call ``listener(stats)`` after every engine step (in the thread that steps the engine, i.e.
        the one reading the outputs); returns the function that removes it. Live progress and the
        throughput series use it to count tokens per step instead of per finished request."""
        self.engine.step_listeners.append(listener)
        return lambda: self.engine.step_listeners.remove(listener)

    @property
    def model_identity(self) -> dict[str, Any]:
        """Weights, config, tokenizer, chat template, generation config and resolved dtype of the loaded
        model: equal to ``describe_model(model, dtype, device)`` (one function computes both)."""
        return dict(self.engine.model_identity)
