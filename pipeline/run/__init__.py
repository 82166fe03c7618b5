"""The state of one run of a job on its output root: the run record, leases, shard planning, the id
index, staging and commit of a shard, the Run handle, running shards (with the throughput series and
speculation counters they record), and the OpenAI Batch driver. Layer order: docs/architecture.md."""
