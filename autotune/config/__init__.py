"""Stage 1, the config: compose a preset with Hydra (compose.py), type and validate it (schema.py: `load_config`; checks.py, validate.py). Nothing here runs a trial."""
