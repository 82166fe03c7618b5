"""What the user asked for: the validated, frozen job config, the JobSpec and its fingerprint, and
the job's command-line flags. Nothing here knows the state of a run."""
