"""Package discovery for setuptools; the rest of the build is in pyproject.toml.

kernels/ (the CUDA C sources) stays at the repository's top level, as DESIGN.md lays it out; the
build maps that folder onto the package `gt_serve.kernels`, so a wheel and an editable install
both hold the .cu files there and the backends find them one way:
importlib.resources.files("gt_serve.kernels") (gt_serve/backends/cupy_backend.py).
"""
from setuptools import find_namespace_packages, setup

setup(
    packages=find_namespace_packages(include=["gt_serve", "gt_serve.*"], exclude=["*.__pycache__"])
    + ["gt_serve.kernels"],
    package_dir={"gt_serve.kernels": "kernels"},
)
