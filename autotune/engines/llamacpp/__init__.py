"""llama.cpp through llama-cpp-python: the engine, its predictor (GGUF header), GPU offload, the GGUF memory estimate and the llama-server flags its export is checked against."""
