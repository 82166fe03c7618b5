"""Resolving and naming a model: where it is (model_source, locate/identity), its config and card,
the presets and embedded SmolLM2, the trained test tokenizer, and the safetensors loader."""
