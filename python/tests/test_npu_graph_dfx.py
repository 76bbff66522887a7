"""torch.ops.npu.print_npugraph_tensor / save_npugraph_tensor: a tensor's values printed or
saved from inside NPU graphs (at each replay), eagerly and under torch.compile; the host
tensor specs of torch.npu._launch_host_func_pending."""
import importlib
import threading

import pytest
import torch

import torch_npu
import torch_npu.npu.graphs as graphs


def _captured(fn):
    """An NPUGraph holding what fn() launches."""
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        fn()
    return g


def test_exported_as_torch_npu_functions():
    assert torch_npu.print_npugraph_tensor is torch.ops.npu.print_npugraph_tensor
    assert torch_npu.save_npugraph_tensor is torch.ops.npu.save_npugraph_tensor
    # not a second copy of the module (and of its operators)
    assert importlib.import_module("torch.npu.graphs") is graphs


def test_print_captured_shows_values_of_each_replay(capsys):
    x = torch.arange(6, dtype=torch.float32, device="npu").reshape(2, 3)

    def body():
        y = x * 2
        torch_npu.print_npugraph_tensor(y, tensor_name="y")
        torch.ops.npu.print_npugraph_tensor(y.t())
    g = _captured(body)
    torch.npu.synchronize()
    assert capsys.readouterr().out == ""  # nothing runs during the capture
    for _ in range(2):
        g.replay()
        x.add_(1)
    torch.npu.synchronize()  # the stream waits for the print: it is done now
    lines = capsys.readouterr().out
    first = torch.arange(6.).reshape(2, 3) * 2
    assert lines == (f"y={first}, shape=(2, 3), dtype=torch.float32\n"
                     f"{first.t()}, shape=(3, 2), dtype=torch.float32\n"
                     f"y={first + 2}, shape=(2, 3), dtype=torch.float32\n"
                     f"{(first + 2).t()}, shape=(3, 2), dtype=torch.float32\n")


def test_print_eager_npu_and_cpu(capsys):
    torch_npu.print_npugraph_tensor(torch.tensor(True), tensor_name="flag")  # cpu: printed now
    assert capsys.readouterr().out == "flag=True, shape=(), dtype=torch.bool\n"
    x = torch.tensor([[1, 2], [3, 4]], dtype=torch.bfloat16, device="npu", requires_grad=True)
    torch_npu.print_npugraph_tensor(x * 1, tensor_name="x")  # values, no grad_fn
    torch_npu.print_npugraph_tensor(torch.empty(0, 2, device="npu"))
    torch.npu.synchronize()
    assert capsys.readouterr().out.splitlines() == [
        "x=tensor([[1., 2.],",
        "        [3., 4.]], dtype=torch.bfloat16), shape=(2, 2), dtype=torch.bfloat16",
        "tensor([], size=(0, 2)), shape=(0, 2), dtype=torch.float32"]


def test_save_captured_names_and_values(tmp_path):
    x = torch.arange(6, dtype=torch.float32, device="npu").reshape(2, 3)
    path = str(tmp_path / "t.pt")
    g1 = _captured(lambda: torch_npu.save_npugraph_tensor(x, save_path=path))
    g2 = _captured(lambda: torch_npu.save_npugraph_tensor(x + 10, save_path=path))
    g3 = _captured(lambda: torch_npu.save_npugraph_tensor(x * 2, save_path=path, overwrite=True))
    assert list(tmp_path.iterdir()) == []  # files are written by the replays
    g1.replay()
    g2.replay()
    g3.replay()
    torch.npu.synchronize()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t_device_0.pt", "t_device_0_0.pt", "t_device_0_1.pt"]
    assert torch.equal(torch.load(tmp_path / "t_device_0_0.pt"), x.cpu())
    assert torch.equal(torch.load(tmp_path / "t_device_0_1.pt"), x.cpu() + 10)
    x.fill_(-1)
    g1.replay()  # a captured call keeps its file: the replay rewrites it with the new values
    g3.replay()
    torch.npu.synchronize()
    assert torch.equal(torch.load(tmp_path / "t_device_0_0.pt"), torch.full((2, 3), -1.))
    assert torch.equal(torch.load(tmp_path / "t_device_0.pt"), torch.full((2, 3), -2.))


def test_save_tensor_list_default_path_and_cpu(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    x = torch.arange(4, dtype=torch.int32, device="npu")
    y = torch.ones(2, 2, dtype=torch.float16, device="npu")
    torch_npu.save_npugraph_tensor([x, y[:, 0]], save_path=str(tmp_path / "list"))  # ".pt" added
    torch_npu.save_npugraph_tensor(y)  # tensor_<timestamp>_device_0_0.pt in the working directory
    torch_npu.save_npugraph_tensor(torch.ones(3), save_path="cpu.bin", overwrite=True)  # cpu: no device
    torch.npu.synchronize()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[:2] == ["cpu.bin", "list_device_0_0.pt"]
    assert len(names) == 3 and names[2].startswith("tensor_") and names[2].endswith("_device_0_0.pt")
    saved = torch.load(tmp_path / "list_device_0_0.pt")
    assert isinstance(saved, list) and torch.equal(saved[0], x.cpu()) and torch.equal(saved[1], y[:, 0].cpu())
    assert torch.equal(torch.load(tmp_path / names[2]), y.cpu())
    assert torch.equal(torch.load(tmp_path / "cpu.bin"), torch.ones(3))


def test_save_bad_arguments(tmp_path):
    x = torch.ones(2, device="npu")
    with pytest.raises(ValueError, match="save_path must end with a file name"):
        torch_npu.save_npugraph_tensor(x, save_path=str(tmp_path) + "/")
    with pytest.raises(ValueError, match="directory of save_path does not exist"):
        torch_npu.save_npugraph_tensor(x, save_path=str(tmp_path / "missing" / "t.pt"))
    with pytest.raises(ValueError, match="tensors of input must be on one device"):
        torch_npu.save_npugraph_tensor([x, x.cpu()], save_path=str(tmp_path / "t.pt"))
    with pytest.raises(NotImplementedError, match="empty list of Tensors"):
        torch_npu.save_npugraph_tensor([])
    with pytest.raises(RuntimeError, match="tensor_name"):
        torch_npu.print_npugraph_tensor(x, tensor_name=1)
    assert list(tmp_path.iterdir()) == []


def test_fake_kernels_and_torch_compile(capsys, reset_dynamo):
    assert torch.ops.npu.print_npugraph_tensor(torch.empty(2, device="meta")) is None
    assert torch.ops.npu.save_npugraph_tensor(torch.empty(2, device="meta")) is None

    def fn(a):
        b = a + 1
        torch_npu.print_npugraph_tensor(b, tensor_name="b")  # no output, kept in the graph
        return b * 2
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    out = compiled(torch.zeros(3, device="npu"))
    torch.npu.synchronize()
    assert torch.equal(out.cpu(), torch.full((3,), 2.))
    assert capsys.readouterr().out == "b=tensor([1., 1., 1.]), shape=(3,), dtype=torch.float32\n"


def test_tensor_specs():
    t = torch.arange(6, dtype=torch.int16).reshape(3, 2)
    spec = graphs._make_npugraph_tensor_ptr_spec(t)
    assert spec == (graphs._NPUGRAPH_TENSOR_PTR_SPEC_MARKER, t.data_ptr(), 12, (3, 2), torch.int16)
    copied = graphs._copy_npugraph_tensor_ptr_specs(("name", [spec], 3))
    t.fill_(7)  # the copy has the bytes as they were
    name, [buffer_spec], three = copied
    assert (name, three) == ("name", 3) and buffer_spec[0] == graphs._NPUGRAPH_TENSOR_BUFFER_SPEC_MARKER
    [value] = graphs._materialize_npugraph_tensor_arg([buffer_spec])
    assert torch.equal(value, torch.arange(6, dtype=torch.int16).reshape(3, 2))
    empty = graphs._copy_npugraph_tensor_ptr_specs(graphs._make_npugraph_tensor_ptr_spec(torch.empty(0, 4)))
    assert graphs._materialize_npugraph_tensor_arg(empty).shape == (0, 4)
    assert graphs._materialize_npugraph_tensor_arg("other") == "other"


def test_launch_host_func_pending_copies_ptr_specs_in_stream_order():
    """The bytes a ptr spec names are copied when the stream reaches the call, so a pending
    call sees each replay's values although the next replay overwrites the host memory."""
    x = torch.zeros(3, device="npu")
    seen, done = [], threading.Event()

    def record(data):
        tag, [value] = data
        seen.append((tag, graphs._materialize_npugraph_tensor_arg(value)))
        if len(seen) == 3:
            done.set()

    def body():
        host = (x + 1).to("cpu", non_blocking=True)
        body.host = host  # keeps the pinned memory alive with the graph
        torch.npu._launch_host_func_pending(torch.npu.current_stream(), record,
                                            ("x+1", [graphs._make_npugraph_tensor_ptr_spec(host)]))
    g = _captured(body)
    for _ in range(3):
        g.replay()
        x.add_(1)
    assert done.wait(10)
    assert [tag for tag, _ in seen] == ["x+1"] * 3
    assert [v.tolist() for _, v in seen] == [[1.] * 3, [2.] * 3, [3.] * 3]
