"""NPU graph replay vs eager on npu: steps of about 200 small ops.

Both sides run on npu with the same data: ``eager`` launches the ops from Python (each a
dispatcher call, shape inference, autograd bookkeeping and a kernel launch); ``graph``
replays them, captured once into a ``torch.npu.NPUGraph``, with a single launch.

* ``graph_train``: a training step (forward, backward, SGD with momentum) of a 12-layer
  MLP of width 32, batch 8: 195 recorded kernels. Target: replay >= 5x faster (ratio
  graph/eager <= 0.2).
* ``graph_step``: 200 elementwise ops on 256-element tensors, no autograd. What a replay
  saves here is only the Python and dispatch cost per op: the replayed kernels still pay
  ATen's TensorIterator setup (about 1 us each) on the stream's worker.
"""
import copy

import torch

from cases import Case

NUMEL = 256
ROUNDS = 50  # 4 ops each


def _step(z, a, b, c):
    for _ in range(ROUNDS):
        z = z * a
        z = z + b
        z = torch.tanh(z)
        z = z - c
    return z


def _build_step(side: str):
    g = torch.Generator().manual_seed(0)
    z, a, b, c = (torch.randn(NUMEL, generator=g).npu() for _ in range(4))
    sync = torch.npu.synchronize
    if side == "eager":
        def run(n: int) -> None:
            for _ in range(n):
                _step(z, a, b, c)
            sync()
        return run
    stream = torch.npu.Stream()
    stream.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(stream):
        _step(z, a, b, c)  # warm up
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph, stream=stream):
        out = _step(z, a, b, c)
    assert graph._num_tasks() == 4 * ROUNDS, graph._num_tasks()
    graph.replay()
    torch.testing.assert_close(out.cpu(), _step(z, a, b, c).cpu())

    def run(n: int) -> None:
        for _ in range(n):
            graph.replay()
        sync()
    run.keep = (graph, out)  # the graph lives as long as the case
    return run


LAYERS = 12


def _build_train(side: str):
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(32, 32), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers).npu()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 32, generator=g).npu()
    t = torch.randn(8, 32, generator=g).npu()
    sync = torch.npu.synchronize

    def step():
        opt.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(model(x), t)
        loss.backward()
        opt.step()
        return loss

    stream = torch.npu.Stream()
    stream.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(stream):
        for _ in range(3):  # warm up: gradients and momentum buffers exist before a capture
            step()
    torch.npu.current_stream().wait_stream(stream)
    if side == "eager":
        def run(n: int) -> None:
            for _ in range(n):
                step()
            sync()
        return run
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph, stream=stream):
        loss = step()
    assert graph._num_tasks() >= 190, graph._num_tasks()
    # the replay trains like eager steps do
    twin = copy.deepcopy(model)
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.01, momentum=0.9)
    twin_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # its own momentum buffers
    graph.replay()
    twin_opt.zero_grad(set_to_none=False)
    torch.nn.functional.mse_loss(twin(x), t).backward()
    twin_opt.step()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p.cpu(), q.cpu(), rtol=1e-5, atol=1e-6)

    def run(n: int) -> None:
        for _ in range(n):
            graph.replay()
        sync()
    run.keep = (graph, loss)
    return run


CASES = [
    Case("graph_train", "NPU graph replay of a ~200-op training step (graph/eager)", target=0.2, n=20,
         repeats=7, warmup=3, build=_build_train, sides=("eager", "graph"), unit="ms",
         note="forward, backward and SGD step of a 12-layer MLP (width 32, batch 8), 195 kernels: eager "
              "launches each from Python through autograd, the graph replays them with one launch."),
    Case("graph_step", "NPU graph replay of 200 elementwise ops (graph/eager)", target=0.35, n=50, repeats=7,
         warmup=5, build=_build_step, sides=("eager", "graph"),
         note="200 elementwise ops on 256-element tensors, no autograd: the replay saves the Python and "
              "dispatch cost per op, the kernels still set up ATen's TensorIterator (~1 us each)."),
]
