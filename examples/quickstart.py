"""Quick start on the simulated Ascend 910B (`nox -s quickstart`, ci/quickstart.sh).

1. the minimal check (x @ y on npu), 2. a small transformer language model trained on
npu:0 with AdamW under mixed precision (torch_npu.npu.amp's GradScaler and autocast).
Prints the loss every few steps; it decreases.
"""
import torch
import torch_npu  # noqa: F401  (registers the npu device)
from torch_npu.npu.amp import GradScaler, autocast

# 1. the minimal check
x = torch.randn(2, 2).npu()
y = torch.randn(2, 2).npu()
print(x @ y)
print(f"torch_npu {torch_npu.__version__}, CANN {torch_npu.utils.get_cann_version()}, "
      f"{torch.npu.device_count()} x {torch.npu.get_device_name(0)}")


class TinyLM(torch.nn.Module):
    def __init__(self, vocab=64, d=128, heads=4, layers=2, seq=32):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.zeros(seq, d))
        layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers)
        self.head = torch.nn.Linear(d, vocab)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(seq))

    def forward(self, tokens):
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        h = self.encoder(h, mask=self.mask[: tokens.shape[1], : tokens.shape[1]], is_causal=True)
        return self.head(h)


def batches(steps, batch=16, seq=32, vocab=64):
    # A learnable toy language: each sequence counts upward modulo vocab.
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        start = torch.randint(0, vocab, (batch, 1), generator=g)
        seqs = (start + torch.arange(seq + 1)) % vocab
        yield seqs[:, :-1], seqs[:, 1:]


def main(steps=60):
    """2. train TinyLM on npu:0 with AdamW under autocast + GradScaler; fail unless the loss falls."""
    torch.npu.manual_seed(0)
    device = torch.device("npu:0")
    model = TinyLM().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    scaler = GradScaler()
    losses = []
    for step, (data, target) in enumerate(batches(steps)):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            output = model(data)
            loss = loss_fn(output.float().flatten(0, 1), target.flatten())
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
        if step % 10 == 0 or step == steps - 1:
            print(f"step {step:3d}  loss {losses[-1]:.4f}")
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print(f"mean loss of the first 5 steps {first:.3f} -> last 5 steps {last:.3f}")
    print(f"npu memory allocated {torch.npu.memory_allocated() / 2**20:.1f} MiB, "
          f"reserved {torch.npu.memory_reserved() / 2**20:.1f} MiB")
    if not last < first:
        raise SystemExit("loss did not decrease")


if __name__ == "__main__":
    main()
