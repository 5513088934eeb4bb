"""What runs in a session: `test_autotp.py` (one pytest case per cell) and, below it, eight rooms along one chain,
each importing only itself and the rooms before it (tests/test_layout.py `SUITES_ROOMS` enforces the order):

base/       files other processes read, the git runner, model types, the elementwise math settled before a fork
verdicts/   the outcome and failure-class vocabulary, whose fault an exception is, check names, what AutoTP did and
            the cause it makes: what every record and the reports read, with no torch behind it
checks/     what a cell measures (probes, inputs, tasks, where it broke, what AutoTP did), the job and rank summary
            that carry it between the driver and the ranks (`contracts`), and one module per check
variants/   how a variant loads, quantizes or trains a model (the ranks' and the reference's side)
reference/  the unsharded reference in a process of its own, and the memory plan that says whether it fits
engine/     the rank groups: forked or launched ranks, the per-cell protocol, what runs inside a rank
records/    what a run writes: cells.jsonl + JUnit properties, repro scripts, the end-of-run summary
run/        a cell from the pytest process: options and command line, the prepared cell, the variant's setup, the
            work done ahead, the driver

The order is the one the imports want: a check judges observations a probe made with the words of `verdicts`; a
variant trains with the checks' probes and contracts; the reference loads a model as a variant does; the engine
forks the reference's process and runs checks and variants in its ranks; the records read the engine's launch
environment; the driver drives all of them.
"""
