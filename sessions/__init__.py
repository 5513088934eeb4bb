"""How a nox session runs: the environment of each version combination (shared with bisection and
triage steps), installing the harness into it, running the suites, recording the cells a failed install
could not run, and the sessions' own commands (add-model, the derived-architecture build check)."""
