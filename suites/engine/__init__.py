"""Rank groups: started (forked on CPU, DeepSpeed's launcher on accelerators), fed one cell at a time,
watched for hangs and deaths; `cell_runner` is what each rank does with a cell."""
