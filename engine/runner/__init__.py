"""A scheduled step into one forward pass: ModelRunner, ModelShard (weights and KV tensors), the
flat StepInputs, the attention-backend seam and the decode CUDA graphs."""
