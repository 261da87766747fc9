"""Prompts: dataset sources (procedural, local files, hub ids), templating, order, curricula.

Light on purpose: `datasets` and `transformers` are imported inside the functions that need them.
"""
