"""Storage credentials never become Prefect flow parameters, logs or artifacts (issue 10, item 6).

The run gets them from a Prefect Secret block named by `credentials_block` (the environment has none,
so the S3 store, moto's server, cannot be used without them); plain credentials in `storage_options`
are refused, and never stored."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import s3fs

from tests.flows.prefect_server import PrefectServer
from tests.flows.support import JOB, SHARD_ROWS, requires_pipeline, write_dataset

pytestmark = [requires_pipeline, pytest.mark.timeout(300)]

KEY_ID = "AKIAPREFIXFLOWKEYID42"
SECRET = "pf-secret-" + uuid.uuid4().hex


async def _api_dump(flow_run_id: Any) -> str:
    """Everything the Prefect API holds about one flow run: its parameters, task runs, logs, artifacts."""
    from prefect import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowRunFilter,
        FlowRunFilterId,
    )

    async with get_client() as client:
        parts = [(await client.read_flow_run(flow_run_id)).model_dump_json()]
        runs = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
        parts += [r.model_dump_json() for r in runs]
        logs = await _read_logs(client, flow_run_id, at_least=4)
        parts += [log.model_dump_json() for log in logs]
        arts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
        parts += [a.model_dump_json() for a in arts]
    assert len(logs) > 3 and len(runs) >= 3  # the dump really covers the run
    return "\n".join(parts)


async def _read_logs(client: Any, flow_run_id: Any, at_least: int) -> list[Any]:
    """The run's logs once the API holds `at_least` of them: the client ships logs in the background,
    so a read right after the run can see only the first batch (CI once saw 1 of them)."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=30)
    log_filter = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
    deadline = time.monotonic() + 30
    logs = await client.read_logs(log_filter=log_filter)
    while len(logs) < at_least and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        logs = await client.read_logs(log_filter=log_filter)
    return list(logs)


@pytest.fixture
def no_ambient_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def bucket(s3_endpoint: str, tmp_path: Path) -> str:
    name = f"secrets-{uuid.uuid4().hex[:8]}"
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint}, skip_instance_cache=True)
    fs.mkdir(name)
    write_dataset(tmp_path / "in")
    fs.put(str(tmp_path / "in") + "/", f"{name}/in/", recursive=True)
    return name


def test_credentials_from_a_secret_block_never_reach_the_api(
    prefect_server: str, s3_endpoint: str, bucket: str, no_ambient_credentials: None
) -> None:
    from prefect.blocks.system import Secret

    from prefixflow.flows import batch_inference

    Secret(value={"key": KEY_ID, "secret": SECRET}).save("pf-s3-credentials", overwrite=True)
    bare = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint}, skip_instance_cache=True)
    with pytest.raises(Exception, match="credentials"):
        bare.ls(bucket)  # without the block this process cannot use the store at all
    state = batch_inference(
        input=f"s3://{bucket}/in",
        output=f"s3://{bucket}/out",
        model="tiny",
        job=JOB,
        shard_rows=SHARD_ROWS,
        endpoint_url=s3_endpoint,
        credentials_block="secret/pf-s3-credentials",
        lanes=1,
        concurrency_limit=None,
        retry_delay_s=0.0,
        progress_poll_s=0.5,
        return_state=True,
    )
    assert state.is_completed(), state.message
    assert state.result()["rows"] == 20 and state.result()["complete"]
    dump = asyncio.run(_api_dump(state.state_details.flow_run_id))
    assert "pf-s3-credentials" in dump  # the block's name is a parameter ...
    assert SECRET not in dump and KEY_ID not in dump  # ... its contents are not
    fs = s3fs.S3FileSystem(key=KEY_ID, secret=SECRET, client_kwargs={"endpoint_url": s3_endpoint})
    for name in ("_prefixflow.json", "_manifest.json"):
        text = fs.cat_file(f"{bucket}/out/{name}").decode()
        assert SECRET not in text and KEY_ID not in text


def test_plain_credentials_in_storage_options_are_refused_and_never_stored(
    prefect_server: str, s3_endpoint: str, bucket: str
) -> None:
    from prefixflow.flows import batch_inference

    state = batch_inference(
        input=f"s3://{bucket}/in",
        output=f"s3://{bucket}/out2",
        model="tiny",
        job=JOB,
        endpoint_url=s3_endpoint,
        storage_options={"key": KEY_ID, "secret": SECRET, "anon": False},
        lanes=1,
        concurrency_limit=None,
        return_state=True,
    )
    assert state.is_failed()
    assert "look like credentials" in state.message and "credentials_block" in state.message
    assert SECRET not in state.message
    dump = asyncio.run(_api_dump_of_failed(state.state_details.flow_run_id))
    assert SECRET not in dump and KEY_ID not in dump and "redacted" in dump


async def _api_dump_of_failed(flow_run_id: Any) -> str:
    from prefect import get_client

    async with get_client() as client:
        run = await client.read_flow_run(flow_run_id)
        logs = await _read_logs(client, flow_run_id, at_least=1)
    return "\n".join([run.model_dump_json(), *(log.model_dump_json() for log in logs)])


def test_serve_refuses_credentials_as_deployment_parameters(capsys: pytest.CaptureFixture[str]) -> None:
    from prefixflow.flows.cli import serve_main

    code = serve_main(["--input", "in/", "--output", "s3://b/out", "--storage-option", f"secret={SECRET}"])
    err = capsys.readouterr().err
    assert code == 2 and "look like credentials" in err and SECRET not in err


def test_credentials_in_a_job_dict_are_refused_and_never_stored(
    prefect_server: str, s3_endpoint: str, bucket: str
) -> None:
    """Issue 22 item 5: `job={"storage": {"options": {...}}}` ran, and both values were in flow_run.parameters."""
    from prefixflow.flows import batch_inference

    secret_job = {
        **JOB,
        "storage": {"endpoint_url": s3_endpoint, "options": {"key": KEY_ID, "secret": SECRET}},
    }
    state = batch_inference(
        input=f"s3://{bucket}/in",
        output=f"s3://{bucket}/out3",
        model="tiny",
        job=secret_job,
        lanes=1,
        concurrency_limit=None,
        return_state=True,
    )
    assert state.is_failed()
    assert "job.storage.options.key" in state.message and "job.storage.options.secret" in state.message
    dump = asyncio.run(_api_dump_of_failed(state.state_details.flow_run_id))
    assert SECRET not in dump and KEY_ID not in dump and "redacted" in dump


def test_a_deployment_run_with_credentials_is_refused_before_prefect_stores_it(prefect_server: str) -> None:
    """Issue 22 item 6: `prefect deployment run ... --param storage_options='{"secret": ...}'` stored the
    secret (Prefect stores deployment-run parameters itself) before the flow refused it. The deployment's
    parameter schema cannot carry credentials, so the Prefect server (prefect_test_harness runs the real
    API server as a subprocess on loopback) rejects the run before creating it."""
    from prefixflow.flows.flow import batch_inference

    name = f"secrets-{uuid.uuid4().hex[:6]}"
    deployment_id = batch_inference.to_deployment(
        name=name, parameters={"input": "in/", "output": "out/"}
    ).apply()
    _check_credentials_refused_before_stored(prefect_server, name, deployment_id)


@pytest.mark.slow  # starts `prefect server start` unless the session already has it
@pytest.mark.timeout(600)
def test_a_deployment_run_with_credentials_is_refused_by_a_real_prefect_server_start(
    real_prefect_server: PrefectServer, tmp_path: Path
) -> None:
    """Issue 22 item 6 against the `prefect server start` command itself (not the test harness), with the
    deployment registered the documented way, by `prefixflow serve --work-pool`."""
    server = real_prefect_server
    made = server.cli("work-pool", "create", "pf-secrets", "--type", "process")
    assert made.returncode == 0, made.stdout + made.stderr
    name = f"secrets-{uuid.uuid4().hex[:6]}"
    done = server.cli(
        "prefixflow",
        "serve",
        "--work-pool",
        "pf-secrets",
        "--name",
        name,
        "--input",
        str(tmp_path),
        "--output",
        str(tmp_path / "out"),
        "--model",
        "tiny",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with server.api():
        from prefect import get_client

        with get_client(sync_client=True) as client:
            deployment_id = client.read_deployment_by_name(f"batch-inference/{name}").id
        _check_credentials_refused_before_stored(
            server.api_url, name, deployment_id, server.client_env("cli")
        )


def _check_credentials_refused_before_stored(
    api_url: str, name: str, deployment_id: Any, env: dict[str, str] | None = None
) -> None:
    """The `prefect deployment run` CLI and the client, with credentials in three places: each refused by
    the server (409, no run created); no stored run holds them; a clean run is still created."""
    import os
    import subprocess
    import sys

    from prefect import get_client

    env = env or dict(os.environ, PREFECT_API_URL=api_url)
    cli = [sys.executable, "-m", "prefect", "deployment", "run", f"batch-inference/{name}"]
    refused = subprocess.run(
        [*cli, "--param", f'storage_options={{"anon": false, "secret": "{SECRET}"}}'],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert refused.returncode != 0, refused.stdout
    nested = {"client_kwargs": {"aws_secret_access_key": SECRET}}

    async def attempt() -> tuple[list[str], str]:
        errors = []
        async with get_client() as client:
            for params in (
                {"storage_options": nested},
                {"job": {"storage": {"options": {"key": KEY_ID}}}},
                {"endpoint_url": f"http://{KEY_ID}:{SECRET}@h:9000"},
            ):
                try:
                    await client.create_flow_run_from_deployment(deployment_id, parameters=params)
                    errors.append("accepted")
                except Exception as exc:  # noqa: BLE001 - the API answers 409 with the failing field
                    errors.append(str(exc))
            ok = await client.create_flow_run_from_deployment(
                deployment_id, parameters={"storage_options": {"anon": True}}
            )
            runs = await client.read_flow_runs()
            return errors, "\n".join([r.model_dump_json() for r in runs] + [ok.model_dump_json()])

    errors, stored = asyncio.run(attempt())
    assert all("Validation failed" in e for e in errors), errors
    assert SECRET not in stored and KEY_ID not in stored
    assert '"anon":true' in stored.replace(" ", "")  # a run without credentials is created as before
