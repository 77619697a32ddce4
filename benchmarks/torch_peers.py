"""The PyTorch peers gpu_peers.py times on the GPU machine: the zoo's real configs written
in plain torch (no transformers or torchvision there), fp16, random weights.

    bert   BERT-base: 12 layers, hidden 768, 12 heads, FFN 3072, GELU, post-norm
    gpt2   GPT-2 small: 12 layers, hidden 768, 12 heads, causal, pre-norm, tied LM head
    llama  TinyLlama width cut to 4 layers: hidden 2048, 32 query / 4 key-value heads,
           RMSNorm, rotary embeddings, SwiGLU 5632, causal
    resnet ResNet-50 (models/cnn.py's module, BatchNorm kept, eval mode)

Each is what the ONNX model in the zoo computes, so tilefuse's plan and these modules do
the same work. ``time_peer`` runs eager or a torch.compile mode and times it with CUDA
events after warm-up.
"""
from __future__ import annotations

import functools
import statistics

SEQ = 128


def _transformers():
    import torch
    import torch.nn.functional as F
    from torch import nn

    class BertLayer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv, self.proj = nn.Linear(768, 2304), nn.Linear(768, 768)
            self.up, self.down = nn.Linear(768, 3072), nn.Linear(3072, 768)
            self.ln1, self.ln2 = nn.LayerNorm(768, eps=1e-12), nn.LayerNorm(768, eps=1e-12)

        def forward(self, x, mask):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, 12, 64).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, s, 768)
            x = self.ln1(x + self.proj(a))
            return self.ln2(x + self.down(F.gelu(self.up(x))))

    class Bert(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.word, self.pos, self.token_type = nn.Embedding(30522, 768), nn.Embedding(512, 768), nn.Embedding(2, 768)
            self.ln = nn.LayerNorm(768, eps=1e-12)
            self.layers = nn.ModuleList(BertLayer() for _ in range(12))
            self.pool = nn.Linear(768, 768)

        def forward(self, ids, attention_mask):
            pos = torch.arange(ids.shape[1], device=ids.device)
            x = self.ln(self.word(ids) + self.pos(pos) + self.token_type(torch.zeros_like(ids)))
            mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
            for layer in self.layers:
                x = layer(x, mask)
            return x, torch.tanh(self.pool(x[:, 0]))

    class Gpt2Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(768), nn.LayerNorm(768)
            self.qkv, self.proj = nn.Linear(768, 2304), nn.Linear(768, 768)
            self.up, self.down = nn.Linear(768, 3072), nn.Linear(3072, 768)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, 12, 64).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, 768)
            x = x + self.proj(a)
            return x + self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh"))

    class Gpt2(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(50257, 768), nn.Embedding(1024, 768)
            self.blocks = nn.ModuleList(Gpt2Block() for _ in range(12))
            self.ln = nn.LayerNorm(768)

        def forward(self, ids, attention_mask):
            x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
            for block in self.blocks:
                x = block(x)
            return self.ln(x) @ self.wte.weight.t()

    class RMSNorm(nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(d))

        def forward(self, x):
            h = x.float()
            return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * self.w

    def rotate(x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    class LlamaLayer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.n1, self.n2 = RMSNorm(2048), RMSNorm(2048)
            self.q, self.k, self.v = nn.Linear(2048, 2048, bias=False), nn.Linear(2048, 256, bias=False), nn.Linear(2048, 256, bias=False)
            self.o = nn.Linear(2048, 2048, bias=False)
            self.gate, self.up = nn.Linear(2048, 5632, bias=False), nn.Linear(2048, 5632, bias=False)
            self.down = nn.Linear(5632, 2048, bias=False)

        def forward(self, x, cos, sin):
            b, s, _ = x.shape
            h = self.n1(x)
            q = rotate(self.q(h).view(b, s, 32, 64).transpose(1, 2), cos, sin)
            k = rotate(self.k(h).view(b, s, 4, 64).transpose(1, 2), cos, sin).repeat_interleave(8, dim=1)
            v = self.v(h).view(b, s, 4, 64).transpose(1, 2).repeat_interleave(8, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, 2048)
            x = x + self.o(a)
            h = self.n2(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Llama(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(32000, 2048)
            self.layers = nn.ModuleList(LlamaLayer() for _ in range(4))
            self.norm = RMSNorm(2048)
            inv = 1.0 / (10000 ** (torch.arange(0, 64, 2).float() / 64))
            self.register_buffer("inv", inv)

        def forward(self, ids, attention_mask):
            x = self.embed(ids)
            t = torch.arange(ids.shape[1], device=ids.device).float()
            f = torch.outer(t, self.inv)
            emb = torch.cat((f, f), dim=-1)
            cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
            for layer in self.layers:
                x = layer(x, cos, sin)
            return self.norm(x)

    return {"bert": (Bert, 30522), "gpt2": (Gpt2, 50257), "llama": (Llama, 32000)}


def make(name: str, batch: int):
    """(fp16 CUDA module in eval mode, its example inputs)."""
    import torch

    torch.manual_seed(0)
    if name == "resnet":
        from models.cnn import ResNet

        model = ResNet((3, 4, 6, 3), 64, 1000)
        return model.cuda().half().eval(), (torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.float16),)
    cls, vocab = _transformers()[name]
    model = cls().cuda().half().eval()
    ids = torch.randint(0, vocab, (batch, SEQ), device="cuda")
    return model, (ids, torch.ones(batch, SEQ, device="cuda", dtype=torch.int64))


def time_peer(name: str, batch: int, mode: str, repeats: int) -> dict:
    """Median and spread of one forward pass (ms), eager or under torch.compile(mode)."""
    import torch

    model, inputs = make(name, batch)
    fn = model if mode == "eager" else torch.compile(model, mode=None if mode == "default" else mode)
    call = functools.partial(fn, *inputs)
    with torch.inference_mode():
        times = event_times(call, repeats, warmup=10)
    del model, fn, call
    torch.cuda.empty_cache()
    return {"model": f"torch-{name}-float16-b{batch}", "mode": mode, **spread(times), "repeats": repeats}


def event_times(fn, repeats: int, warmup: int) -> list[float]:
    """``repeats`` timings (ms) of ``fn()`` on the GPU, CUDA events around each call, after
    ``warmup`` untimed calls."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return times


def spread(times: list[float]) -> dict:
    """Median, 10th and 90th percentile of timings (ms)."""
    times = sorted(times)
    return {"ms_median": statistics.median(times), "ms_p10": times[len(times) // 10],
            "ms_p90": times[(9 * len(times)) // 10]}
