"""What a run writes: one record per cell in cells.jsonl and as JUnit properties (`run_records`), a
standalone repro script per failing cell (`repro`), and the end-of-run summary table (`summary`)."""
