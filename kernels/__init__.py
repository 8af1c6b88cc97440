"""CUDA C sources, one file per kernel family (DESIGN.md). Installed, this folder is the data
package `gt_serve.kernels` (setup.py maps it): backends read the .cu files with importlib.resources."""
