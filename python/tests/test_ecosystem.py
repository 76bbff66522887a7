"""Hugging Face accelerate and peft on npu, unchanged: their npu paths are keyed on torch_npu.

accelerate picks the npu when torch_npu imports (``Accelerator().device``), runs bf16 mixed
precision through ``torch.autocast("npu")`` and launches several processes over hccl
(``accelerate launch --multi_gpu``, MULTI_NPU); peft's LoRA trains a LLaMA on npu as on the
CPU. DeepSpeed is tested with the LLaMA example (test_llama_finetune.py).
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_npu  # noqa: F401
from conftest import subprocess_env


def _env():
    return subprocess_env({"OMP_NUM_THREADS": "1"})


ACCELERATE_SCRIPT = textwrap.dedent("""
    import json, sys, torch
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    acc = Accelerator(mixed_precision=sys.argv[1])
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 16, generator=g)
    data = torch.utils.data.TensorDataset(x, x @ torch.randn(16, 4, generator=g) / 4)  # a target it can learn
    loader = torch.utils.data.DataLoader(data, batch_size=8 // acc.num_processes)  # global batch 8
    losses, dtypes = [], set()
    # what the first Linear computes in (accelerate hands the model's outputs back in fp32)
    model[0].register_forward_hook(lambda mod, inp, out: dtypes.add(str(out.dtype)))
    model, opt, loader = acc.prepare(model, opt, loader)
    for x, y in [batch for epoch in range(3) for batch in loader]:
        with acc.autocast():
            out = model(x)
            loss = torch.nn.functional.mse_loss(out, y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(acc.gather(loss.detach()).mean().item())
    backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else None
    acc.print("RESULT " + json.dumps({"device": str(acc.device), "type": str(acc.distributed_type),
                                      "processes": acc.num_processes, "backend": backend,
                                      "param_device": str(next(model.parameters()).device),
                                      "dtypes": sorted(dtypes), "losses": losses}))
""")


def _accelerate(tmp_path, *launch, precision="no"):
    pytest.importorskip("accelerate", reason="tools/venv.py installs accelerate")
    script = tmp_path / "train.py"
    script.write_text(ACCELERATE_SCRIPT)
    cmd = [sys.executable, str(script), precision]
    if launch:
        cmd = [sys.executable, "-m", "accelerate.commands.launch", *launch, str(script), precision]
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def test_accelerate_single_process_uses_the_npu(tmp_path):
    one = _accelerate(tmp_path)
    assert one["device"] in ("npu", "npu:0") and one["param_device"] == "npu:0"
    assert one["type"] == "DistributedType.NO" and one["dtypes"] == ["torch.float32"]
    assert len(one["losses"]) == 24 and sum(one["losses"][-4:]) < sum(one["losses"][:4]) / 2
    # bf16 mixed precision: the Linear layers run in bf16 under torch.autocast("npu")
    bf16 = _accelerate(tmp_path, precision="bf16")
    assert bf16["dtypes"] == ["torch.bfloat16"]
    assert bf16["losses"] != one["losses"]
    assert max(abs(a - b) for a, b in zip(bf16["losses"], one["losses"])) < 2e-2


def test_accelerate_launch_two_processes_over_hccl_matches_one(tmp_path):
    one = _accelerate(tmp_path)
    two = _accelerate(tmp_path, "--num_processes", "2", "--multi_gpu", "--main_process_port", "0")
    assert two["type"] == "DistributedType.MULTI_NPU" and two["processes"] == 2
    assert two["backend"] == "hccl" and two["param_device"] == "npu:0"
    assert all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(two["losses"], one["losses"])), \
        (two["losses"], one["losses"])


@pytest.mark.parametrize("script", ["test_script", "test_ops", "test_sync", "test_merge_weights",
                                    "test_distributed_data_loop"])
def test_accelerates_own_test_scripts_on_two_npus(script):
    # accelerate ships its multi-process test scripts (`accelerate test` runs test_script.py);
    # they run here as on two accelerators, over hccl.
    pytest.importorskip("accelerate", reason="tools/venv.py installs accelerate")
    if script == "test_distributed_data_loop":
        pytest.importorskip("torchdata", reason="its StatefulDataLoader cases need torchdata")
    import accelerate

    path = os.path.join(os.path.dirname(accelerate.__file__), "test_utils", "scripts", script + ".py")
    p = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--multi_gpu",
                        "--main_process_port", "0", path], env=_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]


def _lora_llama(device):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                                 target_modules=["q_proj", "v_proj"]))
    for name, p in model.named_parameters():  # peft initialises B to zero: start from a non-trivial adapter
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)
    return model.to(device)


def _lora_train(device, steps=4):
    model = _lora_llama(device)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 97, (steps, 2, 16), generator=g)
    losses = []
    for step in range(steps):
        batch = ids[step].to(device)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return model, losses


def test_peft_lora_trains_a_llama_on_npu_as_on_cpu():
    pytest.importorskip("peft", reason="tools/venv.py installs peft")
    model, npu_losses = _lora_train("npu")
    _, cpu_losses = _lora_train("cpu")
    assert max(abs(a - b) for a, b in zip(npu_losses, cpu_losses)) < 1e-5, (npu_losses, cpu_losses)
    assert npu_losses[-1] < npu_losses[0]
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert all(p.device.type == "npu" for p in model.parameters())
    # merging the adapters into the weights keeps the function
    ids = torch.randint(3, 97, (1, 16), device="npu")
    with torch.no_grad():
        before = model(input_ids=ids).logits
        merged = model.merge_and_unload()
        after = merged(input_ids=ids).logits
    assert not any("lora_" in n for n, _ in merged.named_parameters())
    torch.testing.assert_close(after.cpu(), before.cpu(), atol=1e-5, rtol=1e-5)
