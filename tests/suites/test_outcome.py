"""Failure signatures: numbers masked, the deepest library frame named (groups one failure across runs)."""

from suites.outcome import exception_signature, mask_numbers


def test_signature_masks_numbers_and_names_the_deepest_library_frame():
    namespace = {}
    code = compile("def shard(n):\n    raise RuntimeError(f'shape [{n}, 16] is invalid for input of size {n*16}')\n",
                   "/site-packages/deepspeed/module_inject/tp_shard.py", "exec")
    exec(code, namespace)
    signatures = set()
    for size in (3, 5):
        try:
            namespace["shard"](size)
        except RuntimeError as error:
            signatures.add(exception_signature(error))
    assert signatures == {"RuntimeError: shape [N, N] is invalid for input of size N @ deepspeed/module_inject/tp_shard.py:shard"}
    assert mask_numbers("0x7f3a at 1.5e-3") == "N at N"
