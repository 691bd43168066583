"""Stage 2, the search: the space as Optuna distributions and rules (space.py, rules.py), the samplers (samplers.py, bo.py, design.py) and the winner's selection (select.py)."""
