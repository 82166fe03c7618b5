"""OpenAI Batch JSONL in and out: every custom_id answered exactly once, in input order, resumable, on S3
too; the results validated by a plain `json`-per-line reader shaped like an OpenAI Batch client."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from prefixflow.pipeline.cli import main
from prefixflow.pipeline.run.batch_run import prepare_batch, read_results
from prefixflow.pipeline.run.handle import open_run
from prefixflow.pipeline.run.planning import plan_shards
from prefixflow.pipeline.run.record import prepare_output
from prefixflow.pipeline.run.shard_execution import run_shard
from tests.pipeline.support import ENGINE

ENGINE_FLAGS = [f"--engine={k}={v}" for k, v in ENGINE.items()]
CHAT = "/v1/chat/completions"


def _line(custom_id: str, url: str = CHAT, **body: Any) -> dict[str, Any]:
    if url == CHAT and "messages" not in body:
        body["messages"] = [{"role": "user", "content": f"Tell me about {custom_id}."}]
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": "whatever", **body}}


REQUESTS = [
    _line("chat-1", max_tokens=4),
    _line("chat-2", max_completion_tokens=3, temperature=0.7, seed=5, stop=["\n"]),
    _line("cmpl-1", "/v1/completions", prompt="Once upon a time", max_tokens=4),
    _line("embed-1", "/v1/embeddings", input="x"),
    _line("logit-bias", max_tokens=2, logit_bias={"1": 5}),
    _line("bad-temp", max_tokens=2, temperature=-1),
    _line(
        "chat-3",
        max_tokens=2,
        messages=[{"role": "system", "content": "Terse."}, {"role": "user", "content": "Hi"}],
    ),
    _line("cmpl-2", "/v1/completions", prompt=["one prompt in a list"], max_tokens=2),
    _line("chat-n3", max_tokens=3, n=3, temperature=1.0, seed=7, presence_penalty=0.5, frequency_penalty=0.2),
]


def _write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def validate_openai_batch_output(text: str, inputs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """What a client of the OpenAI Batch API checks, with nothing but `json`: one JSON object per line,
    each input custom_id exactly once, and the documented response shapes."""
    by_id: dict[str, dict[str, Any]] = {}
    for raw in text.splitlines():
        line = json.loads(raw)
        assert set(line) == {"id", "custom_id", "response", "error"} and line["error"] is None
        assert isinstance(line["id"], str) and line["custom_id"] not in by_id
        response = line["response"]
        assert set(response) == {"status_code", "request_id", "body"} and isinstance(
            response["request_id"], str
        )
        body = response["body"]
        if response["status_code"] == 200:
            assert body["object"] in ("chat.completion", "text_completion") and isinstance(
                body["created"], int
            )
            assert [c["index"] for c in body["choices"]] == list(range(len(body["choices"])))
            for choice in body["choices"]:
                assert choice["finish_reason"] in ("stop", "length")
                content = (
                    choice["message"]["content"] if body["object"] == "chat.completion" else choice["text"]
                )
                assert isinstance(content, str)
                if body["object"] == "chat.completion":
                    assert choice["message"]["role"] == "assistant"
            usage = body["usage"]
            assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
            assert 0 <= usage["prompt_tokens_details"]["cached_tokens"] <= usage["prompt_tokens"]
        else:
            assert response["status_code"] == 400
            assert isinstance(body["error"]["message"], str) and body["error"]["message"]
        by_id[line["custom_id"]] = line
    assert list(by_id) == [x["custom_id"] for x in inputs]  # every request once, in input order
    return by_id


def _run(inp: str, out: str, *extra: str) -> int:
    return main(
        [
            "run",
            "--input",
            inp,
            "--output",
            out,
            "--model",
            "tiny",
            "--no-progress",
            "--shard-rows",
            "3",
            *ENGINE_FLAGS,
            *extra,
        ]
    )


def test_batch_round_trip(tmp_path: Path, tiny_llm) -> None:
    batch = _write(tmp_path / "batch.jsonl", REQUESTS)
    results = tmp_path / "results.jsonl"
    assert _run(str(batch), str(results)) == 0
    by_id = validate_openai_batch_output(results.read_text(), REQUESTS)
    body = {k: v["response"]["body"] for k, v in by_id.items()}
    assert "/v1/embeddings" in body["embed-1"]["error"]["message"]
    assert "logit_bias" in body["logit-bias"]["error"]["message"]
    assert (
        body["bad-temp"]["error"]["code"] == "bad_sampling"
        and "temperature" in body["bad-temp"]["error"]["message"]
    )
    # chat lines ran through the chat template, completions as given, with the body's max_tokens
    chat = tiny_llm.apply_chat_template(REQUESTS[0]["body"]["messages"])
    from prefixflow.engine import SamplingParams

    expect_chat = tiny_llm.generate(
        [tiny_llm.tokenizer.encode(chat, add_special_tokens=False)], SamplingParams(max_tokens=4)
    )[0]
    assert body["chat-1"]["choices"][0]["message"]["content"] == expect_chat.text
    assert body["chat-1"]["usage"]["prompt_tokens"] == len(expect_chat.prompt_token_ids)
    expect_cmpl = tiny_llm.generate(["Once upon a time"], SamplingParams(max_tokens=4))[0]
    assert body["cmpl-1"]["choices"][0]["text"] == expect_cmpl.text
    assert body["cmpl-2"]["object"] == "text_completion" and body["chat-2"]["usage"]["completion_tokens"] <= 3
    n3 = body["chat-n3"]  # three samples of one prompt, with penalties, seeded
    assert len(n3["choices"]) == 3
    seeded = SamplingParams(
        max_tokens=3, n=3, temperature=1.0, seed=7, presence_penalty=0.5, frequency_penalty=0.2
    )
    chat_n3 = tiny_llm.apply_chat_template(REQUESTS[-1]["body"]["messages"])
    (expect_n3,) = tiny_llm.generate([tiny_llm.tokenizer.encode(chat_n3, add_special_tokens=False)], seeded)
    assert [c["message"]["content"] for c in n3["choices"]] == [s.text for s in expect_n3.outputs]
    assert n3["usage"]["completion_tokens"] == expect_n3.num_output_tokens
    again = results.read_bytes()
    assert _run(str(batch), str(results)) == 0  # a finished run rewrites the same bytes
    assert results.read_bytes() == again


def test_an_interrupted_batch_resumes_and_answers_each_request_once(tmp_path: Path, tiny_llm) -> None:
    batch = _write(tmp_path / "batch.jsonl", REQUESTS)
    results = tmp_path / "results.jsonl"
    job = prepare_batch(str(batch), str(results), "tiny", {"engine": dict(ENGINE)}, shard_rows=3)
    run_id = prepare_output(job.spec).run_id
    first = plan_shards(job.spec)[0]
    run_shard(
        open_run(job.spec), first, tiny_llm
    )  # then the process "dies": one shard committed, no results file
    assert not results.exists()
    committed = sorted(p.name for p in (Path(job.spec.output) / "data").rglob("*.parquet"))
    assert _run(str(batch), str(results)) == 0
    validate_openai_batch_output(results.read_text(), REQUESTS)
    data = Path(job.spec.output) / "data" / run_id / first.shard_id
    assert sorted(p.name for p in data.rglob("*.parquet")) == committed  # the committed shard was not redone


def test_malformed_files_changed_inputs_and_foreign_results_are_refused(tmp_path: Path, capsys) -> None:
    dup = _write(tmp_path / "dup.jsonl", [_line("a"), _line("b"), _line("a")])
    assert _run(str(dup), str(tmp_path / "r.jsonl")) == 2
    assert "line 3: custom_id 'a' is already used on line 1" in capsys.readouterr().err
    (tmp_path / "junk.jsonl").write_text('{"custom_id": "a", "body": {}}\nnot json\n')
    assert _run(str(tmp_path / "junk.jsonl"), str(tmp_path / "r.jsonl")) == 2
    assert "junk.jsonl line 2 is not JSON" in capsys.readouterr().err
    good = _write(tmp_path / "good.jsonl", [_line("a", max_tokens=2)])
    assert _run(str(good), str(tmp_path / "out")) == 2
    assert "results are a JSONL file" in capsys.readouterr().err
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text("mine\n")
    assert _run(str(good), str(foreign)) == 2 and "holds no prefixflow run" in capsys.readouterr().err
    assert foreign.read_text() == "mine\n"
    results = tmp_path / "results.jsonl"
    assert _run(str(good), str(results)) == 0
    _write(good, [_line("a", max_tokens=2), _line("b", max_tokens=2)])  # the file changes under the run
    assert _run(str(good), str(results)) == 2 and "has changed since the run" in capsys.readouterr().err
    assert _run(str(good), str(results), "--new-run") == 0
    assert [x["custom_id"] for x in read_results(str(results))] == ["a", "b"]
    assert len(list((Path(str(results) + ".prefixflow") / "_batch_input").iterdir())) == 1


@pytest.mark.usefixtures("tiny_llm")
def test_batch_files_on_s3(s3_endpoint: str, tmp_path: Path) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint})
    fs.mkdir("batches")
    lines = REQUESTS[:3]
    fs.pipe("batches/in/batch.jsonl", "".join(json.dumps(x) + "\n" for x in lines).encode())
    out = "s3://batches/out/results.jsonl"
    assert _run("s3://batches/in/batch.jsonl", out, "--endpoint-url", s3_endpoint) == 0
    text = fs.cat("batches/out/results.jsonl").decode()
    validate_openai_batch_output(text, lines)
    assert fs.exists("batches/out/results.jsonl.prefixflow/_prefixflow.json")


def test_plan_describes_a_batch_file(tmp_path: Path, capsys) -> None:
    batch = _write(tmp_path / "batch.jsonl", REQUESTS)
    assert main(["plan", "--input", str(batch), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["requests"] == len(REQUESTS)
    assert info["kinds"] == {"chat": 6, "completion": 2, "unsupported": 1}
    assert [r["custom_id"] for r in info["refused"]] == ["embed-1", "logit-bias"]


def test_no_op_fields_are_accepted_and_a_blank_custom_id_is_refused(tmp_path: Path) -> None:
    """Issue 22 item 13: `logprobs: false`, `tools: []`, `response_format: {"type": "text"}` got a 400;
    a whitespace-only custom_id was accepted."""
    from prefixflow.pipeline import InputError
    from prefixflow.pipeline.tasks.openai_batch import parse_batch

    no_ops = _line(
        "noop",
        max_tokens=2,
        logprobs=False,
        tools=[],
        response_format={"type": "text"},
        logit_bias={},
        tool_choice="none",
        parallel_tool_calls=True,
    )
    real = _line("json", max_tokens=2, tools=[{"type": "function", "function": {"name": "f"}}])
    data = "".join(json.dumps(x) + "\n" for x in (no_ops, real)).encode()
    by_id = {r.custom_id: r for r in parse_batch(data, "b.jsonl")}
    assert by_id["noop"].error is None and by_id["noop"].sampling == {"max_tokens": 2}
    assert by_id["json"].error is not None  # a field that would change the answer is still refused
    with pytest.raises(InputError, match="only whitespace"):
        parse_batch((json.dumps(_line("  ", max_tokens=2)) + "\n").encode(), "b.jsonl")


def test_a_second_batch_run_into_the_same_results_is_refused_before_it_writes(tmp_path: Path, capsys) -> None:
    """Issue 25: an OpenAI Batch run holds the driver lease of its state folder for the whole command (the
    conversion, the run, the cleanup of older conversions, the results file), like `prefixflow run`. While
    another live run drives it, a second one is refused naming that run, before it writes or deletes
    anything: not even its converted requests table (a --new-run of a changed file included)."""
    batch = _write(tmp_path / "batch.jsonl", REQUESTS[:2])
    results = tmp_path / "results.jsonl"
    state = tmp_path / "results.jsonl.prefixflow"
    rival = {
        "holder": "rival",
        "mode": "shared",
        "machine": "gpu-host/1/2",
        "host": "gpu-7",
        "pid": 4242,
        "renewed_at": time.time(),
        "ttl_s": 60.0,
        "command": "prefixflow run",
        "driver": "prefixflow run",
    }
    (state / "_leases").mkdir(parents=True)
    (state / "_leases" / "rival.json").write_text(json.dumps(rival))
    changed = _write(tmp_path / "changed.jsonl", REQUESTS[:3])
    for args in ((str(batch), str(results)), (str(changed), str(results), "--new-run")):
        assert _run(*args) == 2
        err = capsys.readouterr().err
        assert "already being written by another run" in err and "pid 4242 on gpu-7" in err, err
        assert sorted(p.name for p in state.iterdir()) == ["_leases"], list(state.rglob("*"))
        assert not results.exists()
    (state / "_leases" / "rival.json").unlink()  # the other run is gone: this one runs
    assert _run(str(batch), str(results)) == 0
    validate_openai_batch_output(results.read_text(), REQUESTS[:2])
