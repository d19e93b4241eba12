"""bf16 gradients accumulate into an fp32 .grad in place (hybridpar/zero/engine.py ``_fp32_grad``), bit
for bit the sum that casting each gradient first gives (bf16 runs on ranks: tests/integration/test_bf16.py)."""


def test_fp32_accumulation_adds_in_place_and_matches_the_cast_then_add():
    """engine._fp32_grad: the first micro-batch's bf16 gradient becomes an fp32 .grad once; later
    ones are added into it by autograd's in-place accumulation, cast on the fly (10 bytes per
    parameter, not the 18 of casting each gradient to an fp32 copy first). The sum is bit for bit
    the one Tensor.grad_dtype = float32 gives. A parameter one backward reaches twice (a one-stage
    model's tied embedding) is why engine.py keeps grad_dtype = float32 there: autograd sums its
    two gradients before accumulating, in bf16 unless it casts each first."""
    import torch

    from hybridpar.zero.engine import _fp32_grad

    torch.manual_seed(0)
    xs = [torch.randn(5, 4, dtype=torch.bfloat16) for _ in range(3)]
    init = torch.randn(4, 4, dtype=torch.bfloat16)

    def run(setup, twice=False):
        p = torch.nn.Parameter(init.clone())
        setup(p)
        for x in xs:
            y = (x @ p) @ p if twice else x @ p
            y.square().sum().backward()
        return p.grad

    def in_place(p):
        p.grad_dtype = None
        p.register_post_accumulate_grad_hook(_fp32_grad)

    def cast_then_add(p):
        p.grad_dtype = torch.float32

    ours, theirs = run(in_place), run(cast_then_add)
    assert ours.dtype == theirs.dtype == torch.float32
    assert torch.equal(ours, theirs)
    plain = run(lambda p: None)  # bf16 running sum: rounded, so it differs
    assert plain.dtype == torch.bfloat16 and not torch.equal(plain.float(), ours)
    assert not torch.equal(run(in_place, twice=True), run(cast_then_add, twice=True))
