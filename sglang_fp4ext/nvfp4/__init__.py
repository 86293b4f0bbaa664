"""NVFP4 format: codec and scale layouts (see ``format.py``)."""
