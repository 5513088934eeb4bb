"""Variants: how a cell's model is loaded (eager, meta + checkpoint json, from_config), quantized or trained; what the
driver prepares for each before the ranks start is suites/run/variant_setup.py."""
