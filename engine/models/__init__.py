"""Model definitions (Llama family) and the layers they are built from."""
