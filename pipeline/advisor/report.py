"""The advice as a human reads it (rich, on the console the CLI passes: stdout) — the JSON form is ``Advice.as_dict()``."""

from __future__ import annotations

from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from prefixflow.pipeline.advisor.advise import Advice

GB = 1e9


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.3g} ms"
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"


def _hours(h: float) -> str:
    return "<0.01" if h < 0.01 else f"{h:,.3g}"


def _span(lo: str, hi: str) -> str:
    return lo if lo == hi else f"{lo}-{hi}"


def engine_settings(advice: Advice) -> dict[str, Any]:
    """The recommended settings as a job config's ``engine:`` section (only EngineConfig fields, only
    values it accepts; empty when nothing fits)."""
    s = advice.settings
    if s.get("fits") is False:
        return {}
    keys = ("ordering", "enable_prefix_caching", "max_num_batched_tokens", "max_num_seqs", "max_model_len")
    out: dict[str, Any] = {k: s[k] for k in keys if k in s}
    if s.get("quantization"):
        out["quantization"] = s["quantization"]
    if s.get("tensor_parallel_size", 1) > 1:
        out["tensor_parallel_size"] = s["tensor_parallel_size"]
    if s.get("kv_offload_bytes"):
        out["kv_offload_bytes"] = s["kv_offload_bytes"]
    if s.get("pipeline_parallel_size", 1) > 1:
        out["pipeline_parallel_size"] = s["pipeline_parallel_size"]
    return out


def print_advice(console: Console, advice: Advice) -> None:
    m, w, sh, d = advice.model, advice.workload, advice.sharing, advice.device
    console.rule("[bold]prefixflow advice")
    console.print(
        f"model {m['model']} ({m['format']}, stored {m['checkpoint_precision']}, "
        f"{m['params'] / 1e6:,.0f} M parameters, context {m['context']:,}); "
        f"target {d.name} ({d.source}); the engine runs its weights {m['engine_path']['label']}",
        soft_wrap=True,
    )
    console.print(
        f"sample: {w.sampled_rows:,} of {w.total_rows:,} rows ({advice.timings.get('total_s', 0):.1f} s)",
        soft_wrap=True,
    )
    if advice.skipped_shards:
        console.print(f"[yellow]unreadable shards left out:[/] {', '.join(advice.skipped_shards[:5])}")

    console.print("\n[bold]Tokens[/]")
    p, o, proj = w.prompt, w.output_expected, w.projected
    console.print(f"  prompt tokens per row: p50 {p.p50:,}  p90 {p.p90:,}  p99 {p.p99:,}  max {p.max:,}")
    console.print(
        f"  expected output per request ({w.output_source}): mean {o.mean:,.1f}  p50 {o.p50:,}  "
        f"p90 {o.p90:,}  max {o.max:,}"
    )
    console.print(
        f"  whole input: {proj['rows']:,} rows -> {proj['requests']:,} requests, "
        f"{proj['prompt_tokens']:,} prompt tokens ({proj['cached_prompt_tokens']:,} from the prefix "
        f"cache), {proj['output_tokens']:,} output tokens",
        soft_wrap=True,
    )
    if w.errors_by_class:
        errs = ", ".join(f"{k} {v}" for k, v in w.errors_by_class.items())
        console.print(
            f"  [yellow]error rows in the sample:[/] {errs} (~{proj['error_rows']:,} in the input); "
            f"e.g. {next(iter(w.error_examples.values()))}",
            soft_wrap=True,
            markup=True,
        )
    for note in w.notes:
        console.print(f"  note: {note}", soft_wrap=True)

    if advice.labels:
        lab = advice.labels
        console.print(f"\n[bold]Labels[/] (mode {lab['mode']}, calibration {lab['calibration']})")
        for note in lab["notes"]:
            console.print(f"  {note}", soft_wrap=True, markup=False)

    console.print("\n[bold]Sharing[/]")
    console.print(
        f"  distinct trie tokens {sh.distinct_tokens:,} of {sh.prompt_tokens:,}; block minimum "
        f"{sh.block_min_tokens:,} at block_size {sh.block_size} -> best prefix hit rate "
        f"{sh.best_hit_rate:.0%}",
        soft_wrap=True,
    )
    for h in sh.heads:
        console.print(
            f"  {h.tokens:,} tokens shared by {h.rows:,} rows: {h.preview}", soft_wrap=True, markup=False
        )
    if advice.flag:
        console.print(f"  [red]template order:[/] {advice.flag.message}", soft_wrap=True)

    console.print(
        f"\n[bold]Memory[/] on {d.name}: KV {advice.kv_bytes_per_token / 1024:,.1f} KiB per token ({d.dtype})"
    )
    t = Table(show_edge=False, pad_edge=False, box=None)
    for col in ("weights", "GB", "share", "KV GB", "KV tokens", "seqs mean/p99", "max_model_len"):
        t.add_column(col, justify="right")
    for prec, f in advice.fits.items():
        t.add_row(
            prec,
            f"{f.weight_bytes / GB:,.2f}",
            f"{f.weight_share:.0%}",
            f"{f.kv_pool_bytes / GB:,.1f}",
            f"{f.kv_tokens:,}",
            f"{f.seqs_at_mean:,}/{f.seqs_at_p99:,}",
            f"{f.max_model_len:,}" if f.fits else "does not fit",
        )
    console.print(t)
    big = advice.largest()
    console.print(
        f"  largest that fit ({big['precision']}): max_model_len {big['max_model_len']:,}, max_num_seqs "
        f"{big['max_num_seqs']:,} (every running sequence at the sample's p99 size)",
        soft_wrap=True,
    )

    console.print("\n[bold]The six questions[/]")
    for a in advice.answers:
        color = {"yes": "green", "no": "cyan", "likely": "green"}.get(a.verdict, "dim")
        console.print(f"{a.number}. {a.question} [{color}]{a.verdict.upper()}[/]")
        for line in a.evidence:
            console.print(f"   - {line}", soft_wrap=True, markup=False)
        console.print(f"   -> {a.recommendation}", soft_wrap=True, markup=False)

    console.print("\n[bold]Recommended engine settings[/] (job config `engine:` section)")
    if advice.settings.get("fits") is False:
        console.print(
            f"  [red]none: nothing fits[/] on {d.name}: {advice.answers[0].recommendation}", soft_wrap=True
        )
    else:
        console.print(
            yaml.safe_dump({"engine": engine_settings(advice)}, sort_keys=False).rstrip(), markup=False
        )

    console.print("\n[bold]Time and cost[/] for the whole input, one lane")
    t = Table(show_edge=False, pad_edge=False, box=None)
    for col in ("device", "weights", "lower bound", "expected", "GPU-h bound", "GPU-h expected"):
        t.add_column(col, justify="right")
    for e in advice.estimates:
        tp = f" TP{e.devices_per_lane}" if e.devices_per_lane > 1 else ""
        by = "mem" if e.bound_by == "memory bandwidth" else "flops"
        t.add_row(
            e.device,
            e.precision + tp,
            f"{_duration(e.lower_bound_s)} ({by})",
            _span(_duration(e.expected_s[0]), _duration(e.expected_s[1])),
            _hours(e.gpu_hours_lower),
            _span(_hours(e.gpu_hours_expected[0]), _hours(e.gpu_hours_expected[1])),
        )
    console.print(t)
    sources = dict.fromkeys((e.efficiency, e.efficiency_source) for e in advice.estimates)
    for (lo, hi), src in sources:
        console.print(
            f"  expected = bound / efficiency {_span(f'{lo:.2g}', f'{hi:.2g}')}: {src}",
            soft_wrap=True,
            markup=False,
        )
