"""npu tensors through torch.multiprocessing (queues, pipes, process arguments): see reductions."""
from torch_npu.multiprocessing import reductions  # noqa: F401
