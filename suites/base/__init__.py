"""What every room uses and that knows nothing of cells: files written atomically for readers in other processes
(`atomic`), the one way to run git (`git`), the types a loaded model is annotated with (`model_types`), and the
elementwise math settled before a process forks (`elementwise_math`)."""
