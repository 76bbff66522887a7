"""Random bad arguments for every torch.ops.npu operator (hypothesis): wrong dtypes, ranks
and shapes, cpu tensors among npu ones, bad layout strings, negative and huge ints, None
where a tensor is required, empty tensors. Each call must succeed or raise one of
RuntimeError / ValueError / TypeError / IndexError / NotImplementedError with a message,
and neither crash the process nor hang.

The operators are enumerated from the dispatcher, so new ones are covered without edits.
The calls run in a child process (this file run as a script), which logs each call before
making it: a crash or a hang (a watchdog ends the child) is reported as a failure naming
the operator and the arguments, and the child restarts at the next operator.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import pytest
import torch

import torch_npu

EXAMPLES_PER_OP = int(os.environ.get("NPU_BAD_ARGS_EXAMPLES", "40"))
CALL_TIMEOUT_S = 30  # one call (and its synchronisation) longer than this is a hang
ALLOWED = (RuntimeError, ValueError, TypeError, IndexError, NotImplementedError)


def npu_op_names():
    return sorted(n[len("npu::"):] for n in torch._C._dispatch_get_all_op_names() if n.startswith("npu::"))


# One valid call (argument name -> value) per operator where it is short to write: the child
# also mutates one argument of it at a time, which reaches the checks behind the first ones
# (shapes that disagree, values out of range) that fully random arguments rarely get past.
def _valid_calls():
    n = lambda *shape: torch.randn(*shape).npu()  # noqa: E731
    i8 = lambda *shape: torch.randint(-4, 4, shape, dtype=torch.int8).npu()  # noqa: E731
    boxes = lambda k: torch.tensor([[0., 0., 4., 4.], [1., 1., 5., 6.], [2., 0., 6., 3.]][:k]).npu()  # noqa: E731
    qkv = dict(query=n(1, 4, 16), key=n(1, 4, 16), value=n(1, 4, 16), num_heads=2, input_layout="BSH")
    return {
        "npu_rms_norm": dict(self=n(2, 3, 8), gamma=n(8)),
        "npu_add_rms_norm": dict(x1=n(2, 8), x2=n(2, 8), gamma=n(8)),
        "npu_swiglu": dict(self=n(2, 8), dim=-1),
        "npu_geglu": dict(self=n(2, 8), dim=-1),
        "npu_rotary_mul": dict(self=n(1, 2, 3, 8), r1=n(1, 2, 1, 8), r2=n(1, 2, 1, 8)),
        "npu_scaled_masked_softmax": dict(x=n(2, 2, 4, 4), mask=torch.rand(2, 2, 4, 4).npu() > 0.5),
        "npu_confusion_transpose": dict(self=n(2, 3, 4), perm=[0, 2, 1], shape=[2, 4, 3], transpose_first=True),
        "npu_fusion_attention": dict(query=n(1, 2, 4, 8), key=n(1, 2, 4, 8), value=n(1, 2, 4, 8), head_num=2,
                                     input_layout="BNSD"),
        "npu_prompt_flash_attention": dict(qkv),
        "npu_fused_infer_attention_score": dict(qkv),
        "npu_incre_flash_attention": dict(qkv, query=n(1, 1, 16)),
        "npu_iou": dict(bboxes=boxes(3), gtboxes=boxes(2)),
        "npu_giou": dict(self=boxes(3).t().contiguous(), gtboxes=boxes(3).t().contiguous()),
        "npu_nms_with_mask": dict(input=torch.cat([boxes(3), torch.rand(3, 1).npu()], 1), iou_threshold=0.5),
        "npu_nms_v4": dict(self=boxes(3), scores=torch.rand(3).npu(), max_output_size=2,
                           iou_threshold=torch.tensor(0.5).npu(), scores_threshold=torch.tensor(0.1).npu()),
        "npu_nms_rotated": dict(self=torch.cat([boxes(3), torch.zeros(3, 1).npu()], 1), scores=torch.rand(3).npu(),
                                iou_threshold=0.5),
        "npu_roi_align": dict(self=n(1, 2, 8, 8), rois=torch.tensor([[0., 1., 1., 5., 5.]]).npu(), spatial_scale=1.0,
                              pooled_height=2, pooled_width=2, sample_num=2, roi_end_mode=1),
        "npu_ps_roi_pooling": dict(self=n(1, 8, 6, 6), rois=torch.tensor([[[0., 0.], [0., 1.], [1., 0.], [4., 3.],
                                                                          [5., 2.]]]).npu(),
                                   spatial_scale=1.0, group_size=2, output_dim=2),
        "npu_moe_gating_top_k_softmax": dict(x=n(4, 8), k=2),
        "npu_grouped_matmul": dict(x=[n(4, 8)], weight=[n(8, 3)]),
        "npu_quant_matmul": dict(x1=i8(4, 8), x2=i8(8, 3), scale=torch.rand(3).npu()),
        "npu_weight_quant_batchmatmul": dict(x=n(4, 8).half(), weight=i8(8, 3),
                                             antiquant_scale=torch.rand(3).half().npu()),
        "npu_quant_conv2d": dict(input=i8(1, 2, 5, 5), weight=i8(3, 2, 3, 3), scale=torch.rand(3).npu(),
                                 output_dtype=torch.float16),
        "npu_trans_quant_param": dict(scale=torch.rand(4).npu()),
        "_npu_fused_adam_step": dict(param=n(10), grad=n(10), exp_avg=n(10), exp_avg_sq=n(10).abs(),
                                     max_exp_avg_sq=None, lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.0,
                                     step=1),
    }


# ---- the child: draws arguments and calls the operators --------------------------------------

def _child(ops, log_path, result_path):
    import faulthandler

    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    dims = st.sampled_from([0, 1, 2, 3, 4, 5, 8])
    dtypes = st.sampled_from([torch.float32] * 4 + [torch.float16, torch.bfloat16, torch.float64, torch.int8,
                                                     torch.int32, torch.int64, torch.bool])
    devices = st.sampled_from(["npu"] * 6 + ["cpu"])

    @st.composite
    def tensors(draw):
        shape = draw(st.lists(dims, min_size=0, max_size=5))
        dtype, device = draw(dtypes), draw(devices)
        if dtype.is_floating_point:
            t = torch.randn(shape, dtype=torch.float32).to(dtype)
        elif dtype == torch.bool:
            t = torch.randint(0, 2, shape).bool()
        else:
            t = torch.randint(-4, 9, shape).to(dtype)
        if draw(st.booleans()) and t.dim() >= 2:
            t = t.transpose(0, 1)  # non-contiguous
        return t.to(device)

    ints = st.sampled_from([-(2 ** 62), -2 ** 31, -7, -1, 0, 1, 2, 3, 4, 8, 64, 2 ** 31 - 1, 2 ** 40])
    floats = st.sampled_from([0.0, -1.0, 0.5, 1.0, 2.0, 1e30, -1e30, math.inf, -math.inf, math.nan])
    strings = st.sampled_from(["BSH", "SBH", "BSND", "BNSD", "TND", "BNSD_BSND", "", "bogus", "half",
                               "interleave", "rint", "bsh", "BSH\x00"])
    scalar_types = st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.int32])

    def strategy(type_str):
        t = type_str.replace("SymInt", "int")
        optional = t.endswith("?")
        t = t.rstrip("?")
        if t == "Tensor":
            s = tensors()
        elif t.startswith("Tensor["):
            s = st.lists(tensors(), min_size=0, max_size=2)
        elif t == "int":
            s = ints
        elif t.startswith("int["):
            s = st.lists(ints, min_size=0, max_size=5)
        elif t == "float":
            s = floats
        elif t == "bool":
            s = st.booleans()
        elif t == "str":
            s = strings
        elif t == "Scalar":
            s = st.one_of(ints, floats)
        elif t == "ScalarType":
            s = scalar_types
        else:
            s = st.none()
        # None where a value is required (a TypeError from the binding, at the least).
        return st.one_of(st.none(), s) if optional or t.startswith("Tensor") else s

    def describe(v):
        if isinstance(v, torch.Tensor):
            return f"tensor({list(v.shape)}, {v.dtype}, {v.device}{'' if v.is_contiguous() else ', strided'})"
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(describe(x) for x in v) + "]"
        return repr(v)

    @st.composite
    def mutated_tensor(draw, t):
        kind = draw(st.sampled_from(["dtype", "cpu", "size", "add_dim", "drop_dim", "empty", "none", "strided",
                                     "values"]))
        if kind == "dtype":
            return t.to(draw(dtypes))
        if kind == "cpu":
            return t.cpu()
        if kind == "none":
            return None
        if kind == "strided":
            return t.transpose(0, -1) if t.dim() >= 2 else t.expand(2, *t.shape)[1]
        if kind == "values":
            v = draw(floats) if t.is_floating_point() else draw(st.sampled_from([-1, 2 ** 31 - 1, 100, -100]))
            return t.clone().fill_(v) if t.dtype != torch.int8 or abs(v) < 128 else t.clone().fill_(-128)
        shape = list(t.shape)
        if kind == "size" and shape:
            shape[draw(st.integers(0, len(shape) - 1))] = draw(dims)
        elif kind == "add_dim":
            shape.insert(draw(st.integers(0, len(shape))), draw(dims))
        elif kind == "drop_dim" and shape:
            shape.pop(draw(st.integers(0, len(shape) - 1)))
        elif kind == "empty":
            shape = [0] + shape[1:]
        return torch.randn(shape).to(t.dtype).to(t.device) if t.is_floating_point() else \
            torch.randint(-4, 5, shape).to(t.dtype).to(t.device)

    def mutated(drawn_valid, name_strategies):
        """One argument of a valid call replaced by a bad value."""
        @st.composite
        def draw_call(draw):
            call = dict(drawn_valid)
            arg = draw(st.sampled_from(sorted(name_strategies)))
            old = call.get(arg)
            if isinstance(old, torch.Tensor):
                call[arg] = draw(mutated_tensor(old))
            elif isinstance(old, list) and old and isinstance(old[0], torch.Tensor):
                call[arg] = [draw(mutated_tensor(old[0]))] + old[1:]
            else:
                call[arg] = draw(name_strategies[arg])
            return call
        return draw_call()

    valid_calls = _valid_calls()
    faulthandler.enable()  # a crash prints the Python stack to stderr (shown in the report)
    failures = {}
    log = open(log_path, "a", buffering=1)
    for name in ops:
        base, _, overload = name.partition(".")
        schema = torch._C._get_schema(f"npu::{base}", overload)
        packet = getattr(torch.ops.npu, base)
        fn = getattr(packet, overload or "default")
        args = [a for a in schema.arguments]

        def arg_strategy(a):
            s = strategy(str(a.type))
            if not a.has_default_value():
                return s
            # Mostly the default, so that an operator with many optional arguments (the
            # attention and grouped-matmul ones) still gets its required ones probed.
            default = st.just(a.default_value)
            return st.one_of(default, default, default, s)

        arg_strategies = {a.name: arg_strategy(a) for a in args}

        calls = st.fixed_dictionaries(arg_strategies)
        if name in valid_calls:
            defaults = {a.name: a.default_value for a in args if a.has_default_value()}
            calls = st.one_of(calls, mutated(dict(defaults, **valid_calls[name]), arg_strategies))

        @settings(max_examples=EXAMPLES_PER_OP, deadline=None, database=None, derandomize=True,
                  phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
        @given(calls)
        def run(drawn):
            if name in failures:
                return
            positional = [drawn[a.name] for a in args if not a.kwarg_only]
            keywords = {a.name: drawn[a.name] for a in args if a.kwarg_only}
            call = f"{name}(" + ", ".join([describe(v) for v in positional] +
                                          [f"{k}={describe(v)}" for k, v in keywords.items()]) + ")"
            log.write(json.dumps({"op": name, "call": call}) + "\n")
            faulthandler.dump_traceback_later(CALL_TIMEOUT_S, exit=True)
            try:
                fn(*positional, **keywords)
                torch.npu.synchronize()  # kernel errors surface here
            except ALLOWED as e:
                if not str(e).strip():
                    failures[name] = f"{call} raised {type(e).__name__} without a message"
            except BaseException as e:  # noqa: BLE001 - any other type is the finding
                failures[name] = f"{call} raised {type(e).__name__}: {str(e)[:300]}"
            finally:
                faulthandler.cancel_dump_traceback_later()
            try:  # a failed kernel must not poison the next call
                torch.npu.synchronize()
            except ALLOWED:
                pass

        run()
        log.write(json.dumps({"op": name, "done": True}) + "\n")
        with open(result_path, "w") as f:
            json.dump(failures, f)
    log.close()


# ---- the parent: runs the child, restarting it after a crash ----------------------------------

def _run_all(ops):
    failures, pending = {}, list(ops)
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(torch_npu.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [package_root, env.get("PYTHONPATH", "")] if p)
    with tempfile.TemporaryDirectory() as tmp:
        while pending:
            log_path, result_path = os.path.join(tmp, "calls.log"), os.path.join(tmp, "result.json")
            for p in (log_path, result_path):
                if os.path.exists(p):
                    os.remove(p)
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), log_path, result_path, *pending],
                                  env=env, cwd=tmp, capture_output=True, text=True,  # cwd: hypothesis's files
                                  timeout=CALL_TIMEOUT_S * 4 + 30 * len(pending))
            if os.path.exists(result_path):
                with open(result_path) as f:
                    failures.update(json.load(f))
            done, last = set(), None
            if os.path.exists(log_path):
                with open(log_path) as f:
                    for line in f:
                        entry = json.loads(line)
                        if entry.get("done"):
                            done.add(entry["op"])
                        else:
                            last = entry
            if proc.returncode == 0:
                break
            # The child died in the middle of `last`: a crash, or the watchdog's exit on a hang.
            if last is None or last["op"] in done:
                pytest.fail(f"the bad-argument child failed outside an operator call "
                            f"(exit {proc.returncode}):\n{proc.stderr[-3000:]}")
            failures[last["op"]] = (f"{last['call']} killed the process (exit {proc.returncode}; a crash, or a "
                                    f"hang of more than {CALL_TIMEOUT_S} s):\n{proc.stderr[-1500:]}")
            pending = pending[pending.index(last["op"]) + 1:]
    return failures


OPS = npu_op_names()


@pytest.fixture(scope="module")
def failures():
    return _run_all(OPS)


def test_every_npu_operator_is_covered():
    assert len(OPS) >= 50 and "npu_fusion_attention" in OPS and "npu_quant_matmul" in OPS


@pytest.mark.parametrize("op", OPS)
def test_bad_arguments(failures, op):
    assert op not in failures, failures[op]


if __name__ == "__main__":
    torch.npu.set_device(0)
    # 3.2 GiB of the 64: a huge size fails fast with OutOfMemoryError instead of a long kernel.
    torch.npu.set_per_process_memory_fraction(0.05)
    _child(sys.argv[3:], sys.argv[1], sys.argv[2])
