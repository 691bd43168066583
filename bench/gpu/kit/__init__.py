"""The GPU check kit: a bench harness for a lent GPU machine, not part of the product.

It builds, carries and runs the staged check (``bench/gpu/*.sh``, docs/gpu.md): ``carry`` (the
wheel lock and its install), ``sources`` (TabbyAPI, llama.cpp, a tiny GGUF), ``venv_check``,
``prepare`` (extensions and models), ``stages`` (stage bookkeeping), ``check`` (the staged
rows), ``llama`` (the CUDA llama-server), ``tabby`` (TabbyAPI on an exported config) and
``lease`` (one command that runs what is not yet verified). Run each as
``python3 -m bench.gpu.kit.NAME`` from the repository root (the scripts put it on
``PYTHONPATH``); the lent machine has no install of autotune.
"""
