"""The unsharded reference every check compares with, computed in a process of its own (`unsharded`), and the memory
plan that says whether it and the rank group fit this runner (`memory_plan`)."""
