"""The Task interface: everything the pipeline asks of a kind of job.

A task validates its part of the job, renders a row into what the engine gets (its prompt template,
the document a long-document policy may shorten), names its output columns and their Arrow types,
runs prepared rows on the engine and turns the outputs into row values, watches rows as they finish
(progress), and finishes a run (label counts, the collapse warning). The defaults are plain
generation, so a task overrides only what it does differently. ``registry.py`` lists the tasks; see
docs/architecture.md, "Adding a task".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import pyarrow as pa

from prefixflow.pipeline.errors import JobConfigError
from prefixflow.pipeline.job.config import JobConfig, SummarizeConfig
from prefixflow.pipeline.tasks.inference import stream_generate

if TYPE_CHECKING:
    from prefixflow.pipeline.engine_access import Engine, Tokenizer
    from prefixflow.pipeline.job.spec import JobSpec
    from prefixflow.pipeline.storage.layout import Layout
    from prefixflow.pipeline.storage.shards import Shards
    from prefixflow.pipeline.tasks.rows import Prepared, RowPreparer

# a finished record in, the row's values out: the same record with the task's columns, or an error row
OutputParser = Callable[[dict[str, Any], str, str], dict[str, Any]]


class RowWatch(Protocol):
    """Sees every finished row of a shard loop (one engine lane) and warns about the rows as a whole."""

    def observe(self, record: Mapping[str, Any]) -> None: ...

    def finish(self) -> None: ...


class Task:
    """One ``task:`` value. Instances are stateless: per-job state lives in the JobConfig."""

    name: ClassVar[str] = ""
    several_samples: ClassVar[bool] = False  # sampling.n > 1 (one row, several outputs) makes sense
    takes_schema: ClassVar[bool] = False  # the job's ``schema:`` is this task's

    # -- validation (once, at load) -----------------------------------------------------------------
    def check(self, cfg: JobConfig, given: Mapping[str, Any]) -> JobConfig:
        """Validate the task's part of ``cfg`` (``given``: the job as written) with the features it
        uses; returns ``cfg`` completed with the task's defaults. Raises JobConfigError."""
        return cfg

    def engine_defaults(self, cfg: JobConfig, device: str) -> dict[str, Any]:
        """Engine settings this task wants unless the job's ``engine:`` section sets them (``device``:
        where the engine will run, resolved). Not in the fingerprint: they follow from the task and the
        device, which are."""
        return {}

    def own_constraint(self, cfg: JobConfig) -> tuple[str, Any] | None:
        """(what it is, the ``StructuredOutputs``) when the task itself constrains every row's output."""
        return None

    # -- input and prompts ----------------------------------------------------------------------------
    def template(self, cfg: JobConfig) -> str | None:
        """The prompt template rows are rendered with (None: a column is the prompt)."""
        return cfg.template

    def prompt_columns(self, cfg: JobConfig) -> set[str]:
        """Input columns the task's prompts read beyond the prompt column and the template's."""
        return set()

    def input_columns(self, cfg: JobConfig) -> tuple[str, ...]:
        """Other input columns the task reads for each row (a label job's gold labels)."""
        return ()

    def named_columns(self, cfg: JobConfig) -> dict[str, str]:
        """Input columns the task's own settings name, each with its key (a typo there is refused at plan)."""
        return {}

    def document_column(self, cfg: JobConfig) -> str | None:
        """The column a long-document policy may shorten (None: prompts too long are error rows)."""
        return None

    def long_documents(self, cfg: JobConfig) -> SummarizeConfig | None:
        """How a document over the context is shortened (truncate, map_reduce); None: an error row."""
        return None

    def reserve_tokens(self, cfg: JobConfig, tokenizer: Tokenizer) -> int:
        """Tokens after the prompt the context must hold besides ``max_tokens`` (a scored label's)."""
        return 1

    # -- output ---------------------------------------------------------------------------------------
    def output_fields(self, cfg: JobConfig) -> list[pa.Field]:
        """The task's own output columns, after the columns every row has."""
        return []

    def kept_values(self, cfg: JobConfig, row: Mapping[str, Any]) -> dict[str, Any]:
        """Values the task copies from the input row into its output row (a label job's gold label)."""
        return {}

    def output_parser(self, cfg: JobConfig) -> OutputParser | None:
        """Built once per shard: turns each finished generation into the row's values (None: the text is
        the value)."""
        return None

    # -- running --------------------------------------------------------------------------------------
    def keeps_run_state(self, cfg: JobConfig) -> bool:
        """Whether ``run_state`` makes anything (a run made before its first shard can make it early)."""
        return False

    def run_state(
        self,
        spec: JobSpec,
        layout: Layout,
        fingerprint: str,
        llm: Engine,
        shards: Shards | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> Any:
        """State every shard of a run shares, made once per run and stored beside it (the label task's
        batch-calibration prior); None when the task keeps none. ``shards``: the run's shards, or how to
        plan them (only called if the state is not stored yet)."""
        return None

    def run(
        self, llm: Engine, prep: RowPreparer, rows: list[Prepared], batch: int, state: Any
    ) -> Iterator[dict[str, Any]]:
        """Finished records of ``rows`` (each one prompt) in completion order."""
        return stream_generate(llm, prep, rows)

    def watch(self, cfg: JobConfig, warn: Callable[[str], None]) -> RowWatch | None:
        """What watches a shard loop's finished rows (the label collapse check); None: nothing."""
        return None

    def scored_choices(self, cfg: JobConfig) -> Sequence[str]:
        """Continuations each row's prompt is scored with instead of generating (empty: it generates)."""
        return ()


def require_prompt(cfg: JobConfig) -> None:
    """A task whose rows have no natural default prompt column."""
    if not (cfg.prompt_column or cfg.template or cfg.messages_column):
        raise JobConfigError(
            f"job config: prompt_column: a {cfg.task} job needs prompt_column (a column) or template (Jinja2)"
        )
