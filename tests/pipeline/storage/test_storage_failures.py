"""Without credentials every command fails the same clean way: one line naming what to fix, exit 2, no
traceback (a real S3 endpoint from moto; the AWS credential chain emptied in a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prefixflow.pipeline.storage.errors import describe_storage_error

REPO = Path(__file__).resolve().parents[3]


def _no_credentials_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
        AWS_DEFAULT_REGION="us-east-1",
    )
    return env


@pytest.mark.parametrize(
    "command",
    [
        ["status", "s3://bucket/out"],
        ["plan", "--input", "s3://bucket/in/"],
        ["run", "--input", "s3://bucket/in/", "--output", "s3://bucket/out", "--model", "tiny"],
    ],
)
def test_every_command_fails_cleanly_without_credentials(
    tmp_path: Path, s3_endpoint: str, command: list[str]
) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "prefixflow.pipeline.cli", *command, "--endpoint-url", s3_endpoint],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=_no_credentials_env(tmp_path),
    )
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert (
        "NoCredentialsError" in res.stderr
        and "AWS_ACCESS_KEY_ID" in res.stderr
        and "AWS_PROFILE" in res.stderr
    )


def test_the_endpoint_can_come_from_the_environment(tmp_path: Path, s3_endpoint: str) -> None:
    env = {**os.environ, "AWS_ENDPOINT_URL": s3_endpoint}
    res = subprocess.run(
        [sys.executable, "-m", "prefixflow.pipeline.cli", "status", "s3://nobucket/out"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert (
        res.returncode == 2 and "holds no prefixflow run" in res.stderr
    )  # reached moto, found nothing there


def test_storage_errors_are_found_in_the_exception_chain() -> None:
    class ClientError(Exception):
        def __init__(self) -> None:
            super().__init__("An error occurred (AccessDenied)")
            self.response = {"Error": {"Code": "AccessDenied"}}

    try:
        try:
            raise ClientError()
        except ClientError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert describe_storage_error(outer).startswith("AccessDenied: access denied")
    assert describe_storage_error(ValueError("unrelated")) is None


def test_the_polars_hint_carries_the_storage_options_it_needs(s3_endpoint: str) -> None:
    """The summary's "read with polars..." line works as printed against an S3-compatible endpoint."""
    import io

    import polars as pl
    import pyarrow as pa
    import pyarrow.parquet as pq
    import s3fs

    from prefixflow.pipeline.job.config import StorageConfig
    from prefixflow.pipeline.storage.read_hint import polars_hint, polars_storage_options

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint})
    fs.mkdir("hint")
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": ["a", "b"]}), buf)
    fs.pipe("hint/out/data/s1/part-0.parquet", buf.getvalue())
    glob = "s3://hint/out/data/**/*.parquet"
    storage = StorageConfig(endpoint_url=s3_endpoint, options={"key": "testing", "secret": "testing"})
    hint = polars_hint(glob, storage)
    assert f"'aws_endpoint_url': '{s3_endpoint}'" in hint and "'aws_access_key_id': '<from your" in hint
    assert "testing" not in hint  # secrets are never echoed
    options = {k: v for k, v in polars_storage_options(glob, storage).items() if not v.startswith("<")}
    assert pl.scan_parquet(glob, storage_options=options).collect()["id"].to_list() == ["a", "b"]
    assert (
        polars_hint("/tmp/out/data/**/*.parquet", storage)
        == "polars.scan_parquet('/tmp/out/data/**/*.parquet')"
    )
