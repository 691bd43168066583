"""Stage 4, the record of a study: Optuna storage and trial records (study.py, records.py), reading a study directory (studies.py), the typed summary (summary.py) and MLflow (tracking.py)."""
