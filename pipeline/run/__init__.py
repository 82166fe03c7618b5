"""The state of one run of a job on its output root."""
