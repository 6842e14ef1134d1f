"""Runnable examples beside the gateway (the ``make demo`` demo, sample configurations).

Not installed with the package: run from a checkout (``python -m examples.demo``).
"""
