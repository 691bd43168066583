"""Measurement: workloads and timings, statistics, and quality vs a reference."""
