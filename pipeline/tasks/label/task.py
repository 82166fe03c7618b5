"""``task: label``: one of the job's labels per row, by scoring each label (``score``, calibrated),
parsing free text (``generate``) or generating under a constraint (``constrained``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from prefixflow.pipeline import engine_access
from prefixflow.pipeline.errors import LABEL_PARSE_ERROR, JobConfigError
from prefixflow.pipeline.job.config import BATCH_CALIBRATIONS, CALIBRATED_MODES, JobConfig
from prefixflow.pipeline.tasks.base import OutputParser, RowWatch, Task, require_prompt
from prefixflow.pipeline.tasks.inference import stream_generate
from prefixflow.pipeline.tasks.label.batch import LabelPrior, run_prior
from prefixflow.pipeline.tasks.label.labeling import constrained_rows, score_labels
from prefixflow.pipeline.tasks.label.quality import gold_text
from prefixflow.pipeline.tasks.label.references import check_references
from prefixflow.pipeline.tasks.label.scoring import check_distinct_forms, label_choices
from prefixflow.pipeline.tasks.label.watch import LabelWatch

if TYPE_CHECKING:
    from prefixflow.pipeline.engine_access import Engine, Tokenizer
    from prefixflow.pipeline.job.spec import JobSpec
    from prefixflow.pipeline.storage.layout import Layout
    from prefixflow.pipeline.storage.shards import Shards
    from prefixflow.pipeline.tasks.rows import Prepared, RowPreparer


def constrained_choices(cfg: JobConfig) -> tuple[str, ...]:
    """``label.mode: constrained`` generates exactly one of these (the labels after ``choice_prefix``)."""
    return tuple(cfg.label.choice_prefix + lb for lb in cfg.label.labels)


def constrained_label(text: str, cfg: JobConfig) -> str | None:
    """The label a constrained generation produced (exactly ``choice_prefix + label``), if it finished."""
    return next((lb for lb in cfg.label.labels if text == cfg.label.choice_prefix + lb), None)


def parse_label(text: str, labels: tuple[str, ...]) -> str | None:
    """The label named earliest in the text (whole word, case-insensitive; longer labels win ties)."""
    best: tuple[int, int, str] | None = None
    for label in labels:
        m = re.search(rf"(?<!\w){re.escape(label)}(?!\w)", text, flags=re.IGNORECASE)
        if m and (best is None or (m.start(), -len(label)) < best[:2]):
            best = (m.start(), -len(label), label)
    return best[2] if best else None


def uses_batch(cfg: JobConfig) -> bool:
    """Batch calibration: the run estimates the label prior once, from a sample of its rows."""
    return cfg.label.mode in CALIBRATED_MODES and cfg.label.calibration in BATCH_CALIBRATIONS


class LabelTask(Task):
    name = "label"

    def engine_defaults(self, cfg: JobConfig, device: str) -> dict[str, Any]:
        """Batch-invariant scoring on the CPU: a row's scores are then the same bits however the run
        batches it, so a resumed shard writes exactly the bytes an uninterrupted run would (issue 26).
        GPUs have no batch-invariant kernels here, and ``engine.batch_invariant: false`` opts out."""
        if device == "cpu" and cfg.engine.get("kernel_backend") != "triton":
            return {"batch_invariant": True}
        return {}

    def check(self, cfg: JobConfig, given: Mapping[str, Any]) -> JobConfig:
        label = cfg.label
        if len(label.labels) < 2:
            raise JobConfigError(
                "job config: label.labels: a label job needs at least two labels, e.g. [positive, negative]"
            )
        if len(set(label.labels)) != len(label.labels):
            raise JobConfigError(f"job config: label.labels: labels must be unique, got {list(label.labels)}")
        if label.mode == "score":
            check_distinct_forms(label.labels, label.case_variants)
        require_prompt(cfg)
        if cfg.summarize.long_document == "map_reduce" and "summarize" in given:
            raise JobConfigError(
                "job config: summarize.long_document: map_reduce applies to summarize jobs only"
            )
        if label.mode in CALIBRATED_MODES:
            check_references(cfg, self.template(cfg))
        return cfg

    def own_constraint(self, cfg: JobConfig) -> tuple[str, Any] | None:
        if cfg.label.mode != "constrained":
            return None
        return "the label set", engine_access.StructuredOutputs(choice=constrained_choices(cfg))

    def input_columns(self, cfg: JobConfig) -> tuple[str, ...]:
        return (cfg.label.gold_column,) if cfg.label.gold_column else ()

    def named_columns(self, cfg: JobConfig) -> dict[str, str]:
        return {cfg.label.gold_column: "label.gold_column"} if cfg.label.gold_column else {}

    def reserve_tokens(self, cfg: JobConfig, tokenizer: Tokenizer) -> int:
        if cfg.label.mode != "score":
            return 1
        return max(
            len(tokenizer.encode(choice, add_special_tokens=False)) for choice in label_choices(cfg).choices
        )

    def scored_choices(self, cfg: JobConfig) -> Sequence[str]:
        return [cfg.label.choice_prefix + lb for lb in cfg.label.labels] if cfg.label.mode == "score" else ()

    # -- output ---------------------------------------------------------------------------------------
    def output_fields(self, cfg: JobConfig) -> list[pa.Field]:
        per_label = pa.struct([pa.field(lb, pa.float64()) for lb in cfg.label.labels])
        fields = [pa.field("label", pa.string()), pa.field("label_probs", per_label)]
        if (
            cfg.label.mode == "score"
        ):  # each label's log-score before calibration: recalibrate without rerunning
            fields.append(pa.field("label_logprobs_raw", per_label))
        if cfg.label.gold_column:  # the input's true label, as text (the quality report compares with it)
            fields.append(pa.field("label_gold", pa.string()))
        return fields

    def kept_values(self, cfg: JobConfig, row: Mapping[str, Any]) -> dict[str, Any]:
        gold = cfg.label.gold_column
        return {"label_gold": gold_text(row.get(gold))} if gold else {}

    def output_parser(self, cfg: JobConfig) -> OutputParser | None:
        labels = cfg.label.labels
        constrained = cfg.label.mode == "constrained"

        def parse(rec: dict[str, Any], text: str, finish_reason: str) -> dict[str, Any]:
            label = constrained_label(text, cfg) if constrained else parse_label(text, labels)
            if label is not None:
                return {**rec, "label": label}
            why = (
                f"output is not one of the labels (finish_reason {finish_reason})"
                if constrained
                else f"no label found in the output; expected one of: {', '.join(labels)}"
            )
            return {**rec, "finish_reason": "error", "error_class": LABEL_PARSE_ERROR, "error": why}

        return parse

    # -- running --------------------------------------------------------------------------------------
    def keeps_run_state(self, cfg: JobConfig) -> bool:
        return uses_batch(cfg)

    def run_state(
        self,
        spec: JobSpec,
        layout: Layout,
        fingerprint: str,
        llm: Engine,
        shards: Shards | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> LabelPrior | None:
        """Batch calibration's stored prior (estimated now when this is the run's first shard)."""
        if not uses_batch(spec.config):
            return None
        return run_prior(spec, layout, fingerprint, llm, shards, warn=warn)

    def run(
        self, llm: Engine, prep: RowPreparer, rows: list[Prepared], batch: int, state: Any
    ) -> Iterator[dict[str, Any]]:
        bias = (
            state.bias if isinstance(state, LabelPrior) else "shard"
        )  # "shard": reference prompts, per shard
        if prep.cfg.label.mode == "score":
            return score_labels(llm, prep, rows, batch, bias)
        if prep.cfg.label.mode == "constrained":  # calibrated through a first-token logit bias
            return stream_generate(llm, prep, constrained_rows(llm, prep, rows, bias))
        return super().run(llm, prep, rows, batch, state)

    def watch(self, cfg: JobConfig, warn: Callable[[str], None]) -> RowWatch | None:
        return LabelWatch(len(cfg.label.labels), warn)
