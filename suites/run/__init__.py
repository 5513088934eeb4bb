"""A cell from the pytest process: the suites' options and command line (`command`), a cell worked out once
(`prepared`), its variant's setup (`variant_setup`), a cold run's checkpoints and references done ahead (`ahead`),
and the driver that runs a cell on a rank group and turns what the ranks say into its verdict (`driver`)."""
