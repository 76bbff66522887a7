"""FSDP2 (fully_shard) on npu over hccl, through torch_npu.testing._internal.common_fsdp's
FSDPNPUTest (torch's FSDPTest with npu devices, as torch_npu's): a training step of a sharded
model equals the same step on one device."""
import copy

import torch
import torch.distributed as dist
from torch.testing._internal.common_utils import run_tests

import torch_npu  # noqa: F401
from torch_npu.testing._internal.common_fsdp import FSDPNPUTest


class TestFullyShardOnNpu(FSDPNPUTest):
    @property
    def world_size(self):
        return 2

    def test_helpers_point_at_npu(self):
        import torch.testing._internal.common_fsdp as common_fsdp

        self.assertEqual((common_fsdp.DEVICE_TYPE, common_fsdp.DISTRIBUTED_BACKEND), ("npu", "hccl"))
        self.assertEqual(torch.npu.current_device(), self.rank)
        self.assertEqual(dist.get_backend(), "hccl")

    def test_sharded_steps_match_one_device(self):
        from torch.distributed.fsdp import fully_shard

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).npu()
        ref = copy.deepcopy(model)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref))
        x = torch.randn(4, 16, device="npu")  # the same batch on every rank: averaged grads equal one's
        for _ in range(3):
            loss, ref_loss = model(x).square().sum(), ref(x).square().sum()
            loss.backward()
            ref_loss.backward()
            opt.step()
            ref_opt.step()
            opt.zero_grad()
            ref_opt.zero_grad()
            self.assertEqual(loss, ref_loss)
        for p, r in zip(model.parameters(), ref.parameters()):
            self.assertEqual(p.full_tensor(), r)


if __name__ == "__main__":
    run_tests()
