"""Label jobs: score mode and its calibration (batch prior, contextual references), the collapse
watch, and the quality report with its charts."""
