"""Tasks: what a job does with each row (generate, summarize, label, extract, OpenAI Batch lines).

``base.Task`` is the one interface; ``registry`` maps ``task:`` names to implementations. Only the
registry imports the implementations, so the pipeline's row, inference and output modules import
``base`` alone and never branch on a task name.
"""
