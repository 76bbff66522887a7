"""torch_npu.contrib.transfer_to_npu: CUDA scripts run unchanged on NPUs.

transfer_to_npu changes ``torch`` for the whole process, so every test runs its code in a
fresh interpreter (``run_python``) and this process stays untouched.
"""

import sys
import textwrap

import torch

from conftest import run_python

_PRELUDE = textwrap.dedent("""
    import warnings
    warnings.simplefilter("ignore", UserWarning)
    import torch
    import torch_npu
""")


def _run(code, env=None, prelude=_PRELUDE):
    result = run_python(prelude + textwrap.dedent(code), env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_cuda_training_script_runs_on_npu():
    out = _run("""
        from torch_npu.contrib import transfer_to_npu
        import torch.nn as nn

        assert torch.cuda.is_available() and torch.cuda.device_count() == torch.npu.device_count()
        torch.manual_seed(0)
        torch.cuda.manual_seed_all(0)
        torch.cuda.set_device(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        scaler = torch.cuda.amp.GradScaler()
        x = torch.randn(64, 16, device="cuda")
        y = torch.randint(0, 4, (64,)).to("cuda:0")
        losses = []
        for _ in range(20):
            opt.zero_grad(set_to_none=True)
            with torch.cuda.amp.autocast():
                out = model(x)
                loss = nn.functional.cross_entropy(out, y)
            assert out.dtype == torch.float16
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            losses.append(loss.item())
        torch.cuda.synchronize()
        params = list(model.parameters())
        print("DEVICES", {str(t.device) for t in params + [x, y, out]})
        print("IS_CUDA", all(t.is_cuda for t in params + [x, y, out]))
        print("GRADS", {str(p.grad.device) for p in params})
        print("OPT_STATE", {str(s["exp_avg"].device) for s in opt.state.values()})
        print("LEARNS", losses[-1] < losses[0] * 0.8, losses[0], losses[-1])
        print("MEMORY", torch.cuda.memory_allocated() > 0,
              torch.cuda.memory_allocated() == torch.npu.memory_allocated(),
              torch.cuda.max_memory_allocated() >= torch.cuda.memory_allocated())
        print("SCALER", type(scaler).__module__, scaler.is_enabled(), scaler.get_scale())
    """)
    assert "DEVICES {'npu:0'}" in out
    assert "IS_CUDA True" in out
    assert "GRADS {'npu:0'}" in out
    assert "OPT_STATE {'npu:0'}" in out
    assert "LEARNS True" in out
    assert "MEMORY True True True" in out
    assert "SCALER torch_npu.npu.amp.grad_scaler True" in out


def test_torch_compile_after_transfer_to_npu():
    """torch.cuda.manual_seed becomes torch.npu.manual_seed: Dynamo's rule map holds both names,
    and torch.compile failed ("Duplicate torch object ... with different rules") while they differed."""
    out = _run("""
        from torch_npu.contrib import transfer_to_npu
        model = torch.nn.Linear(2, 2).cuda()
        x = torch.randn(3, 2).cuda()
        print(torch.allclose(torch.compile(model)(x), model(x)))
    """)
    assert out.strip().endswith("True")


def test_torch_cuda_is_torch_npu():
    out = _run("""
        from torch_npu.contrib import transfer_to_npu

        cuda, npu = torch.cuda, torch.npu
        print("AVAILABLE", cuda.is_available(), cuda.device_count() == npu.device_count())
        cuda.set_device("cuda:1")
        print("SET_DEVICE", cuda.current_device(), npu.current_device())
        cuda.set_device(torch.device("cuda", 0))
        with cuda.device("cuda:2"):
            print("DEVICE_CTX", npu.current_device())
        with cuda.device(torch.device("cuda", 3)):
            print("DEVICE_CTX", npu.current_device())
        print("DEVICE_OF", cuda.device_of(torch.ones(1, device="cuda:1")).idx)
        stream = cuda.Stream(device="cuda:1")
        print("STREAM", stream.device, isinstance(stream, cuda.Stream),
              isinstance(npu.current_stream(), cuda.Stream), isinstance(stream, npu.Stream),
              issubclass(npu.Stream, cuda.Stream))
        side = cuda.Stream()
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        with cuda.stream(side):
            start.record()
            a = torch.ones(64, 64, device="cuda") @ torch.ones(64, 64, device="cuda")
            end.record()
        cuda.current_stream().wait_stream(side)
        cuda.synchronize("cuda:0")
        print("EVENTS", type(start) is npu.Event, start.elapsed_time(end) >= 0, a[0, 0].item())
        print("PROPS", cuda.get_device_name("cuda:0") == npu.get_device_name(0),
              cuda.get_device_properties(torch.device("cuda", 0)).total_memory
              == npu.get_device_properties(0).total_memory)
        x = torch.empty(1024, device="cuda")
        print("MEMORY", cuda.memory_allocated("cuda:0") == npu.memory_allocated(0) > 0,
              cuda.memory_reserved() >= cuda.memory_allocated(),
              cuda.memory.memory_allocated() == npu.memory_allocated(),
              cuda.memory_stats()["allocated_bytes.all.current"] == cuda.memory_allocated(),
              "memory summary" in cuda.memory_summary().lower(),
              cuda.mem_get_info("cuda")[1] == npu.mem_get_info()[1])
        del x
        cuda.empty_cache()
        cuda.reset_peak_memory_stats()
        cuda.manual_seed(7)
        a = torch.randn(3, device="cuda")
        npu.manual_seed(7)
        b = torch.randn(3, device="npu")
        state = cuda.get_rng_state("cuda")
        cuda.set_rng_state(state, device="cuda:0")
        print("RNG", torch.equal(a, b), cuda.initial_seed() == npu.initial_seed() == 7,
              len(cuda.default_generators) == npu.device_count())
        cuda.manual_seed_all(1)
        cuda.random.manual_seed(1)
        print("AMP", cuda.amp.autocast is npu.amp.autocast,
              cuda.amp.GradScaler is npu.amp.GradScaler,
              cuda.amp.autocast_mode.autocast is npu.amp.autocast,
              cuda.amp.grad_scaler.GradScaler is npu.amp.GradScaler,
              cuda.amp.custom_fwd is npu.amp.custom_fwd)
        print("OOM", cuda.OutOfMemoryError is npu.OutOfMemoryError)
    """)
    assert "AVAILABLE True True" in out
    assert "SET_DEVICE 1 1" in out
    assert "DEVICE_CTX 2" in out and "DEVICE_CTX 3" in out
    assert "DEVICE_OF 1" in out
    assert "STREAM npu:1 True True True True" in out
    assert "EVENTS True True 64.0" in out
    assert "PROPS True True" in out
    assert "MEMORY True True True True True True" in out
    assert "RNG True True True" in out
    assert "AMP True True True True True" in out
    assert "OOM True" in out


def test_cuda_device_arguments_become_npu():
    out = _run("""
        from torch_npu.contrib import transfer_to_npu

        x = torch.zeros(2, 2)
        made = {
            "tensor": torch.tensor([1.0], device="cuda:1"),
            "as_tensor": torch.as_tensor([1.0], device="cuda:1"),
            "zeros": torch.zeros(2, device=torch.device("cuda", 1)),
            "ones": torch.ones(2, device=torch.device("cuda:1")),
            "empty": torch.empty(2, device="cuda:1"),
            "randn": torch.randn(2, device="cuda:1"),
            "rand": torch.rand(2, device="cuda:1"),
            "randint": torch.randint(0, 5, (2,), device="cuda:1"),
            "randperm": torch.randperm(4, device="cuda:1"),
            "arange": torch.arange(3, device="cuda:1"),
            "full": torch.full((2,), 1.0, device="cuda:1"),
            "eye": torch.eye(2, device="cuda:1"),
            "linspace": torch.linspace(0, 1, 3, device="cuda:1"),
            "zeros_like": torch.zeros_like(x, device="cuda:1"),
            "ones_like": torch.ones_like(x, device="cuda:1"),
            "empty_like": torch.empty_like(x, device="cuda:1"),
            "full_like": torch.full_like(x, 2.0, device="cuda:1"),
            "randn_like": torch.randn_like(x, device="cuda:1"),
            "rand_like": torch.rand_like(x, device="cuda:1"),
            "randint_like": torch.randint_like(x, 3, device="cuda:1"),
            "new_zeros": x.new_zeros(2, device="cuda:1"),
            "new_ones": x.new_ones(2, device="cuda:1"),
            "new_empty": x.new_empty(2, device="cuda:1"),
            "new_full": x.new_full((2,), 3.0, device="cuda:1"),
            "new_tensor": x.new_tensor([1.0], device="cuda:1"),
            "to_str": x.to("cuda:1"),
            "to_device": x.to(torch.device("cuda", 1)),
            "to_kwarg": x.to(device="cuda:1", dtype=torch.float16),
            "to_non_blocking": x.to("cuda:1", non_blocking=True),
            "cuda_int": x.cuda(1),
            "cuda_str": x.cuda("cuda:1"),
            "cuda_device": x.cuda(device=torch.device("cuda", 1)),
            "linear": torch.nn.Linear(2, 2, device="cuda:1").weight,
            "module_to": torch.nn.Linear(2, 2).to("cuda:1").weight,
            "module_cuda": torch.nn.Linear(2, 2).cuda(torch.device("cuda:1")).weight,
            "to_empty": torch.nn.Linear(2, 2, device="meta").to_empty(device="cuda:1").weight,
            "fftfreq": torch.fft.fftfreq(4, device="cuda:1"),
        }
        print("FACTORIES", sorted({str(t.device) for t in made.values()}))
        print("DEFAULT", torch.zeros(1, device="cuda").device, x.cuda().device)
        print("PIN", x.pin_memory(device="cuda").is_pinned(), x.pin_memory().is_pinned())
        print("STORAGE", torch.UntypedStorage(4, device="cuda:1").device,
              x.untyped_storage().cuda().device)
        with torch.device("cuda:1"):
            print("WITH_DEVICE", torch.empty(1).device)
        torch.set_default_device("cuda:1")
        print("DEFAULT_DEVICE", torch.get_default_device(), torch.zeros(1).device)
        torch.set_default_device(None)
        print("DEVICE_MODULE", torch.get_device_module("cuda") is torch.npu)
        gen = torch.Generator(device="cuda")
        gen.manual_seed(3)
        print("GENERATOR", gen.device, isinstance(gen, torch.Generator),
              type(gen) is torch._C.Generator, torch.randn(2, device="cuda", generator=gen).device)
        print("EVENT", torch.Event(device="cuda").device.type,
              isinstance(torch.Event(), torch.Event))
        with torch.autocast(device_type="cuda"):
            y = torch.ones(2, 2, device="cuda") @ torch.ones(2, 2, device="cuda")
            print("AUTOCAST", y.dtype, torch.is_autocast_enabled("cuda"),
                  torch.is_autocast_enabled(), torch.get_autocast_dtype("cuda"))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            print("AUTOCAST_BF16", (torch.ones(2, 2, device="cuda") @ torch.ones(2, 2)
                                    .cuda()).dtype, torch.get_autocast_gpu_dtype())
        print("AUTOCAST_OFF", torch.is_autocast_enabled("cuda"))
        scalers = [torch.amp.GradScaler("cuda"), torch.amp.GradScaler(device="cuda"),
                   torch.amp.GradScaler()]
        print("GRADSCALER", {s._device for s in scalers}, all(s.is_enabled() for s in scalers))
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.deterministic = True
        print("FLAGS ok")
    """)
    assert "FACTORIES ['npu:1']" in out
    assert "DEFAULT npu:0 npu:0" in out
    assert "PIN True True" in out
    assert "STORAGE npu:1 npu:0" in out
    assert "WITH_DEVICE npu:1" in out
    assert "DEFAULT_DEVICE npu:1 npu:1" in out
    assert "DEVICE_MODULE True" in out
    assert "GENERATOR npu:0 True True npu:0" in out
    assert "EVENT npu True" in out
    assert "AUTOCAST torch.float16 True True torch.float16" in out
    assert "AUTOCAST_BF16 torch.bfloat16 torch.bfloat16" in out
    assert "AUTOCAST_OFF False" in out
    assert "GRADSCALER {'npu'} True" in out
    assert "FLAGS ok" in out


def test_load_map_location_and_cuda_checkpoints(tmp_path):
    out = _run(f"""
        import torch.serialization as serialization
        from torch_npu.contrib import transfer_to_npu

        folder = {str(tmp_path)!r}
        cpu_file = folder + "/cuda_model.pt"
        torch.save({{"w": torch.arange(4.0)}}, cpu_file)
        print("CPU_CKPT", torch.load(cpu_file)["w"].device,
              torch.load(cpu_file, map_location="cuda")["w"].device,
              torch.load(cpu_file, "cuda:1")["w"].device,
              torch.load(cpu_file, map_location=torch.device("cuda", 2))["w"].device,
              torch.load(cpu_file, map_location={{"cpu": "cuda:3"}})["w"].device)

        npu_file = folder + "/npu.pt"
        torch.save(torch.ones(2, device="cuda:1"), npu_file)
        print("NPU_CKPT", torch.load(npu_file).device,
              torch.load(npu_file, map_location={{"cuda:1": "cuda:2"}}).device,
              torch.load(npu_file, map_location="cpu").device)

        # A checkpoint written on a CUDA machine: its storages are tagged "cuda:N".
        tag = serialization.location_tag
        serialization.location_tag = lambda storage: "cuda:1"
        cuda_file = folder + "/from_gpu.pt"
        torch.save({{"w": torch.full((2,), 5.0)}}, cuda_file)
        serialization.location_tag = tag
        loaded = torch.load(cuda_file)["w"]
        print("GPU_CKPT", loaded.device, loaded.tolist(),
              torch.load(cuda_file, weights_only=True)["w"].device,
              torch.load(cuda_file, map_location="cpu")["w"].device,
              torch.load(cuda_file, map_location={{"cuda:1": "cuda:0"}})["w"].device)
    """)
    assert "CPU_CKPT cpu npu:0 npu:1 npu:2 npu:3" in out
    assert "NPU_CKPT npu:1 npu:2 cpu" in out
    assert "GPU_CKPT npu:1 [5.0, 5.0] npu:1 cpu npu:0" in out


def test_dataloader_pin_memory_device():
    out = _run("""
        from torch_npu.contrib import transfer_to_npu

        data = torch.utils.data.TensorDataset(torch.randn(8, 2), torch.arange(8))
        loader = torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True,
                                             pin_memory_device="cuda")
        batch = next(iter(loader))
        print("LOADER", loader.pin_memory_device, all(t.is_pinned() for t in batch),
              batch[0].cuda(non_blocking=True).device)
    """)
    assert "LOADER npu True npu:0" in out


def test_is_cuda():
    out = _run("""
        from torch_npu.contrib import transfer_to_npu

        npu_tensor = torch.ones(2, device="npu:1")
        param = torch.nn.Parameter(torch.ones(2).cuda())
        print("NPU", npu_tensor.is_cuda, param.is_cuda, npu_tensor.cuda().is_cuda,
              torch.ones(2).cuda().is_cuda)
        print("CPU", torch.ones(2).is_cuda, torch.nn.Parameter(torch.ones(2)).is_cuda)
        print("STORAGE", npu_tensor.storage().is_cuda, torch.ones(2).storage().is_cuda)
        seq = torch.nn.utils.rnn.pack_padded_sequence(torch.ones(2, 3, 4), [3, 2],
                                                      batch_first=True)
        print("PACKED", seq.cuda().is_cuda, seq.cuda().data.device, seq.is_cuda)
    """)
    assert "NPU True True True True" in out
    assert "CPU False False" in out
    assert "STORAGE True False" in out
    assert "PACKED True npu:0 False" in out


def test_environment_variable():
    code = """
        import sys, torch
        print("LOADED", "torch_npu.contrib.transfer_to_npu" in sys.modules)
        print("CUDA", torch.cuda.is_available(), torch.zeros(1, device="cuda").device,
              torch.ones(1).cuda().is_cuda)
    """
    prelude = "import warnings\nwarnings.simplefilter('ignore', UserWarning)\nimport torch_npu\n"
    out = _run(code, env={"TORCH_TRANSFER_TO_NPU": "1"}, prelude=prelude)
    assert "LOADED True" in out
    assert "CUDA True npu:0 True" in out

    off = _run('import sys\nprint("LOADED", "torch_npu.contrib.transfer_to_npu" in sys.modules, '
               'torch.cuda.is_available())', env={"TORCH_TRANSFER_TO_NPU": "0"})
    assert "LOADED False False" in off

    bad = run_python("import torch_npu", env={"TORCH_TRANSFER_TO_NPU": "yes"})
    assert bad.returncode != 0
    assert "TORCH_TRANSFER_TO_NPU" in bad.stderr


def test_environment_variable_with_torch_autoload(tmp_path):
    # ``import torch`` alone loads torch_npu through the torch.backends entry point.
    dist = tmp_path / "torch_npu_transfer_check-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch-npu-transfer-check\n"
                                   "Version: 0.0\n")
    (dist / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = torch_npu:_autoload\n")
    code = textwrap.dedent("""
        import warnings
        warnings.simplefilter("ignore", UserWarning)
        import torch
        print("CUDA", torch.cuda.is_available(), torch.randn(2, device="cuda").device)
    """)
    env = {"PYTHONPATH": str(tmp_path), "TORCH_DEVICE_BACKEND_AUTOLOAD": "1",
           "TORCH_TRANSFER_TO_NPU": "1"}
    result = run_python(code, env=env)
    assert result.returncode == 0, result.stderr
    assert "CUDA True npu:0" in result.stdout


def test_warns_once_and_is_idempotent():
    out = _run("""
        import importlib
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from torch_npu.contrib import transfer_to_npu
            import torch_npu.contrib.transfer_to_npu
            importlib.reload(transfer_to_npu)
            transfer_to_npu._apply()
        ours = [w for w in caught if "transfer_to_npu" in str(w.message)]
        print("WARNINGS", len(ours), ours[0].filename.endswith("<string>"))
        print("WRAPPED_ONCE", not hasattr(torch.zeros.__wrapped__, "__wrapped__"),
              not hasattr(torch.Tensor.to.__wrapped__, "__wrapped__"),
              not hasattr(torch.cuda.set_device.__wrapped__, "__wrapped__"),
              torch.Generator.__mro__[1] is torch._C.Generator)
        print("WORKS", torch.zeros(1, device="cuda").device, torch.Generator("cuda").device)
    """)
    assert "WARNINGS 1 True" in out
    assert "WRAPPED_ONCE True True True True" in out
    assert "WORKS npu:0 npu:0" in out

    quiet = _run("""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from torch_npu.contrib import transfer_to_npu
        print("WARNINGS", len([w for w in caught if "transfer_to_npu" in str(w.message)]))
    """, env={"RANK": "1"})
    assert "WARNINGS 0" in quiet


def test_distributed_nccl_becomes_hccl():
    out = _run("""
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d
        from torch.nn.parallel import DistributedDataParallel
        from torch.distributed.device_mesh import DeviceMesh

        calls = []

        def recorder(name):
            def record(*args, **kwargs):
                calls.append((name, args, kwargs))
            return record

        # Stand-ins for the functions the backend name reaches.
        dist.init_process_group = c10d.init_process_group = recorder("init")
        c10d._new_group_with_tag = recorder("group")
        DistributedDataParallel.__init__ = lambda self, *a, **k: calls.append(("ddp", a[1:], k))
        DeviceMesh.__init__ = lambda self, *a, **k: calls.append(("mesh", a, k))

        from torch_npu.contrib import transfer_to_npu

        dist.init_process_group(backend="nccl", init_method="file:///tmp/cuda_nccl",
                                device_id=torch.device("cuda", 1))
        dist.init_process_group("nccl", "env://")
        dist.init_process_group(backend="cpu:gloo,cuda:nccl")
        dist.init_process_group(backend="gloo")
        dist.new_group([0], backend="nccl")
        c10d.new_group([0], None, "NCCL")
        DistributedDataParallel(torch.nn.Linear(1, 1), device_ids=["cuda:1"],
                                output_device=torch.device("cuda", 1))
        DistributedDataParallel(torch.nn.Linear(1, 1), [torch.device("cuda", 2)])
        DistributedDataParallel(torch.nn.Linear(1, 1), device_ids=[3])
        DeviceMesh("cuda", [0])
        for name, args, kwargs in calls:
            shown = {k: v for k, v in kwargs.items()
                     if k in ("backend", "device_id", "device_ids", "output_device")}
            print("CALL", name, args, shown)
        print("NCCL_AVAILABLE", dist.is_nccl_available() == ("hccl" in dist.Backend.backend_list))
    """)
    assert ("CALL init () {'backend': 'hccl', 'device_id': device(type='npu', index=1)}"
            in out), out
    assert "CALL init ('hccl', 'env://') {}" in out
    assert "CALL init () {'backend': 'cpu:gloo,npu:hccl'}" in out
    assert "CALL init () {'backend': 'gloo'}" in out
    assert out.count("CALL group ([0], None, 'hccl', None, None)") == 2, out
    assert ("CALL ddp () {'device_ids': ['npu:1'], 'output_device': device(type='npu', index=1)}"
            in out), out
    assert "CALL ddp ([device(type='npu', index=2)],) {}" in out
    assert "CALL ddp () {'device_ids': [3]}" in out
    assert "CALL mesh ('npu', [0]) {}" in out
    assert "NCCL_AVAILABLE True" in out


def test_distributed_process_group_and_default_backends():
    out = _run("""
        import os
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d
        from torch_npu.contrib import transfer_to_npu

        hccl = torch_npu._C._distributed_c10d.ProcessGroupHCCL
        print("PG_CLASS", dist.ProcessGroupNCCL is hccl, c10d.ProcessGroupNCCL is hccl,
              type(dist.ProcessGroupNCCL.Options()).__name__)
        print("DEFAULTS", "cuda" in dist.Backend.default_device_backend_map,
              dist.get_default_backend_for_device("cuda"),
              dist.get_default_backend_for_device(torch.device("cuda", 0)))
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29000 + os.getpid() % 1000))
        dist.init_process_group("nccl", rank=0, world_size=1)
        backend = dist.group.WORLD._get_backend(torch.device("cuda"))
        x = torch.ones(2, device="cuda")
        dist.all_reduce(x)
        print("PG", dist.get_backend(), type(backend) is hccl, x.device)
        dist.destroy_process_group()
    """)
    assert "PG_CLASS True True Options" in out
    assert "DEFAULTS False hccl hccl" in out
    assert "PG hccl True npu:0" in out


def test_amp_modules_memory_history_profiler_and_extensions():
    out = _run("""
        import logging
        import torch.utils.cpp_extension as cpp_extension
        from torch.profiler import ProfilerActivity
        from torch_npu.contrib import transfer_to_npu

        amp = torch.npu.amp
        print("AMP_MODULES", torch.cuda.amp.autocast_mode is amp.autocast_mode,
              torch.cuda.amp.common is amp.common, torch.cuda.amp.grad_scaler is amp.grad_scaler)
        print("HOST_CACHE", torch._C._host_emptyCache is torch_npu._C._npu_hostEmptyCache)

        torch.cuda.memory._record_memory_history(device="cuda:0")
        x = torch.ones(1024, device="cuda")
        snapshot = torch.cuda.memory._snapshot(device=torch.device("cuda", 0))
        torch.cuda.memory._record_memory_history(enabled=None)
        print("HISTORY", any(t["action"] == "alloc" for t in snapshot["device_traces"][0]))

        records = []
        handler = logging.Handler()
        handler.emit = records.append
        logging.getLogger().addHandler(handler)
        config = torch._C._profiler._ExperimentalConfig()
        with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                                    experimental_config=config) as prof:
            (x * 2).sum().item()
        print("PROFILER", type(prof) is torch_npu.profiler.profile,
              isinstance(prof, torch.profiler.profile), prof._npu, prof._cpu,
              len(records) == 1 and "experimental_config" in records[0].getMessage())
        print("SCHEDULE", torch.profiler.schedule is torch_npu.profiler.schedule,
              torch.profiler.tensorboard_trace_handler is torch_npu.profiler.tensorboard_trace_handler)
        print("INCLUDES", cpp_extension.include_paths(device_type="cuda")
              == cpp_extension.include_paths(device_type="npu"))
    """)
    assert "AMP_MODULES True True True" in out
    assert "HOST_CACHE True" in out
    assert "HISTORY True" in out
    assert "PROFILER True True True True True" in out
    assert "SCHEDULE True True" in out
    assert "INCLUDES True" in out


def test_library_functions_see_cuda_unavailable(tmp_path):
    # A stand-in library, installed (dist-info) at version 2.0.
    (tmp_path / "fakelib.py").write_text(
        "import torch\n"
        "def probe():\n    return torch.cuda.is_available()\n"
        "def failing():\n    raise RuntimeError(torch.cuda.is_available())\n"
        "class Tool:\n    def probe(self):\n        return torch.cuda.is_available()\n")
    dist = tmp_path / "fakelib-2.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fakelib\nVersion: 2.0\n")
    out = _run("""
        import fakelib
        from torch_npu.contrib import transfer_to_npu as t

        config = t._load_json_file(t._CONFIG_PATH)
        print("SHIPPED", sorted(config), config["transformers"]["apis"][
            "transformers.utils.import_utils.is_torch_cuda_available"])
        t._do_wrapper_libraries_func({"fakelib": {"version": "3.0", "apis": {"fakelib.probe": "function"}}})
        print("TOO_OLD", fakelib.probe())
        t._do_wrapper_libraries_func({"fakelib": {"version": "1.5", "apis": {
            "fakelib.probe": "function", "fakelib.failing": "function",
            "fakelib.Tool.probe": "method", "fakelib.missing": "function",
            "nolib.probe": "function"}}, "notinstalled": {"version": "0", "apis": {}}})
        try:
            fakelib.failing()
        except RuntimeError as e:
            raised = str(e)
        print("WRAPPED", fakelib.probe(), fakelib.Tool().probe(), raised, torch.cuda.is_available())
    """, env={"PYTHONPATH": str(tmp_path)})
    assert "SHIPPED ['accelerate', 'peft', 'transformers', 'trl'] function" in out
    assert "TOO_OLD True" in out
    assert "WRAPPED False False False True" in out


def test_config_file_checks_and_helpers(tmp_path):
    out = _run(f"""
        import os
        from torch_npu.contrib import transfer_to_npu as t

        folder = {str(tmp_path)!r}
        good, link, bad, listed = (os.path.join(folder, n) for n in ("a.json", "l.json", "b.json", "c.json"))
        with open(good, "w") as f:
            f.write('{{"k": 1}}')
        os.symlink(good, link)
        with open(bad, "w") as f:
            f.write("not json")
        with open(listed, "w") as f:
            f.write("[1, 2]")
        print("VALID", t._check_input_file_valid(good), t._check_input_file_valid(link),
              t._check_input_file_valid(folder + "/missing.json"))
        print("LOADED", t._load_json_file(good), t._load_json_file(link), t._load_json_file(bad),
              t._load_json_file(listed))
        print("DICT", t._replace_cuda_to_npu_in_dict({{"cuda:0": "cuda:1", 3: torch.device("cuda")}}))

        @t._wrapper_cuda
        def devices(*args, **kwargs):
            return args, kwargs
        print("CUDA_WRAPPER", devices("cuda:1", 2, device_ids=("cuda:0", 1)))

        @t._wrapper_hccl
        def backend(*args, **kwargs):
            return args, kwargs
        print("HCCL_WRAPPER", backend("nccl", "tcp://cuda:1", backend="cuda:nccl"))
    """)
    assert "VALID True False False" in out
    assert "LOADED {'k': 1} {} {} {}" in out
    assert "DICT {'npu:0': 'npu:1', 3: device(type='cuda')}" in out
    assert "CUDA_WRAPPER (('npu:1', 2), {'device_ids': ('npu:0', 1)})" in out
    assert "HCCL_WRAPPER (('hccl', 'tcp://cuda:1'), {'backend': 'npu:hccl'})" in out


def test_cuda_graphs_mapped_only_if_npu_has_them():
    out = _run("""
        stock = {name: getattr(torch.cuda, name) for name in
                 ("CUDAGraph", "graph", "make_graphed_callables")}
        from torch_npu.contrib import transfer_to_npu
        for cuda_name, npu_name in (("CUDAGraph", "NPUGraph"), ("graph", "graph"),
                                    ("make_graphed_callables", "make_graphed_callables")):
            expected = getattr(torch.npu, npu_name, stock[cuda_name])
            print(cuda_name, getattr(torch.cuda, cuda_name) is expected)
    """)
    assert "CUDAGraph True" in out
    assert "graph True" in out
    assert "make_graphed_callables True" in out


def test_cpu_code_unaffected(tmp_path):
    out = _run(f"""
        import torch.nn as nn

        def train():
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
            opt = torch.optim.AdamW(model.parameters(), lr=0.1)
            data = torch.utils.data.DataLoader(
                torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 2)),
                batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1))
            for x, y in data:
                opt.zero_grad()
                nn.functional.mse_loss(model(x.to("cpu")), y).backward()
                opt.step()
            return model

        before = train()
        from torch_npu.contrib import transfer_to_npu
        after = train()
        same = all(torch.equal(a, b) for a, b in zip(before.parameters(), after.parameters()))
        print("TRAIN", same, {{p.device.type for p in after.parameters()}},
              any(p.is_cuda for p in after.parameters()))
        x = torch.randn(2, 2)
        print("TENSORS", torch.zeros(2).device, torch.zeros(2, device="cpu").device,
              x.to(torch.float64).device, x.to("cpu", torch.float64).dtype,
              x.new_zeros(1).device, after.to(torch.float64)[0].weight.dtype,
              torch.device("cuda").type)
        gen = torch.Generator()
        gen.manual_seed(0)
        print("GENERATOR", gen.device, type(gen) is torch._C.Generator,
              torch.randn(2, generator=gen).device)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            print("AUTOCAST", (x @ x).dtype, torch.is_autocast_enabled("cpu"))
        scaler = torch.amp.GradScaler("cpu")
        print("SCALER", scaler._device)
        path = {str(tmp_path)!r} + "/cuda"
        torch.save({{"x": x}}, path)
        loaded = torch.load(path)["x"]
        print("LOAD", loaded.device, torch.equal(loaded, x))
    """)
    assert "TRAIN True {'cpu'} False" in out
    assert "TENSORS cpu cpu cpu torch.float64 cpu torch.float64 cuda" in out
    assert "GENERATOR cpu True cpu" in out
    assert "AUTOCAST torch.bfloat16 True" in out
    assert "SCALER cpu" in out
    assert "LOAD cpu True" in out


def test_this_process_is_untouched():
    # The tests above patched torch in their own interpreters only.
    assert "torch_npu.contrib.transfer_to_npu" not in sys.modules
    assert not torch.ones(1, device="npu").is_cuda
    assert torch.Generator is torch._C.Generator


def test_transfer_to_npu_profiler_kernel_device():
    code = textwrap.dedent("""
        import warnings
        warnings.simplefilter("ignore")
        import torch, torch_npu
        from torch_npu.contrib import transfer_to_npu
        from torch.autograd.profiler_util import Kernel
        assert Kernel("model_inference", "cuda", 11).device == "npu"
        assert Kernel(name="k", device="cuda:1", duration=2) == ("k", "npu:1", 2)
        assert Kernel("k", "cpu", 3).device == "cpu"
        print("OK")
    """)
    result = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout
