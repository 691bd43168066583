"""Stage 5, what a study leaves: exports in each engine's own form (export.py), the report (report.py, report_html.py) and the --dry-run plan (plan.py)."""
