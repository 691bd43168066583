"""vLLM's OpenAI server (CPU venv or CUDA): the engine, its GPU helpers and the predictor."""
