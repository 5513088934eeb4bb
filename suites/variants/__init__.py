"""Variants: how a cell's model is loaded (eager, meta + checkpoint json, from_config), quantized or
trained, and what the driver prepares for each before the ranks start (`variant_setup`)."""
