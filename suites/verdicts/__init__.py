"""What a verdict says, in words every layer above reads: the outcome and failure class Literals (`vocabulary`), a
cell's outcome and whose fault an exception is (`outcome`), the checks' names (`check_names`), what AutoTP did and
the cause it makes (`cause`: the record; `mechanism`, `policy`, `statements`, `cause_titles`)."""
