"""The step loop and its bookkeeping: LLMEngine, the Scheduler (the only writer of request state),
Request, CallStreams, the step types, stats, and the KV cache manager over its block pool."""
