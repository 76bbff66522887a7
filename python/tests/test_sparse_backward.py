"""Every sparse OpInfo (each sparse layout it supports) and torch.sparse.mm's reductions,
forward and backward on npu against the CPU. The cases run in a child process that names
each case before running it, so a crash (a kernel reading memory it must not) is reported
as a failure naming the case, and the remaining cases run in a new child."""
import json
import textwrap

from conftest import run_python

CHILD = textwrap.dedent(r'''
    import json, os, unittest, warnings
    import torch, torch_npu
    from torch.testing._internal.common_methods_invocations import op_db
    warnings.simplefilter("ignore")

    RANDOM = {"rand_like", "randn_like", "randint_like"}
    LAYOUTS = {"coo": torch.sparse_coo, "csr": torch.sparse_csr, "csc": torch.sparse_csc,
               "bsr": torch.sparse_bsr, "bsc": torch.sparse_bsc}

    def cases():
        for op in op_db:
            for name, layout in LAYOUTS.items():
                flag = "supports_sparse" if name == "coo" else f"supports_sparse_{name}"
                if getattr(op, flag, False):
                    yield f"{op.full_name}[{name}]", op, layout
        for reduce in ("sum", "mean", "amax", "amin"):
            yield f"torch.sparse.mm[csr,{reduce}]", reduce, torch.sparse_csr

    def to_npu(x):
        if isinstance(x, torch.Tensor):
            return x.detach().to("npu").requires_grad_(x.requires_grad)
        if isinstance(x, (list, tuple)):
            return type(x)(to_npu(e) for e in x)
        if isinstance(x, dict):
            return {k: to_npu(v) for k, v in x.items()}
        return x

    def dense(t):
        return t.to_dense() if t.layout != torch.strided else t

    def run(fn, args, kwargs):
        out = fn(*args, **kwargs)
        grads = []
        if isinstance(out, torch.Tensor) and out.requires_grad:
            dense(out).sum().backward()
            grads = [dense(a.grad).cpu() if a.grad is not None else None
                     for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        return dense(out).cpu() if isinstance(out, torch.Tensor) else out, grads

    def samples(op, layout):
        if isinstance(op, str):  # torch.sparse.mm with a reduction
            torch.manual_seed(0)
            a = torch.randn(5, 5).relu().to_sparse_csr().requires_grad_()
            b = torch.randn(5, 3, requires_grad=True)
            return [(lambda x, y, r=op: torch.sparse.mm(x, y, r), [a, b], {})]
        grad = op.supports_autograd
        try:
            given = list(op.sample_inputs_sparse(layout, "cpu", torch.float32, requires_grad=grad))
        except NotImplementedError:  # no sparse samples of its own: its dense 2-d ones, converted
            given = [s for s in op.sample_inputs("cpu", torch.float32) if s.input.dim() == 2]
            for s in given:
                x = s.input.detach()
                x = x.to_sparse() if layout == torch.sparse_coo else x.to_sparse(layout=layout, blocksize=(
                    (1, 1) if layout in (torch.sparse_bsr, torch.sparse_bsc) else None))
                s.input = x.requires_grad_(grad)
        except unittest.SkipTest:
            given = []
        return [(op.op, [s.input, *s.args], dict(s.kwargs)) for s in given[:4]]

    all_cases = list(cases())
    start = int(os.environ["SPARSE_CASES_START"])
    for i, (name, op, layout) in enumerate(all_cases[start:], start):
        print("START", i, name, flush=True)
        result, compared = "OK", 0
        try:
            for fn, args, kwargs in samples(op, layout):
                try:
                    expected = run(fn, args, kwargs)
                except Exception:
                    continue  # the CPU refuses it too
                got = run(fn, to_npu(args), to_npu(kwargs))
                if name.split("[")[0] in RANDOM:  # the npu generator's numbers, not the CPU's
                    assert (got[0].shape, got[0].dtype) == (expected[0].shape, expected[0].dtype)
                else:
                    torch.testing.assert_close(got, expected, equal_nan=True, rtol=1e-5, atol=1e-5)
                compared += 1
        except Exception as e:
            result = "FAIL " + f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
        print("END", i, compared, json.dumps(result), flush=True)
    print("DONE", len(all_cases), flush=True)
''')


def run_child(start):
    return run_python(CHILD, env={"SPARSE_CASES_START": str(start)}, timeout=900)


def test_sparse_opinfos_forward_backward_match_cpu_without_crashing():
    failures, start, total, compared = [], 0, None, 0
    while total is None or start < total:
        proc = run_child(start)
        current = None
        for line in proc.stdout.splitlines():
            kind, _, rest = line.partition(" ")
            if kind == "START":
                current = rest
            elif kind == "END":
                index, n, result = rest.split(" ", 2)
                compared += int(n)
                if json.loads(result) != "OK":
                    failures.append(f"{current}: {json.loads(result)}")
                current, start = None, int(index) + 1
            elif kind == "DONE":
                total = int(rest)
        if total is None or start < total:
            assert current is not None, f"the child failed before any case:\n{proc.stderr[-3000:]}"
            failures.append(f"{current}: the process died (exit {proc.returncode}): {proc.stderr[-500:]}")
            start = int(current.split(" ", 1)[0]) + 1
    assert compared > 100, f"only {compared} sparse samples were compared"
    assert not failures, "\n".join(failures)
