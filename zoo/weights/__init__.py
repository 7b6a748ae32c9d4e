"""Weight files: safe readers for safetensors headers and torch pickles."""
