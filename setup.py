"""Packaging: the package is ``autotune/``; the top-level ``conf/`` and ``objectives/`` (where the
project's design card draws them) are mapped into it as ``autotune.conf`` and
``autotune.objectives``, so a wheel and an editable install carry every preset and metric.

Everything else about the build is in pyproject.toml; this file only lists the packages, because
``[tool.setuptools.packages.find]`` cannot add a package that lives outside ``autotune/``.
A source checkout run without an install finds them too (``autotune/__init__.py``).
"""

from setuptools import find_packages
from setuptools import setup

MAPPED = {"autotune.conf": "conf", "autotune.objectives": "objectives"}

setup(
    packages=[*find_packages(include=["autotune", "autotune.*"]), *MAPPED],
    package_dir=MAPPED,
)
