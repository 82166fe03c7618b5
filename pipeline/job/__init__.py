"""What the user asked for: the validated, frozen job model and its options (config, flags: the bottom
layer), and the JobSpec with its fingerprint, load_job and open_engine (spec: above the tasks it asks to
check the job). Nothing here knows the state of a run."""
