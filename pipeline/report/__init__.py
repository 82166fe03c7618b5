"""What a run says about itself: finalize and status totals, live progress, throughput series and
their reports and charts, speculative-decoding counters."""
