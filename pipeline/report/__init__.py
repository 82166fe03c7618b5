"""What a run says about itself: finalize and status totals, live progress, throughput and label
reports and charts (it reads the run; the run never imports it)."""
