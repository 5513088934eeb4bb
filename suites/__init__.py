"""What runs in a session: `test_autotp.py` (one pytest case per cell) and `driver.py` (a cell from the
pytest process: memory plan, unsharded reference, rank group, verdict).

engine/    the rank groups: forked or launched ranks, the per-cell protocol, what runs inside a rank
checks/    what a cell measures (probes, inputs, tasks) and how it is judged (one module per check)
variants/  how a variant loads, quantizes or trains a model, and what the driver prepares for it
records/   what a run writes: cells.jsonl + JUnit properties, repro scripts, the end-of-run summary
"""
