"""S3 against a real endpoint on loopback (moto's server over HTTP): exclusive create, a whole job from
S3 to S3, and the committed output read back by s3fs, pyarrow's own S3 client and polars."""

from __future__ import annotations

import uuid
from pathlib import Path

import polars as pl
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pytest
import s3fs

from prefixflow.pipeline import FingerprintMismatch, load_job, plan_shards, prepare_output
from prefixflow.pipeline.cli import main
from prefixflow.pipeline.job.config import StorageConfig
from prefixflow.pipeline.local_run import run_local
from prefixflow.pipeline.storage.store import Store
from tests.pipeline.support import job, write_dataset


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    name = f"b-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint}).mkdir(name)
    return name


def test_exclusive_create_uses_if_none_match(s3_endpoint: str, bucket: str) -> None:
    store = Store.open(f"s3://{bucket}/out", StorageConfig(endpoint_url=s3_endpoint))
    path = store.join("_commits", "s.json")
    assert store.create_exclusive(path, b"first")
    assert not store.create_exclusive(path, b"second")  # the server answers 412 Precondition Failed
    assert store.read_bytes(path) == b"first"


def test_job_from_s3_to_s3(tmp_path: Path, s3_endpoint: str, bucket: str, tiny_llm) -> None:
    ids = write_dataset(tmp_path / "in", files=2, rows_per_file=7)
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint})
    fs.put(str(tmp_path / "in") + "/", f"{bucket}/docs/", recursive=True)
    out = f"s3://{bucket}/runs/out"
    spec = load_job(
        f"s3://{bucket}/docs/", out, "tiny", job("generate", keep_columns=["title"]), endpoint_url=s3_endpoint
    )
    glob = load_job(f"s3://{bucket}/docs/*-1.parquet", "", "tiny", endpoint_url=s3_endpoint)
    assert [s.relpath for s in plan_shards(glob)] == ["part-1.parquet"]
    summary, failures = run_local(spec, llm=tiny_llm, progress=False)
    assert failures == [] and summary.complete and summary.rows == 14
    assert summary.data_glob == f"s3://{bucket}/runs/out/data/**/*.parquet"

    # s3fs + pyarrow.dataset
    table = ds.dataset(f"{bucket}/runs/out/data", filesystem=fs, format="parquet").to_table()
    assert sorted(table.column("id").to_pylist()) == sorted(ids)
    # pyarrow's own S3 client
    host = s3_endpoint.removeprefix("http://")
    native = pafs.S3FileSystem(
        endpoint_override=host, scheme="http", access_key="testing", secret_key="testing", region="us-east-1"
    )
    assert ds.dataset(f"{bucket}/runs/out/data", filesystem=native, format="parquet").count_rows() == 14
    # polars' own object-store client
    opts = {
        "aws_endpoint_url": s3_endpoint,
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
        "aws_region": "us-east-1",
        "aws_allow_http": "true",
    }
    df = pl.scan_parquet(summary.data_glob, storage_options=opts).collect()
    assert df.height == 14 and df["id"].n_unique() == 14 and df["title"].null_count() == 0
    assert not fs.exists(f"{bucket}/runs/out/_staging") or not fs.find(f"{bucket}/runs/out/_staging")

    # resume: nothing left to do; a different job into the same output is refused
    again, _ = run_local(spec, llm=tiny_llm, progress=False)
    assert (
        again.rows == 14 and pl.scan_parquet(summary.data_glob, storage_options=opts).collect().height == 14
    )
    other = load_job(
        spec.input, out, "tiny", job("generate", sampling={"max_tokens": 5}), endpoint_url=s3_endpoint
    )
    with pytest.raises(FingerprintMismatch):
        prepare_output(other)
    assert main(["status", out, "--endpoint-url", s3_endpoint, "--json"]) == 0
