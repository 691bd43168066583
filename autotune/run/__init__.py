"""Stage 3, running trials: the ask/tell loop (driver.py), Ray placement (placement.py, cluster.py), the launch (launcher.py) and the side-by-side re-measurement (remeasure.py)."""
