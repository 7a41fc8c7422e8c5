"""`python -m bench.usage`: CPU cost of usage sampling."""
