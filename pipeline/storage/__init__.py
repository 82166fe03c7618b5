"""Bytes on fsspec (local or S3): the Store and its exactly-once primitives, storage-error
classification, input discovery and reading, how to read the results back, the output root's file
names (layout), shards (row ranges of the input) and the row sample over row groups."""
