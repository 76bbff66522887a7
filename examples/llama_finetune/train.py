"""Fine-tune a LLaMA-2 model (transformers' LlamaForCausalLM) on npu, end to end.

    python examples/llama_finetune/train.py                       # tiny LLaMA, npu:0, 20 steps
    torchrun --nproc_per_node=2 examples/llama_finetune/train.py  # DDP over hccl, one device per rank
    torchrun --nproc_per_node=2 examples/llama_finetune/train.py --parallel zero2   # DeepSpeed ZeRO-2
    python examples/llama_finetune/train.py --device cpu          # the same run on the CPU (gloo)
    python examples/llama_finetune/train.py --size 7b             # LLaMA-2 7B's shape: runs or says what it needs

Nothing is downloaded: the model is built from a LlamaConfig (random weights, seeded) and
the training text is generated and tokenized here (byte-level tokenizer). Options: DDP, FSDP2
or DeepSpeed ZeRO stage 1-3 (``--parallel``), bf16 autocast (``--bf16``), ``torch.optim.AdamW`` or
``torch_npu.optim.NpuFusedAdamW`` (``--optim``), transformers' linear warm-up schedule,
gradient accumulation, checkpoints (``--save``/``--resume``), torch_npu's profiler around
two steps (``--profile``), a loss curve PNG (``--plot``) and the losses as JSON (``--losses``).
See README.md next to this file.
"""
import argparse
import contextlib
import json
import math
import os
import random
import struct
import sys
import time
import zlib

import torch
import torch.distributed as dist

# ---------------------------------------------------------------- data: text and tokenizer

NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def make_corpus(n_sentences, seed=0):
    """Deterministic English-like training text: small sums written out in words."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_sentences):
        a, b = rng.randrange(10), rng.randrange(10)
        form = rng.randrange(3)
        if form == 0:
            lines.append(f"{NUMBERS[a]} plus {NUMBERS[b]} is {a + b}.")
        elif form == 1:
            lines.append(f"the npu adds {a} and {b} and gets {a + b}.")
        else:
            lines.append(f"{a} + {b} = {a + b}; {b} + {a} = {a + b}.")
    return lines


class ByteTokenizer:
    """A byte-level tokenizer: token = byte + 3; 0 = <pad>, 1 = <s>, 2 = </s> (LLaMA's ids)."""
    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2
    vocab_size = 256 + 3

    def encode(self, text):
        return [self.bos_token_id] + [b + 3 for b in text.encode("utf-8")] + [self.eos_token_id]

    def decode(self, ids):
        return bytes(i - 3 for i in ids if i >= 3).decode("utf-8", errors="replace")


def make_dataset(seq, n_sequences, seed=0):
    """Tokenized text packed into ``n_sequences`` rows of ``seq`` tokens (LongTensor [n, seq])."""
    tok = ByteTokenizer()
    ids = []
    corpus_seed = seed
    while len(ids) < seq * n_sequences:
        for line in make_corpus(256, corpus_seed):
            ids.extend(tok.encode(line))
        corpus_seed += 1
    return torch.tensor(ids[: seq * n_sequences], dtype=torch.long).view(n_sequences, seq)


# ---------------------------------------------------------------- model configurations

def llama_config(args):
    from transformers import LlamaConfig
    if args.size == "7b":  # meta-llama/Llama-2-7b-hf's config.json
        kw = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096)
    else:  # the same architecture, small enough for a CPU-backed simulator
        kw = dict(vocab_size=ByteTokenizer.vocab_size, hidden_size=64, intermediate_size=176,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                  max_position_embeddings=512)
    if args.layers is not None:
        kw["num_hidden_layers"] = args.layers
    return LlamaConfig(rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu", tie_word_embeddings=False,
                       attention_bias=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                       attn_implementation=args.attn, **kw)


def memory_need(config, args, world):
    """Bytes one device needs: fp32 weights, gradients and AdamW's two moments (16 B/parameter,
    divided over the ranks under FSDP) plus activations kept for the backward
    (Korthikanti et al.'s s*b*h*(34 + 5*a*s/h) per layer, 16-bit; twice that in fp32) and the logits."""
    from transformers import LlamaForCausalLM
    with torch.device("meta"):
        n_params = sum(p.numel() for p in LlamaForCausalLM(config).parameters())
    states = 16 * n_params // (world if sharded(args) else 1)
    b, s, h, a = args.batch, args.seq, config.hidden_size, config.num_attention_heads
    act_bytes = 1 if args.bf16 else 2
    activations = config.num_hidden_layers * s * b * h * (34 + 5 * a * s / h) * act_bytes
    logits = 3 * b * s * config.vocab_size * 4
    return n_params, int(states + activations + logits)


def sharded(args):
    """Weights, gradients and optimizer states divided over the ranks (FSDP2, ZeRO-3)."""
    return args.parallel in ("fsdp", "zero3")


ZERO = {"zero1": 1, "zero2": 2, "zero3": 3}


def host_available():
    """What the simulator's host-memory check allows: MemAvailable less 5% of RAM."""
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":")
            info[k] = int(v.split()[0]) * 1024
    return info["MemAvailable"] - info["MemTotal"] // 20


# ---------------------------------------------------------------- a loss curve without matplotlib

def write_png(path, values, width=640, height=360):
    """Draws ``values`` as a line (black on white, grey axes) into a PNG, with zlib only."""
    pix = [[255] * width for _ in range(height)]
    m = 30
    for x in range(m, width - m):
        pix[height - m][x] = 128
    for y in range(m, height - m + 1):
        pix[y][m] = 128
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    pts = [(m + round(i * (width - 2 * m - 1) / max(len(values) - 1, 1)),
            height - m - round((v - lo) / span * (height - 2 * m))) for i, v in enumerate(values)]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:] or pts):
        n = max(abs(x1 - x0), abs(y1 - y0), 1)
        for k in range(n + 1):
            x, y = x0 + (x1 - x0) * k // n, y0 + (y1 - y0) * k // n
            for dy in (0, 1):
                pix[min(y + dy, height - 1)][x] = 0
    raw = b"".join(b"\x00" + bytes(row) for row in pix)

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def plot(path, losses, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        write_png(path, losses)
        print(f"loss curve -> {path} (matplotlib is not installed: drawn by write_png, no labels; "
              f"loss {max(losses):.3f} at the top, {min(losses):.3f} at the bottom)")
        return
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot(range(1, len(losses) + 1), losses)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    print(f"loss curve -> {path}")


# ---------------------------------------------------------------- training

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["npu", "cpu"], default="npu")
    p.add_argument("--size", choices=["tiny", "7b"], default="tiny")
    p.add_argument("--layers", type=int, default=None, help="override num_hidden_layers")
    p.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa", help="transformers' attn_implementation")
    p.add_argument("--parallel", choices=["none", "ddp", "fsdp", *ZERO], default=None,
                   help="default: ddp under torchrun, none otherwise; zeroN: DeepSpeed's ZeRO stage N")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps in all (a resumed run continues to it)")
    p.add_argument("--batch", type=int, default=4, help="sequences per rank per micro-batch")
    p.add_argument("--seq", type=int, default=64, help="tokens per sequence")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=2, help="warm-up steps of the linear schedule")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--offload", action="store_true",
                   help="with --parallel zero2/zero3: ZeRO-Offload, the optimizer step on the host (DeepSpeedCPUAdam)")
    p.add_argument("--max-grad-norm", type=float, default=0.0,
                   help="clip the gradients' global norm to this before each optimizer step (0: no clipping)")
    p.add_argument("--bf16", action="store_true", help="torch.autocast(device, dtype=torch.bfloat16)")
    p.add_argument("--lora", type=int, default=0, metavar="R",
                   help="peft LoRA of rank R on the attention's q_proj and v_proj (only the adapters train)")
    p.add_argument("--optim", choices=["torch", "npu_fused"], default="torch",
                   help="torch.optim.AdamW or torch_npu.optim.NpuFusedAdamW")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", metavar="DIR", help="write a checkpoint to DIR after the last step")
    p.add_argument("--stop-after", type=int, default=None, metavar="N",
                   help="stop (and --save) after step N, as if interrupted; the schedule still spans --steps")
    p.add_argument("--resume", metavar="DIR", help="continue from the checkpoint in DIR")
    p.add_argument("--profile", metavar="DIR", help="profile steps 2-3 with torch_npu.profiler into DIR")
    p.add_argument("--plot", metavar="FILE.png", help="draw the loss curve")
    p.add_argument("--losses", metavar="FILE.json",
                   help="write the per-step losses (and the run's facts) as JSON")
    p.add_argument("--force", action="store_true",
                   help="with --device npu: allocate even when the memory check says it cannot fit")
    args = p.parse_args(argv)
    for name in ("steps", "batch", "seq", "accum"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.optim == "npu_fused" and args.device != "npu":
        p.error("--optim npu_fused is torch_npu.optim.NpuFusedAdamW: it needs --device npu")
    if args.parallel in ZERO and args.device != "npu":
        p.error(f"--parallel {args.parallel} is DeepSpeed on npu (its accelerator is torch_npu's); "
                "the CPU reference is --parallel ddp --device cpu")
    if args.offload and args.parallel not in ("zero2", "zero3"):
        p.error("--offload is DeepSpeed's optimizer offload: it needs --parallel zero2 or zero3")
    if args.force and args.device != "npu":
        p.error("--force needs --device npu (the simulator raises torch.OutOfMemoryError; "
                "on the cpu the kernel's OOM killer would end the process)")
    return args


def log0(*a):
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(*a, flush=True)


def setup(args):
    """Process group (hccl on npu, gloo on cpu) and this rank's device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.parallel is None:
        args.parallel = "ddp" if "WORLD_SIZE" in os.environ else "none"
    if args.device == "npu":
        import torch_npu  # noqa: F401  (registers the npu device and the hccl backend)
        torch.npu.set_device(local_rank)
        device = torch.device(f"npu:{local_rank}")
    else:
        device = torch.device("cpu")
    if args.parallel != "none":
        if "WORLD_SIZE" not in os.environ:
            raise SystemExit(f"--parallel {args.parallel} needs torchrun (torchrun --nproc_per_node=N ...)")
        dist.init_process_group(backend="hccl" if args.device == "npu" else "gloo")
    elif world > 1:
        raise SystemExit("--parallel none with several ranks: each would train alone; use ddp or fsdp")
    return device, rank, world


def build_model(config, args, device, world):
    from transformers import LlamaForCausalLM
    n_params, need = memory_need(config, args, world)
    gib = 1 << 30
    limits = {"host": host_available()}
    if args.device == "npu":
        limits["device"] = torch.npu.mem_get_info(device)[0]
    fits = all(need <= v for v in limits.values())
    have = ", ".join(f"{k} {v / gib:.1f} GiB free" for k, v in limits.items())
    log0(f"model: LLaMA-2 {args.size} ({config.num_hidden_layers} layers, hidden {config.hidden_size}), "
         f"{n_params / 1e6:.1f}M parameters; needs about {need / gib:.2f} GiB per device ({have})")
    if not fits and not args.force:
        raise SystemExit(
            f"LLaMA-2 {args.size} does not fit: full fine-tuning with AdamW in fp32 needs about "
            f"{need / gib:.1f} GiB per device ({16 * n_params / gib:.1f} GiB of weights, gradients and optimizer "
            f"states{' over ' + str(world) + ' ranks' if sharded(args) else ''} + activations "
            f"of batch {args.batch} x {args.seq}), this machine has {have}. Use more ranks with "
            f"--parallel fsdp, fewer layers (--layers), or --force to let the allocator raise.")
    torch.manual_seed(args.seed)
    if fits:  # built on the CPU under the seed, then moved: npu and cpu runs start from the same weights
        model = LlamaForCausalLM(config)
        model.to(device)
    else:  # --force: allocate the real thing on the device; the simulator raises torch.OutOfMemoryError
        with torch.device("meta"):
            model = LlamaForCausalLM(config)
        model.to_empty(device=device)
        model.init_weights()
    return model


def add_lora(model, args):
    """peft's LoRA adapters (rank --lora, alpha 2 x rank) on q_proj and v_proj; the base weights freeze."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise SystemExit("--lora needs peft (pip install peft)")
    model = get_peft_model(model, LoraConfig(r=args.lora, lora_alpha=2 * args.lora, lora_dropout=0.0,
                                             target_modules=["q_proj", "v_proj"]))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log0(f"LoRA rank {args.lora}: {trainable} trainable parameters")
    return model


def wrap(model, args, device):
    if args.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(model, device_ids=[device.index] if device.type == "npu" else None)
    if args.parallel == "fsdp":
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:
            raise SystemExit(f"--parallel fsdp needs FSDP2 (torch.distributed.fsdp.fully_shard); "
                             f"torch {torch.__version__} does not have it")
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    return model


def deepspeed_engine(model, optimizer, scheduler, args):
    """DeepSpeed's engine around the model and the torch optimizer, ZeRO stage 1-3. DeepSpeed
    finds the npu through its accelerator (torch_npu) and the CANN home torch_npu exports."""
    try:
        import deepspeed
    except ImportError:
        raise SystemExit(f"--parallel {args.parallel} needs DeepSpeed (pip install deepspeed)")
    config = {"train_micro_batch_size_per_gpu": args.batch, "gradient_accumulation_steps": args.accum,
              "zero_optimization": {"stage": ZERO[args.parallel]}, "steps_per_print": 1 << 30,
              "gradient_clipping": args.max_grad_norm}  # DeepSpeed's default would clip at 1.0
    if args.offload:  # DeepSpeed's own AdamW on the host (a C++ op it builds against CANN's home)
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
        config["optimizer"] = {"type": "AdamW", "params": {"lr": args.lr, "betas": [0.9, 0.95], "eps": 1e-8,
                                                           "weight_decay": args.weight_decay}}
        config["zero_force_ds_cpu_optimizer"] = True
    if args.offload:  # the engine makes the optimizer, the schedule is made on it
        engine, optimizer, _, scheduler = deepspeed.initialize(
            model=model, model_parameters=param_groups(model, args), config=config,
            lr_scheduler=lambda opt: make_scheduler(opt, args))
    else:
        engine, optimizer, _, scheduler = deepspeed.initialize(model=model, optimizer=optimizer,
                                                               lr_scheduler=scheduler, config=config)
    return engine, optimizer, scheduler


def param_groups(model, args):
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and p.requires_grad]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2 and p.requires_grad]
    return [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_scheduler(optimizer, args):
    from transformers import get_linear_schedule_with_warmup
    return get_linear_schedule_with_warmup(optimizer, num_warmup_steps=args.warmup, num_training_steps=args.steps)


def make_optimizer(model, args):
    groups = param_groups(model, args)
    if args.optim == "npu_fused":
        import torch_npu
        return torch_npu.optim.NpuFusedAdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)


def save_checkpoint(path, model, optimizer, scheduler, step, args):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    if args.parallel in ZERO:  # DeepSpeed's own format: each rank writes its partition
        model.save_checkpoint(path, tag="last", client_state={"step": step, "args": checkpoint_args(args)})
        log0(f"checkpoint (step {step}) -> {path}")
        return
    if args.parallel == "fsdp":  # gather the shards into full tensors on rank 0
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_sd, optim_sd = get_state_dict(model, optimizer, options=opts)
    else:
        module = model.module if args.parallel == "ddp" else model
        model_sd = {k: v.cpu() for k, v in module.state_dict().items()}
        optim_sd = _to_cpu(optimizer.state_dict())
    if not dist.is_initialized() or dist.get_rank() == 0:
        os.makedirs(path, exist_ok=True)
        torch.save({"model": model_sd, "optimizer": optim_sd, "scheduler": scheduler.state_dict(), "step": step,
                    "args": checkpoint_args(args)}, os.path.join(path, "checkpoint.pt"))
        log0(f"checkpoint (step {step}) -> {os.path.join(path, 'checkpoint.pt')}")
    if dist.is_initialized():
        dist.barrier()


def checkpoint_args(args):
    return {k: getattr(args, k) for k in ("size", "layers", "lr", "warmup", "steps", "seed", "batch", "seq", "accum")}


def check_resumable(path, saved, args):
    for k in ("size", "layers", "seed", "batch", "seq", "accum", "steps"):
        if saved[k] != getattr(args, k):
            raise SystemExit(f"--resume {path}: the checkpoint was made with --{k} {saved[k]}, "
                             f"this run has {getattr(args, k)}")


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj


def load_checkpoint(path, model, optimizer, scheduler, args, device):
    if args.parallel in ZERO:  # the engine restores weights, optimizer and scheduler
        _, client = model.load_checkpoint(path, tag="last")
        if client is None:
            raise SystemExit(f"--resume {path}: no DeepSpeed checkpoint there (tag 'last')")
        check_resumable(path, client["args"], args)
        log0(f"resumed from {path} after step {client['step']}")
        return client["step"]
    ckpt = torch.load(os.path.join(path, "checkpoint.pt"), map_location="cpu", weights_only=False)
    check_resumable(path, ckpt["args"], args)
    if args.parallel == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
        set_state_dict(model, optimizer, model_state_dict=ckpt["model"], optim_state_dict=ckpt["optimizer"],
                       options=StateDictOptions(full_state_dict=True))
    else:
        module = model.module if args.parallel == "ddp" else model
        module.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])  # moves the states to the parameters' device
    scheduler.load_state_dict(ckpt["scheduler"])
    log0(f"resumed from {path} after step {ckpt['step']}")
    return ckpt["step"]


def make_profiler(args):
    if args.device == "npu":
        import torch_npu
        prof = torch_npu.profiler
        activities = [prof.ProfilerActivity.CPU, prof.ProfilerActivity.NPU]
    else:
        prof = torch.profiler
        activities = [prof.ProfilerActivity.CPU]
    # wait one step, then record two (steps 2 and 3 of the run)
    return prof.profile(activities=activities, schedule=prof.schedule(wait=1, warmup=0, active=2, repeat=1),
                        on_trace_ready=prof.tensorboard_trace_handler(args.profile), record_shapes=True)


def main(argv=None):
    args = parse_args(argv)
    device, rank, world = setup(args)
    try:
        train(args, device, rank, world)
    except torch.OutOfMemoryError:
        if device.type == "npu":  # what the caching allocator holds, as the OOM left it
            print(torch.npu.memory_summary(device, abbreviated=True), file=sys.stderr, flush=True)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def train(args, device, rank, world):
    config = llama_config(args)
    model = build_model(config, args, device, world)
    if args.lora:
        model = add_lora(model, args)
    model = wrap(model, args, device)
    model.train()
    optimizer = make_optimizer(model, args)
    scheduler = make_scheduler(optimizer, args)
    if args.parallel in ZERO:
        model, optimizer, scheduler = deepspeed_engine(model, optimizer, scheduler, args)
    start = load_checkpoint(args.resume, model, optimizer, scheduler, args, device) if args.resume else 0
    last = min(args.steps, args.stop_after) if args.stop_after else args.steps

    # Every optimizer step uses a global batch of world * accum * batch sequences; rank r takes
    # its slice, so 2 ranks x batch b compute what 1 rank x batch 2b does.
    global_batch = world * args.accum * args.batch
    data = make_dataset(args.seq, global_batch * args.steps, seed=args.seed)
    log0(f"data: {data.numel()} tokens ({data.shape[0]} sequences of {args.seq}); global batch {global_batch} "
         f"= {world} rank(s) x {args.accum} micro-batch(es) x {args.batch}; device {device.type}, "
         f"parallel {args.parallel}, optimizer {type(optimizer).__name__}, bf16 {args.bf16}")
    profiler = make_profiler(args) if args.profile else None
    if profiler:
        profiler.start()
    losses, step_seconds = [], []
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16)
    t_start = time.perf_counter()
    for step in range(start, last):
        t0 = time.perf_counter()
        rows = data[step * global_batch:(step + 1) * global_batch].view(world, args.accum, args.batch, args.seq)
        total = torch.zeros((), device=device)
        for micro in range(args.accum):
            input_ids = rows[rank, micro].to(device)
            attention_mask = torch.ones_like(input_ids)
            sync = micro == args.accum - 1
            if args.parallel == "fsdp":
                model.set_requires_gradient_sync(sync)
            ctx = model.no_sync() if args.parallel == "ddp" and not sync else contextlib.nullcontext()
            with ctx:
                with autocast:
                    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids)
                if args.parallel in ZERO:  # the engine divides by the accumulation steps and steps
                    model.backward(out.loss)  # optimizer and scheduler on the last micro-batch only
                    model.step()
                else:
                    (out.loss / args.accum).backward()
            total += out.loss.detach().float() / args.accum
        if args.parallel not in ZERO:
            if args.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()  # NpuFusedAdamW keeps its gradients (set_to_none=False)
        if dist.is_initialized():
            dist.all_reduce(total)
            total /= world
        loss = total.item()
        losses.append(loss)
        step_seconds.append(time.perf_counter() - t0)
        if profiler:
            profiler.step()
        log0(f"step {step + 1}/{args.steps} loss {loss:.6f} lr {scheduler.get_last_lr()[0]:.2e} "
             f"{time.perf_counter() - t0:.2f}s")
    if profiler:
        profiler.stop()
        log0(f"profile (steps 2-3) -> {args.profile}")
    elapsed = time.perf_counter() - t_start
    if args.save:
        save_checkpoint(args.save, model, optimizer, scheduler, last, args)
    if rank == 0:
        if losses:
            log0(f"done: {len(losses)} steps in {elapsed:.1f}s, loss {losses[0]:.4f} -> {losses[-1]:.4f}")
        if args.plot and losses:
            plot(args.plot, losses, f"LLaMA-2 {args.size} fine-tune on {device.type} ({args.parallel}, world {world})")
        if args.losses:
            with open(args.losses, "w") as f:
                json.dump({"losses": losses, "first_step": start + 1, "world": world, "device": device.type,
                           "parallel": args.parallel, "optimizer": type(optimizer).__name__,
                           "seconds": elapsed, "step_seconds": step_seconds}, f)


if __name__ == "__main__":
    main()
