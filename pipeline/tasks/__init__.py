"""What depends on the job's task: a row into engine requests, engine outputs into row values,
generation constraints, extract's JSON schema and typed columns, OpenAI Batch lines in and out, and
the label task (label/)."""
