"""Speculative decoding: proposers (n-gram prompt lookup, a draft model), exact verification of a run
of k+1 positions as an ordinary chunk, rollback, and the batch-aware policy that picks k per request.
See docs/engine.md "Speculative decoding"."""
