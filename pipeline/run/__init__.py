"""The state of one run of a job on its output root: the layout, the run record, leases, shard
planning, the id index, the output schema, staging and commit of a shard, running shards, and the
one-lane and OpenAI Batch drivers."""
