"""Label jobs: the task, scoring, calibration, references, the collapse watch and quality reports."""
