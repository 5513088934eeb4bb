"""What a cell measures and how it is judged: `probes` observe a model (reference and ranks alike) on `inputs`,
accuracy tasks (`task_probe`, `lm_eval_tasks`, `task_scoring`) score it, `breakpoints`, `sharding` and
`policy_inference` record where a cell broke and what AutoTP did; `contracts` are the records that cross between the
driver and the ranks; one module per check compares the sharded observations with the reference and returns a
`CheckResult` (`result`); `judge` runs an inference cell's checks in order.
"""
