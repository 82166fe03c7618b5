"""Bytes on fsspec (local or S3): the Store and its exactly-once primitives, storage-error
classification, input discovery and reading, and how to read the results back."""
