"""ExLlamaV2 0.3.2 (CUDA): the engine, its pure load plan, the generator pump, the extension build and the predictor. Imports exllamav2 only inside a trial."""
