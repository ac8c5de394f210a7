"""Examples that ship with lightning-scale; importable so tests and benchmarks share them."""
