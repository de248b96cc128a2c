"""Collector: probes, the training-loop Monitor and data checks. Torch lives here."""
