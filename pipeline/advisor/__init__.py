"""The workload advisor: the six-question decision tree answered from the job's own data, model and
device (``prefixflow plan --advise``; ``advise.advise``), and the predicted-vs-measured comparison after
a run (``compare``). Modules are imported where used, so ``advisor.roofline`` stays light."""
