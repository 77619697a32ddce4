"""Robustness campaign: hostile models, external data, plans and feeds, each run in an
isolated process and classified against onnxruntime (see campaign.py)."""
