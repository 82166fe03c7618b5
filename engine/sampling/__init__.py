"""Per-request sampling: SamplingParams, the sampler (a pure function of logits and params),
n-sample groups, stop checking, log-prob views and UTF-8 safe output tails."""
